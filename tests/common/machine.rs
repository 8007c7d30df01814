//! Debian machines in containers, for the tests of the installed package (`package`,
//! `systemd`, `arm64`): an image built on the bookworm that `scripts/build-vllm-cpu-image`
//! debootstraps (nothing pulled) and cached by a hash of the base's id and its recipe;
//! a container with this network's CA bundle and pip settings (it re-signs TLS), as a
//! machine on it would have them; `docker exec` with the host's pip and proxy variables;
//! files copied in and out. What runs in a machine is each area's.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{BIN, Run, docker, repo};

/// The ordinary user every such machine has.
pub const USER: &str = "anna";
pub const HOME: &str = "/home/anna";
const BASE_REPOSITORY: &str = "pruefstand-vllm-cpu-base";

/// The amd64 package `scripts/package` made for this version, checked to be newer than
/// the binary under test (a stale package would test old code).
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

/// The image `repository:<hash>` of the Dockerfile `recipe` makes from the base's tag,
/// built only when that tag is missing.
pub fn image_on_base(repository: &str, recipe: impl FnOnce(&str) -> String) -> String {
    docker::ensure_dockerd();
    let listed = Command::new("docker")
        .args(["images", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}", BASE_REPOSITORY])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    let (base, base_id) = listed.lines().find_map(|l| l.split_once(' ')).unwrap_or_else(|| {
        panic!("no {BASE_REPOSITORY} image: scripts/build-vllm-cpu-image makes it (scripts/test runs it)")
    });
    let dockerfile = recipe(base);
    let hash = &sha256(&format!("{base_id}\n{dockerfile}"))[..12];
    let tag = format!("{repository}:{hash}");
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
}

fn sha256(text: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// A running container, removed on drop.
pub struct Container {
    pub name: String,
}

impl Container {
    /// `docker run -d --name NAME ARGS…` (ARGS: options, the image, its command; a
    /// leftover of the same name removed first), then this network's CA bundle and pip
    /// settings copied in.
    pub fn run(name: &str, args: &[&str]) -> Container {
        let _ = Command::new("docker").args(["rm", "-f", name]).output();
        let out = Command::new("docker").args(["run", "-d", "--name", name]).args(args).output().unwrap();
        assert!(out.status.success(), "docker run failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let container = Container { name: name.to_string() };
        for path in ["/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf"] {
            if Path::new(path).is_file() {
                container.copy_in(Path::new(path), path);
            }
        }
        container
    }

    pub fn copy_in(&self, from: &Path, to: &str) {
        let out = Command::new("docker").arg("cp").arg(from).arg(format!("{}:{to}", self.name)).output().unwrap();
        assert!(out.status.success(), "docker cp {}: {}", from.display(), String::from_utf8_lossy(&out.stderr));
    }

    pub fn copy_out(&self, from: &str, to: &Path) {
        let out = Command::new("docker").arg("cp").arg(format!("{}:{from}", self.name)).arg(to).output().unwrap();
        assert!(out.status.success(), "docker cp {from}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// `docker exec` as `user` in `dir` with `env`; anna gets her HOME and USER, every
    /// user the host's pip and proxy variables.
    pub fn exec(&self, user: &str, dir: &str, env: &[(&str, &str)], argv: &[&str]) -> Run {
        let mut cmd = Command::new("docker");
        cmd.args(["exec", "-u", user, "-w", dir, "-e", "DEBIAN_FRONTEND=noninteractive"]);
        if user != "root" {
            cmd.args(["-e", &format!("HOME={HOME}"), "-e", &format!("USER={USER}")]);
        }
        for name in [
            "PIP_INDEX_URL",
            "PIP_EXTRA_INDEX_URL",
            "PIP_TRUSTED_HOST",
            "PIP_DEFAULT_TIMEOUT",
            "http_proxy",
            "https_proxy",
            "no_proxy",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "NO_PROXY",
        ] {
            if let Ok(value) = std::env::var(name) {
                cmd.args(["-e", &format!("{name}={value}")]);
            }
        }
        for (name, value) in env {
            cmd.args(["-e", &format!("{name}={value}")]);
        }
        cmd.arg(&self.name).args(argv);
        Run::from(cmd.output().unwrap())
    }

    /// The packaged units pass systemd's own checker, as anna's user manager would load
    /// them, with nothing to remark.
    pub fn verify_units(&self) {
        let verify = self
            .exec(
                USER,
                "/usr/lib/systemd/user",
                &[("XDG_RUNTIME_DIR", "/tmp/anna-runtime")],
                &[
                    "bash",
                    "-c",
                    "mkdir -m 0700 -p \"$XDG_RUNTIME_DIR\" && systemd-analyze --user verify pruefstand.service \
                     pruefstand-voll@.service pruefstand-voll@.timer pruefstand-nacht@.service pruefstand-nacht@.timer \
                     pruefstand-lernnacht@.service pruefstand-lernnacht@.timer",
                ],
            )
            .ok();
        assert_eq!(format!("{}{}", verify.stdout, verify.stderr), "", "systemd-analyze has remarks");
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.name]).output();
    }
}
