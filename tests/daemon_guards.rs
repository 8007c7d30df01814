//! The daemon behind its guards, against real stand-ins: a fake
//! `libnvidia-ml.so` (real dlopen through nvml-wrapper) and a fake systemd on a private
//! D-Bus. A busy GPU or an active busy unit keeps a job waiting and `status` says why;
//! going clear starts it; a foreign process appearing mid-run ends up in R1 and the
//! report.

use std::time::{Duration, Instant};

use crate::common::dbus::{DbusDaemon, FakeSystemd};
use crate::common::nvml::{FakeNvml, NvmlState};
use crate::common::*;

fn config(nvml: Option<&FakeNvml>, units: &str) -> String {
    let gpu = match nvml {
        Some(fake) => format!("nvml = \"block\"\nlibrary = {:?}\n", fake.library().display().to_string()),
        None => "nvml = \"ignore\"\nlibrary = \"/nonexistent/libnvidia-ml.so.1\"\n".to_string(),
    };
    format!(
        "[paths]\nreports = \"reports\"\n[guard.gpu]\n{gpu}utilization_max = 10\nsamples = 2\ninterval_s = 0.2\n[guard.units]\n{units}\n"
    )
}

/// Waits until `pruefstand status` (the daemon's published state) mentions `text`.
fn wait_status(bench: &Bench, text: &str) -> String {
    wait_status_where(bench, text, |status| status.contains(text))
}

/// Waits until `pruefstand status` satisfies `ready` (`what` names it in a failure).
fn wait_status_where(bench: &Bench, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = bench.run(&["status"]).ok().stdout;
        if ready(&status) {
            return status;
        }
        assert!(Instant::now() < deadline, "status never said {what:?}; last:\n{status}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn r1(run_dir: &std::path::Path) -> serde_json::Value {
    json(&run_dir.join("judgement.json"))["rules"].as_array().unwrap().iter().find(|r| r["id"] == "R1").unwrap().clone()
}

#[test]
fn a_busy_gpu_keeps_the_job_waiting_until_idle_for_the_window() {
    let bench = Bench::new();
    let nvml = FakeNvml::new();
    nvml.set(&NvmlState::default().utilization(87).process(0, 4242).process(0, 4343));
    bench.write("pruefstand.toml", &config(Some(&nvml), ""));
    bench.write("versions/slow.toml", &slow_version(0));
    let plan = bench.write("mini.toml", MINI_PLAN);
    let _daemon = bench.daemon();
    let id = bench.start(&["slow", "--plan", plan.to_str().unwrap()]);

    let status = wait_status(&bench, "utilization 87 %");
    assert!(
        status.contains("foreign compute process 4242") && status.contains("4343"),
        "both processes named: {status}"
    );
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(bench.job(id)["state"], "pending", "a busy GPU keeps the job waiting");

    nvml.set(&NvmlState::default().utilization(3).process(0, 4343));
    let status = wait_status_where(&bench, "only process 4343 left", |status| {
        status.contains("foreign compute process 4343") && !status.contains("utilization") && !status.contains("4242")
    });
    assert!(status.contains("waiting"), "{status}");
    assert_eq!(bench.job(id)["state"], "pending");

    nvml.set(&NvmlState::default().utilization(0));
    let job = bench.wait_job(id, "done", 120);
    let run_dir = std::path::PathBuf::from(job["run_dir"].as_str().unwrap());
    assert_eq!(cases(&run_dir).len(), MINI_CASES);
    let r1 = r1(&run_dir);
    assert_eq!(r1["status"], "pass", "{r1}");
    assert_eq!(json(&run_dir.join("run.json"))["gpu"]["state"], "exclusive", "the GPU was watched and stayed ours");
}

#[test]
fn a_foreign_process_appearing_mid_run_is_in_r1_and_the_report() {
    let bench = Bench::new();
    let nvml = FakeNvml::new();
    nvml.set(&NvmlState::default().utilization(0));
    bench.write("pruefstand.toml", &config(Some(&nvml), ""));
    bench.write("versions/slow.toml", &slow_version(150));
    let plan = bench.write("mini.toml", MINI_PLAN);
    let _daemon = bench.daemon();
    let id = bench.start(&["slow", "--plan", plan.to_str().unwrap()]);
    bench.wait_cases(id, 1);
    nvml.set(&NvmlState::default().utilization(95).process(0, 7777));
    let job = bench.wait_job(id, "done", 180);
    let run_dir = std::path::PathBuf::from(job["run_dir"].as_str().unwrap());
    let r1 = r1(&run_dir);
    assert_eq!(r1["status"], "fail", "a foreign process took the GPU: {r1}");
    assert!(r1["reason"].as_str().unwrap().contains("7777") || r1["measured"].to_string().contains("7777"), "{r1}");
    assert_eq!(job["verdict"], "invalid");
    let report = std::fs::read_to_string(run_dir.join("report.html")).unwrap();
    assert!(report.contains("7777"), "the report names the intruder");
}

#[test]
fn an_active_busy_unit_blocks_and_its_stop_releases_the_job() {
    let bench = Bench::new();
    let bus = DbusDaemon::start();
    let systemd = FakeSystemd::serve(&bus.address);
    systemd.set("training@7.service", "active");
    systemd.set("unrelated.service", "active");
    bench.write("pruefstand.toml", &config(None, "user = [\"training@*.service\"]"));
    bench.write("versions/slow.toml", &slow_version(0));
    let plan = bench.write("mini.toml", MINI_PLAN);
    let address = bus.address.clone();
    let _daemon = bench.daemon_with(move |cmd| {
        cmd.env("DBUS_SESSION_BUS_ADDRESS", &address);
    });
    let id = bench.start(&["slow", "--plan", plan.to_str().unwrap()]);
    let status = wait_status(&bench, "busy unit training@7.service active (user bus)");
    assert!(!status.contains("unrelated.service"), "{status}");
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(bench.job(id)["state"], "pending");
    systemd.set("training@7.service", "inactive");
    bench.wait_job(id, "done", 120);
}
