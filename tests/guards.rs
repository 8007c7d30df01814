//! `pruefstand check` against real stand-ins: the fake NVML library
//! (loaded through `[guard.gpu] library`) and private dbus-daemons with a fake systemd
//! (reached through `DBUS_SESSION_BUS_ADDRESS` / `DBUS_SYSTEM_BUS_ADDRESS`). Docker is
//! pointed at a socket that does not exist, so its line is deterministic everywhere.
//! The guards' API (wait, watch, reconnect) is tested beside the code, src/guard/tests.rs.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::Digest;

use crate::common::dbus::{DbusDaemon, FakeSystemd};
use crate::common::nvml::{FakeNvml, NvmlState};
use crate::common::{self, Bench, Run};

/// A bench whose guards use the fakes, and the environment pointing the binary at them.
struct Stand {
    bench: Bench,
    nvml: FakeNvml,
    user_bus: DbusDaemon,
    system_bus: DbusDaemon,
    user: FakeSystemd,
    system: FakeSystemd,
    scratch: tempfile::TempDir,
}

impl Stand {
    fn new(guard_extra: &str) -> Stand {
        let bench = Bench::new();
        let nvml = FakeNvml::new();
        let user_bus = DbusDaemon::start();
        let system_bus = DbusDaemon::start();
        let user = FakeSystemd::serve(&user_bus.address);
        let system = FakeSystemd::serve(&system_bus.address);
        // The guard settings under test replace the repository's own.
        bench.write(
            "pruefstand.toml",
            &format!(
                "[paths]\nreports = \"reports\"\n[guard.gpu]\nlibrary = {:?}\n{guard_extra}\n[guard.units]\nuser = [\"training@*.service\"]\nsystem = [\"ollama.service\"]\n",
                nvml.library().display().to_string()
            ),
        );
        chmod(&bench.path().join("pruefstand.toml"), 0o600);
        let scratch = tempfile::tempdir().unwrap();
        Stand { bench, nvml, user_bus, system_bus, user, system, scratch }
    }

    /// A venv as `setup` leaves it (its python only answers the version question).
    fn fake_venv(&self) -> PathBuf {
        let venv = self.scratch.path().join("venv");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::fs::write(venv.join("bin/python"), "#!/bin/sh\necho 0.1.35\n").unwrap();
        chmod(&venv.join("bin/python"), 0o755);
        let requirements = std::fs::read(common::repo().join("scripts/requirements.txt")).unwrap();
        std::fs::write(venv.join(".pruefstand-ready"), hex::encode(sha2::Sha256::digest(&requirements))).unwrap();
        venv
    }

    fn check(&self, args: &[&str], venv: &Path) -> Run {
        let mut all = vec!["check"];
        all.extend_from_slice(args);
        let mut cmd = self.bench.cmd(&all);
        cmd.env("DBUS_SESSION_BUS_ADDRESS", &self.user_bus.address)
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.system_bus.address)
            .env("DOCKER_HOST", format!("unix://{}", self.scratch.path().join("no-docker.sock").display()))
            .env("PRUEFSTAND_VENV", venv);
        Run::from(cmd.output().expect("pruefstand runs"))
    }
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The line with this status that starts with `what` (after the status column).
fn line<'a>(run: &'a Run, status: &str, what: &str) -> &'a str {
    let prefix = format!("{status:<4}  {what}");
    run.stdout
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?}\nstdout:\n{}\nstderr:\n{}", run.stdout, run.stderr))
}

#[test]
fn check_all_clear_on_the_fakes() {
    let stand = Stand::new("");
    stand.user.set("training@llama.service", "inactive");
    let venv = stand.fake_venv();
    let run = stand.check(&["demo-kandidat"], &venv).ok();
    line(&run, "OK", "bench root ");
    line(&run, "OK", "pruefstand.toml permissions (mode 600, 0 hook(s))");
    line(&run, "OK", "version demo-kandidat (");
    assert!(line(&run, "OK", "Python venv ").ends_with("with agentdojo 0.1.35"));
    // A simulated model (its reference's too) needs no Docker: not probed, no warning.
    line(&run, "OK", "Docker: not needed (demo-kandidat runs no model container)");
    assert!(!run.stdout.contains("Docker not reachable"), "{}", run.stdout);
    line(&run, "OK", "model: simulated");
    let nvml = line(&run, "OK", "NVML: GPU 0 Fake Thor (driver 580.0-fake, ");
    assert!(nvml.ends_with("libnvidia-ml.so.1): utilization and compute processes readable"), "{nvml}");
    line(&run, "OK", "GPU idle now (utilization ≤ 10 %, no compute process)");
    line(&run, "OK", "D-Bus user bus: systemd answers");
    line(&run, "OK", "D-Bus system bus: systemd answers");
    line(&run, "OK", "busy units training@*.service (user bus): none active (1 loaded)");
    line(&run, "OK", "busy units ollama.service (system bus): none active (0 loaded)");
    assert_eq!(run.stdout.lines().last(), Some("0 FAIL, 0 WARN"), "{}", run.stdout);

    // A simulated version whose reference runs in a container does need Docker.
    let kandidat = std::fs::read_to_string(stand.bench.path().join("versions/demo-kandidat.toml")).unwrap();
    let on_docker = kandidat.replace("reference = \"demo-baseline\"", "reference = \"demo-docker\"");
    assert_ne!(on_docker, kandidat);
    stand.bench.write("versions/sim-on-docker.toml", &on_docker);
    let run = stand.check(&["sim-on-docker"], &venv).code(2);
    line(&run, "FAIL", "Docker not reachable at unix://");
}

