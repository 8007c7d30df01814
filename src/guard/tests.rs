//! The guards against the real stand-ins: the fake NVML library loaded through
//! nvml-wrapper, and a private dbus-daemon with a fake systemd (tests/common).

#[path = "../../tests/common/dbus.rs"]
mod dbus;
#[path = "../../tests/common/nvml.rs"]
mod nvml;

use std::time::{Duration, Instant};

use super::*;
use dbus::{DbusDaemon, FakeSystemd};
use nvml::{FakeNvml, NvmlState};
use pruefstand_core::settings::Unavailable;

/// Fast sampling: the tests count samples, never time.
fn config(fake: Option<&FakeNvml>) -> GuardConfig {
    let mut config = GuardConfig::default();
    config.gpu.library = Some(fake.map_or_else(|| "/nonexistent/libnvidia-ml.so.1".into(), |f| f.library()));
    config.gpu.interval_s = 0.02;
    config
}

/// Polls until `f` holds; the deadline only keeps a broken test from hanging.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn busy_utilization_blocks_with_the_reason() {
    let fake = FakeNvml::new();
    fake.set(&NvmlState::default().utilization(87));
    let guards = Guards::new(&config(Some(&fake)));
    let sample = guards.sample(&OwnProcesses::none()).await;
    assert_eq!(sample.blocking, vec!["GPU 0 utilization 87 % > 10 %"]);
    assert!(sample.gpu_observed);
    fake.set(&NvmlState::default().utilization(10));
    // Released between jobs, NVML is opened again by the next sample.
    guards.release().await;
    let sample = guards.sample(&OwnProcesses::none()).await;
    assert!(sample.is_clear(), "10 % is within the threshold: {:?}", sample.blocking);
}

#[tokio::test]
async fn foreign_compute_processes_block_and_ours_are_ignored() {
    let fake = FakeNvml::new();
    // Three entries: a wrong struct layout decodes the first right and garbles the rest.
    fake.set(&NvmlState::default().process(0, 4242).process(0, 777_001).process(0, 777_002));
    let guards = Guards::new(&config(Some(&fake)));
    let sample = guards.sample(&OwnProcesses::pids([4242])).await;
    let pids: Vec<u32> = sample.foreign_processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, vec![777_001, 777_002]);
    assert_eq!(sample.blocking.len(), 2);
    assert!(sample.blocking[0].starts_with("foreign compute process 777001 ("), "{:?}", sample.blocking);
    assert!(sample.blocking[0].ends_with(") on GPU 0"), "{:?}", sample.blocking);

    let all_ours = guards.sample(&OwnProcesses::pids([4242, 777_001, 777_002])).await;
    assert!(all_ours.is_clear(), "{:?}", all_ours.blocking);
}

#[tokio::test]
async fn a_process_on_the_second_gpu_is_attributed_to_it() {
    let fake = FakeNvml::new();
    let mut state = NvmlState::default().process(1, 31337).process(1, 31338);
    state.gpus = 2;
    fake.set(&state);
    let sample = Guards::new(&config(Some(&fake))).sample(&OwnProcesses::none()).await;
    let seen: Vec<(u32, u32)> = sample.foreign_processes.iter().map(|p| (p.gpu, p.pid)).collect();
    assert_eq!(seen, vec![(1, 31337), (1, 31338)]);
}

#[tokio::test]
async fn idle_for_the_window_clears_and_a_busy_sample_restarts_it() {
    let fake = FakeNvml::new();
    fake.set(&NvmlState::default().utilization(95));
    let guards = Guards::new(&config(Some(&fake)));
    let mut seen = Vec::new();
    let last = guards
        .wait_until_clear(&OwnProcesses::none(), |status| {
            seen.push(status.clear_samples);
            // The GPU goes idle after two busy samples, then one busy blip after one idle one.
            match seen.len() {
                2 => fake.set(&NvmlState::default().utilization(3)),
                3 => fake.set(&NvmlState::default().utilization(50)),
                4 => fake.set(&NvmlState::default()),
                _ => {}
            }
        })
        .await;
    assert_eq!(seen, vec![0, 0, 1, 0, 1, 2, 3]);
    assert!(last.is_clear());
}

