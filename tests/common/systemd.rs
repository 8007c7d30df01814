//! A Debian bookworm machine with systemd as PID 1, in a container: the image
//! `pruefstand-systemd-test:<hash>` is the debootstrap'd base that
//! `scripts/build-vllm-cpu-image` imports (nothing is pulled) plus systemd, D-Bus with
//! the user session bus, the package's dependencies and the user anna (uid 1000) with
//! linger, tagged by a hash of the base's id and this recipe, so it is built once per
//! input.
//!
//! The container runs `/sbin/init` without `--privileged` (this Docker refuses it):
//! `SYS_ADMIN`, no seccomp or AppArmor profile, the host's cgroup tree and namespace,
//! tmpfs on /run, /run/lock and /tmp, and `SIGRTMIN+3` as its stop signal — systemd
//! answers Docker's default SIGTERM by re-executing itself, so `docker stop` would end
//! in a SIGKILL after the timeout instead of a shutdown. It uses the host's network,
//! Debian archive, CA bundle and pip settings (this network re-signs TLS), and a pip
//! cache under /var/tmp shared between runs.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::Run;
use super::machine::{Container, image_on_base};
pub use super::machine::{HOME, USER, deb};

const UID: u32 = 1000;
const PIP_CACHE: &str = "/var/tmp/pruefstand-systemd-test-pip";
/// What the package depends on (Cargo.toml's `depends`, apart from libc) and man-db: in
/// the image, so installing the `.deb` needs no download. Its other recommendation,
/// Docker, is left out: an engine in this container could not start.
const PACKAGES: &str = "systemd systemd-sysv dbus dbus-user-session libpam-systemd python3 python3-venv man-db procps";

/// The image, built when its tag is missing.
pub fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        // Linger is a file: the user manager starts at boot, without a login. A fixed
        // machine id keeps one journal folder across reboots. ~/.cache/pip exists so
        // the cache mounted there does not make ~/.cache root's.
        image_on_base("pruefstand-systemd-test", |base| {
            format!(
                "FROM {base}\n\
                 RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends {PACKAGES} \\\n \
                 && useradd --create-home --uid {UID} --shell /bin/bash {USER} \\\n \
                 && install -d -o {USER} -g {USER} {HOME}/.cache {HOME}/.cache/pip \\\n \
                 && mkdir -p /var/lib/systemd/linger && touch /var/lib/systemd/linger/{USER} \\\n \
                 && systemd-machine-id-setup && rm -rf /var/lib/apt/lists/*\n"
            )
        })
    })
}

/// A booted container; removed on drop.
pub struct Machine {
    container: Container,
    pub name: String,
}

impl Machine {
    /// Starts the machine and waits until systemd says it is running.
    pub fn boot() -> Machine {
        let image = image();
        std::fs::create_dir_all(PIP_CACHE).unwrap();
        std::os::unix::fs::chown(PIP_CACHE, Some(UID), Some(UID)).ok();
        let name = format!("pruefstand-systemd-test-{}", std::process::id());
        let pip = format!("{PIP_CACHE}:{HOME}/.cache/pip");
        let container = Container::run(
            &name,
            &[
                "--label",
                "pruefstand-test=systemd",
                "--network",
                "host",
                "--stop-signal",
                "SIGRTMIN+3",
                "--cap-add",
                "SYS_ADMIN",
                "--security-opt",
                "seccomp=unconfined",
                "--security-opt",
                "apparmor=unconfined",
                "--tmpfs",
                "/run",
                "--tmpfs",
                "/run/lock",
                "--tmpfs",
                "/tmp",
                "-v",
                "/sys/fs/cgroup:/sys/fs/cgroup:rw",
                "--cgroupns=host",
                "-v",
                &pip,
                image,
                "/sbin/init",
            ],
        );
        let machine = Machine { container, name };
        machine.wait_running();
        machine
    }