#[test]
fn check_names_what_is_busy_and_what_is_missing() {
    let stand = Stand::new("utilization_max = 20");
    stand.nvml.set(&NvmlState::default().utilization(87).process(0, 4242).process(0, 4343));
    stand.user.set("training@llama.service", "active");
    stand.system.set("ollama.service", "activating");
    chmod(&stand.bench.path().join("pruefstand.toml"), 0o664);
    let run = stand.check(&["kandidat"], &stand.scratch.path().join("no-venv")).code(2);

    assert!(line(&run, "WARN", "pruefstand.toml is writable by group/others (mode 664)").contains("→ chmod 600 "));
    let venv = line(&run, "FAIL", "Python venv: no venv at ");
    // The binary under test runs from the checkout's target/, not from PATH: the hint
    // says the command that runs it there.
    assert!(venv.ends_with("→ run `cargo run -- setup` (creates it, about a minute)"), "{venv}");
    // kandidat runs in Docker: now its absence fails, and the model files are checked.
    line(&run, "FAIL", "Docker not reachable at unix://");
    line(&run, "FAIL", "model path /srv/models/Qwen3-8B: ");
    let adapter = line(&run, "FAIL", &format!("{}:", stand.bench.path().join("versions/kandidat.toml").display()));
    assert!(adapter.contains(": adapter.path /srv/adapters/inj-harden-r3: No such file"), "{adapter}");
    let busy = line(&run, "WARN", "GPU busy now: GPU 0 utilization 87 % > 20 %; foreign compute process 4242 (");
    assert!(busy.contains("; foreign compute process 4343 ("), "{busy}");
    assert!(busy.ends_with("→ jobs wait until it is idle"), "{busy}");
    line(
        &run,
        "WARN",
        "busy unit training@llama.service active (user bus, pattern training@*.service) → jobs wait until it stops",
    );
    line(&run, "WARN", "busy unit ollama.service activating (system bus, pattern ollama.service)");
}

#[test]
fn check_reports_unsupported_utilization() {
    let stand = Stand::new("");
    stand.nvml.set(&NvmlState { utilization: None, ..NvmlState::default() });
    let run = stand.check(&[], &stand.fake_venv()).ok();
    let nvml = line(&run, "WARN", "NVML: GPU 0 Fake Thor");
    assert!(nvml.ends_with("utilization not supported: idle judged by compute processes only"), "{nvml}");
    line(&run, "OK", "GPU idle now");
}

#[test]
fn check_without_nvml_or_buses_fails_or_warns_per_config() {
    // Blocking defaults: no NVML and unreachable buses with patterns are failures.
    let stand = Stand::new("");
    stand.bench.write(
        "pruefstand.toml",
        "[guard.gpu]\nlibrary = \"/nonexistent/libnvidia-ml.so.1\"\n[guard.units]\nuser = [\"training@*.service\"]\n",
    );
    chmod(&stand.bench.path().join("pruefstand.toml"), 0o600);
    let nowhere = format!("unix:path={}", stand.scratch.path().join("no-bus").display());
    let venv = stand.fake_venv();
    let run = |extra_env: &[(&str, &str)]| {
        let mut cmd = stand.bench.cmd(&["check"]);
        cmd.env("DBUS_SESSION_BUS_ADDRESS", &nowhere)
            .env("DBUS_SYSTEM_BUS_ADDRESS", &nowhere)
            .env("DOCKER_HOST", format!("unix://{}", stand.scratch.path().join("no-docker.sock").display()))
            .env("PRUEFSTAND_VENV", &venv);
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        Run::from(cmd.output().unwrap())
    };
    let blocked = run(&[]).code(2);
    let nvml = line(&blocked, "FAIL", "NVML: cannot load NVML from /nonexistent/libnvidia-ml.so.1: ");
    assert!(nvml.contains(": jobs would wait forever → "), "{nvml}");
    assert!(nvml.contains("nvml = \"ignore\""), "{nvml}");
    let user = line(&blocked, "FAIL", "D-Bus user bus unreachable: cannot connect: ");
    assert!(user.contains("busy units training@*.service cannot be checked: jobs would wait"), "{user}");
    // No patterns on the system bus: not asked, not warned about.
    line(&blocked, "OK", "D-Bus system bus: no busy units configured (not asked)");
    assert!(!blocked.stdout.contains("GPU idle now") && !blocked.stdout.contains("GPU busy now"), "{}", blocked.stdout);

    stand.bench.write(
        "pruefstand.toml",
        "[guard.gpu]\nnvml = \"ignore\"\nlibrary = \"/nonexistent/libnvidia-ml.so.1\"\n[guard.units]\nuser = [\"training@*.service\"]\nunreachable = \"ignore\"\n",
    );
    let ignored = run(&[]).ok();
    let nvml = line(&ignored, "OK", "NVML: cannot load NVML");
    assert!(nvml.ends_with("ignored by config: runs are not guarded, R1 says not observed"), "{nvml}");
    let user = line(&ignored, "WARN", "D-Bus user bus unreachable: ");
    assert!(user.contains("ignored by config"), "{user}");
}

