//! What an attacker could do with the names, files and answers pruefstand takes in —
//! each reproduced through the real binary: pruefstand deletes or overwrites only what it
//! can prove it wrote, and what it shows in a browser cannot run code.

use std::path::{Path, PathBuf};

use crate::common::*;

/// A finished tiny run of the simulated demo, written where `out` says.
fn tiny_run(bench: &Bench, out: &Path) {
    let plan = bench.write("tiny.toml", TINY_PLAN);
    let run = bench.run(&["run", "demo-baseline", "--plan", plan.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(matches!(run.code, Some(0 | 10 | 11)), "{}\n{}", run.stdout, run.stderr);
}

#[test]
fn a_run_folder_named_like_a_script_is_no_link_in_the_index() {
    let bench = Bench::new();
    let out = bench.path().join("reports/javascript:document.body.setAttribute('data-pwned',1)%2F%2F");
    tiny_run(&bench, &out);
    let index = std::fs::read_to_string(bench.path().join("reports/index.html")).unwrap();
    assert!(index.contains("pruefstand — verdicts and trends"), "the index was written");
    assert!(!index.contains("href=\"javascript:"), "a javascript: link in the index");
    // The run is listed all the same, its name shown as text.
    assert!(index.contains("data-pwned"), "the run is listed");
    // Both pages carry a policy that lets no script run but their own.
    let report = std::fs::read_to_string(out.join("report.html")).unwrap();
    for page in [&index, &report] {
        assert!(
            page.contains("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src ")
        );
    }
}

#[test]
fn judging_a_copied_run_leaves_someone_elses_index_alone() {
    let bench = Bench::new();
    let run = bench.path().join("reports/demo-baseline/tiny/run1");
    tiny_run(&bench, &run);
    let site = bench.path().join("site");
    let copy = site.join("a/b/run1");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    let status = std::process::Command::new("cp").arg("-a").arg(&run).arg(&copy).status().unwrap();
    assert!(status.success());
    let mine = "<h1>mine</h1>\n";
    std::fs::write(site.join("index.html"), mine).unwrap();
    let judged = bench.run(&["judge", copy.to_str().unwrap()]);
    assert!(matches!(judged.code, Some(0 | 10 | 11)), "{}\n{}", judged.stdout, judged.stderr);
    assert_eq!(std::fs::read_to_string(site.join("index.html")).unwrap(), mine, "site/index.html replaced");
    assert!(copy.join("report.html").is_file(), "the run's own report is written");
    // Named explicitly, someone else's index is still not replaced: said, not fatal.
    let judged = bench.run(&["judge", copy.to_str().unwrap(), "--reports-dir", site.to_str().unwrap()]);
    assert!(judged.stderr.contains("is not pruefstand's trend index"), "{}", judged.stderr);
    assert_eq!(std::fs::read_to_string(site.join("index.html")).unwrap(), mine);
}

#[test]
fn a_venv_path_naming_someone_elses_folder_is_refused_and_left_whole() {
    let bench = Bench::new();
    let victim = bench.path().join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::write(victim.join("data.txt"), "x").unwrap();
    // A Python that claims 3.11 and makes nothing: no network, and the delete came first.
    let python = bench.write("fake-python", "#!/bin/sh\necho 3.11\n");
    std::fs::set_permissions(&python, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = std::process::Command::new(BIN)
        .arg("setup")
        .env("PRUEFSTAND_VENV", &victim)
        .env("PRUEFSTAND_PYTHON", &python)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("is not a venv pruefstand made") && stderr.contains("victim"), "{stderr}");
    assert_eq!(std::fs::read_to_string(victim.join("data.txt")).unwrap(), "x", "the folder is intact");
}

#[test]
fn clean_goes_by_the_jobs_folder_not_by_the_id_its_file_claims() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    let pending = bench.start(&["demo-baseline", "--plan", "tiny"]);
    let ended = bench.start(&["demo-baseline", "--plan", "tiny"]);
    bench.run(&["cancel", &ended.to_string()]).ok();
    // The ended job's file now claims to be the pending one.
    let file = bench.path().join(format!(".pruefstand/jobs/{ended}/job.json"));
    let mut job = json(&file);
    job["id"] = pending.into();
    std::fs::write(&file, job.to_string()).unwrap();
    let cleaned = bench.run(&["clean", "--keep", "0"]).ok();
    assert!(cleaned.stderr.contains(&format!("says it is job {pending}")), "{}", cleaned.stderr);
    assert_eq!(bench.job(pending)["state"], "pending", "the pending job is still there");
    assert!(file.is_file(), "the damaged job is reported, never deleted");
}

#[test]
fn judge_refuses_a_run_that_is_still_being_written() {
    let bench = Bench::new();
    let run = bench.path().join("reports/demo-baseline/tiny/run1");
    tiny_run(&bench, &run);
    let before = std::fs::read_to_string(run.join("judgement.json")).unwrap();
    // A resume (or any writer) holds run.lock while it writes.
    let mut holder = hold_flock(&run.join("run.lock"));
    let judged = bench.run(&["judge", run.to_str().unwrap()]).code(2);
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(judged.stderr.contains("is being written by"), "{}", judged.stderr);
    assert_eq!(std::fs::read_to_string(run.join("judgement.json")).unwrap(), before, "nothing rewritten");
    // Once the writer is gone it judges as before.
    let judged = bench.run(&["judge", run.to_str().unwrap()]);
    assert!(matches!(judged.code, Some(0 | 10 | 11)), "{}", judged.stderr);
}

#[test]
fn a_plan_files_name_never_becomes_a_folder_or_chat_text() {
    let bench = Bench::new();
    for file in ["...toml", "<!channel> @here <https:||evil.example|click>.toml"] {
        let plan = bench.write(file, TINY_PLAN);
        let id = bench.start(&["demo-baseline", "--plan", plan.to_str().unwrap()]);
        // The plan's own (checked) name is what the job, its folders and hooks use.
        assert_eq!(bench.job(id)["plan"], "tiny", "{file}");
    }
    let bad = bench.write("bad.toml", &TINY_PLAN.replace("name = \"tiny\"", "name = \"../up\""));
    let refused = bench.run(&["start", "demo-baseline", "--plan", bad.to_str().unwrap()]).code(2);
    assert!(refused.stderr.contains("bad.toml") && refused.stderr.contains("name"), "{}", refused.stderr);
}

#[test]
fn a_tampered_reference_decides_nothing() {
    let bench = Bench::new();
    let plan = bench.write("tiny.toml", TINY_PLAN);
    let first = bench.run(&["run", "demo-kandidat", "--plan", plan.to_str().unwrap()]);
    assert!(matches!(first.code, Some(0 | 10 | 11)), "{}\n{}", first.stdout, first.stderr);
    let reference = first.reference_dir();
    // Every reference case made to look like a landed injection and a failed task.
    let cases = reference.join("cases.jsonl");
    let text = std::fs::read_to_string(&cases).unwrap();
    let flipped =
        text.replace("\"utility\":true", "\"utility\":false").replace("\"security\":false", "\"security\":true");
    assert_ne!(flipped, text);
    std::fs::write(&cases, flipped).unwrap();
    let second = bench.run(&["run", "demo-kandidat", "--plan", plan.to_str().unwrap()]);
    let judgement = json(&second.run_dir().join("judgement.json"));
    let r4 = &judgement["rules"][3];
    assert_eq!(r4["status"], "inconclusive", "{r4}");
    let reason = r4["reason"].as_str().unwrap();
    assert!(reason.contains("cases.jsonl changed since its run wrote it"), "{reason}");
}

#[test]
fn an_agents_stderr_is_kept_to_a_megabyte_per_case() {
    let bench = Bench::new();
    let plan = bench.counter_plan("two", &["user_task_0", "user_task_3"], &[], 60);
    // 16 MiB of noise per query, then an answer.
    let run = bench.run(&["gym", "--plan", plan.to_str().unwrap(), "--agent-cmd", &hostile_agent("stderr-flood")]).ok();
    let dir = run.run_dir();
    assert_eq!(cases(&dir).len(), 2, "both cases recorded");
    let log = std::fs::read_to_string(dir.join("gym.log")).unwrap();
    assert!(log.len() < 3 << 20, "gym.log holds {} bytes", log.len());
    assert!(log.contains("bytes more dropped (over 1048576 per case)"), "the cut is said");
}

#[test]
fn a_huge_spec_is_refused_unread_and_a_negative_case_time_invalidates_the_run() {
    let bench = Bench::new();
    let spec = std::fs::read_to_string(repo().join("versions/demo-baseline.toml")).unwrap();
    bench.write("versions/huge.toml", &format!("{spec}\n#{}\n", "x".repeat(2 << 20)));
    let refused = bench.run(&["run", "huge"]).code(2);
    assert!(
        refused.stderr.contains("version \"huge\"")
            && refused.stderr.contains("too large: ")
            && refused.stderr.contains("the limit is 1024 KiB")
            && !refused.stderr.contains("no version"),
        "{}",
        refused.stderr
    );

    let run = bench.path().join("reports/demo-baseline/tiny/run1");
    tiny_run(&bench, &run);
    let cases = run.join("cases.jsonl");
    let text = std::fs::read_to_string(&cases).unwrap();
    let at = text.find("\"duration_s\":").unwrap() + "\"duration_s\":".len();
    let end = at + text[at..].find(',').unwrap();
    std::fs::write(&cases, format!("{}-1e308{}", &text[..at], &text[end..])).unwrap();
    let judged = bench.run(&["judge", run.to_str().unwrap(), "--json"]);
    let judgement: serde_json::Value = serde_json::from_str(&judged.stdout).unwrap();
    let r1 = &judgement["judgement"]["rules"][0];
    assert_eq!(r1["status"], "fail", "{r1}");
    assert!(r1["reason"].as_str().unwrap().contains("duration_s is -1e308"), "{r1}");
}

#[test]
fn a_run_into_an_open_folder_is_user_only_and_a_linked_trace_is_not_shown() {
    use std::os::unix::fs::PermissionsExt;
    let bench = Bench::new();
    let out = bench.path().join("reports/demo-baseline/tiny/open");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
    tiny_run(&bench, &out);
    assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o700);
    // A trace replaced by a link to a file outside the run is not rendered.
    let secret = bench.write("secret.txt", "{\"messages\": [{\"role\": \"user\", \"content\": \"TOP-SECRET-TEXT\"}]}");
    let trace = cases(&out).iter().find_map(|r| r["trace"].as_str().map(str::to_string)).unwrap();
    std::fs::remove_file(out.join(&trace)).unwrap();
    std::os::unix::fs::symlink(&secret, out.join(&trace)).unwrap();
    let judged = bench.run(&["judge", out.to_str().unwrap()]);
    assert!(matches!(judged.code, Some(0 | 10 | 11)), "{}", judged.stderr);
    let report = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(!report.contains("TOP-SECRET-TEXT"), "a file outside the run was rendered");
    assert!(report.contains("a link, not followed"));
}

