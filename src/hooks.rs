//! Completion hooks, `[[hooks]]` in pruefstand.toml: chat webhooks (Slack, Mattermost,
//! Discord, Matrix, ntfy, plain JSON) and `exec` hooks (an argv array, no shell; the
//! run's facts in `PRUEFSTAND_*` variables), fired by the daemon when a job ends
//! (any verdict, `invalid` included) or fails.
//!
//! Each hook runs in its own background task with a timeout per attempt and retries
//! with exponential backoff. An exec hook runs in its own process group, killed whole
//! when its attempt times out. A job's notifications are written down in its folder
//! ([`LEDGER_FILE`]) before the first attempt and after each, so the daemon sends what a
//! stop left owed after its next start; every request carries the same idempotency key
//! (`<job>-<try>-<outcome>`: a restarted job's new result is news to a receiver that
//! drops duplicates), and each attempt is a line of the job's log. A notification whose
//! ledger is gone (`clean --force`) or replaced (`restart`, then the new try's end) is
//! superseded: its retries stop, and nothing of it is written again. Failures are logged and change nothing else: not the
//! verdict, not the queue, not the next job. Webhook URLs and tokens are secrets: logs
//! name a hook by its `name` and kind only, errors are stripped of URLs, and `Debug`
//! prints `***`.
//!
//! ```toml
//! [[hooks]]
//! name = "team"
//! kind = "slack"                  # slack | mattermost | discord | matrix | ntfy | json | exec
//! url_env = "PRUEFSTAND_SLACK"    # or url = "https://…" (http(s) only; then keep the file 0600)
//! on = ["rejected", "invalid", "failed"]   # default: every outcome
//! timeout_s = 10
//! retries = 3
//! backoff_s = 1.0
//!
//! [[hooks]]
//! name = "log"
//! kind = "exec"
//! argv = ["/usr/local/bin/bench-notify", "--channel", "ml"]
//! ```
//!
//! Matrix: `url` is the room's send endpoint
//! (`https://HS/_matrix/client/v3/rooms/ROOM/send/m.room.message`; a transaction id is
//! appended, so a retried message is not posted twice), `token` the access token. ntfy:
//! `url` is the topic URL; an optional `token` goes in as a bearer token.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::bail;
use serde::{Deserialize, Serialize};

use pruefstand_core::queue::Job;
use pruefstand_core::root::{CONFIG_FILE, Root};
use pruefstand_core::settings::url::SecretUrl;
use pruefstand_core::settings::{HookConfig, Kind, Secret};
use pruefstand_core::util;
use pruefstand_store::RunDir;

const OUTCOMES: [&str; 5] = ["approved", "rejected", "inconclusive", "invalid", "failed"];

/// Checks the `[[hooks]]` of the root's config as the daemon and `start` do: the first
/// of [`problems`] without the delivery checks.
pub(crate) fn validate(root: &Root) -> anyhow::Result<()> {
    match problems(root, false).into_iter().next() {
        Some(problem) => bail!("{problem}"),
        None => Ok(()),
    }
}

/// What is wrong with the `[[hooks]]`, one message each naming pruefstand.toml, the
/// line, the hook and the field. With `deliveries`, also what would fail every
/// delivery from this environment (`check`): an exec program not found on `PATH`, a
/// `url_env`/`token_env` not set, a URL in `url_env` that is not http(s).
pub(crate) fn problems(root: &Root, deliveries: bool) -> Vec<String> {
    let file = root.path.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    let mut found = Vec::new();
    for (index, hook) in root.config.hooks.iter().enumerate() {
        let mut bad = |key: &str, message: String| {
            let line = hook_key_line(&text, index, key).map(|l| format!(":{l}")).unwrap_or_default();
            found.push(format!("{}{line}: hook {:?}: {message}", file.display(), util::cut(&hook.name, 80)));
        };
        if hook.kind == Kind::Exec {
            match hook.argv.first() {
                None => bad("argv", "an exec hook needs argv = [\"program\", …]".into()),
                Some(program) if deliveries && !runnable(program) => {
                    bad("argv", format!("argv: program {program:?} is not found or not executable"))
                }
                Some(_) => {}
            }
        } else if hook.url.is_some() == hook.url_env.is_some() {
            bad("url", format!("a {} hook needs exactly one of url and url_env", hook.kind.as_str()));
        }
        if hook.kind == Kind::Matrix && hook.token.is_none() && hook.token_env.is_none() {
            bad("token", "a matrix hook needs token or token_env (the access token)".into());
        }
        // A job's owed notifications are kept by hook name: two of one name would share one.
        if root.config.hooks[..index].iter().any(|earlier| earlier.name == hook.name) {
            bad("name", "another hook above has this name; each hook needs its own".into());
        }
        if let Some(outcome) = hook.on.iter().flatten().find(|o| !OUTCOMES.contains(&o.as_str())) {
            bad("on", format!("on = {:?} is not one of {}", util::cut(outcome, 80), OUTCOMES.join(", ")));
        }
        if !deliveries {
            continue;
        }
        for (key, var) in [("url_env", &hook.url_env), ("token_env", &hook.token_env)] {
            let Some(var) = var else { continue };
            match std::env::var(var) {
                Err(_) => bad(key, format!("{key} names {var}, which is not set")),
                Ok(url) if key == "url_env" && SecretUrl::parse(&url).is_err() => {
                    bad(key, format!("{key}: {var} holds no http:// or https:// URL"))
                }
                Ok(_) => {}
            }
        }
    }
    found
}