#[tokio::test]
async fn wait_status_says_why() {
    let fake = FakeNvml::new();
    fake.set(&NvmlState::default().utilization(87));
    let guards = Guards::new(&config(Some(&fake)));
    let mut lines = Vec::new();
    guards
        .wait_until_clear(&OwnProcesses::none(), |status| {
            lines.push(status.line());
            fake.set(&NvmlState::default());
        })
        .await;
    assert_eq!(lines[0], "waiting: GPU 0 utilization 87 % > 10 %");
    assert_eq!(lines.last().unwrap(), "guards clear (3 of 3 samples)");
}

#[tokio::test]
async fn a_foreign_process_appearing_during_a_watch_violates_exclusivity() {
    let fake = FakeNvml::new();
    // Our own process is on the GPU throughout, and busy: that is the run itself.
    fake.set(&NvmlState::default().utilization(99).process(0, 500));
    let guards = Guards::new(&config(Some(&fake)));
    let watch = guards.watch(OwnProcesses::pids([500]));
    fake.set(&NvmlState::default().utilization(99).process(0, 500).process(0, 60_606));
    eventually("the foreign process is seen", || !watch.events().is_empty()).await;
    fake.set(&NvmlState::default().utilization(99).process(0, 500));
    match watch.finish().await {
        GpuExclusivity::Violated { events } => {
            assert_eq!(events.len(), 1, "one event however many samples saw it: {events:?}");
            assert!(events[0].starts_with("foreign compute process 60606 ("), "{events:?}");
            assert!(events[0].contains("first seen 20"), "{events:?}");
        }
        other => panic!("expected Violated, got {other:?}"),
    }
}

#[tokio::test]
async fn an_undisturbed_watch_is_exclusive() {
    let fake = FakeNvml::new();
    fake.set(&NvmlState::default().utilization(99).process(0, 500));
    let guards = Guards::new(&config(Some(&fake)));
    let watch = guards.watch(OwnProcesses::pids([500]));
    // At least one sample must have happened for "observed".
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(watch.finish().await, GpuExclusivity::Exclusive);
}

#[tokio::test]
async fn unsupported_utilization_relies_on_processes_and_says_so() {
    let fake = FakeNvml::new();
    let state = NvmlState { utilization: None, ..Default::default() };
    fake.set(&state);
    let guards = Guards::new(&config(Some(&fake)));
    let sample = guards.sample(&OwnProcesses::none()).await;
    assert!(sample.is_clear(), "{:?}", sample.blocking);
    assert!(sample.gpu_observed);
    assert_eq!(sample.notes, vec!["GPU 0: utilization not supported: judged by compute processes only"]);
    fake.set(&state.clone().process(0, 9001).process(0, 9002));
    let sample = guards.sample(&OwnProcesses::none()).await;
    assert_eq!(sample.foreign_processes.len(), 2, "{:?}", sample.blocking);
}

#[tokio::test]
async fn nothing_readable_on_a_gpu_counts_as_no_nvml() {
    let fake = FakeNvml::new();
    fake.set(&NvmlState { utilization: None, processes: None, ..NvmlState::default() });
    let sample = Guards::new(&config(Some(&fake))).sample(&OwnProcesses::none()).await;
    assert_eq!(sample.blocking, vec!["no NVML: GPU 0: NVML supports neither utilization nor the compute process list"]);
    assert!(!sample.gpu_observed);
}

#[tokio::test]
async fn no_nvml_blocks_or_is_ignored_per_config() {
    let mut config = config(None);
    let sample = Guards::new(&config).sample(&OwnProcesses::none()).await;
    assert_eq!(sample.blocking.len(), 1);
    assert!(
        sample.blocking[0].starts_with("no NVML: cannot load NVML from /nonexistent/libnvidia-ml.so.1:"),
        "{:?}",
        sample.blocking
    );

    config.gpu.nvml = Unavailable::Ignore;
    let guards = Guards::new(&config);
    let sample = guards.sample(&OwnProcesses::none()).await;
    assert!(sample.is_clear(), "{:?}", sample.blocking);
    assert!(sample.notes[0].starts_with("no NVML (ignored by config): "), "{:?}", sample.notes);
    let cleared = guards.wait_until_clear(&OwnProcesses::none(), |_| {}).await;
    assert!(cleared.is_clear());
    let watch = guards.watch(OwnProcesses::none());
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(watch.finish().await, GpuExclusivity::NotObserved);
}