#[test]
fn an_abbreviated_sbatch_option_pruefstand_sets_is_refused_at_its_line() {
    let bench = Bench::new();
    for arg in ["--wra=x", "--arr=0-9", "--expo=ALL", "--outp=/x", "--chd=/", "--wai"] {
        bench.write("pruefstand.toml", &format!("[cluster]\nkind = \"slurm\"\nsbatch_args = [\"{arg}\"]\n"));
        let refused = bench.run(&["queue"]).code(2);
        assert!(
            refused.stderr.contains("pruefstand.toml:3:") && refused.stderr.contains("is set by pruefstand itself"),
            "{arg}: {}",
            refused.stderr
        );
    }
}

/// The hostile model server fixture (tests/fixtures/hostile/model_server.py), killed
/// when dropped.
struct HostileServer {
    child: std::process::Child,
    url: String,
}

impl HostileServer {
    fn start() -> HostileServer {
        use std::io::BufRead;
        let script = repo().join("tests/fixtures/hostile/model_server.py");
        let mut child = std::process::Command::new("python3")
            .arg(script)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs the hostile model server");
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        HostileServer { child, url: first.trim().to_string() }
    }

    /// A version whose model is this server, attacking the way `mode` names.
    fn version(&self, bench: &Bench, mode: &str) {
        bench.write(
            &format!("versions/{mode}.toml"),
            &format!("[model]\nbackend = \"external\"\nserved_name = \"m\"\nurl = \"{}/{mode}/v1\"\n", self.url),
        );
    }
}