    /// systemd has finished booting with no failed unit, and anna's user manager (through
    /// linger) runs.
    pub fn wait_running(&self) {
        // Until PID 1 is up, systemctl cannot reach it and answers nothing.
        let mut state = String::new();
        self.wait_for("systemd to answer", 60, || {
            state = self.root(&["systemctl", "is-system-running", "--wait"]).stdout.trim().to_string();
            !state.is_empty()
        });
        let failed = self.root(&["systemctl", "--failed", "--no-legend", "--no-pager"]).stdout;
        assert_eq!(state, "running", "the machine did not boot cleanly; failed units:\n{failed}");
        self.wait_for("anna's user manager", 60, || {
            self.root(&["systemctl", "is-active", &format!("user@{UID}.service")]).stdout.trim() == "active"
        });
    }

    pub fn copy_in(&self, from: &Path, to: &str) {
        self.container.copy_in(from, to)
    }

    /// `docker exec` as `user` in `dir`; anna gets her session bus and runtime folder,
    /// as a login would give her.
    pub fn exec(&self, user: &str, dir: &str, argv: &[&str]) -> Run {
        let (runtime, bus) = (format!("/run/user/{UID}"), format!("unix:path=/run/user/{UID}/bus"));
        let env: &[(&str, &str)] =
            if user == "root" { &[] } else { &[("XDG_RUNTIME_DIR", &runtime), ("DBUS_SESSION_BUS_ADDRESS", &bus)] };
        self.container.exec(user, dir, env, argv)
    }

    pub fn root(&self, argv: &[&str]) -> Run {
        self.exec("root", "/", argv)
    }

    /// As anna, in her home.
    pub fn user(&self, argv: &[&str]) -> Run {
        self.exec(USER, HOME, argv)
    }

    /// As anna, through bash.
    pub fn sh(&self, script: &str) -> Run {
        self.user(&["bash", "-c", script])
    }

    /// Writes `text` to `path` as anna (folders made as needed).
    pub fn write(&self, path: &str, text: &str) {
        let dir = Path::new(path).parent().unwrap().to_str().unwrap();
        let script = "mkdir -p \"$1\" && cat > \"$2\"";
        let mut cmd = Command::new("docker");
        cmd.args(["exec", "-i", "-u", USER, &self.name, "sh", "-c", script, "sh", dir, path]);
        cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "writing {path} failed");
    }

    pub fn read(&self, path: &str) -> String {
        self.user(&["cat", path]).ok().stdout
    }

    /// `systemctl --user ARGS…` as anna.
    pub fn user_ctl(&self, args: &[&str]) -> Run {
        let mut argv = vec!["systemctl", "--user", "--no-pager"];
        argv.extend_from_slice(args);
        self.user(&argv)
    }

    /// One property of a user unit (`systemctl --user show -P`).
    pub fn user_prop(&self, unit: &str, property: &str) -> String {
        self.user_ctl(&["show", "-P", property, unit]).ok().stdout.trim().to_string()
    }

    /// Every file under `dir` with its SHA-256, sorted.
    pub fn snapshot(&self, dir: &str) -> String {
        let script = format!("cd {dir} && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum");
        self.root(&["bash", "-c", &script]).ok().stdout
    }

    /// Polls `done` every 200 ms (each a `docker exec`) for at most `timeout_s`.
    pub fn wait_for(&self, what: &str, timeout_s: u64, done: impl FnMut() -> bool) {
        assert!(self.wait_until(timeout_s, done), "timed out after {timeout_s} s waiting for {what}");
    }

    /// Like `wait_for`, but says whether `done` came true instead of panicking.
    pub fn wait_until(&self, timeout_s: u64, mut done: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(timeout_s);
        while !done() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        true
    }

    /// `docker` on this machine's container (restart, kill, start, stop).
    pub fn docker(&self, args: &[&str]) {
        let out = Command::new("docker").args(args).arg(&self.name).output().unwrap();
        assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}