/// Whether `program` can be started as `exec` starts it: a path, or a name on `PATH`.
fn runnable(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &Path| path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if program.contains('/') {
        return executable(Path::new(program));
    }
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| executable(&dir.join(program))))
}

/// The line (1-based) of `key` in the `index`-th `[[hooks]]` table of `text`; that
/// table's header when the key is not written there.
fn hook_key_line(text: &str, index: usize, key: &str) -> Option<usize> {
    let (mut seen, mut inside, mut header) = (0, false, None);
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if line.starts_with('[') {
            let name = line.strip_prefix("[[").and_then(|rest| rest.trim_start().strip_prefix("hooks"));
            let is_hook = name.is_some_and(|rest| rest.trim_start().starts_with("]]"));
            inside = is_hook && seen == index;
            if inside {
                header = Some(n + 1);
            }
            seen += usize::from(is_hook);
        } else if inside && line.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with('=')) {
            return Some(n + 1);
        }
    }
    header
}

/// A warning when pruefstand.toml holds webhook secrets and others can read it.
pub(crate) fn permission_warning(root: &Root) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let holds_secrets = root.config.hooks.iter().any(|h| h.url.is_some() || h.token.is_some());
    let path = root.path.join(CONFIG_FILE);
    let mode = std::fs::metadata(&path).ok()?.permissions().mode() & 0o777;
    (holds_secrets && mode & 0o044 != 0).then(|| {
        format!(
            "{} holds webhook URLs or tokens (secrets) and is readable by group or others (mode {mode:o}): chmod 600 it, or move them to url_env/token_env",
            path.display()
        )
    })
}

/// The facts a hook reports.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct Facts {
    /// approved | rejected | inconclusive | invalid | failed
    pub(crate) outcome: String,
    pub(crate) job: u64,
    /// The job's try that ended so (`queue`'s try, counting restarts); 0 in ledgers of
    /// older builds.
    #[serde(default, rename = "try")]
    pub(crate) try_number: u32,
    pub(crate) version: String,
    pub(crate) plan: String,
    pub(crate) verdict: Option<String>,
    /// The judgement's one line, or the error.
    pub(crate) summary: String,
    pub(crate) utility: Option<f64>,
    pub(crate) utility_under_attack: Option<f64>,
    /// The ASR of all attacks.
    pub(crate) asr: Option<f64>,
    /// The figure R2 judged, by its name (`held-out ASR` when the plan held families
    /// out): the judgement's `figures.decisive`.
    pub(crate) decisive: Option<pruefstand_judge::Decisive>,
    pub(crate) run_dir: Option<PathBuf>,
    pub(crate) report: Option<PathBuf>,
    pub(crate) error: Option<String>,
}

