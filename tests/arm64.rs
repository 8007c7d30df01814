//! The Jetson's architecture, executed: the arm64 package on this amd64 machine, under
//! emulation.
//!
//! `the_arm64_package_installs_and_runs_as_on_amd64`: the `.deb` that `scripts/package
//! --target aarch64-unknown-linux-gnu` cross-built (scripts/test makes it) goes into a
//! container of the arm64 Debian bookworm that `scripts/build-arm64-image` debootstraps
//! (qemu-aarch64 registered through binfmt_misc with the F flag, so the container holds
//! no emulator; every process in it is arm64). The container has the host's network,
//! CA bundle and pip settings, and a wheelhouse of the aarch64 wheels downloaded once on
//! the host (`/var/tmp/pruefstand-arm64/wheels-cp311`), pip's only source in the
//! container, so a rerun downloads none. In it:
//! `apt-get install ./pruefstand_…_arm64.deb` as root, then as the user anna `init`,
//! `setup` (the venv from aarch64 wheels, under Debian's CPython 3.11), `check
//! demo-kandidat`, `run demo-kandidat` on a plan of a dozen cases over two suites,
//! attacked and clean → approved with no errored case and the records those of the same
//! plan run natively here, case by case; `man pruefstand` and `systemd-analyze --user
//! verify` of the units; then the GPU guard as on a Thor: the fake NVML built for
//! aarch64 (`aarch64-linux-gnu-gcc`) answering as Thor's does (utilization and
//! processes readable, memory NOT_SUPPORTED), `nvml = "block"` as the Jetson guide
//! sets it, idle and then busy with a foreign compute process. The run times,
//! emulated and native, are printed (`--nocapture`): context, not assertions.
//!
//! `the_pinned_requirements_resolve_to_aarch64_cp312_wheels`: every pin of
//! `scripts/requirements.txt` has a binary wheel for the Jetson (aarch64, CPython 3.12,
//! Ubuntu 24.04's glibc 2.39), so a bump that would need a compiler there fails here.
//! The wheels land in `/var/tmp/pruefstand-arm64/wheels-cp312`; a rerun downloads none.
//!
//! Not here: the GPU runtime, the real NVML and JetPack's Docker (a real Thor only), the
//! units under a real systemd, CPython 3.12 executing the gym (bookworm has 3.11).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use crate::common::machine::{Container, HOME, USER};
use crate::common::nvml::{self, NvmlState};
use crate::common::{BIN, Bench, Run, cases, repo, untimed};

/// The host folder of the arm64 wheelhouses.
const CACHE: &str = "/var/tmp/pruefstand-arm64";
/// Where the container sees the cp311 wheelhouse.
const WHEELS: &str = "/var/cache/pruefstand-wheels";

/// A dozen cases over two suites, attacked and clean (the plan `klein`): demo-kandidat
/// is approved on it against demo-baseline.
const PLAN: &str = include_str!("fixtures/arm64-klein.toml");
const PLAN_CASES: usize = 12;

/// `pip download` of every pin of `scripts/requirements.txt` as binary wheels for
/// aarch64 under this CPython ("3.12") and these manylinux tags, into `dest` (files
/// already there are not downloaded again), by the managed venv's pip.
fn download_wheels(python_version: &str, manylinux: &[&str], dest: &Path) -> Run {
    std::fs::create_dir_all(dest).unwrap();
    let mut cmd = Command::new(&crate::common::pyenv().python);
    cmd.args(["-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps", "--only-binary=:all:"]);
    for tag in manylinux {
        cmd.arg("--platform").arg(format!("{tag}_aarch64"));
    }
    cmd.args(["--python-version", python_version, "--implementation", "cp"]);
    for abi in [&format!("cp{}", python_version.replace('.', "")), "abi3", "none"] {
        cmd.args(["--abi", abi]);
    }
    cmd.arg("--dest").arg(dest).arg("-r").arg(repo().join("scripts/requirements.txt"));
    Run::from(cmd.output().unwrap())
}

/// The wheels `pruefstand setup` installs in the arm64 container (bookworm: CPython
/// 3.11, glibc 2.36), downloaded here once; pip in the container installs from them
/// alone (`PIP_FIND_LINKS`, `PIP_NO_INDEX`), so a rerun downloads no wheel. (pip's own
/// HTTP cache keeps nothing on this network, and with the index beside a folder of
/// wheels pip still downloads from the index.)
fn wheelhouse() -> PathBuf {
    let dest = Path::new(CACHE).join("wheels-cp311");
    let run = download_wheels("3.11", &["manylinux2014", "manylinux_2_28", "manylinux_2_34"], &dest);
    assert_eq!(run.code, Some(0), "downloading the aarch64/cp311 wheels failed:\n{}", run.stderr);
    dest
}