fn units_config(user: &[&str], system: &[&str]) -> GuardConfig {
    let mut config = config(None);
    config.gpu.nvml = Unavailable::Ignore; // units only
    config.units.user = user.iter().map(|s| s.to_string()).collect();
    config.units.system = system.iter().map(|s| s.to_string()).collect();
    config
}

#[tokio::test]
async fn an_active_unit_blocks_on_its_bus_and_its_stop_clears() {
    let user_bus = DbusDaemon::start();
    let system_bus = DbusDaemon::start();
    let user = FakeSystemd::serve(&user_bus.address);
    let system = FakeSystemd::serve(&system_bus.address);
    user.set("training@llama.service", "inactive");
    // The same name on the other bus must not count for the user pattern.
    system.set("training@other.service", "active");
    system.set("ollama.service", "inactive");
    let config = units_config(&["training@*.service"], &["ollama.service"]);
    let guards = Guards::with_bus_addresses(&config, Some(user_bus.address.clone()), Some(system_bus.address.clone()));
    assert!(guards.sample(&OwnProcesses::none()).await.is_clear());

    user.set("training@llama.service", "active");
    system.set("ollama.service", "activating");
    let sample = guards.sample(&OwnProcesses::none()).await;
    assert_eq!(
        sample.blocking,
        vec!["busy unit training@llama.service active (user bus)", "busy unit ollama.service activating (system bus)"]
    );

    user.set("training@llama.service", "inactive");
    system.set("ollama.service", "failed");
    assert!(guards.sample(&OwnProcesses::none()).await.is_clear());
}

#[tokio::test]
async fn a_bus_restart_is_survived_by_reconnecting() {
    let mut bus = DbusDaemon::start();
    let mut fake = FakeSystemd::serve(&bus.address);
    fake.set("training@a.service", "active");
    let config = units_config(&["training@*.service"], &[]);
    let guards = Guards::with_bus_addresses(&config, Some(bus.address.clone()), None);
    assert_eq!(
        guards.sample(&OwnProcesses::none()).await.blocking,
        vec!["busy unit training@a.service active (user bus)"]
    );

    fake.disconnect();
    bus.stop();
    let down = guards.sample(&OwnProcesses::none()).await;
    assert_eq!(down.blocking.len(), 1);
    assert!(down.blocking[0].starts_with("user bus unreachable: "), "{:?}", down.blocking);
    assert!(down.blocking[0].ends_with("(busy units training@*.service cannot be checked)"), "{:?}", down.blocking);

    bus.restart();
    fake.connect(&bus.address);
    fake.set("training@a.service", "inactive");
    let back = guards.sample(&OwnProcesses::none()).await;
    assert!(back.is_clear(), "{:?}", back.blocking);
}

#[tokio::test]
async fn a_bus_restart_between_samples_is_survived_too() {
    // No sample while the bus is down: the first call on the stale connection fails,
    // and the one after reconnects.
    let mut bus = DbusDaemon::start();
    let mut fake = FakeSystemd::serve(&bus.address);
    fake.set("training@a.service", "active");
    let guards =
        Guards::with_bus_addresses(&units_config(&["training@*.service"], &[]), Some(bus.address.clone()), None);
    assert!(!guards.sample(&OwnProcesses::none()).await.is_clear());
    fake.disconnect();
    bus.restart();
    fake.connect(&bus.address);
    let mut samples = 0;
    loop {
        samples += 1;
        let sample = guards.sample(&OwnProcesses::none()).await;
        if sample.blocking == vec!["busy unit training@a.service active (user bus)"] {
            break;
        }
        assert!(samples < 3, "not reconnected after {samples} samples: {:?}", sample.blocking);
    }
}