impl Facts {
    pub(crate) fn finished(
        job: &Job,
        run_dir: &Path,
        utility: Option<f64>,
        utility_under_attack: Option<f64>,
        asr: Option<f64>,
    ) -> Facts {
        let verdict = job.verdict.map(|v| v.as_str().to_string());
        let run = RunDir::new(run_dir);
        let report = [run.report_path(), run.judgement_markdown_path()].into_iter().find(|p| p.is_file());
        // A job failed at its verdict (its file damaged) keeps the verdict it reached.
        let failed = job.state == pruefstand_core::queue::State::Failed;
        Facts {
            outcome: verdict.clone().filter(|_| !failed).unwrap_or_else(|| "failed".into()),
            job: job.id,
            try_number: job.starts,
            version: job.version.clone(),
            plan: job.plan.clone(),
            verdict,
            summary: job.summary.clone().unwrap_or_default(),
            utility,
            utility_under_attack,
            asr,
            decisive: job.figures.as_ref().and_then(|h| h.decisive.as_deref().cloned()),
            run_dir: Some(run_dir.to_path_buf()),
            report,
            error: job.error.clone().filter(|_| failed),
        }
    }

    pub(crate) fn failed(job: &Job, error: &str) -> Facts {
        Facts {
            outcome: "failed".into(),
            job: job.id,
            try_number: job.starts,
            version: job.version.clone(),
            plan: job.plan.clone(),
            verdict: None,
            summary: error.lines().next().unwrap_or_default().to_string(),
            utility: None,
            utility_under_attack: None,
            asr: None,
            decisive: None,
            run_dir: job.run_dir.clone(),
            report: None,
            error: Some(error.to_string()),
        }
    }

    /// A few chat lines (Markdown-ish, fine for every chat kind): the outcome, the
    /// figure R2 judged, the other figures by their names (`judge::words`), the summary.
    pub(crate) fn message(&self) -> String {
        use pruefstand_core::words;
        let pct = |v: Option<f64>| v.map_or("–".to_string(), util::pct);
        let mut text = format!("pruefstand: {} on {} — {}", self.version, self.plan, self.outcome.to_uppercase());
        if let Some(d) = &self.decisive {
            text += &format!("\n{} judged: {}", d.rule, d.text);
        }
        if self.verdict.is_some() {
            text += &format!(
                "\n{} {} · {} {} · {} {}",
                words::ASR_ALL,
                pct(self.asr),
                words::UTILITY_CLEAN,
                pct(self.utility),
                words::UTILITY_UNDER_ATTACK,
                pct(self.utility_under_attack),
            );
        }
        if !self.summary.is_empty() {
            text += &format!("\n{}", self.summary);
        }
        if let Some(report) = self.report.as_ref().or(self.run_dir.as_ref()) {
            text += &format!("\nreport: {}", report.display());
        }
        text
    }

    /// The same on every attempt and across daemon restarts, for receivers that
    /// de-duplicate: the job, its try and its outcome — a `restart`ed job's new result
    /// comes under a new key.
    pub(crate) fn key(&self) -> String {
        match self.try_number {
            0 => format!("{}-{}", self.job, self.outcome),
            n => format!("{}-{n}-{}", self.job, self.outcome),
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        let opt = |v: Option<f64>| v.map(|v| format!("{v:.6}")).unwrap_or_default();
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
        [
            ("OUTCOME", self.outcome.clone()),
            ("JOB", self.job.to_string()),
            ("VERSION", self.version.clone()),
            ("PLAN", self.plan.clone()),
            ("VERDICT", self.verdict.clone().unwrap_or_default()),
            ("SUMMARY", self.summary.clone()),
            ("UTILITY", opt(self.utility)),
            ("UTILITY_UNDER_ATTACK", opt(self.utility_under_attack)),
            ("ASR", opt(self.asr)),
            ("DECISIVE", self.decisive.as_ref().map(|d| d.text.clone()).unwrap_or_default()),
            ("DECISIVE_NAME", self.decisive.as_ref().map(|d| d.name.clone()).unwrap_or_default()),
            ("DECISIVE_RATE", opt(self.decisive.as_ref().map(|d| d.rate))),
            ("RUN_DIR", path(&self.run_dir)),
            ("REPORT", path(&self.report)),
            ("ERROR", self.error.clone().unwrap_or_default()),
            ("IDEMPOTENCY_KEY", self.key()),
        ]
        .into_iter()
        .map(|(k, v)| (format!("PRUEFSTAND_{k}"), v))
        .collect()
    }
}

/// The file in a job's folder that holds its notifications and how far each got.
pub(crate) const LEDGER_FILE: &str = "notifications.json";

/// One job's notifications: written down before the first attempt and after each, so
/// a daemon that stops mid-retry sends what is still owed after its next start.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct Notifications {
    key: String,
    facts: Facts,
    hooks: Vec<Delivery>,
}

