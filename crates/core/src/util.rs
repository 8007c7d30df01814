//! Small shared helpers: exit codes, durable file writes, hashing, per-run keys, sizes,
//! child processes' environment, how a moment is shown. Reading what people write
//! (configuration files, names) is [`crate::input`]'s.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, anyhow};
use sha2::{Digest, Sha256};

/// Exit codes of `run` (and `start --wait`), documented in the README.
pub const EXIT_APPROVED: u8 = 0;
pub const EXIT_REJECTED: u8 = 10;
pub const EXIT_INCONCLUSIVE: u8 = 11;
pub const EXIT_INVALID: u8 = 12;
/// Bad input, missing tools, a run that could not be carried out.
pub const EXIT_COULD_NOT_RUN: u8 = 2;

/// How an operation failed, for the callers that act differently on each: the daemon
/// waits out a full disk instead of failing the job, `run` says how to resume an
/// interrupted run. Sorted once, where the error is made ([`Failure::of`]); callers
/// match on it. `{}` shows the top message, `{:#}` the whole chain, and `?` turns it into
/// an `anyhow::Error` that keeps the chain.
#[derive(Debug)]
pub enum Failure {
    /// No room left: ENOSPC or EDQUOT somewhere in the cause. Worth retrying once
    /// there is space.
    DiskFull(anyhow::Error),
    /// A run its control stopped (Ctrl-C, SIGTERM, a cancel) after its directory was
    /// claimed: the finished cases are kept in `run_dir`, the directory to resume —
    /// the candidate's, also when the stop came during its reference's run. `cause`
    /// says where it stopped.
    Interrupted { run_dir: std::path::PathBuf, cause: anyhow::Error },
    /// Anything else.
    Other(anyhow::Error),
}

impl Failure {
    /// `err` sorted by its cause: a full disk when an I/O error in its chain says so,
    /// otherwise [`Failure::Other`].
    pub fn of(err: anyhow::Error) -> Failure {
        let disk_full = err.chain().any(|cause| {
            cause
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::raw_os_error)
                .is_some_and(|code| code == nix::libc::ENOSPC || code == nix::libc::EDQUOT)
        });
        if disk_full { Failure::DiskFull(err) } else { Failure::Other(err) }
    }

    /// The error underneath, whichever kind.
    pub fn cause(&self) -> &anyhow::Error {
        match self {
            Failure::DiskFull(cause) | Failure::Interrupted { cause, .. } | Failure::Other(cause) => cause,
        }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Failure {
        Failure::of(err)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if f.alternate() { write!(f, "{:#}", self.cause()) } else { write!(f, "{}", self.cause()) }
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause().source()
    }
}

/// Writes a file so that a crash leaves either the old or the new content: write to a
/// temporary file beside it, fsync, rename, fsync the folder.
pub fn write_atomic(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    crate::blocking::assert_may_block("util::write_atomic (two fsyncs)");
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).with_context(|| format!("writing into {}", dir.display()))?;
    tmp.write_all(contents)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).with_context(|| format!("replacing {}", path.display()))?;
    if let Ok(dir) = std::fs::File::open(dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

pub fn write_json_atomic<T: serde::Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    let mut text = serde_json::to_vec_pretty(value)?;
    text.push(b'\n');
    write_atomic(path, &text)
}

/// A rate as a percentage with one decimal: `0.123` → `12.3 %` (reports, reasons,
/// Markdown, chat).
/// For `skip_serializing_if`: a count that is zero is left out, so files written before
/// the count existed stay byte-equal.
pub fn is_zero(n: &u64) -> bool {
    *n == 0
}

pub fn pct(p: f64) -> String {
    format!("{:.1} %", 100.0 * p)
}

/// Lower-case alphanumerics only: survives YAML folding, quoting and escaping of
/// punctuation, which is how goals and injected wording reach a model inside tool
/// outputs (the simulated model matches them so).
pub fn alnum_norm(s: &str) -> String {
    s.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// HMAC-SHA256 (RFC 2104) of `message` under `key`, hex: an identity of a secret that
/// no one without the key can test guesses against.
pub(crate) fn hmac_sha256_hex(key: &[u8], message: &[u8]) -> String {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|k| k ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new().chain_update(pad(0x36)).chain_update(message).finalize();
    hex::encode(Sha256::new().chain_update(pad(0x5c)).chain_update(inner).finalize())
}

/// Text from elsewhere (a server's model ids) made safe for a terminal: every control
/// character (ESC of an ANSI sequence, BEL, C1, a newline) shown as its `\u{..}` escape,
/// bidi overrides too, so nothing a server sends can move the cursor or recolour lines.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            c if c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c) || ('\u{2066}'..='\u{2069}').contains(&c) => {
                c.escape_unicode().to_string()
            }
            c => c.to_string(),
        })
        .collect()
}

/// A random per-run API key.
pub fn new_api_key() -> String {
    use rand::RngExt;
    let bytes: [u8; 24] = rand::rng().random();
    format!("pfs-{}", hex::encode(bytes))
}

/// "16g", "512m", "1024k", "65536" → bytes.
pub fn parse_bytes(s: &str) -> anyhow::Result<i64> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix('b').unwrap_or(&t);
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1i64 << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: i64 = num.trim().parse().map_err(|_| anyhow!("{s:?} is not a size (e.g. \"16g\", \"512m\")"))?;
    n.checked_mul(mult).filter(|v| *v > 0).ok_or_else(|| anyhow!("{s:?} is not a positive size"))
}