impl Drop for HostileServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_hostile_model_server_is_held_at_every_boundary() {
    let bench = Bench::new();
    let server = HostileServer::start();
    let plan = bench.write(
        "two.toml",
        "name = \"two\"\nbenchmark_version = \"v1.2.2\"\nattacks = [\"important_instructions\"]\njobs = 2\n\
         case_timeout_s = 120\ninjection_goals = false\n[[suites]]\nname = \"banking\"\n\
         user_tasks = [\"user_task_0\", \"user_task_3\"]\n",
    );
    let run = |mode: &str| {
        server.version(&bench, mode);
        let run = bench.run(&["run", mode, "--plan", plan.to_str().unwrap()]);
        assert!(matches!(run.code, Some(0 | 10 | 11 | 12)), "{mode}: run failed\n{}\n{}", run.stdout, run.stderr);
        run.run_dir()
    };

    // 64 MiB answers: refused at the agent's 16 MiB limit, as case errors.
    let dir = run("huge");
    let records = cases(&dir);
    assert!(!records.is_empty());
    for record in &records {
        let error = record["error"].as_str().unwrap_or_else(|| panic!("huge: no error in {record}"));
        assert!(error.contains("over 16 MiB"), "{error}");
    }

    // Usage of 2^64-1 tokens per call: counts saturate, R5 never shows a wrapped 0.
    let dir = run("usage");
    for record in cases(&dir) {
        assert_eq!(record["prompt_tokens"].as_u64(), Some(i64::MAX as u64), "{record}");
    }
    let r5 = json(&dir.join("judgement.json"))["rules"].as_array().unwrap().iter().find(|r| r["id"] == "R5").cloned();
    assert!(!r5.unwrap()["reason"].as_str().unwrap().contains("tokens per case 0"));