/// How far one hook's notification got.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct Delivery {
    hook: String,
    /// Attempts made so far, across restarts.
    attempts: u32,
    state: Standing,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Standing {
    Owed,
    Delivered,
    GivenUp,
}

/// A job's notifications in flight: [`LEDGER_FILE`] and the job's own log (`pruefstand
/// log`) in its folder, or neither (`dir` None).
pub(crate) struct Ledger {
    dir: Option<PathBuf>,
    notes: Mutex<Notifications>,
    /// Held while the file is written, so the hooks of one job, each saving on the
    /// blocking pool, write one after another and the last write holds the last state.
    saving: Mutex<()>,
    /// Whether the file holds this ledger (written by it, or read from it): from then on
    /// a file gone or of another key means it is superseded.
    written: std::sync::atomic::AtomicBool,
}

impl Ledger {
    /// The notifications of `facts` owed to each hook whose `on` takes its outcome, not
    /// yet written down; None when no hook takes it.
    pub(crate) fn new(dir: Option<PathBuf>, hooks: &[HookConfig], facts: Facts) -> Option<Arc<Ledger>> {
        let hooks: Vec<Delivery> = hooks
            .iter()
            .filter(|h| h.on.as_ref().is_none_or(|on| on.contains(&facts.outcome)))
            .map(|h| Delivery { hook: h.name.clone(), attempts: 0, state: Standing::Owed, last: None })
            .collect();
        (!hooks.is_empty()).then(|| {
            let notes = Mutex::new(Notifications { key: facts.key(), facts, hooks });
            Arc::new(Ledger { dir, notes, saving: Mutex::new(()), written: false.into() })
        })
    }

    /// The ledger a job's folder holds, if any.
    pub(crate) fn read(dir: &Path) -> anyhow::Result<Option<Arc<Ledger>>> {
        use anyhow::Context;
        let path = dir.join(LEDGER_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
        };
        let notes =
            serde_json::from_str(&text).with_context(|| format!("{}: not a notification ledger", path.display()))?;
        let saving = Mutex::new(());
        Ok(Some(Arc::new(Ledger {
            dir: Some(dir.to_path_buf()),
            notes: Mutex::new(notes),
            saving,
            written: true.into(),
        })))
    }

