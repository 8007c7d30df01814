//! The one console: every message and every progress report of the process goes through
//! here, so a terminal, a log file and the journal each get what suits them.
//!
//! - Library code never prints. It emits `tracing` events (`info!` for what a user wants
//!   to follow, `warn!`/`error!` for trouble) and reports case progress through a
//!   [`Progress`].
//! - A command on a terminal shows an indicatif bar; messages are printed above it, so
//!   the bar is never torn. Without a terminal (a pipe, CI, a timer's log) the same
//!   progress comes as a plain line every tenth of the plan.
//! - The daemon's events carry the job they belong to (`[job=12]`, from the span the
//!   daemon opens per job). Under systemd (`JOURNAL_STREAM` set) each line starts with
//!   its syslog priority (`<4>` for a warning), which journald turns into the entry's
//!   priority: `journalctl --user -u pruefstand -p warning` filters.
//! - While the daemon runs a job it registers the job's own log file ([`job_log`]):
//!   every event inside that job's span is appended there too, so `pruefstand log <job>`
//!   shows one job's lines without the daemon's others.
//! - Results go to stdout through [`out`] (the `outln!` macro). A closed stdout
//!   (`pruefstand queue | head -1`) ends the process quietly with status 0, as ripgrep
//!   does, instead of a panic.
//!
//! - A command hint is written `` `pruefstand …` `` in backticks. When `pruefstand` is
//!   not what runs this binary — run by its path or by `cargo run`, not found on
//!   `PATH` — the console says the command the user can run instead (`cargo run
//!   --release --` in the checkout it was built in, else the binary's path): see
//!   [`as_run`]. A process described as `` `pruefstand run x`, pid N `` (a lock's
//!   holder) is left as it was named.
//!
//! Not here: what a message says (the caller's), the daemon's status file (`daemon`).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pruefstand_core::eta::Eta;
use pruefstand_core::util;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Who reads the process's stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Audience {
    /// A person at a terminal or a script: `warning: …` lines and a progress bar.
    Command,
    /// The daemon's log (the journal under systemd): a level and the job on every line.
    Daemon,
    /// `pruefstand agent`: stderr lands in the gym's log; warnings only by default.
    Agent,
}

/// Whether hints are said as the user can run them ([`as_run`]): not for the agent,
/// whose output is a protocol, nor for pages generated from the command line.
static HINTS_AS_RUN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Output that must stay as written whatever runs the binary (`man`, `completions`:
/// what a package ships): hints are not rewritten.
pub(crate) fn verbatim() {
    HINTS_AS_RUN.store(false, std::sync::atomic::Ordering::Relaxed);
}

/// The command that runs this binary, when it is not `pruefstand` on `PATH`: in the
/// cargo checkout it was built in (the working directory inside it), `cargo run
/// [--release] --`; else the binary's own path, shell-quoted. None: `pruefstand` is
/// the name to use.
fn invocation() -> Option<&'static str> {
    static INVOCATION: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    INVOCATION
        .get_or_init(|| {
            let exe = std::env::current_exe().ok()?.canonicalize().ok()?;
            let on_path = std::env::var_os("PATH").is_some_and(|path| {
                std::env::split_paths(&path)
                    .any(|dir| dir.join("pruefstand").canonicalize().is_ok_and(|found| found == exe))
            });
            if on_path {
                return None;
            }
            Some(cargo_run(&exe).unwrap_or_else(|| {
                let path = exe.to_string_lossy().into_owned();
                shlex::try_quote(&path).map_or(path.clone(), |q| q.into_owned())
            }))
        })
        .as_deref()
}

/// `cargo run --release --` (or `cargo run --` for a debug build) when `exe` is
/// `<checkout>/target/<profile>/pruefstand` and the working directory lies in that
/// checkout, where cargo finds its Cargo.toml.
fn cargo_run(exe: &std::path::Path) -> Option<String> {
    let profile_dir = exe.parent()?;
    let target = profile_dir.parent()?;
    let checkout = target.parent()?;
    if target.file_name()? != "target" || !checkout.join("Cargo.toml").is_file() {
        return None;
    }
    let cwd = std::env::current_dir().ok()?.canonicalize().ok()?;
    if !cwd.starts_with(checkout) {
        return None;
    }
    Some(match profile_dir.file_name()?.to_str()? {
        "release" => "cargo run --release --".to_string(),
        "debug" => "cargo run --".to_string(),
        other => format!("cargo run --profile {other} --"),
    })
}

