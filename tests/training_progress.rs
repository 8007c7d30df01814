//! A training job's progress in `status`, `status --json`, `status --watch` and `serve`
//! through the real binary, without a real training (that is `training::`'s, minutes
//! each): a job the daemon really runs, its file given a training folder as the daemon
//! records one when a training starts (`training_dir`), whose `trainer-events.jsonl` the
//! test writes line by line as the trainer would. The reader itself (resumed attempts,
//! a null loss, no step yet) is unit-tested in `src/train/progress.rs`.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::common::chromium::Chromium;
use crate::common::*;

const START: &str = r#"{"event":"checked","rows":13,"tokens":18420}
{"event":"start","steps":8,"resumed_from":0}
"#;

fn step(step: u64, loss: f64, seconds: f64) -> String {
    format!("{{\"event\":\"step\",\"step\":{step},\"steps\":8,\"loss\":{loss},\"seconds\":{seconds}}}\n")
}

fn append(path: &Path, text: &str) {
    std::fs::OpenOptions::new().append(true).create(true).open(path).unwrap().write_all(text.as_bytes()).unwrap();
}

/// Job `id`'s file with `training_dir` set, replaced atomically as the queue writes it
/// (the daemon reads it meanwhile).
fn record_training_dir(bench: &Bench, id: u64, dir: &Path) {
    let path = bench.path().join(format!(".pruefstand/jobs/{id}/job.json"));
    let mut job = bench.job(id);
    job["training_dir"] = dir.to_str().unwrap().into();
    let staged = path.with_extension("json.test");
    std::fs::write(&staged, serde_json::to_string_pretty(&job).unwrap()).unwrap();
    std::fs::rename(&staged, &path).unwrap();
    // What the queue does after a write: wake the watchers of `jobs/`.
    append(&bench.path().join(".pruefstand/jobs/.changed"), "test");
}

fn status_json(bench: &Bench) -> serde_json::Value {
    serde_json::from_str(&bench.run(&["status", "--json"]).ok().stdout).unwrap()
}

/// `pruefstand serve` on a free port; its address and the child (killed on drop).
struct Serve(std::process::Child, String);

impl Serve {
    fn start(bench: &Bench) -> Serve {
        let mut child = bench
            .cmd(&["serve", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.trim().trim_start_matches("http://").trim_end_matches('/').to_string();
        Serve(child, addr)
    }

    fn api_status(&self) -> serde_json::Value {
        let mut stream = std::net::TcpStream::connect(&self.1).unwrap();
        write!(stream, "GET /api/status HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.1).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let (_, body) = answer.split_once("\r\n\r\n").unwrap();
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn status_and_serve_follow_a_training_jobs_steps_loss_and_eta() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    // Slow enough that the job is still running when the test has looked.
    bench.write("versions/slow.toml", &slow_version(60_000));
    let id = bench.start(&["slow", "--plan", "tiny"]);
    let daemon = bench.daemon();
    bench.wait_job(id, "running", 300);
    // Its cases counted and under way, each model call 60 s: from here the daemon writes
    // nothing until a case ends, so what follows wakes `serve` and `--watch` through the
    // training's events alone.
    wait_until("the job's cases under way", 300, || status_json(&bench)["state"]["total"].as_u64() > Some(0));
    std::thread::sleep(std::time::Duration::from_secs(1));
    let dir: PathBuf = bench.path().join("reports/slow-sft/training/0123456789abcdef");
    std::fs::create_dir_all(&dir).unwrap();
    let events = dir.join("trainer-events.jsonl");
    append(&events, START);
    append(&events, &(step(1, 0.7012, 20.0) + &step(2, 0.6802, 90.0) + &step(3, 0.6123, 25.0)));
    let serve = Serve::start(&bench);
    let chromium = Chromium::find();
    let mut tab = chromium.tab(&format!("http://{}/", serve.1), 1280, 800);
    record_training_dir(&bench, id, &dir);

    // `status`: the step, its loss, and the ETA `log` prints (median 25 s × 5 steps).
    let line = format!("training slow-sft (job {id}): step 3/8, loss 0.6123, ETA 2 min 05 s");
    let status = bench.run(&["status"]).ok().stdout;
    assert!(status.contains(&line), "{status}");
    let training = &status_json(&bench)["training"];
    assert_eq!(training["job"], id, "{training}");
    assert_eq!((&training["phase"], &training["state"]), (&"training".into(), &"running".into()), "{training}");
    assert_eq!((training["step"].as_u64(), training["steps"].as_u64()), (Some(3), Some(8)), "{training}");
    assert_eq!((training["loss"].as_f64(), training["eta_s"].as_f64()), (Some(0.6123), Some(125.0)), "{training}");
    assert_eq!(training["dir"], dir.to_str().unwrap());
    assert_eq!(serve.api_status()["training"], *training, "/api/status is status --json");

    // `status --watch` (no terminal: a line each change) says the training's line.
    let mut watch = bench.cmd(&["status", "--watch"]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert_eq!(first, line);

    // The live page: the training's line, its steps on the bar, loss and ETA.
    let look = |tab: &mut crate::common::chromium::Tab| {
        tab.eval(
            "['job-train','step','steps','loss','eta'].map(id => document.getElementById(id).textContent)\
             .concat([String(document.getElementById('bar').value), String(document.getElementById('steps-box').hidden), \
             String(document.getElementById('cases-box').hidden)])",
        )
    };
    let mut seen = serde_json::Value::Null;
    wait_until("the page to show the training", 60, || {
        seen = look(&mut tab);
        seen[0] == line.as_str()
    });
    assert_eq!(seen, serde_json::json!([line, "3", "8", "0.6123", "2 min 05 s", "3", "false", "true"]));

    // The next step, written to the events file alone, reaches all three: the page while
    // the daemon has written nothing since (inotify on the training's folder woke it).
    let published = status_json(&bench)["state"]["updated_at"].clone();
    append(&events, &step(4, 0.5961, 25.0));
    let line = format!("training slow-sft (job {id}): step 4/8, loss 0.5961, ETA 1 min 40 s");
    wait_until("the page to show step 4", 60, || {
        seen = look(&mut tab);
        seen[0] == line.as_str()
    });
    assert_eq!((&seen[1], &seen[3], &seen[5]), (&"4".into(), &"0.5961".into(), &"4".into()), "{seen}");
    assert_eq!(status_json(&bench)["state"]["updated_at"], published, "the daemon wrote meanwhile");
    assert_eq!(lines.next().unwrap().unwrap(), line, "--watch woke on the events file");
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(bench.run(&["status"]).ok().stdout.contains(&line));
    let errors = tab.errors();
    assert!(errors.is_empty(), "{errors:?}");

    // Its daemon gone, the job still `running` in its file: the last step and loss stay,
    // the ETA goes (nothing runs to reach it). Trained, it says so.
    drop(daemon);
    let status = bench.run(&["status"]).ok().stdout;
    assert!(status.contains(&format!("training slow-sft (job {id}): step 4/8, loss 0.5961\n")), "{status}");
    append(
        &events,
        r#"{"event":"done","adapter":"/work/out/adapter","sha256":{},"losses":[0.6931,0.6802,0.6123,0.5961],"rows_used":13}"#,
    );
    let status = bench.run(&["status"]).ok().stdout;
    assert!(status.contains(&format!("training slow-sft (job {id}): done, step 4/4, loss 0.5961\n")), "{status}");
    let training = &status_json(&bench)["training"];
    assert_eq!((&training["phase"], training["eta_s"].is_null()), (&"done".into(), true), "{training}");
}