/// The arm64 image, built (or found) by `scripts/build-arm64-image`, which also
/// registers the emulator: its tag.
fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        crate::common::docker::ensure_dockerd();
        let out = Command::new(repo().join("scripts/build-arm64-image")).output().unwrap();
        let run = Run::from(out);
        assert_eq!(run.code, Some(0), "scripts/build-arm64-image failed:\n{}", run.stderr);
        run.stdout.lines().last().expect("the script prints the tag").to_string()
    })
}

/// The arm64 package of this version, checked to hold a binary built after the one
/// under test (which `cargo test` relinks whenever the source changed): a stale package
/// would test old code.
fn deb() -> PathBuf {
    let path = repo().join(format!("target/debian/pruefstand_{}-1_arm64.deb", env!("CARGO_PKG_VERSION")));
    let binary = repo().join("target/aarch64-unknown-linux-gnu/debug/pruefstand");
    let how = "make it with `cargo build --target aarch64-unknown-linux-gnu --bin pruefstand` and \
               `scripts/package --profile dev --no-build --target aarch64-unknown-linux-gnu` (scripts/test does)";
    let modified = |p: &Path| {
        std::fs::metadata(p).and_then(|m| m.modified()).unwrap_or_else(|e| panic!("{}: {e}: {how}", p.display()))
    };
    let built = modified(&binary);
    assert!(built >= modified(Path::new(BIN)), "{} is older than {BIN}: {how}", binary.display());
    assert!(modified(&path) >= built, "{} is older than {}: {how}", path.display(), binary.display());
    path
}

/// A running arm64 container of the test image, removed on drop.
struct Machine(Container);

impl Machine {
    fn start() -> Machine {
        let wheels = format!("{}:{WHEELS}:ro", wheelhouse().display());
        let name = format!("pruefstand-arm64-test-{}", std::process::id());
        Machine(Container::run(
            &name,
            &["--platform", "linux/arm64", "--network", "host", "-v", &wheels, image(), "sleep", "infinity"],
        ))
    }

    fn copy_in(&self, from: &Path, to: &str) {
        self.0.copy_in(from, to)
    }

    fn copy_out(&self, from: &str, to: &Path) {
        self.0.copy_out(from, to)
    }

    /// A file of the user's, written through a copy (no shell between text and file).
    fn write(&self, text: &str, to: &str) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, text).unwrap();
        self.copy_in(&file, to);
        self.root(&["chown", &format!("{USER}:{USER}"), to]).ok();
    }

    /// `docker exec` as `user` in `dir`, the wheelhouse as pip's only source.
    fn exec(&self, user: &str, dir: &str, env: &[(&str, &str)], argv: &[&str]) -> Run {
        let mut all = vec![("PIP_FIND_LINKS", WHEELS), ("PIP_NO_INDEX", "1")];
        all.extend_from_slice(env);
        self.0.exec(user, dir, &all, argv)
    }

    fn root(&self, argv: &[&str]) -> Run {
        self.exec("root", "/tmp", &[], argv)
    }

    fn user(&self, dir: &str, argv: &[&str]) -> Run {
        self.exec(USER, dir, &[], argv)
    }
}

/// The `check` line with this status whose text starts with `what`.
fn line<'a>(check: &'a Run, status: &str, what: &str) -> &'a str {
    let prefix = format!("{status:<4}  {what}");
    check
        .stdout
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?}\nstdout:\n{}\nstderr:\n{}", check.stdout, check.stderr))
}

/// The records of a run folder, untimed, in case order.
fn records(run_dir: &Path) -> Vec<serde_json::Value> {
    let mut records: Vec<_> = cases(run_dir).into_iter().map(untimed).collect();
    records.sort_by_key(|r| r["case_id"].as_str().unwrap().to_string());
    records
}

