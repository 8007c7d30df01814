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

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{BIN, Run, docker, repo};

pub const USER: &str = "anna";
pub const HOME: &str = "/home/anna";
const UID: u32 = 1000;
const BASE_REPOSITORY: &str = "pruefstand-vllm-cpu-base";
const PIP_CACHE: &str = "/var/tmp/pruefstand-systemd-test-pip";
/// What the package depends on (Cargo.toml's `depends`, apart from libc) and man-db: in
/// the image, so installing the `.deb` needs no download. Its other recommendation,
/// Docker, is left out: an engine in this container could not start.
const PACKAGES: &str = "systemd systemd-sysv dbus dbus-user-session libpam-systemd python3 python3-venv man-db procps";

/// The package `scripts/package` made for this version and this machine's architecture,
/// checked to be newer than the binary under test (a stale package would test old code).
pub fn deb() -> PathBuf {
    let arch = Command::new("dpkg").arg("--print-architecture").output().expect("dpkg runs");
    let arch = String::from_utf8_lossy(&arch.stdout).trim().to_string();
    let path = repo().join(format!("target/debian/pruefstand_{}-1_{arch}.deb", env!("CARGO_PKG_VERSION")));
    let made = std::fs::metadata(&path).and_then(|m| m.modified()).unwrap_or_else(|e| {
        panic!("{}: {e}: make it with `scripts/package --profile dev --no-build` (scripts/test does)", path.display())
    });
    let built = std::fs::metadata(BIN).and_then(|m| m.modified()).unwrap();
    assert!(
        made >= built,
        "{} is older than {BIN}: run `scripts/package --profile dev --no-build` after `cargo build --bins --tests`",
        path.display()
    );
    path
}

/// The image, built when its tag is missing.
pub fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        docker::ensure_dockerd();
        let listed = Command::new("docker")
            .args(["images", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}", BASE_REPOSITORY])
            .output()
            .unwrap();
        let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
        let (base, base_id) = listed.lines().find_map(|l| l.split_once(' ')).unwrap_or_else(|| {
            panic!("no {BASE_REPOSITORY} image: scripts/build-vllm-cpu-image makes it (scripts/test runs it)")
        });
        // Linger is a file: the user manager starts at boot, without a login. A fixed
        // machine id keeps one journal folder across reboots. ~/.cache/pip exists so
        // the cache mounted there does not make ~/.cache root's.
        let dockerfile = format!(
            "FROM {base}\n\
             RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends {PACKAGES} \\\n \
             && useradd --create-home --uid {UID} --shell /bin/bash {USER} \\\n \
             && install -d -o {USER} -g {USER} {HOME}/.cache {HOME}/.cache/pip \\\n \
             && mkdir -p /var/lib/systemd/linger && touch /var/lib/systemd/linger/{USER} \\\n \
             && systemd-machine-id-setup && rm -rf /var/lib/apt/lists/*\n"
        );
        let hash = &sha256(&format!("{base_id}\n{dockerfile}"))[..12];
        let tag = format!("pruefstand-systemd-test:{hash}");
        let present = Command::new("docker").args(["image", "inspect", &tag]).output().unwrap().status.success();
        if !present {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("Dockerfile"), &dockerfile).unwrap();
            let out = Command::new("docker")
                .env("DOCKER_BUILDKIT", "0")
                .args(["build", "-q", "--network", "host", "-t", &tag])
                .arg(dir.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "building {tag} failed:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        tag
    })
}

fn sha256(text: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// A booted container; removed on drop.
pub struct Machine {
    pub name: String,
}

impl Machine {
    /// Starts the machine and waits until systemd says it is running.
    pub fn boot() -> Machine {
        let image = image();
        std::fs::create_dir_all(PIP_CACHE).unwrap();
        std::os::unix::fs::chown(PIP_CACHE, Some(UID), Some(UID)).ok();
        let name = format!("pruefstand-systemd-test-{}", std::process::id());
        let _ = Command::new("docker").args(["rm", "-f", &name]).output();
        let out = Command::new("docker")
            .args(["run", "-d", "--name", &name, "--label", "pruefstand-test=systemd", "--network", "host"])
            .args(["--stop-signal", "SIGRTMIN+3", "--cap-add", "SYS_ADMIN"])
            .args(["--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined"])
            .args(["--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp"])
            .args(["-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--cgroupns=host"])
            .args(["-v", &format!("{PIP_CACHE}:{HOME}/.cache/pip")])
            .args([image, "/sbin/init"])
            .output()
            .unwrap();
        assert!(out.status.success(), "docker run failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let machine = Machine { name };
        for path in ["/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf"] {
            if Path::new(path).is_file() {
                machine.copy_in(Path::new(path), path);
            }
        }
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
        let out = Command::new("docker").arg("cp").arg(from).arg(format!("{}:{to}", self.name)).output().unwrap();
        assert!(out.status.success(), "docker cp {}: {}", from.display(), String::from_utf8_lossy(&out.stderr));
    }

    /// `docker exec` as `user` in `dir`; anna gets her session bus and runtime folder,
    /// as a login would give her, and the host's pip and proxy settings.
    pub fn exec(&self, user: &str, dir: &str, argv: &[&str]) -> Run {
        let mut cmd = Command::new("docker");
        cmd.args(["exec", "-u", user, "-w", dir, "-e", "DEBIAN_FRONTEND=noninteractive"]);
        if user != "root" {
            cmd.args(["-e", &format!("HOME={HOME}"), "-e", &format!("USER={USER}")]);
            cmd.args(["-e", &format!("XDG_RUNTIME_DIR=/run/user/{UID}")]);
            cmd.args(["-e", &format!("DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/{UID}/bus")]);
        }
        for name in ["PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT"]
            .into_iter()
            .chain(["http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"])
        {
            if let Ok(value) = std::env::var(name) {
                cmd.args(["-e", &format!("{name}={value}")]);
            }
        }
        cmd.arg(&self.name).args(argv);
        Run::from(cmd.output().unwrap())
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

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.name]).output();
    }
}