#[tokio::test]
async fn an_unreachable_bus_blocks_or_is_noted_per_config() {
    let dir = tempfile::tempdir().unwrap();
    let nowhere = format!("unix:path={}", dir.path().join("no-bus").display());
    let mut config = units_config(&[], &["ollama.service"]);
    let sample = Guards::with_bus_addresses(&config, None, Some(nowhere.clone())).sample(&OwnProcesses::none()).await;
    assert!(sample.blocking[0].starts_with("system bus unreachable: cannot connect: "), "{:?}", sample.blocking);
    config.units.unreachable = Unavailable::Ignore;
    let sample = Guards::with_bus_addresses(&config, None, Some(nowhere)).sample(&OwnProcesses::none()).await;
    assert!(sample.is_clear());
    assert!(sample.notes.iter().any(|n| n.ends_with("; ignored by config")), "{:?}", sample.notes);
}

#[tokio::test]
async fn a_busy_unit_during_a_watch_violates_exclusivity() {
    let fake_gpu = FakeNvml::new();
    let bus = DbusDaemon::start();
    let systemd = FakeSystemd::serve(&bus.address);
    let mut config = units_config(&["training@*.service"], &[]);
    config.gpu.library = Some(fake_gpu.library());
    config.gpu.nvml = Unavailable::Block;
    let guards = Guards::with_bus_addresses(&config, Some(bus.address.clone()), None);
    let watch = guards.watch(OwnProcesses::none());
    systemd.set("training@b.service", "active");
    eventually("the busy unit is seen", || !watch.events().is_empty()).await;
    match watch.finish().await {
        GpuExclusivity::Violated { events } => {
            assert!(events[0].starts_with("busy unit training@b.service active (user bus), first seen"), "{events:?}")
        }
        other => panic!("expected Violated, got {other:?}"),
    }
}

#[test]
fn config_defaults_and_validation() {
    let parse = |text: &str| toml::from_str::<GuardConfig>(text);
    let config = parse("").unwrap();
    assert_eq!(config.gpu.nvml, Unavailable::Block);
    assert_eq!((config.gpu.utilization_max, config.gpu.samples, config.gpu.interval_s), (10, 3, 5.0));
    assert!(config.units.user.is_empty() && config.units.unreachable == Unavailable::Block);

    let config = parse(
        "[gpu]\nnvml = \"ignore\"\nlibrary = \"/x/libnvidia-ml.so.1\"\nutilization_max = 5\nsamples = 4\ninterval_s = 2.5\n\
         [units]\nuser = [\"training@*.service\"]\nsystem = [\"ollama.service\"]\nunreachable = \"ignore\"\n",
    )
    .unwrap();
    assert_eq!(config.gpu.nvml, Unavailable::Ignore);
    assert_eq!(config.units.system, vec!["ollama.service"]);

    for (bad, says) in [
        ("[gpu]\nutilization_max = 150", "percentage"),
        ("[gpu]\nsamples = 0", "is not in [1, 86400]"),
        ("[gpu]\nsamples = 4294967295", "is not in [1, 86400]"),
        ("[gpu]\ninterval_s = 0", "interval_s"),
        ("[gpu]\nnvml = \"maybe\"", "unknown variant"),
        ("[gpu]\nthreshold = 3", "unknown field"),
    ] {
        let err = parse(bad).unwrap_err().to_string();
        assert!(err.contains(says), "{bad:?} → {err}");
    }
}

#[test]
fn container_processes_are_found_by_cgroup() {
    let id = "3f4e2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f";
    assert!(cgroup_names_container(&format!("0::/system.slice/docker-{id}.scope\n"), id));
    assert!(cgroup_names_container(&format!("12:cpu,cpuacct:/docker/{id}\n0::/docker/{id}\n"), id));
    assert!(!cgroup_names_container("0::/user.slice/user-1000.slice/session-2.scope\n", id));
    assert!(!cgroup_names_container(&format!("0::/docker/{id}\n"), "3f4e"), "short ids never match");
    assert!(OwnProcesses::pids([7]).contains(7));
    assert!(!OwnProcesses::none().with_container(id).contains(std::process::id()));
}