/// `text` with each command hint `` `pruefstand …` `` said as the user can run it
/// ([`invocation`]); unchanged where `pruefstand` is on `PATH`, for the agent and for
/// [`verbatim`] output. A hint naming a process (`` `pruefstand run x`, pid 7 ``) is
/// left alone: it says what ran, not what to type.
fn as_run(text: &str) -> std::borrow::Cow<'_, str> {
    let wanted = HINTS_AS_RUN.load(std::sync::atomic::Ordering::Relaxed) && text.contains("pruefstand ");
    match invocation().filter(|_| wanted) {
        Some(invocation) => std::borrow::Cow::Owned(said_as(text, invocation)),
        None => std::borrow::Cow::Borrowed(text),
    }
}

/// [`as_run`]'s rewrite with `invocation` for `pruefstand`.
fn said_as(text: &str, invocation: &str) -> String {
    const NAME: &str = "pruefstand ";
    let mut said = String::with_capacity(text.len() + 32);
    let mut rest = text;
    // A hint opens with a backtick, maybe `nohup ` before the name.
    let next = |rest: &str| {
        ["`", "`nohup "].iter().filter_map(|open| Some((rest.find(&format!("{open}{NAME}"))?, open.len()))).min()
    };
    while let Some((at, open)) = next(rest) {
        said.push_str(&rest[..at + open]);
        let after = &rest[at + open + NAME.len()..];
        let a_process = after.find('`').is_some_and(|end| after[end + 1..].starts_with(", pid "));
        if a_process {
            said.push_str(NAME);
        } else {
            said.push_str(invocation);
            said.push(' ');
        }
        rest = after;
    }
    said.push_str(rest);
    said
}

/// Installs the process's one subscriber. `PRUEFSTAND_LOG` (an `EnvFilter`) overrides
/// the audience's default.
pub(crate) fn init(audience: Audience) {
    HINTS_AS_RUN.store(audience != Audience::Agent, std::sync::atomic::Ordering::Relaxed);
    let default = match audience {
        Audience::Command | Audience::Daemon => "warn,pruefstand=info",
        Audience::Agent => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("PRUEFSTAND_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let format = Lines { audience, journal: audience == Audience::Daemon && under_journald() };
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| Stderr)
        .with_ansi(false)
        .event_format(format)
        .finish()
        .with(JobLogs);
    // try_init, not set_global_default: it also forwards the `log` crate's records.
    let _ = subscriber.try_init();
}

/// The open log file of each job the daemon runs now.
static JOB_LOGS: Mutex<BTreeMap<u64, File>> = Mutex::new(BTreeMap::new());

/// A registered job log; unregistered (and closed) on drop.
pub(crate) struct JobLog(u64);

impl Drop for JobLog {
    fn drop(&mut self) {
        util::lock(&JOB_LOGS).remove(&self.0);
    }
}

/// Appends every event inside the span `job` with `job = id` to `file` until the
/// returned guard is dropped.
pub(crate) fn job_log(id: u64, file: File) -> JobLog {
    util::lock(&JOB_LOGS).insert(id, file);
    JobLog(id)
}

/// The job id a `job` span carries, kept in the span's extensions.
struct JobId(u64);

/// The layer behind [`job_log`].
struct JobLogs;

impl<S> tracing_subscriber::Layer<S> for JobLogs
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if attrs.metadata().name() != "job" {
            return;
        }
        let mut found = FieldText::default();
        attrs.record(&mut found);
        if let (Some(job), Some(span)) = (found.job, ctx.span(id)) {
            span.extensions_mut().insert(JobId(job));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        let mut logs = util::lock(&JOB_LOGS);
        if logs.is_empty() {
            return;
        }
        let Some(job) = ctx
            .event_scope(event)
            .and_then(|scope| scope.from_root().find_map(|span| span.extensions().get::<JobId>().map(|id| id.0)))
        else {
            return;
        };
        let Some(file) = logs.get_mut(&job) else { return };
        let mut text = FieldText::default();
        event.record(&mut text);
        let time = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ");
        // One write per line, so a reader (`log --follow`) never sees half of one. A full
        // disk must not end the job over its log; the daemon's stderr has it too.
        let line = format!("{time} {:>5} {}\n", event.metadata().level(), text.text);
        let _ = file.write_all(line.as_bytes());
    }
}

/// An event's message and fields as one line (`message k=v …`), and a `job` field's value.
#[derive(Default)]
struct FieldText {
    text: String,
    job: Option<u64>,
}

impl tracing::field::Visit for FieldText {
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        if field.name() == "job" {
            self.job = Some(value);
        }
        self.record_debug(field, &value);
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        if !self.text.is_empty() {
            self.text.push(' ');
        }
        let _ = match field.name() {
            "message" => write!(self.text, "{value:?}"),
            name => write!(self.text, "{name}={value:?}"),
        };
    }
}

/// systemd connects a service's stderr to the journal and says so in `JOURNAL_STREAM`.
fn under_journald() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some()
}

/// The syslog priority journald reads from a `<N>` line prefix (sd-daemon(3)).
fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// One line per event: `[<N>][time LEVEL ][[span fields] ]message`.
struct Lines {
    audience: Audience,
    journal: bool,
}