    /// Writes the ledger down (a whole-file atomic replace: blocking, an fsync) — never
    /// into a job folder that is gone (cleaned) or over a ledger that superseded it.
    pub(crate) fn save(&self) -> anyhow::Result<()> {
        use std::sync::atomic::Ordering;
        let Some(dir) = &self.dir else { return Ok(()) };
        let _saving = util::lock(&self.saving);
        if !dir.is_dir() || self.superseded() {
            return Ok(());
        }
        let notes = util::lock(&self.notes).clone();
        let mut bytes = serde_json::to_vec_pretty(&notes)?;
        bytes.push(b'\n');
        pruefstand_core::queue::write_private(&dir.join(LEDGER_FILE), &bytes)?;
        self.written.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Whether the job's folder no longer holds this ledger: removed (`clean --force`,
    /// `restart`) or replaced by a later try's. Never for a ledger not yet written (one
    /// that could not be written is sent all the same). Blocking (reads the file).
    fn superseded(&self) -> bool {
        let Some(dir) = &self.dir else { return false };
        if !self.written.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        let ours = util::lock(&self.notes).key.clone();
        let on_disk = std::fs::read(dir.join(LEDGER_FILE))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .and_then(|v| v["key"].as_str().map(str::to_string));
        on_disk.as_deref() != Some(ours.as_str())
    }

    pub(crate) fn job(&self) -> u64 {
        util::lock(&self.notes).facts.job
    }

    /// The hooks still owed, with the attempts made for each.
    pub(crate) fn owed(&self) -> Vec<(String, u32)> {
        let notes = util::lock(&self.notes);
        notes.hooks.iter().filter(|d| d.state == Standing::Owed).map(|d| (d.hook.clone(), d.attempts)).collect()
    }

    fn facts(&self) -> Facts {
        util::lock(&self.notes).facts.clone()
    }

    /// Records an attempt's end (or a hook's end without one, `attempted` false), the
    /// file written on the blocking pool.
    async fn record(self: &Arc<Self>, hook: &str, attempted: bool, state: Standing, last: Option<String>) {
        {
            let mut notes = util::lock(&self.notes);
            if let Some(delivery) = notes.hooks.iter_mut().find(|d| d.hook == hook) {
                delivery.attempts += u32::from(attempted);
                delivery.state = state;
                delivery.last = last;
            }
        }
        let ledger = self.clone();
        if let Err(err) = crate::runtime::blocking(move || ledger.save()).await {
            tracing::warn!("job {}: cannot write down its notifications: {err:#}", self.job());
        }
    }

    /// A line in the daemon's log and in the job's own, as `pruefstand log` shows it.
    pub(crate) fn say(&self, level: tracing::Level, text: &str) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        match level {
            tracing::Level::INFO => tracing::info!("{text}"),
            _ => tracing::warn!("{text}"),
        }
        let Some(dir) = &self.dir else { return };
        let line = format!("{} {level:>5} {text}\n", chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ"));
        // One write per line, like the job's other lines; a full disk costs the line only.
        if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(dir.join("log")) {
            let _ = file.write_all(line.as_bytes());
        }
    }
}

/// Sends what the ledger still owes, each hook concurrently; returns when all are
/// delivered or given up. A hook no longer in pruefstand.toml is given up.
pub(crate) async fn fire_all(hooks: Vec<HookConfig>, ledger: Arc<Ledger>) {
    let mut set = tokio::task::JoinSet::new();
    for (name, _) in ledger.owed() {
        match hooks.iter().find(|h| h.name == name) {
            Some(hook) => {
                set.spawn(fire(hook.clone(), ledger.clone()));
            }
            None => {
                let why = "no longer in pruefstand.toml";
                ledger.say(tracing::Level::WARN, &format!("hook {name:?}: not sent, {why} (job {})", ledger.job()));
                ledger.record(&name, false, Standing::GivenUp, Some(why.into())).await;
            }
        }
    }
    while set.join_next().await.is_some() {}
}

/// One hook, with retries counted across restarts. Logs by name and kind only.
async fn fire(hook: HookConfig, ledger: Arc<Ledger>) {
    let label = format!("hook {:?} ({})", hook.name, hook.kind.as_str());
    let facts = ledger.facts();
    let attempts = hook.retries + 1;
    let made = ledger.owed().into_iter().find(|(name, _)| *name == hook.name).map_or(0, |(_, made)| made);
    let say =
        |level, text: String| ledger.say(level, &format!("{label}: {text} (job {}, {})", facts.job, facts.outcome));
    use tracing::Level;
    if made >= attempts {
        say(Level::WARN, format!("gave up after {made} attempts"));
        return ledger.record(&hook.name, false, Standing::GivenUp, None).await;
    }
    for attempt in made + 1..=attempts {
        let checked = ledger.clone();
        if crate::runtime::blocking(move || checked.superseded()).await {
            say(Level::INFO, "not sent any more: superseded (the job was restarted or cleaned)".into());
            return;
        }
        let result = match tokio::time::timeout(Duration::from_secs_f64(hook.timeout_s), deliver(&hook, &facts)).await {
            Ok(result) => result,
            Err(_) => Err(Failure::Retry(format!("timed out after {} s", hook.timeout_s))),
        };
        match result {
            Ok(()) => {
                say(Level::INFO, format!("delivered (attempt {attempt}/{attempts})"));
                return ledger.record(&hook.name, true, Standing::Delivered, None).await;
            }
            Err(Failure::Final(why)) => {
                say(Level::WARN, format!("attempt {attempt}/{attempts} failed, not retried: {why}"));
                return ledger.record(&hook.name, true, Standing::GivenUp, Some(why)).await;
            }
            Err(Failure::Retry(why)) if attempt < attempts => {
                let wait = (hook.backoff_s * 2f64.powi(attempt as i32 - 1)).min(300.0);
                say(Level::WARN, format!("attempt {attempt}/{attempts} failed: {why}; retrying in {wait:.1} s"));
                ledger.record(&hook.name, true, Standing::Owed, Some(why)).await;
                tokio::time::sleep(Duration::from_secs_f64(wait)).await;
            }
            Err(Failure::Retry(why)) => {
                say(Level::WARN, format!("gave up after {attempts} attempts: {why}"));
                return ledger.record(&hook.name, true, Standing::GivenUp, Some(why)).await;
            }
        }
    }
}

enum Failure {
    /// Worth another try: network errors, 5xx, 429, a failing exec.
    Retry(String),
    /// A configuration problem (4xx, a missing variable): retrying cannot help.
    Final(String),
}

fn secret(
    hook: &HookConfig,
    value: &Option<Secret>,
    env: &Option<String>,
    what: &str,
) -> Result<Option<String>, Failure> {
    match (value, env) {
        (Some(secret), _) => Ok(Some(secret.expose().to_string())),
        (None, Some(var)) => std::env::var(var)
            .map(Some)
            .map_err(|_| Failure::Final(format!("{what}_env names {var}, which is not set"))),
        (None, None) if what == "url" => Err(Failure::Final(format!("hook {:?} has no url", hook.name))),
        (None, None) => Ok(None),
    }
}

async fn deliver(hook: &HookConfig, facts: &Facts) -> Result<(), Failure> {
    if hook.kind == Kind::Exec {
        return exec(hook, facts).await;
    }
    let url = secret(hook, &hook.url, &hook.url_env, "url")?.expect("url is required");
    let token = secret(hook, &hook.token, &hook.token_env, "token")?;
    let client = reqwest::Client::builder()
        .user_agent(concat!("pruefstand/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| Failure::Final(redact(&e.without_url().to_string(), &url)))?;
    let message = facts.message();
    let request = match hook.kind {
        Kind::Slack => client.post(&url).json(&serde_json::json!({ "text": message })),
        Kind::Mattermost => client.post(&url).json(&serde_json::json!({ "text": message, "username": "pruefstand" })),
        Kind::Discord => {
            let content: String = message.chars().take(2000).collect();
            client.post(&url).json(&serde_json::json!({ "content": content, "username": "pruefstand" }))
        }
        Kind::Matrix => {
            // Same transaction id on every retry: the homeserver posts it once; a new
            // try's result (its key) is a new transaction.
            let txn = format!(
                "pruefstand-{}-{}",
                facts.key(),
                pruefstand_core::util::sha256_hex(message.as_bytes()).get(..12).unwrap_or("")
            );
            let request = client
                .put(format!("{}/{txn}", url.trim_end_matches('/')))
                .json(&serde_json::json!({ "msgtype": "m.text", "body": message }));
            request.bearer_auth(token.clone().unwrap_or_default())
        }
        Kind::Ntfy => {
            let bad = matches!(facts.outcome.as_str(), "rejected" | "invalid" | "failed");
            let request = client
                .post(&url)
                .header("Title", format!("pruefstand: {} {}", facts.version, facts.outcome))
                .header("Tags", if bad { "x" } else { "white_check_mark" })
                .header("Priority", if bad { "high" } else { "default" })
                .body(message);
            match &token {
                Some(token) => request.bearer_auth(token),
                None => request,
            }
        }
        Kind::Json => client.post(&url).json(facts),
        Kind::Exec => unreachable!("handled above"),
    };
    let request = request.header("Idempotency-Key", facts.key());
    let response = request.send().await.map_err(|e| Failure::Retry(redact(&error_chain(e), &url)))?;
    let status = response.status();
    if status.is_success() {
        Ok(())
    } else if status.is_server_error() || status.as_u16() == 429 {
        Err(Failure::Retry(format!("HTTP {status}")))
    } else {
        Err(Failure::Final(format!("HTTP {status}")))
    }
}

async fn exec(hook: &HookConfig, facts: &Facts) -> Result<(), Failure> {
    use std::os::unix::process::CommandExt;
    // Only the verdict's facts: other hooks' secrets stay out of this one's environment.
    let mut command = std::process::Command::new(&hook.argv[0]);
    pruefstand_core::util::minimal_env(&mut command);
    command.args(&hook.argv[1..]).envs(facts.env()).stdin(std::process::Stdio::null());
    // Its own process group: a hook that times out is killed with everything it started.
    command.process_group(0);
    let mut command = tokio::process::Command::from(command);
    command.kill_on_drop(true);
    let mut child = command.spawn().map_err(|e| Failure::Final(format!("cannot start {}: {e}", hook.argv[0])))?;
    let group = child.id().map(|pid| GroupKill(pid as i32));
    let status = child.wait().await.map_err(|e| Failure::Retry(format!("waiting for {}: {e}", hook.argv[0])))?;
    // Ended by itself: what it left running in the background is its own business.
    std::mem::forget(group);
    if status.success() { Ok(()) } else { Err(Failure::Retry(format!("{} exited with {status}", hook.argv[0]))) }
}

/// Kills an exec hook's process group when its attempt is dropped unfinished (a
/// timeout, the daemon's exit): a hanging script's children go with it.
struct GroupKill(i32);

impl Drop for GroupKill {
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, killpg};
        let _ = killpg(nix::unistd::Pid::from_raw(self.0), Signal::SIGKILL);
    }
}

/// A reqwest error with its sources, without the URL.
fn error_chain(err: reqwest::Error) -> String {
    let err = err.without_url();
    let mut text = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        text += &format!(": {cause}");
        source = cause.source();
    }
    text
}

