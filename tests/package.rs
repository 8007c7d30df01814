//! The Debian package as a user meets it, and the Jetson guide's commands.
//!
//! `a_user_installs_the_package_and_gets_a_verdict`: the `.deb` that `scripts/package`
//! made (scripts/test runs it before the tests) goes into a container of a Debian
//! bookworm made by debootstrap — the base image `scripts/build-vllm-cpu-image` imports,
//! so nothing is pulled — plus `man-db`, `systemd` (for `systemd-analyze`) and an
//! ordinary user, anna. The container uses the host's network and its Debian archive,
//! CA bundle and pip settings (this network re-signs TLS), as a machine on it would. In
//! it: `apt-get install ./pruefstand_….deb` as root, then as anna `pruefstand init`, a
//! second `init` refused, `pruefstand run demo-kandidat --plan schnell` approved, the man
//! pages, the bash completion, `systemd-analyze --user verify` of the units, and after
//! `apt-get remove` and `apt-get purge` anna's bench root unchanged.
//!
//! `every_pruefstand_command_in_the_jetson_guide_parses`: each `pruefstand …` line of a
//! code block and each `pruefstand …` code span in `docs/jetson.md` runs with `--help`
//! appended, so a misspelt command, option or missing value fails (clap reads the
//! words before it reaches `--help`).
//!
//! Not here: the units running under a real systemd (the container has no init), arm64.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use crate::common::machine::{self, Container, HOME, USER, deb};
use crate::common::{BIN, Run, repo};

/// The test image: the debootstrap'd base plus man-db, systemd and the user, tagged by
/// a hash of the base's id and this recipe, so it is built once per input.
fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        // The lists are dropped: at test time `apt-get update` reads the archive as it is
        // now, as a user's machine would.
        machine::image_on_base("pruefstand-package-test", |base| {
            format!(
                "FROM {base}\n\
                 RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends man-db systemd \\\n \
                 && useradd --create-home --shell /bin/bash {USER} && rm -rf /var/lib/apt/lists/*\n"
            )
        })
    })
}

/// A running container of the test image, removed on drop.
struct Machine(Container);

impl Machine {
    fn start() -> Machine {
        let name = format!("pruefstand-package-test-{}", std::process::id());
        Machine(Container::run(&name, &["--network", "host", image(), "sleep", "infinity"]))
    }

    fn copy_in(&self, from: &Path, to: &str) {
        self.0.copy_in(from, to)
    }

    fn exec(&self, user: &str, dir: &str, env: &[(&str, &str)], argv: &[&str]) -> Run {
        self.0.exec(user, dir, env, argv)
    }

    fn root(&self, argv: &[&str]) -> Run {
        self.exec("root", "/tmp", &[], argv)
    }

    fn user(&self, dir: &str, argv: &[&str]) -> Run {
        self.exec(USER, dir, &[], argv)
    }

    /// Every file under `dir` with its SHA-256, sorted: what must survive a removal.
    fn snapshot(&self, dir: &str) -> String {
        let script = format!("cd {dir} && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum");
        self.root(&["bash", "-c", &script]).ok().stdout
    }
}