#[test]
fn check_outside_a_bench_root_fails_cleanly() {
    let stand = Stand::new("");
    let empty = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(common::BIN);
    cmd.args(["check"])
        .current_dir(empty.path())
        .env_remove("PRUEFSTAND_ROOT")
        .env("PRUEFSTAND_VENV", stand.fake_venv());
    cmd.env("DOCKER_HOST", "unix:///nonexistent/docker.sock").env("DBUS_SESSION_BUS_ADDRESS", &stand.user_bus.address);
    cmd.env("DBUS_SYSTEM_BUS_ADDRESS", &stand.system_bus.address);
    let run = Run::from(cmd.output().unwrap()).code(2);
    line(&run, "FAIL", "bench root: no bench root: ");
    // The rest still runs, on the default config.
    line(&run, "OK", "Python venv ");
    assert!(run.stdout.lines().any(|l| l.contains("NVML")), "{}", run.stdout);
}

#[test]
fn check_does_not_hang_on_a_silent_docker_socket() {
    let stand = Stand::new("");
    // Bound and listening but never accepting: connects succeed, answers never come.
    let socket = stand.scratch.path().join("silent-docker.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let mut cmd = stand.bench.cmd(&["check"]);
    cmd.env("DBUS_SESSION_BUS_ADDRESS", &stand.user_bus.address)
        .env("DBUS_SYSTEM_BUS_ADDRESS", &stand.system_bus.address)
        .env("DOCKER_HOST", format!("unix://{}", socket.display()))
        .env("PRUEFSTAND_VENV", stand.fake_venv());
    let run = Run::from(cmd.output().unwrap()).ok();
    let docker = line(&run, "WARN", "Docker");
    assert!(docker.contains("no answer within 3 s") || docker.contains("Timeout"), "{docker}");
}

/// `pruefstand ARGS…` against `bench` with its root read-only: a read-only bind mount
/// in a mount namespace of its own where we are root (a mode bit does not stop root),
/// else the root's folder made 0555.
fn on_read_only_root(bench: &Bench, args: &[&str]) -> Run {
    let root = bench.path().to_str().unwrap();
    let mut cmd = if nix::unistd::geteuid().is_root() {
        let mut cmd = std::process::Command::new("unshare");
        cmd.args(["-m", "sh", "-c", "mount --bind \"$0\" \"$0\" && mount -o remount,bind,ro \"$0\" && exec \"$@\""]);
        cmd.arg(root).arg(common::BIN);
        cmd
    } else {
        std::fs::set_permissions(bench.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
        std::process::Command::new(common::BIN)
    };
    cmd.arg("--root").arg(root).args(args).current_dir(common::repo()).stdin(std::process::Stdio::null());
    let run = Run::from(cmd.output().unwrap());
    std::fs::set_permissions(bench.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    run
}

/// A bench root `start` and the daemon cannot write in fails `check` too, naming the
/// folder, instead of `0 FAIL`.
#[test]
fn check_fails_a_read_only_bench_root_as_start_refuses_it() {
    let bench = Bench::new();
    let start = on_read_only_root(&bench, &["start", "demo-baseline", "--plan", "schnell"]);
    assert_eq!(start.code, Some(2), "start refuses: {}\n{}", start.stdout, start.stderr);
    let check = on_read_only_root(&bench, &["check"]);
    assert_eq!(check.code, Some(2), "{}\n{}", check.stdout, check.stderr);
    let fail = line(&check, "FAIL", "bench root: cannot write in ");
    assert!(fail.contains(bench.path().to_str().unwrap()), "{fail}");
}