/// Belt and braces: no error text may carry the URL or its path (which holds the
/// token in Slack, Discord and ntfy URLs).
fn redact(text: &str, url: &str) -> String {
    let mut text = text.replace(url, "<url>");
    if let Ok(parsed) = reqwest::Url::parse(url) {
        let path = parsed.path();
        if path.len() > 1 {
            text = text.replace(path, "<path>");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hook_key_is_found_in_its_own_table() {
        let text = "[guard]\nx = 1\n[[hooks]]\nname = \"a\"\non = [\"x\"]\n[[ hooks ]]\nname = \"b\"\n[run]\non = 1\n";
        assert_eq!(hook_key_line(text, 0, "on"), Some(5));
        assert_eq!(hook_key_line(text, 1, "on"), Some(6), "the header when the key is not in the table");
        assert_eq!(hook_key_line(text, 1, "name"), Some(7));
        assert_eq!(hook_key_line(text, 2, "on"), None);
    }

    #[test]
    fn secrets_do_not_debug_print() {
        let hook: HookConfig =
            toml::from_str("name = \"x\"\nkind = \"slack\"\nurl = \"https://hooks.example/T0/SECRET\"").unwrap();
        assert!(!format!("{hook:?}").contains("SECRET"));
    }

    #[test]
    fn the_chat_text_names_the_figure_r2_judged_and_the_others_by_their_names() {
        let decisive = pruefstand_judge::Decisive {
            rule: pruefstand_judge::RuleId::R2,
            name: "held-out ASR".into(),
            rate: 17.0 / 64.0,
            hits: 17,
            cases: 64,
            errors: 0,
            deff: 1.2,
            lower: 0.165,
            upper: 0.38,
            alpha_lower: 0.05,
            alpha_upper: 0.03,
            bound: 0.165,
            bound_side: pruefstand_core::words::BoundSide::Lower,
            level: 0.95,
            limit: 0.1,
            status: pruefstand_core::record::RuleStatus::Fail,
            sequential: false,
            text: "held-out ASR 26.6 % (17/64), 95 % lower bound 16.5 % > limit 10 %".into(),
        };
        let facts = Facts {
            outcome: "rejected".into(),
            job: 1,
            try_number: 1,
            version: "demo-auswendig".into(),
            plan: "schnell".into(),
            verdict: Some("rejected".into()),
            summary: "rejected: R2 failed".into(),
            utility: Some(0.962),
            utility_under_attack: Some(0.592),
            asr: Some(0.165),
            decisive: Some(decisive),
            run_dir: None,
            report: None,
            error: None,
        };
        let text = facts.message();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "pruefstand: demo-auswendig on schnell — REJECTED");
        assert_eq!(lines[1], "R2 judged: held-out ASR 26.6 % (17/64), 95 % lower bound 16.5 % > limit 10 %");
        assert_eq!(lines[2], "ASR (all attacks) 16.5 % · utility (clean) 96.2 % · utility under attack 59.2 %");
        let env = facts.env();
        let var = |k: &str| env.iter().find(|(name, _)| name == k).map(|(_, v)| v.clone()).unwrap();
        assert_eq!(var("PRUEFSTAND_DECISIVE_NAME"), "held-out ASR");
        assert_eq!(var("PRUEFSTAND_DECISIVE_RATE"), "0.265625");
    }

    #[test]
    fn errors_are_redacted() {
        let url = "http://127.0.0.1:9/hook/SECRET";
        assert_eq!(
            redact("error sending request for url (http://127.0.0.1:9/hook/SECRET)", url),
            "error sending request for url (<url>)"
        );
        assert!(!redact("GET /hook/SECRET failed", url).contains("SECRET"));
    }
}

#[cfg(test)]
mod fuzz;
