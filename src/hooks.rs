//! Completion hooks, `[[hooks]]` in pruefstand.toml: chat webhooks (Slack, Mattermost,
//! Discord, Matrix, ntfy, plain JSON) and `exec` hooks (an argv array, no shell; the
//! run's facts in `PRUEFSTAND_*` variables), fired by the daemon when a job ends
//! (any verdict, `invalid` included) or fails.
//!
//! Each hook runs in its own background task with a timeout per attempt and retries
//! with exponential backoff. An exec hook runs in its own process group, killed whole
//! when its attempt times out. Failures are logged and change nothing else: not the
//! verdict, not the queue, not the next job. Webhook URLs and tokens are secrets: logs
//! name a hook by its `name` and kind only, errors are stripped of URLs, and `Debug`
//! prints `***`.
//!
//! ```toml
//! [[hooks]]
//! name = "team"
//! kind = "slack"                  # slack | mattermost | discord | matrix | ntfy | json | exec
//! url_env = "PRUEFSTAND_SLACK"    # or url = "https://…" (then keep the file 0600)
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
use std::time::Duration;

use anyhow::bail;
use serde::Serialize;

use crate::queue::Job;
use crate::root::{CONFIG_FILE, Root};
use crate::rundir::RunFile;
use crate::settings::{HookConfig, Kind, Secret};
use crate::util;

const OUTCOMES: [&str; 5] = ["approved", "rejected", "inconclusive", "invalid", "failed"];

/// Checks the `[[hooks]]` of the root's config; errors name pruefstand.toml and the hook.
pub fn validate(root: &Root) -> anyhow::Result<()> {
    let file = root.path.join(CONFIG_FILE);
    for hook in &root.config.hooks {
        let at = || format!("{}: hook {:?}", file.display(), hook.name);
        if hook.kind == Kind::Exec {
            if hook.argv.is_empty() {
                bail!("{}: an exec hook needs argv = [\"program\", …]", at());
            }
        } else if hook.url.is_some() == hook.url_env.is_some() {
            bail!("{}: a {} hook needs exactly one of url and url_env", at(), hook.kind.as_str());
        }
        if hook.kind == Kind::Matrix && hook.token.is_none() && hook.token_env.is_none() {
            bail!("{}: a matrix hook needs token or token_env (the access token)", at());
        }
        if let Some(bad) = hook.on.iter().flatten().find(|o| !OUTCOMES.contains(&o.as_str())) {
            bail!("{}: on = {bad:?} is not one of {}", at(), OUTCOMES.join(", "));
        }
    }
    Ok(())
}