#[test]
fn the_arm64_package_installs_and_runs_as_on_amd64() {
    let deb = deb();
    let machine = Machine::start();
    let arch = machine.root(&["bash", "-c", "uname -m; dpkg --print-architecture"]).ok();
    assert_eq!(arch.stdout, "aarch64\narm64\n", "the container is not arm64");
    let file = deb.file_name().unwrap().to_str().unwrap().to_string();
    machine.copy_in(&deb, &format!("/tmp/{file}"));

    // As root: the package; the image holds its dependencies (python3, python3-venv)
    // and man-db, so no lists are needed. What it recommends (Docker) is the amd64
    // test's: installing docker.io under emulation would cost minutes.
    let t0 = Instant::now();
    machine.root(&["apt-get", "install", "-y", "-q", "--no-install-recommends", &format!("./{file}")]).ok();
    let install_s = t0.elapsed().as_secs_f64();
    let status = machine.root(&["dpkg-query", "-W", "-f", "${Status} ${Version} ${Architecture}", "pruefstand"]).ok();
    assert_eq!(status.stdout, format!("install ok installed {}-1 arm64", env!("CARGO_PKG_VERSION")));
    let elf = machine.root(&["od", "-An", "-tu2", "-j18", "-N2", "/usr/bin/pruefstand"]).ok();
    assert_eq!(elf.stdout.trim(), "183", "/usr/bin/pruefstand is not an aarch64 ELF (e_machine)");
    let version = Run::from(Command::new(BIN).arg("--version").output().unwrap()).ok().stdout;
    assert_eq!(machine.user(HOME, &["pruefstand", "--version"]).ok().stdout, version);

    // As anna: a bench root, the small plan in it, the venv from aarch64 wheels.
    let init = machine.user(HOME, &["pruefstand", "init"]).ok();
    let root = format!("{HOME}/pruefstand");
    assert_eq!(init.stdout.trim(), root, "{}", init.stderr);
    machine.write(PLAN, &format!("{root}/profiles/klein.toml"));
    let t0 = Instant::now();
    let setup = machine.user(&root, &["pruefstand", "setup"]).ok();
    let setup_s = t0.elapsed().as_secs_f64();
    let python = setup.stdout.lines().find_map(|l| l.split_once("venv: ").map(|(_, v)| v.trim().to_string()));
    let python = python.unwrap_or_else(|| panic!("no venv line:\n{}", setup.stdout));
    // pydantic-core is compiled (Rust): its extension module names the platform.
    let probe = machine
        .user(
            &root,
            &[
                &python,
                "-c",
                "import platform, pydantic_core._pydantic_core as m, agentdojo; print(platform.machine()); \
                 print(platform.python_version()); print(m.__file__.rsplit('/', 1)[1])",
            ],
        )
        .ok();
    let probe: Vec<&str> = probe.stdout.lines().collect();
    assert_eq!(probe[0], "aarch64", "{probe:?}");
    assert!(probe[1].starts_with("3.11."), "bookworm's CPython: {probe:?}");
    assert!(probe[2].ends_with("-aarch64-linux-gnu.so"), "pydantic-core is not the aarch64 build: {probe:?}");

    // check: no GPU here and no D-Bus, which the repository's config lets pass.
    let check = machine.user(&root, &["pruefstand", "check", "demo-kandidat"]);
    line(&check, "OK", "version demo-kandidat (");
    assert!(line(&check, "OK", "Python venv ").ends_with("with agentdojo 0.1.35"), "{}", check.stdout);
    line(&check, "OK", "model: simulated");
    line(&check, "OK", "NVML: ");
    assert_eq!(check.code, Some(0), "check fails on arm64:\n{}\n{}", check.stdout, check.stderr);

    // The main job on the small plan: the reference first, then the candidate.
    let t0 = Instant::now();
    let run = machine.user(&root, &["pruefstand", "run", "demo-kandidat", "--plan", "klein"]).ok();
    let emulated_s = t0.elapsed().as_secs_f64();
    assert!(run.stdout.lines().any(|l| l == "verdict: approved"), "{}\n{}", run.stdout, run.stderr);
    let prefix = format!("{root}/reports/demo-kandidat/klein/");
    // A path inside the container: found by its prefix, not on this machine's disk.
    let run_dir = run
        .stdout
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("run directory: ").filter(|d| d.starts_with(&prefix)))
        .expect("the run directory is printed");
    let copied = tempfile::tempdir().unwrap();
    machine.copy_out(&format!("{run_dir}/cases.jsonl"), copied.path());
    let arm64 = records(copied.path());
    assert_eq!(arm64.len(), PLAN_CASES, "one record per planned case");
    let errored: Vec<_> = arm64.iter().filter(|r| !r["error"].is_null()).collect();
    assert!(errored.is_empty(), "bench errors on arm64: {errored:?}");

    // The same plan here, natively: the simulated model is deterministic per case.
    let bench = Bench::new();
    bench.write("profiles/klein.toml", PLAN);
    let t0 = Instant::now();
    let native = bench.run(&["run", "demo-kandidat", "--plan", "klein"]).ok();
    let native_s = t0.elapsed().as_secs_f64();
    assert!(native.stdout.lines().any(|l| l == "verdict: approved"), "{}", native.stdout);
    let amd64 = records(&native.run_dir());
    for (a, b) in arm64.iter().zip(&amd64) {
        assert_eq!(a, b, "case {} differs between arm64 (left) and amd64 (right)", a["case_id"]);
    }
    assert_eq!(arm64.len(), amd64.len());
    eprintln!(
        "arm64 under emulation: apt-get install {install_s:.1} s, setup {setup_s:.1} s; run of {PLAN_CASES} cases \
         (reference and candidate) {emulated_s:.1} s emulated, {native_s:.1} s native: {:.1}× slower",
        emulated_s / native_s
    );

    // The man pages and the units, as on amd64.
    let man = machine.exec(USER, HOME, &[("MANPAGER", "cat"), ("MANWIDTH", "100")], &["man", "pruefstand"]).ok();
    assert!(man.stdout.contains("pruefstand - Local GPU test bench"), "{}", man.stdout);
    machine.0.verify_units();

    // The GPU guard as on a Thor: NVML's library where the config names it, jobs
    // blocked when it cannot be read (the Jetson guide's setting).
    let nvml_dir = format!("{HOME}/nvml");
    machine.user(HOME, &["mkdir", "-p", &nvml_dir]).ok();
    let library = format!("{nvml_dir}/libnvidia-ml.so.1");
    machine.copy_in(nvml::aarch64_library(), &library);
    machine.root(&["chown", USER, &library]).ok();
    let thor = NvmlState { name: "NVIDIA Thor".into(), ..NvmlState::default() };
    machine.write(&thor.render(), &format!("{nvml_dir}/fake_nvml.state"));
    let config = format!("{root}/pruefstand.toml");
    let edit = format!("s|^nvml = \"ignore\"$|nvml = \"block\"\\nlibrary = \"{library}\"|");
    machine.user(&root, &["sed", "-i", &edit, &config]).ok();
    let config_text = machine.user(&root, &["cat", &config]).ok().stdout;
    assert!(config_text.contains(&format!("library = \"{library}\"")), "the edit missed:\n{config_text}");

    let check = machine.user(&root, &["pruefstand", "check", "demo-kandidat"]).ok();
    let nvml_line = line(&check, "OK", "NVML: GPU 0 NVIDIA Thor (driver 580.0-fake, ");
    assert!(nvml_line.ends_with("utilization and compute processes readable"), "{nvml_line}");
    line(&check, "OK", "GPU idle now (utilization ≤ 10 %, no compute process)");

    let busy = NvmlState { name: "NVIDIA Thor".into(), ..NvmlState::default() }.utilization(93).process(0, 4242);
    machine.write(&busy.render(), &format!("{nvml_dir}/fake_nvml.state"));
    let check = machine.user(&root, &["pruefstand", "check", "demo-kandidat"]).ok();
    let busy_line = line(&check, "WARN", "GPU busy now: GPU 0 utilization 93 % > 10 %; foreign compute process 4242");
    assert!(busy_line.ends_with("→ jobs wait until it is idle"), "{busy_line}");
}