impl<S, N> FormatEvent<S, N> for Lines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> std::fmt::Result {
        let level = *event.metadata().level();
        match (self.audience, self.journal) {
            (Audience::Daemon, true) => write!(writer, "<{}>", priority(level))?,
            (Audience::Daemon, false) | (Audience::Agent, _) => {
                write!(writer, "{} {level:>5} ", chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ"))?
            }
            (Audience::Command, _) => match level {
                Level::ERROR => write!(writer, "error: ")?,
                Level::WARN => write!(writer, "warning: ")?,
                Level::INFO => {}
                _ => write!(writer, "{}: ", level.as_str().to_ascii_lowercase())?,
            },
        }
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                if let Some(fields) = extensions.get::<FormattedFields<N>>()
                    && !fields.is_empty()
                {
                    write!(writer, "[{fields}] ")?;
                }
            }
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// The progress bar on screen, if any: messages are printed above it.
static BAR: Mutex<Option<indicatif::ProgressBar>> = Mutex::new(None);

fn bar() -> Option<indicatif::ProgressBar> {
    util::lock(&BAR).clone()
}

/// stderr, around the bar. Write errors are swallowed: a closed stderr must not end a
/// run (tracing does not panic on them either).
struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // tracing hands over one whole line at a time.
        let said = std::str::from_utf8(buf).map(as_run);
        let bytes = said.as_ref().map_or(buf, |text| text.as_bytes());
        let write = || {
            let _ = std::io::stderr().write_all(bytes);
        };
        match bar() {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Writes a command's result to stdout. A closed stdout (the reader went away) ends the
/// process quietly with status 0; any other write error is reported and ends it with 2.
pub(crate) fn out(args: std::fmt::Arguments<'_>) {
    let text = args.as_str().map_or_else(|| args.to_string(), str::to_string);
    let text = as_run(&text);
    let mut stdout = std::io::stdout().lock();
    let written = stdout.write_all(text.as_bytes()).and_then(|()| stdout.write_all(b"\n"));
    if let Err(err) = written.and_then(|()| stdout.flush()) {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        tracing::error!("writing to stdout: {err}");
        std::process::exit(i32::from(pruefstand_core::util::EXIT_COULD_NOT_RUN));
    }
}

/// `println!` for a command's results, through [`out`].
#[macro_export]
macro_rules! outln {
    () => { $crate::console::out(format_args!("")) };
    ($($arg:tt)*) => { $crate::console::out(format_args!($($arg)*)) };
}

/// Cases done of a plan, with an ETA: a bar on a terminal, else an `info` line every
/// tenth of the plan (which in the daemon carries the job's span).
pub(crate) struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: usize,
    done: usize,
    errors: usize,
    in_flight: usize,
    run_this_time: usize,
    last_line: usize,
    eta: Eta,
    /// A plain progress line waiting for the finished case's slot to be refilled: said
    /// at the record, it would count that slot as empty while cases remain.
    line_due: bool,
    /// A later pass of one run (an attacker campaign's round): its start line is
    /// debug, as the run's first pass said it and the campaign says each round.
    continuing: bool,
}

impl Progress {
    /// A bar only for a command whose stderr is a terminal.
    pub(crate) fn new(total: usize) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} cases  {msg}",
                )
                .expect("valid template"),
            );
            bar.enable_steady_tick(Duration::from_millis(250));
            *util::lock(&BAR) = Some(bar.clone());
            bar
        });
        Progress {
            bar,
            total,
            done: 0,
            errors: 0,
            in_flight: 0,
            run_this_time: 0,
            last_line: 0,
            eta: Eta::new(Instant::now()),
            line_due: false,
            continuing: false,
        }
    }

    /// For a later pass of a run whose first pass had its own progress (a campaign's
    /// round): what it starts with is not said again at `info`.
    pub(crate) fn continuing(mut self) -> Progress {
        self.continuing = true;
        self
    }

    /// The plan's size and what is already recorded (a resumed run).
    /// `jobs`: cases in flight to begin with, on `processes` gym workers.
    pub(crate) fn start(&mut self, total: usize, to_run: usize, jobs: usize, processes: usize) {
        self.total = total;
        self.done = total - to_run;
        self.last_line = self.done;
        // The first `jobs` cases start, and mostly finish, together.
        self.eta = Eta::new(Instant::now());
        self.eta.observe(0, jobs, Instant::now());
        if let Some(bar) = &self.bar {
            bar.set_length(total as u64);
            bar.set_position(self.done as u64);
        }
        let resumed = if self.done > 0 { format!(", {} already recorded", self.done) } else { String::new() };
        let line = format!(
            "{to_run} of {total} cases to run, {jobs} in flight at first on {processes} gym processes{resumed}"
        );
        if self.continuing {
            tracing::debug!("{line}");
        } else {
            tracing::info!("{line}");
        }
    }

    /// Cases running now (shown on the bar; in the plain progress lines).
    pub(crate) fn in_flight(&mut self, n: usize) {
        self.in_flight = n;
        self.eta.observe(self.run_this_time, n, Instant::now());
        self.show_message();
    }

    /// A case started, `n` in flight now: a line held for the refill is said.
    pub(crate) fn case_started(&mut self, n: usize) {
        self.in_flight(n);
        if self.line_due {
            self.line();
        }
    }

    fn line(&mut self) {
        self.line_due = false;
        tracing::info!(
            "progress: {}/{} cases, {} in flight, {} errors, {}",
            self.done,
            self.total,
            self.in_flight,
            self.errors,
            self.eta()
        );
    }

    fn show_message(&self) {
        if let Some(bar) = &self.bar {
            let errors = if self.errors > 0 { format!(", {} errors", self.errors) } else { String::new() };
            bar.set_message(format!("{}  {} in flight{errors}", self.eta(), self.in_flight));
        }
    }

    pub(crate) fn case_done(&mut self, errored: bool) {
        self.done += 1;
        self.run_this_time += 1;
        self.eta.observe(self.run_this_time, self.in_flight, Instant::now());
        if errored {
            self.errors += 1;
        }
        match &self.bar {
            Some(bar) => {
                bar.set_position(self.done as u64);
                self.show_message();
            }
            None => {
                let step = (self.total / 10).max(1);
                if self.done - self.last_line >= step || self.done == self.total {
                    self.last_line = self.done;
                    // With cases still to start, the next start refills the slot this
                    // one left: the line waits for it (a later line due replaces it; a
                    // drain's is said when the progress ends).
                    let unstarted = self.total.saturating_sub(self.done + self.in_flight);
                    if unstarted > 0 {
                        self.line_due = true;
                    } else {
                        self.line();
                    }
                }
            }
        }
    }
}