    // 3 MB answers full of markup and control characters: the report stays small,
    // shows them as text, and runs none of it.
    let dir = run("inject");
    let report = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(report.len() < 15 << 20, "report.html is {} bytes", report.len());
    assert!(report.contains("bytes more"), "long conversation text is cut and says so");
    assert!(!report.contains("<script>document.body") && !report.contains("<img src=x"), "markup is escaped");
    assert!(report.contains("U+202E") && !report.contains('\u{202e}'), "a bidi override is shown, not obeyed");
    assert!(!report.contains('\u{1b}') && !report.contains('\u{7}'), "raw ESC/BEL never reach the page");
}

/// Every file under `dir` (recursively) whose bytes contain any of `needles`.
fn files_containing(dir: &Path, needles: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() && !path.is_symlink() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                let text = String::from_utf8_lossy(&bytes);
                found.extend(needles.iter().filter(|n| text.contains(*n)).map(|n| format!("{}: {n}", path.display())));
            }
        }
    }
    found
}

/// A password and a token in an external model's URL reach the server and nothing
/// else: not `check`'s or `run`'s output, not a file of the run or the index, not the
/// daemon's log or the queue; the run and the judgement show the URL redacted.
#[test]
fn credentials_in_a_model_url_appear_in_no_output_file_or_log() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://alice:S3CRETPW@127.0.0.1:{port}/v1?token=T0KEN");
    let shown = format!("http://***@127.0.0.1:{port}/v1?token=***");
    // The detector's URL is the model server's `/classify`: it carries the credentials too.
    let spec = format!(
        "[model]\nbackend = \"external\"\nserved_name = \"m\"\nurl = \"{url}\"\n[guardrail]\nkind = \"classifier\"\n"
    );
    let spec_file = bench.write("versions/elsewhere.toml", &spec);
    let mut server = bench.sim_serve("m", port);

    let check = bench.run(&["check", "elsewhere"]);
    let run = bench.run(&["run", "elsewhere", "--plan", "tiny"]);
    let daemon = bench.daemon();
    let id = bench.start(&["elsewhere", "--plan", "tiny"]);
    let job = bench.wait_job(id, "done", 300);
    let queue = bench.run(&["queue"]);
    drop(daemon);
    let _ = server.kill();
    let _ = server.wait();

    assert!(check.stdout.contains(&format!("model server at {shown} serves m")), "{}", check.stdout);
    assert!(matches!(run.code, Some(0 | 10 | 11)), "{}\n{}", run.stdout, run.stderr);
    assert!(job["verdict"].is_string(), "{job}");
    // The cases reached the server through the URL: none is an error.
    let dir = run.run_dir();
    assert!(cases(&dir).iter().all(|r| r["error"].is_null()), "{:?}", cases(&dir));
    let request = json(&dir.join("gym-request.json"));
    assert_eq!(request["detector"]["url"], format!("http://***@127.0.0.1:{port}/classify?token=***"), "{request}");
    assert_eq!(json(&dir.join("version.json"))["spec"]["model"]["url"], shown.as_str());
    let provenance = std::fs::read_to_string(dir.join("provenance.json")).unwrap();
    // The identity is keyed with the bench's own key: no unsalted hash of the URL to
    // test guesses against, and the same URL gives the same identity on this bench.
    let unkeyed = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(url.as_bytes()));
    assert!(!provenance.contains(&unkeyed), "an unsalted hash of the URL: {provenance}");
    let key = std::fs::read(bench.path().join(".pruefstand/identity.key")).unwrap();
    assert_eq!(key.len(), 32);
    let identity = &json(&dir.join("provenance.json"))["model_url"]["hmac_sha256"];
    assert_eq!(identity.as_str().unwrap().len(), 64, "{provenance}");
    let job_dir = PathBuf::from(job["run_dir"].as_str().unwrap());
    assert_eq!(&json(&job_dir.join("provenance.json"))["model_url"]["hmac_sha256"], identity, "one URL, one identity");

    let secrets = ["S3CRETPW", "T0KEN"];
    for (what, text) in [
        ("check", &check.stdout),
        ("check's stderr", &check.stderr),
        ("run", &run.stdout),
        ("run's stderr", &run.stderr),
        ("queue", &queue.stdout),
    ] {
        assert!(!secrets.iter().any(|s| text.contains(s)), "{what}: {text}");
    }
    // The spec itself and the queued job's copy of it (the daemon connects from it)
    // hold the URL whole; nothing else may.
    std::fs::remove_file(&spec_file).unwrap();
    std::fs::remove_file(bench.path().join(format!(".pruefstand/jobs/{id}/snapshot/version/elsewhere.toml"))).unwrap();
    let leaks = files_containing(bench.path(), &secrets);
    assert!(leaks.is_empty(), "{leaks:#?}");
}