#[test]
fn a_user_installs_the_package_and_gets_a_verdict() {
    let deb = deb();
    let machine = Machine::start();
    let file = deb.file_name().unwrap().to_str().unwrap().to_string();
    machine.copy_in(&deb, &format!("/tmp/{file}"));
    let local = format!("./{file}");

    // As root: the archive's lists, then the package with its dependencies (and what
    // it recommends, as a plain `apt-get install` takes it).
    machine.root(&["apt-get", "update", "-q"]).ok();
    machine.root(&["apt-get", "install", "-y", "-q", &local]).ok();
    let status = machine.root(&["dpkg-query", "-W", "-f", "${Status} ${Version}", "pruefstand"]).ok();
    assert_eq!(status.stdout, format!("install ok installed {}-1", env!("CARGO_PKG_VERSION")));
    for path in [
        "/usr/bin/pruefstand",
        "/usr/lib/systemd/user/pruefstand.service",
        "/usr/lib/systemd/user/pruefstand-voll@.service",
        "/usr/lib/systemd/user/pruefstand-voll@.timer",
        "/usr/lib/systemd/user/pruefstand-nacht@.service",
        "/usr/lib/systemd/user/pruefstand-nacht@.timer",
        "/usr/lib/systemd/user/pruefstand-lernnacht@.service",
        "/usr/lib/systemd/user/pruefstand-lernnacht@.timer",
        "/usr/share/man/man1/pruefstand.1.gz",
        "/usr/share/man/man1/pruefstand-init.1.gz",
        "/usr/share/zsh/vendor-completions/_pruefstand",
        "/usr/share/fish/vendor_completions.d/pruefstand.fish",
        "/usr/share/pruefstand/pruefstand.toml",
        "/usr/share/pruefstand/versions/demo-kandidat.toml",
        "/usr/share/pruefstand/profiles/schnell.toml",
    ] {
        machine.root(&["test", "-s", path]).ok();
    }
    let version = Run::from(Command::new(BIN).arg("--version").output().unwrap()).ok().stdout;
    assert_eq!(
        machine.user(HOME, &["pruefstand", "--version"]).ok().stdout,
        version,
        "the package holds another build"
    );

    // As anna: a bench root in ~/pruefstand, user-only config, an empty reports/.
    let init = machine.user(HOME, &["pruefstand", "init"]).ok();
    assert_eq!(init.stdout.trim(), format!("{HOME}/pruefstand"), "{}", init.stderr);
    let listing = machine
        .user(HOME, &["bash", "-c", "cd pruefstand && stat -c '%a %n' pruefstand.toml && ls versions profiles reports"])
        .ok();
    assert!(listing.stdout.starts_with("600 pruefstand.toml\n"), "{}", listing.stdout);
    for name in ["demo-kandidat.toml", "kandidat.toml", "schnell.toml", "voll.toml"] {
        assert!(listing.stdout.lines().any(|l| l == name), "{name} missing:\n{}", listing.stdout);
    }

    // An existing root is never overwritten: the user's edit stays.
    let root = format!("{HOME}/pruefstand");
    machine.user(&root, &["bash", "-c", "echo '# my edit' >> pruefstand.toml"]).ok();
    let again = machine.user(HOME, &["pruefstand", "init"]).code(2);
    assert!(
        again.stderr.contains("pruefstand.toml exists") && again.stderr.contains("overwrites nothing"),
        "{}",
        again.stderr
    );
    let config = machine.user(&root, &["cat", "pruefstand.toml"]).ok().stdout;
    assert!(config.ends_with("# my edit\n"), "init touched the config:\n{config}");

    // The main job, from the root: the venv is made on first use, then the verdict.
    let run = machine.user(&root, &["pruefstand", "run", "demo-kandidat", "--plan", "schnell"]);
    let run = run.ok();
    assert!(run.stdout.lines().any(|l| l == "verdict: approved"), "{}\n{}", run.stdout, run.stderr);
    let report = run.stdout.lines().find_map(|l| l.strip_prefix("report: ")).expect("a report line").to_string();
    assert!(report.starts_with(&format!("{root}/reports/demo-kandidat/schnell/")), "{report}");
    machine.user(&root, &["test", "-s", &report]).ok();

    // The man pages, through man-db.
    let man = machine.exec(USER, HOME, &[("MANPAGER", "cat"), ("MANWIDTH", "100")], &["man", "pruefstand"]).ok();
    assert!(man.stdout.contains("pruefstand - Local GPU test bench"), "{}", man.stdout);
    assert!(man.stdout.contains("pruefstand-init(1)"), "the main page lists the commands:\n{}", man.stdout);
    let man_init = machine.exec(USER, HOME, &[("MANPAGER", "cat")], &["man", "pruefstand-init"]).ok();
    assert!(man_init.stdout.contains("--from"), "{}", man_init.stdout);

    // bash completes a command name from the installed completion.
    let completion = machine
        .user(
            HOME,
            &[
                "bash",
                "-c",
                "source /usr/share/bash-completion/completions/pruefstand; COMP_WORDS=(pruefstand in); COMP_CWORD=1; \
                 COMP_LINE='pruefstand in'; COMP_POINT=13; _pruefstand pruefstand in pruefstand; printf '%s\\n' \"${COMPREPLY[@]}\"",
            ],
        )
        .ok();
    assert_eq!(completion.stdout, "init\ninstall-units\n");

    // The units: systemd's own checker, as the user manager would load them.
    machine.0.verify_units();
    let service = machine.user(HOME, &["cat", "/usr/lib/systemd/user/pruefstand.service"]).ok().stdout;
    assert!(service.contains("\nExecStart=/usr/bin/pruefstand --root %h/pruefstand daemon\n"), "{service}");

    // Removal and purge delete the package's files, nothing of anna's.
    let before = machine.snapshot(&root);
    assert!(before.contains("/cases.jsonl\n") && before.contains("/report.html\n"), "{before}");
    machine.root(&["apt-get", "remove", "-y", "-q", "pruefstand"]).ok();
    machine.root(&["test", "!", "-e", "/usr/bin/pruefstand"]).ok();
    machine.root(&["test", "!", "-e", "/usr/share/pruefstand"]).ok();
    assert_eq!(machine.snapshot(&root), before, "apt-get remove changed the bench root");
    machine.root(&["apt-get", "install", "-y", "-q", &local]).ok();
    machine.root(&["apt-get", "purge", "-y", "-q", "pruefstand"]).ok();
    let gone = machine.root(&["dpkg-query", "-W", "-f", "${Status}", "pruefstand"]);
    assert!(gone.code != Some(0) || gone.stdout.contains("not-installed"), "{}", gone.stdout);
    assert_eq!(machine.snapshot(&root), before, "apt-get purge changed the bench root");
    machine.user(HOME, &["test", "-d", ".cache/pruefstand"]).ok();
}

