//! `pruefstand install-units`: writes the systemd user units of `units/` (built into
//! the binary) with this binary's path and the bench root filled in, to
//! `~/.config/systemd/user/` or `--dir`, and prints the commands that enable them.
//! With `--packaged` (for `scripts/package`) it writes them as the Debian package
//! installs them in `/usr/lib/systemd/user/`: `/usr/bin/pruefstand` on the bench root
//! `%h/pruefstand` (what `pruefstand init` makes). Units a user writes to
//! `~/.config/systemd/user/` take precedence over the packaged ones, so a root
//! elsewhere is one `install-units` away.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use pruefstand_core::root::Root;

const UNITS: [(&str, &str); 7] = [
    ("pruefstand.service", include_str!("../../units/pruefstand.service")),
    ("pruefstand-voll@.service", include_str!("../../units/pruefstand-voll@.service")),
    ("pruefstand-voll@.timer", include_str!("../../units/pruefstand-voll@.timer")),
    ("pruefstand-nacht@.service", include_str!("../../units/pruefstand-nacht@.service")),
    ("pruefstand-nacht@.timer", include_str!("../../units/pruefstand-nacht@.timer")),
    ("pruefstand-lernnacht@.service", include_str!("../../units/pruefstand-lernnacht@.service")),
    ("pruefstand-lernnacht@.timer", include_str!("../../units/pruefstand-lernnacht@.timer")),
];

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Where to write them (default: ~/.config/systemd/user).
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
    /// As the package installs them: /usr/bin/pruefstand, bench root %h/pruefstand
    /// (needs --dir; for scripts/package).
    #[arg(long, hide = true, requires = "dir")]
    pub(crate) packaged: bool,
}

/// Where the package puts the binary.
const PACKAGED_BIN: &str = "/usr/bin/pruefstand";

/// A unit's text as the package installs it: the binary at [`PACKAGED_BIN`], the root
/// `%h/` + [`pruefstand_core::root::HOME_ROOT`] left to systemd's `%h` (the user's home), and the
/// man page as the documentation (a packaged root holds no README).
fn render_packaged(text: &str) -> String {
    let root = format!("%h/{}", pruefstand_core::root::HOME_ROOT);
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        if line.starts_with("Documentation=") {
            out.push_str("Documentation=man:pruefstand-daemon(1) man:pruefstand(1)\n");
        } else {
            out.push_str(&line.replace("@PRUEFSTAND_BIN@", PACKAGED_BIN).replace("@PRUEFSTAND_ROOT@", &root));
        }
    }
    out
}

/// A unit's text with the binary and root filled in, escaped for where they stand: a
/// quoted word in `ExecStart=` (systemd would split a path at a space and expand `%h`),
/// a percent-encoded URL in `Documentation=`.
pub(super) fn render(text: &str, bin: &std::path::Path, root: &std::path::Path) -> anyhow::Result<String> {
    let (bin, root) = (path_text(bin)?, path_text(root)?);
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (bin, root) = if line.starts_with("Documentation=") {
            (url_path(&bin), url_path(&root))
        } else {
            (exec_word(&bin, true), exec_word(&root, false))
        };
        out.push_str(&line.replace("@PRUEFSTAND_BIN@", &bin).replace("@PRUEFSTAND_ROOT@", &root));
    }
    Ok(out)
}

fn path_text(path: &std::path::Path) -> anyhow::Result<String> {
    let text =
        path.to_str().with_context(|| format!("{} is not UTF-8: systemd units cannot name it", path.display()))?;
    anyhow::ensure!(!text.contains(['\n', '\r']), "{text:?} holds a line break: systemd units cannot name it");
    Ok(text.to_string())
}

/// One word of a systemd command line: quoted, with `\` and `"` escaped, `%` doubled
/// (specifiers are expanded inside quotes too) and, in an argument, `$` doubled
/// (variables are expanded in arguments, not in the command's path).
fn exec_word(text: &str, command: bool) -> String {
    let mut word = String::from("\"");
    for c in text.chars() {
        match c {
            '\\' | '"' => {
                word.push('\\');
                word.push(c);
            }
            '%' => word.push_str("%%"),
            '$' if !command => word.push_str("$$"),
            _ => word.push(c),
        }
    }
    word.push('"');
    word
}

/// A path inside a `file://` URL: percent-encoded, then `%` doubled for systemd.
fn url_path(text: &str) -> String {
    let mut url = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"/-._~".contains(&byte) {
            url.push(byte as char);
        } else {
            url.push_str(&format!("%%{byte:02X}"));
        }
    }
    url
}

pub(crate) fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    if args.packaged {
        let dir = args.dir.context("--packaged needs --dir")?;
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, text) in UNITS {
            let path = dir.join(name);
            pruefstand_core::util::write_atomic(&path, render_packaged(text).as_bytes())?;
            outln!("{}", path.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let root = Root::find(root)?;
    let bin = std::env::current_exe().and_then(|p| p.canonicalize()).context("finding this binary")?;
    let dir = match args.dir {
        Some(dir) => dir,
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".config/systemd/user"),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, text) in UNITS {
        let path = dir.join(name);
        pruefstand_core::util::write_atomic(&path, render(text, &bin, &root.path)?.as_bytes())?;
        outln!("{}", path.display());
    }
    tracing::info!(
        "next:\n  systemctl --user daemon-reload\n  systemctl --user enable --now pruefstand.service\n  systemctl --user enable --now pruefstand-voll@kandidat.timer   # nightly voll of a version\n  loginctl enable-linger $USER   # run without a login session"
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_quoted_and_escaped_for_systemd() {
        assert_eq!(exec_word("/srv/my root %h/$X\\\"", false), "\"/srv/my root %%h/$$X\\\\\\\"\"");
        assert_eq!(exec_word("/srv/$X/bin", true), "\"/srv/$X/bin\"");
        assert_eq!(url_path("/srv/my root%"), "/srv/my%%20root%%25");
        let text = "Documentation=file://@PRUEFSTAND_ROOT@/README.md\nExecStart=@PRUEFSTAND_BIN@ --root @PRUEFSTAND_ROOT@ daemon\n";
        let unit = render(text, std::path::Path::new("/b in/p"), std::path::Path::new("/r %h")).unwrap();
        assert_eq!(
            unit,
            "Documentation=file:///r%%20%%25h/README.md\nExecStart=\"/b in/p\" --root \"/r %%h\" daemon\n"
        );
        assert!(render(text, std::path::Path::new("/b"), std::path::Path::new("/r\nx")).is_err());
    }

    #[test]
    fn packaged_units_run_the_installed_binary_on_the_home_root() {
        for (name, text) in UNITS {
            let unit = render_packaged(text);
            assert!(!unit.contains("@PRUEFSTAND_"), "{name} keeps a placeholder:\n{unit}");
            for line in unit.lines().filter(|l| l.starts_with("ExecStart=")) {
                assert!(line.starts_with("ExecStart=/usr/bin/pruefstand --root %h/pruefstand "), "{name}: {line}");
            }
        }
        let service = render_packaged(UNITS[0].1);
        assert!(service.contains("\nDocumentation=man:pruefstand-daemon(1) man:pruefstand(1)\n"), "{service}");
        assert!(service.contains("ExecStart=/usr/bin/pruefstand --root %h/pruefstand daemon\n"), "{service}");
    }
}