/// A model URL that is not http(s) is refused at its line before any case runs, and
/// an adapter folder that resolves elsewhere (a symlink to /etc) is judged where it
/// leads: no adapter_config.json there, no adapter.
#[test]
fn a_file_url_and_an_adapter_linked_to_etc_are_refused() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    let spec = bench.write(
        "versions/local-file.toml",
        "[model]\nbackend = \"external\"\nserved_name = \"m\"\nurl = \"file:///etc/passwd\"\n",
    );
    let run = bench.run(&["run", "local-file", "--plan", "tiny"]).code(2);
    let want = format!("{}:4:7: url: file:///etc/passwd is no http:// or https:// URL", spec.display());
    assert!(run.stderr.contains(&want), "{want}\n{}", run.stderr);
    assert!(!bench.path().join("reports/local-file").exists(), "no case ran");

    let link = bench.path().join("lora-link");
    std::os::unix::fs::symlink("/etc", &link).unwrap();
    let spec = bench.write(
        "versions/linked.toml",
        &format!(
            "[model]\nbackend = \"docker\"\nimage = \"img\"\npath = \"/etc\"\nserved_name = \"m\"\n\n[adapter]\nname = \"lora\"\npath = \"{}\"\n",
            link.display()
        ),
    );
    let check = bench.run(&["check", "linked"]).code(2);
    let want = format!(
        "FAIL  {}:9:1: adapter.path {} (resolved: /etc) holds no adapter_config.json",
        spec.display(),
        link.display()
    );
    assert!(check.stdout.contains(&want), "{want}\n{}", check.stdout);
    assert!(!check.stdout.contains("adapter lora path"), "{}", check.stdout);
}