/// The `pruefstand …` commands of a Markdown text: each such line of a code block and
/// each such code span, as words (cut at a comment, pipe, redirection or `&&`).
fn commands(markdown: &str) -> Vec<Vec<String>> {
    use pulldown_cmark::{Event, Parser, Tag, TagEnd};
    let mut found = Vec::new();
    let mut in_block = false;
    let take = |line: &str, found: &mut Vec<Vec<String>>| {
        let line = line.trim();
        if !line.starts_with("pruefstand ") && line != "pruefstand" {
            return;
        }
        let words = shlex::split(line).unwrap_or_else(|| panic!("unbalanced quotes: {line}"));
        let words: Vec<String> = words
            .into_iter()
            .take_while(|w| !w.starts_with('#') && !["|", ">", ">>", "&&", ";", "2>&1"].contains(&w.as_str()))
            .collect();
        found.push(words);
    };
    for event in Parser::new(markdown) {
        match event {
            Event::Start(Tag::CodeBlock(_)) => in_block = true,
            Event::End(TagEnd::CodeBlock) => in_block = false,
            Event::Text(text) if in_block => text.lines().for_each(|l| take(l, &mut found)),
            Event::Code(code) => take(&code, &mut found),
            _ => {}
        }
    }
    found
}

#[test]
fn every_pruefstand_command_in_the_jetson_guide_parses() {
    let guide = std::fs::read_to_string(repo().join("docs/jetson.md")).unwrap();
    let commands = commands(&guide);
    let said: Vec<String> = commands.iter().map(|w| w.join(" ")).collect();
    for needed in [
        "pruefstand init",
        "pruefstand check kandidat",
        "pruefstand run kandidat --plan schnell",
        "pruefstand start kandidat --plan voll",
    ] {
        assert!(said.iter().any(|c| c == needed), "the guide lacks `{needed}`; it has:\n{}", said.join("\n"));
    }
    let mut failed = Vec::new();
    for words in &commands {
        let out = Command::new(BIN).args(&words[1..]).arg("--help").output().unwrap();
        if !out.status.success() || out.stdout.is_empty() {
            failed.push(format!("{}\n{}", words.join(" "), String::from_utf8_lossy(&out.stderr)));
        }
    }
    assert!(failed.is_empty(), "commands of docs/jetson.md the binary refuses:\n{}", failed.join("\n"));
}

#[test]
fn the_guide_checker_finds_a_misspelt_command() {
    let words = commands("```sh\npruefstand chekc kandidat   # typo\n```\nand `pruefstand run x --plna voll`\n");
    assert_eq!(words, [vec!["pruefstand", "chekc", "kandidat"], vec!["pruefstand", "run", "x", "--plna", "voll"]]);
    for words in &words {
        let out = Command::new(BIN).args(&words[1..]).arg("--help").output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{words:?} passed");
    }
}