/// Makes the child die with us: the kernel sends it SIGKILL when the thread that spawned
/// it ends (`PR_SET_PDEATHSIG`), so a `kill -9` of pruefstand leaves no gym behind. The
/// spawning thread must outlive the child, which every caller's wait guarantees.
pub fn die_with_parent(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = nix::unistd::getpid();
    // SAFETY: prctl, getppid and raise are async-signal-safe system calls.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(std::io::Error::from)?;
            // The parent may have died between the fork and the prctl.
            if nix::unistd::getppid() != parent {
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            }
            Ok(())
        });
    }
}

/// What a child of pruefstand inherits from its environment: locale, paths, terminal
/// and log settings — never the rest, which may hold secrets a child must not see (a
/// webhook's `url_env`, a token). Whatever a child needs beyond this is given to it
/// explicitly.
const INHERITED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TZ",
    "TMPDIR",
    "TERM",
    "NO_COLOR",
    "JOURNAL_STREAM",
    "PRUEFSTAND_LOG",
    "RUST_BACKTRACE",
];

/// Clears `command`'s environment down to [`INHERITED`].
pub fn minimal_env(command: &mut std::process::Command) {
    command.env_clear();
    for name in INHERITED {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
}

/// `text` cut to `max` characters, the cut marked with `…`: a name someone typed is
/// echoed in messages and tables, and a 10,000-character one must not fill them.
pub fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max.saturating_sub(1)) {
        Some((at, _)) if text.chars().count() > max => format!("{}…", &text[..at]),
        _ => text.to_string(),
    }
}

/// A mutex's guard, the one way every lock of pruefstand is taken: a thread that
/// panicked while holding it left the data at a consistent step (each holder changes it
/// in one go), so the guard is taken all the same instead of spreading the panic to
/// every later user.
pub fn lock<T: ?Sized>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Nearest-rank percentile (no interpolation: a budget is about actual cases).
pub fn percentile(mut xs: Vec<f64>, q: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    Some(xs[rank - 1])
}

/// The one way a command shows a moment (`status`, `queue`, `log`): local time to the
/// second, `2026-03-04 15:06:07`. What is stored stays RFC 3339 in UTC.
pub(crate) fn local_datetime<Tz: chrono::TimeZone>(at: &chrono::DateTime<Tz>) -> String {
    at.with_timezone(&chrono::Local).format("%Y-%m-%d %H:%M:%S").to_string()
}

/// A stored RFC 3339 time as [`local_datetime`] shows it; the text itself when it is not
/// one.
pub fn local_time(rfc3339: &str) -> String {
    chrono::DateTime::parse_from_rfc3339(rfc3339).map_or_else(|_| rfc3339.to_string(), |t| local_datetime(&t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_shows_control_characters_as_escapes() {
        assert_eq!(printable("m\u{1b}[31mred\u{7}\u{202e}"), "m\\u{1b}[31mred\\u{7}\\u{202e}");
        assert_eq!(printable("Qwen/Qwen3-8B"), "Qwen/Qwen3-8B");
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // RFC 4231, test cases 2 and 6 (a key longer than a block).
        assert_eq!(
            hmac_sha256_hex(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hmac_sha256_hex(&[0xaa; 131], b"Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn a_full_disk_is_told_from_other_failures_through_any_context() {
        let enospc = anyhow::Error::new(std::io::Error::from_raw_os_error(nix::libc::ENOSPC))
            .context("writing cases.jsonl")
            .context("recording case 7");
        let failure = Failure::of(enospc);
        assert!(matches!(failure, Failure::DiskFull(_)), "{failure:?}");
        assert!(format!("{failure:#}").starts_with("recording case 7: writing cases.jsonl: "), "{failure:#}");
        assert_eq!(failure.to_string(), "recording case 7");
        // Back through `?` into anyhow, the chain (and so the kind) survives.
        let again: anyhow::Error = failure.into();
        assert!(matches!(Failure::of(again), Failure::DiskFull(_)));
        let denied = anyhow::Error::new(std::io::Error::from_raw_os_error(nix::libc::EACCES)).context("writing");
        assert!(matches!(Failure::of(denied), Failure::Other(_)));
        assert!(matches!(Failure::of(anyhow!("no such version")), Failure::Other(_)));
    }

    #[test]
    fn cut_keeps_short_text_and_marks_a_cut() {
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("abcd", 3), "ab…");
        assert_eq!(cut("äöüß", 2), "ä…");
        assert_eq!(cut(&"x".repeat(10_000), 40).chars().count(), 40);
    }

    #[test]
    fn a_child_gets_only_the_inherited_variables() {
        // SAFETY: this test process sets a variable no other test reads.
        unsafe { std::env::set_var("PRUEFSTAND_TEST_SECRET_XYZ", "s3cret") };
        let mut command = std::process::Command::new("/usr/bin/env");
        minimal_env(&mut command);
        command.env("GIVEN", "1");
        let out = String::from_utf8(command.output().unwrap().stdout).unwrap();
        assert!(!out.contains("s3cret"), "{out}");
        assert!(
            out.contains("GIVEN=1")
                && out.lines().all(|l| INHERITED.iter().any(|n| l.starts_with(&format!("{n}="))) || l == "GIVEN=1"),
            "{out}"
        );
    }

    #[test]
    fn atomic_write_replaces_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/a.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        assert_eq!(std::fs::read_dir(path.parent().unwrap()).unwrap().count(), 1, "no temporary file left");
    }

    #[test]
    fn times_are_shown_local_to_the_second() {
        let shown = local_time("2026-01-02T03:04:05.123456789Z");
        let expected = chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z").unwrap();
        assert_eq!(shown, expected.with_timezone(&chrono::Local).format("%Y-%m-%d %H:%M:%S").to_string());
        assert_eq!(shown.len(), "2026-01-02 03:04:05".len());
        assert_eq!(local_time("yesterday"), "yesterday");
    }

    #[test]
    fn sha256_of_empty_input() {
        assert_eq!(sha256_hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