/// A warning when pruefstand.toml holds webhook secrets and others can read it.
pub fn permission_warning(root: &Root) -> Option<String> {
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
#[derive(Serialize, Clone, Debug)]
pub struct Facts {
    /// approved | rejected | inconclusive | invalid | failed
    pub outcome: String,
    pub job: u64,
    pub version: String,
    pub plan: String,
    pub verdict: Option<String>,
    /// The judgement's one line, or the error.
    pub summary: String,
    pub utility: Option<f64>,
    pub utility_under_attack: Option<f64>,
    /// The ASR of all attacks.
    pub asr: Option<f64>,
    /// The figure R2 judged, by its name (`held-out ASR` when the plan held families
    /// out): the judgement's `figures.decisive`.
    pub decisive: Option<crate::judge::Decisive>,
    pub run_dir: Option<PathBuf>,
    pub report: Option<PathBuf>,
    pub error: Option<String>,
}

impl Facts {
    pub fn finished(
        job: &Job,
        run_dir: &Path,
        utility: Option<f64>,
        utility_under_attack: Option<f64>,
        asr: Option<f64>,
    ) -> Facts {
        let verdict = job.verdict.map(|v| v.as_str().to_string());
        let report =
            [RunFile::Report, RunFile::JudgementMarkdown].into_iter().map(|f| f.path_in(run_dir)).find(|p| p.is_file());
        Facts {
            outcome: verdict.clone().unwrap_or_else(|| "failed".into()),
            job: job.id,
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
            error: None,
        }
    }

    pub fn failed(job: &Job, error: &str) -> Facts {
        Facts {
            outcome: "failed".into(),
            job: job.id,
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
    pub fn message(&self) -> String {
        use crate::words;
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
        ]
        .into_iter()
        .map(|(k, v)| (format!("PRUEFSTAND_{k}"), v))
        .collect()
    }
}

/// Fires every hook whose `on` takes the outcome, concurrently; returns when all are
/// delivered or given up.
pub async fn fire_all(hooks: Vec<HookConfig>, facts: Facts) {
    let mut set = tokio::task::JoinSet::new();
    for hook in hooks {
        if hook.on.as_ref().is_none_or(|on| on.contains(&facts.outcome)) {
            set.spawn(fire(hook, facts.clone()));
        }
    }
    while set.join_next().await.is_some() {}
}

/// One hook, with retries. Logs by name and kind only.
pub async fn fire(hook: HookConfig, facts: Facts) {
    let label = format!("hook {:?} ({})", hook.name, hook.kind.as_str());
    let attempts = hook.retries + 1;
    for attempt in 1..=attempts {
        match tokio::time::timeout(Duration::from_secs_f64(hook.timeout_s), deliver(&hook, &facts)).await {
            Ok(Ok(())) => {
                tracing::info!("{label}: delivered (job {}, {})", facts.job, facts.outcome);
                return;
            }
            Ok(Err(Failure::Final(why))) => {
                tracing::warn!("{label}: failed, not retried: {why}");
                return;
            }
            Ok(Err(Failure::Retry(why))) if attempt < attempts => {
                let wait = (hook.backoff_s * 2f64.powi(attempt as i32 - 1)).min(300.0);
                tracing::warn!("{label}: attempt {attempt}/{attempts} failed: {why}; retrying in {wait:.1} s");
                tokio::time::sleep(Duration::from_secs_f64(wait)).await;
            }
            Ok(Err(Failure::Retry(why))) => tracing::warn!("{label}: gave up after {attempts} attempts: {why}"),
            Err(_) if attempt < attempts => {
                let wait = (hook.backoff_s * 2f64.powi(attempt as i32 - 1)).min(300.0);
                tracing::warn!(
                    "{label}: attempt {attempt}/{attempts} timed out after {} s; retrying in {wait:.1} s",
                    hook.timeout_s
                );
                tokio::time::sleep(Duration::from_secs_f64(wait)).await;
            }
            Err(_) => {
                tracing::warn!("{label}: gave up after {attempts} attempts: timed out after {} s", hook.timeout_s)
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
            // Same transaction id on every retry: the homeserver posts it once.
            let txn = format!(
                "pruefstand-{}-{}-{}",
                facts.job,
                facts.outcome,
                crate::util::sha256_hex(message.as_bytes()).get(..12).unwrap_or("")
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
    crate::util::minimal_env(&mut command);
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
    fn secrets_do_not_debug_print() {
        let hook: HookConfig =
            toml::from_str("name = \"x\"\nkind = \"slack\"\nurl = \"https://hooks.example/T0/SECRET\"").unwrap();
        assert!(!format!("{hook:?}").contains("SECRET"));
    }

    #[test]
    fn the_chat_text_names_the_figure_r2_judged_and_the_others_by_their_names() {
        let decisive = crate::judge::Decisive {
            rule: "R2".into(),
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
            bound_side: crate::words::BoundSide::Lower,
            level: 0.95,
            limit: 0.1,
            status: crate::record::RuleStatus::Fail,
            sequential: false,
            text: "held-out ASR 26.6 % (17/64), 95 % lower bound 16.5 % > limit 10 %".into(),
        };
        let facts = Facts {
            outcome: "rejected".into(),
            job: 1,
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