/// A URL written wrongly, or readable two ways, never shows its password: `check`,
/// `run` and `start` refuse it with the userinfo hidden, and an authority an HTTP client
/// would read as host `user`, port 12 is refused rather than taken.
#[test]
fn a_malformed_or_ambiguous_model_url_never_prints_its_password() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    for url in [
        "http:/u:SECRET@127.0.0.1:9/v1",
        "http:\\\\u:SECRET@127.0.0.1:9/v1",
        "https//u:SECRET@127.0.0.1:9/v1",
        "http//u:SECRET@127.0.0.1:9/v1",
        "http://user:12/SECRET@127.0.0.1:9/v1",
        "http://u:SEC#RET@127.0.0.1:9/v1",
    ] {
        let spec = format!("[model]\nbackend = \"external\"\nserved_name = \"m\"\nurl = {url:?}\n");
        bench.write("versions/odd.toml", &spec);
        for args in [&["check", "odd"][..], &["run", "odd", "--plan", "tiny"], &["start", "odd", "--plan", "tiny"]] {
            let out = bench.run(args);
            let text = format!("{}{}", out.stdout, out.stderr);
            assert_ne!(out.code, Some(0), "{url} {args:?}: {text}");
            assert!(!text.contains("SEC"), "{url} {args:?}: {text}");
            assert!(text.contains("url: "), "{url} {args:?}: the refusal names the field: {text}");
        }
    }
    assert!(!bench.path().join("reports/odd").exists(), "no case ran");
}

/// A model server's ids reach `check`'s output with their control characters escaped:
/// an ANSI sequence in a served name cannot recolour or rewrite the terminal.
#[test]
fn a_served_model_id_with_escapes_is_shown_escaped() {
    let bench = Bench::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    bench.write(
        "versions/elsewhere.toml",
        &format!("[model]\nbackend = \"external\"\nserved_name = \"m\"\nurl = \"http://127.0.0.1:{port}/v1\"\n"),
    );
    let mut server = bench.sim_serve("evil\u{1b}[2J\u{1b}]0;owned\u{7}", port);
    let check = bench.run(&["check", "elsewhere"]);
    let _ = server.kill();
    let _ = server.wait();
    assert!(check.stdout.contains("does not serve \"m\""), "{}", check.stdout);
    assert!(check.stdout.contains("evil\\u{1b}[2J"), "{}", check.stdout);
    assert!(!check.stdout.contains('\u{1b}') && !check.stdout.contains('\u{7}'), "{:?}", check.stdout);
}
