//! The real Docker Engine for the container tests: `ensure_dockerd()` starts Debian's
//! `dockerd` when nothing answers (as root; log in /tmp/pruefstand-test-dockerd.log)
//! and waits for it, or panics with its log — a test never skips. `sim_image()` builds
//! `pruefstand-sim:local` from the binary under test once per test process. `api()`
//! and `block_on` let tests inspect containers through the Docker API (bollard).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bollard::Docker;
use futures_util::StreamExt;

pub const SIM_IMAGE: &str = "pruefstand-sim:local";
const DOCKERD_LOG: &str = "/tmp/pruefstand-test-dockerd.log";

pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

fn answers() -> bool {
    block_on(async {
        let Ok(d) = Docker::connect_with_local_defaults() else { return false };
        tokio::time::timeout(Duration::from_secs(3), d.ping()).await.is_ok_and(|r| r.is_ok())
    })
}

/// The engine answers, started here if needed (once per process).
pub fn ensure_dockerd() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        if answers() {
            return;
        }
        let log = std::fs::OpenOptions::new().create(true).append(true).open(DOCKERD_LOG).unwrap();
        // Detached from the test process: it outlives the test run (other test
        // processes use it too); a second start while one runs fails harmlessly.
        #[allow(clippy::zombie_processes)]
        let _dockerd = Command::new("dockerd")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start dockerd ({e}); install Debian's docker.io"));
        let deadline = Instant::now() + Duration::from_secs(60);
        while !answers() {
            if Instant::now() > deadline {
                panic!(
                    "dockerd did not answer within 60 s; its log ({DOCKERD_LOG}):\n{}",
                    std::fs::read_to_string(DOCKERD_LOG).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    });
}

/// Builds the sim image from the binary under test, once per test process.
pub fn sim_image() -> &'static str {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        ensure_dockerd();
        let out = Command::new(super::repo().join("scripts/build-sim-image")).arg(super::BIN).output().unwrap();
        assert!(out.status.success(), "build-sim-image failed:\n{}", String::from_utf8_lossy(&out.stderr));
    });
    SIM_IMAGE
}

/// A test image FROM the sim image with a Dockerfile tail (e.g. another entrypoint).
pub fn derived_image(tag: &str, dockerfile_tail: &str) -> String {
    sim_image();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("Dockerfile"), format!("FROM {SIM_IMAGE}\n{dockerfile_tail}\n")).unwrap();
    let out = Command::new("docker")
        .env("DOCKER_BUILDKIT", "0")
        .args(["build", "-q", "-t", tag])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "docker build {tag}: {}", String::from_utf8_lossy(&out.stderr));
    tag.to_string()
}

pub fn api() -> Docker {
    ensure_dockerd();
    block_on(async { Docker::connect_with_local_defaults().unwrap().negotiate_version().await.unwrap() })
}

fn label_filter(label: &str) -> HashMap<String, Vec<String>> {
    HashMap::from([("label".to_string(), vec![label.to_string()])])
}

/// Containers (any state) carrying `label` (`k=v`).
pub fn containers(label: &str) -> Vec<bollard::models::ContainerSummary> {
    let docker = api();
    block_on(async {
        let options = bollard::query_parameters::ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&label_filter(label))
            .build();
        docker.list_containers(Some(options)).await.unwrap()
    })
}

pub fn inspect(id: &str) -> bollard::models::ContainerInspectResponse {
    let docker = api();
    block_on(async {
        docker.inspect_container(id, None::<bollard::query_parameters::InspectContainerOptions>).await.unwrap()
    })
}

/// The container, or None once it is gone.
pub fn try_inspect(id: &str) -> Option<bollard::models::ContainerInspectResponse> {
    let docker = api();
    block_on(async {
        docker.inspect_container(id, None::<bollard::query_parameters::InspectContainerOptions>).await.ok()
    })
}

pub fn kill(id: &str) {
    let docker = api();
    block_on(async {
        docker.kill_container(id, None::<bollard::query_parameters::KillContainerOptions>).await.unwrap()
    });
}

/// `create` events since `since` (unix seconds) of containers labelled `label`.
pub fn creates_since(since: i64, label: &str) -> usize {
    let docker = api();
    let until = chrono::Utc::now().timestamp() + 1;
    block_on(async {
        let mut filters = label_filter(label);
        filters.insert("type".into(), vec!["container".into()]);
        filters.insert("event".into(), vec!["create".into()]);
        let options = bollard::query_parameters::EventsOptionsBuilder::default()
            .since(&since.to_string())
            .until(&until.to_string())
            .filters(&filters)
            .build();
        docker.events(Some(options)).filter(|e| std::future::ready(e.is_ok())).count().await
    })
}

pub fn volume_names() -> Vec<String> {
    let docker = api();
    block_on(async {
        let list = docker.list_volumes(None::<bollard::query_parameters::ListVolumesOptions>).await.unwrap();
        let mut names: Vec<String> = list.volumes.unwrap_or_default().into_iter().map(|v| v.name).collect();
        names.sort();
        names
    })
}

pub fn network_names() -> Vec<String> {
    let docker = api();
    block_on(async {
        let list = docker.list_networks(None::<bollard::query_parameters::ListNetworksOptions>).await.unwrap();
        let mut names: Vec<String> = list.into_iter().filter_map(|n| n.name).collect();
        names.sort();
        names
    })
}

/// Polls `f` every 100 ms until it gives Some, or panics after `secs` with `what`.
pub fn wait_for<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Lines in a run directory's cases.jsonl (0 when absent).
pub fn recorded(run_dir: &Path) -> usize {
    std::fs::read_to_string(run_dir.join("cases.jsonl"))
        .map_or(0, |t| t.lines().filter(|l| !l.trim().is_empty()).count())
}