/// A distribution name as wheel file names spell it (PEP 503, compared loosely).
fn normalized(name: &str) -> String {
    name.to_lowercase().replace(['_', '.'], "-")
}

#[test]
fn the_pinned_requirements_resolve_to_aarch64_cp312_wheels() {
    let requirements = repo().join("scripts/requirements.txt");
    let text = std::fs::read_to_string(&requirements).unwrap();
    let pins: Vec<(String, String)> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, version) = l.split_once("==").unwrap_or_else(|| panic!("not an exact pin: {l}"));
            (normalized(name), version.trim().to_string())
        })
        .collect();
    assert!(!pins.is_empty());
    let dest = Path::new(CACHE).join("wheels-cp312");
    // The Jetson: Ubuntu 24.04's glibc 2.39, CPython 3.12.
    let download =
        download_wheels("3.12", &["manylinux2014", "manylinux_2_28", "manylinux_2_34", "manylinux_2_39"], &dest);
    assert_eq!(
        download.code,
        Some(0),
        "a pin has no aarch64/cp312 wheel (the Jetson would need a compiler):\n{}",
        download.stderr
    );

    // Every pin has its wheel there, each for aarch64 (or any platform) and CPython 3.12.
    let wheels: Vec<String> = std::fs::read_dir(&dest)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".whl"))
        .collect();
    let mut missing = Vec::new();
    for (pin, version) in &pins {
        let found = wheels.iter().find(|w| {
            let mut parts = w.split('-');
            parts.next().map(normalized).as_ref() == Some(pin) && parts.next() == Some(version.as_str())
        });
        let Some(wheel) = found else {
            missing.push(format!("{pin}=={version}"));
            continue;
        };
        // name-version[-build]-python-abi-platform.whl
        let tags: Vec<&str> = wheel.trim_end_matches(".whl").rsplitn(4, '-').collect();
        let (platform, abi, python) = (tags[0], tags[1], tags[2]);
        assert!(platform == "any" || platform.split('.').all(|p| p.ends_with("aarch64")), "{wheel}: not for aarch64");
        assert!(abi.split('.').any(|a| ["none", "abi3", "cp312"].contains(&a)), "{wheel}: not for CPython 3.12's ABI");
        assert!(python.split('.').any(|p| p == "py3" || p.starts_with("cp3") || p.starts_with("py3")), "{wheel}");
    }
    assert!(missing.is_empty(), "pins without their wheel in {}: {missing:?}", dest.display());
}