#[test]
fn init_copies_the_examples_and_refuses_any_part_of_a_root() {
    let dir = tempfile::tempdir().unwrap();
    let init = |args: &[&str]| Run::from(Command::new(BIN).arg("init").args(args).output().unwrap());
    let from = repo();
    let from = from.to_str().unwrap();
    let root = dir.path().join("bench");
    let made = init(&[root.to_str().unwrap(), "--from", from]).ok();
    assert_eq!(made.stdout.trim(), root.to_str().unwrap());
    for sub in ["versions", "profiles"] {
        let mut want: Vec<_> = std::fs::read_dir(repo().join(sub)).unwrap().map(|e| e.unwrap().file_name()).collect();
        let mut got: Vec<_> = std::fs::read_dir(root.join(sub)).unwrap().map(|e| e.unwrap().file_name()).collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{sub}/");
    }
    assert_eq!(std::fs::read_dir(root.join("reports")).unwrap().count(), 0);
    // The copy is a working root: `check` finds it and its versions.
    let check = Run::from(
        Command::new(BIN).arg("--root").arg(&root).args(["check", "demo-kandidat", "--json"]).output().unwrap(),
    );
    assert!(check.stdout.contains("version demo-kandidat"), "{}\n{}", check.stdout, check.stderr);

    // Any one part of a root is enough to refuse, and nothing is written then.
    for part in ["pruefstand.toml", "versions", "profiles", "reports"] {
        let other = dir.path().join(format!("has-{part}"));
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join(part), "mine").unwrap();
        let refused = init(&[other.to_str().unwrap(), "--from", from]).code(2);
        assert!(refused.stderr.contains(&format!("{part} exists")), "{}", refused.stderr);
        assert_eq!(std::fs::read_dir(&other).unwrap().count(), 1, "init wrote beside {part}");
    }
    // Examples that are not there: named, with the way out.
    let missing = init(&[dir.path().join("x").to_str().unwrap(), "--from", dir.path().to_str().unwrap()]).code(2);
    assert!(missing.stderr.contains("holds no bench root examples (pass --from DIR)"), "{}", missing.stderr);
    assert!(!dir.path().join("x").exists());
}

/// `scripts/package --target aarch64-unknown-linux-gnu` on an x86_64 workstation names
/// the cross linker itself (the host's `cc` cannot link aarch64), and leaves one the
/// caller set alone. Driven with stand-ins for cargo, cargo-deb and the linker on
/// `PATH`: the build they record is the script's, nothing is compiled.
#[test]
fn the_package_script_sets_the_cross_linker_for_an_arm64_package() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    let tools = dir.path().join("tools");
    std::fs::create_dir_all(tools.join("cargo-deb-3.8.0/bin")).unwrap();
    std::fs::create_dir_all(&bin).unwrap();
    let seen = dir.path().join("linker.txt");
    let script = |path: &Path, text: &str| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    // cargo: the metadata the script asks for, and a build that records the linker.
    script(
        &bin.join("cargo"),
        &format!(
            "#!/bin/sh\ncase \"$1\" in\n  metadata) echo '{{\"target_directory\": \"{}\"}}' ;;\n  build) echo \"linker=${{CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER:-}}\" > {}; exit 3 ;;\nesac\n",
            dir.path().join("target").display(),
            seen.display()
        ),
    );
    for stand_in in ["dpkg-shlibdeps", "aarch64-linux-gnu-gcc"] {
        script(&bin.join(stand_in), "#!/bin/sh\nexit 0\n");
    }
    script(&tools.join("cargo-deb-3.8.0/bin/cargo-deb"), "#!/bin/sh\nexit 0\n");
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let package = |linker: Option<&str>| {
        let mut cmd = Command::new(repo().join("scripts/package"));
        cmd.args(["--target", "aarch64-unknown-linux-gnu"])
            .env("PATH", &path)
            .env("PRUEFSTAND_TOOLS", &tools)
            .env_remove("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER");
        if let Some(linker) = linker {
            cmd.env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", linker);
        }
        let run = Run::from(cmd.output().unwrap());
        assert_ne!(run.code, Some(0), "the stand-in build fails: {}", run.stderr);
        std::fs::read_to_string(&seen).unwrap_or_else(|_| panic!("no build ran: {}", run.stderr))
    };
    let host = String::from_utf8(Command::new("uname").arg("-m").output().unwrap().stdout).unwrap();
    let own = if host.trim() == "x86_64" { "linker=aarch64-linux-gnu-gcc\n" } else { "linker=\n" };
    assert_eq!(package(None), own, "on {host}");
    assert_eq!(package(Some("/opt/cross/gcc")), "linker=/opt/cross/gcc\n");
}