impl Progress {
    /// `ETA 42 s`, or `ETA estimating` while the rate would mislead.
    fn eta(&self) -> String {
        eta_text(self.eta.remaining_s(self.total - self.done, Instant::now()))
    }
}

fn eta_text(seconds: Option<f64>) -> String {
    match seconds {
        Some(s) => format!("ETA {s:.0} s"),
        None => "ETA estimating".into(),
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if self.line_due {
            self.line();
        }
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
            *util::lock(&BAR) = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_are_said_as_run_and_a_process_as_it_was_named() {
        let text = "start one: `pruefstand daemon` or `systemctl --user start pruefstand`; \
                    held by `pruefstand run kandidat`, pid 7; `pruefstand resume`; \
                    `nohup pruefstand --root /r daemon >> daemon.log 2>&1 &`";
        assert_eq!(
            said_as(text, "cargo run --release --"),
            "start one: `cargo run --release -- daemon` or `systemctl --user start pruefstand`; \
             held by `pruefstand run kandidat`, pid 7; `cargo run --release -- resume`; \
             `nohup cargo run --release -- --root /r daemon >> daemon.log 2>&1 &`"
        );
        assert_eq!(said_as("no hint here", "x"), "no hint here");
    }

    #[test]
    fn journald_priorities_follow_syslog() {
        assert_eq!(priority(Level::ERROR), 3);
        assert_eq!(priority(Level::WARN), 4);
        assert_eq!(priority(Level::INFO), 6);
        assert_eq!(priority(Level::DEBUG), 7);
    }

    #[test]
    fn a_job_log_gets_the_events_of_its_job_span_only() {
        use tracing_subscriber::layer::SubscriberExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let subscriber = tracing_subscriber::registry().with(JobLogs);
        tracing::subscriber::with_default(subscriber, || {
            let _log = job_log(41, File::create(&path).unwrap());
            tracing::info!("outside any job");
            tracing::info_span!("job", job = 42u64).in_scope(|| tracing::info!("another job's line"));
            tracing::info_span!("job", job = 41u64).in_scope(|| tracing::warn!(cases = 3, "the job's line"));
        });
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains(" WARN the job's line cases=3"), "{text}");
    }

    #[test]
    fn plain_progress_counts_a_resumed_run_from_what_is_recorded() {
        let mut progress = Progress::new(0); // cargo test: stderr is no terminal
        progress.start(20, 5, 4, 2);
        assert_eq!((progress.done, progress.total), (15, 20));
        progress.case_done(true);
        progress.case_done(false);
        assert_eq!((progress.done, progress.errors), (17, 1));
    }

    #[test]
    fn the_first_line_of_a_run_has_no_eta_yet() {
        let mut progress = Progress::new(0);
        progress.start(20, 20, 4, 1);
        progress.case_done(false);
        assert_eq!(progress.eta(), "ETA estimating", "the first line of a run");
    }
}
