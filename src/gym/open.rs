//! An open pass (docs/protocol.md §2, the request's `open`): one gym for a whole
//! attacker campaign. Its cases are handed over as the campaign writes them (`cases`
//! commands on the gym's stdin) and each record comes back the moment its case
//! finishes, so the model server neither waits for a gym to start between rounds nor
//! for the slowest pair of a round. Closed, it ends as any pass does: the records
//! compacted in the order the caller gives, `plan.json` and the telemetry written.
//!
//! Not here: which cases, and when (`adaptive`); the pass's driving, sinks and end,
//! which are the closed pass's (`super`).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};

use anyhow::bail;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::{Control, Executed, Follow, GymRequest, GymSettings, blocking_in, follow_events, hand_over, spawn};
use crate::concurrency::{Concurrency, Observer};
use pruefstand_core::case::{Case, CaseRecord};
use pruefstand_core::inventory::Inventory;
use pruefstand_core::plan::Plan;
use pruefstand_core::record::Wording;
use pruefstand_gym::events::{Ask, GymEvent, Seen, Sink};
use pruefstand_gym::pyenv::PyEnv;
use pruefstand_store::{PlanFile, RunDir};

/// The gym's exit status, the events it printed as followed, and whether reading them
/// failed: what the task following the gym leaves.
type Followed = (std::io::Result<std::process::ExitStatus>, Follow, anyhow::Result<()>);

/// A running open pass. Dropped unclosed (a stop), its gym is killed.
pub(crate) struct OpenPass {
    run_dir: RunDir,
    plan: Plan,
    inventory: Inventory,
    continues: bool,
    /// Lines for the gym's stdin (the steering's and the campaign's), in order.
    lines: Option<mpsc::UnboundedSender<Vec<u8>>>,
    records: mpsc::UnboundedReceiver<CaseRecord>,
    /// Owns the gym (killed on drop): follows its events to their end.
    follow: Option<tokio::task::JoinHandle<Followed>>,
    observer: Option<Observer>,
    control: Option<std::sync::Arc<Control>>,
}

impl OpenPass {
    /// Starts the gym on `plan.cases` (a resume's recorded ones skipped), open for at most
    /// `at_most` cases in all.
    pub(crate) async fn start(
        pyenv: &PyEnv,
        run_dir: &RunDir,
        plan: &Plan,
        inventory: &Inventory,
        settings: GymSettings,
        at_most: usize,
    ) -> anyhow::Result<OpenPass> {
        let continues = settings.frame.as_ref().is_some_and(super::Frame::continues);
        let (request, mut pass) = super::prepare(run_dir, plan, inventory, settings).await?;
        let request = GymRequest { open: Some(at_most.max(request.cases.len())), ..request };
        let control = pass.control.clone();
        if control.as_deref().is_some_and(Control::is_stopped) {
            bail!("stopped before the gym started");
        }
        let request = blocking_in(run_dir, move |run_dir| super::resume(run_dir, request)).await?;
        let planned = request.open.unwrap_or(request.cases.len());
        let mut child = spawn(pyenv, run_dir, control.is_some())?;
        let stdin = hand_over(child.stdin.take().expect("piped stdin"), &pass.agent_env, &pass.concurrency, true)
            .await?
            .expect("an open pass keeps the gym's stdin");
        let (lines, to_stdin) = mpsc::unbounded_channel();
        tokio::spawn(write_lines(stdin, to_stdin));
        let steering: crate::concurrency::Commands = match pass.concurrency {
            Concurrency::Auto { .. } => Some(Box::new(LineWriter(lines.clone()))),
            Concurrency::Fixed(_) => None,
        };
        let observer = Observer::spawn(&pass.concurrency, pass.metrics_url.clone(), steering, planned);
        if let (Some(control), Some(pid)) = (&control, child.id()) {
            control.attach(pid);
        }
        let (records_in, records) = mpsc::unbounded_channel();
        pass.sinks.push(Box::new(Forward(records_in)));
        let (caller, feed, frame, held) = (pass.sinks, observer.feed(), pass.frame, control.clone());
        let follow =
            blocking_in(run_dir, move |run_dir| Follow::open(run_dir, (held, frame), caller, feed, planned)).await?;
        let follow = tokio::spawn(async move {
            let (follow, result) = follow_events(&mut child, follow).await;
            if result.is_err() {
                let _ = child.start_kill();
            }
            (child.wait().await, follow, result)
        });
        Ok(OpenPass {
            run_dir: run_dir.clone(),
            plan: plan.clone(),
            inventory: inventory.clone(),
            continues,
            lines: Some(lines),
            records,
            follow: Some(follow),
            observer: Some(observer),
            control,
        })
    }

    /// More cases to run, after those handed over before, with what each injects.
    pub(crate) fn add(
        &self,
        cases: &[Case],
        wording: &BTreeMap<String, Wording>,
        templates: &BTreeMap<String, String>,
    ) -> anyhow::Result<()> {
        if cases.is_empty() {
            return Ok(());
        }
        let command =
            serde_json::json!({ "command": "cases", "cases": cases, "wording": wording, "templates": templates });
        self.send(command)
    }

    fn send(&self, command: serde_json::Value) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(&command)?;
        line.push(b'\n');
        match &self.lines {
            Some(lines) if lines.send(line).is_ok() => Ok(()),
            _ => bail!("the gym's stdin is closed (the gym ended; see {})", self.run_dir.gym_log_path().display()),
        }
    }

    /// The record of the next case to finish; None once the gym has ended (closed, or
    /// failed: `close` says why).
    pub(crate) async fn next(&mut self) -> Option<CaseRecord> {
        self.records.recv().await
    }

    /// A record that has come in already, without waiting.
    pub(crate) fn ready(&mut self) -> Option<CaseRecord> {
        self.records.try_recv().ok()
    }

    /// No more cases: the gym finishes those it has and ends. Its records compacted to
    /// `cases` (every case of the pass, in the order `cases.jsonl` keeps them), and
    /// `plan.json` and the telemetry written over them.
    pub(crate) async fn close(mut self, cases: Vec<Case>) -> anyhow::Result<Executed> {
        // End of input closes it too; the command says it while the steering still writes.
        let _ = self.send(serde_json::json!({ "command": "close" }));
        self.lines = None;
        let follow = self.follow.take().expect("a pass is closed once");
        let (status, follow, result) = follow.await?;
        let observer = self.observer.take().expect("a pass is closed once");
        let outcome =
            super::ended(&self.run_dir, (status?, follow, result), observer, self.control.as_deref(), cases.clone())
                .await?;
        let plan = Plan { cases, ..self.plan.clone() };
        let plan_file = PlanFile::new(&plan, &self.inventory);
        blocking_in(&self.run_dir, move |run_dir| run_dir.write_plan(&plan_file)).await?;
        super::executed(&self.run_dir, &plan, outcome, self.continues).await
    }
}

impl Drop for OpenPass {
    fn drop(&mut self) {
        if let Some(follow) = self.follow.take() {
            // The task owns the gym: aborted, it drops it, which kills it.
            follow.abort();
            if let Some(control) = self.control.as_deref() {
                control.detach();
            }
        }
        if let Some(observer) = self.observer.take() {
            observer.live().finished = true;
        }
    }
}

/// Writes each line to the gym's stdin as it comes, until every sender is gone (end of
/// input) or the gym stops reading.
async fn write_lines(
    mut stdin: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
    mut lines: mpsc::UnboundedReceiver<Vec<u8>>,
) {
    while let Some(line) = lines.recv().await {
        if let Err(err) = async {
            stdin.write_all(&line).await?;
            stdin.flush().await
        }
        .await
        {
            tracing::debug!("writing to the gym's stdin: {err}");
            return;
        }
    }
}

/// The steering's writer on an open pass: each write (a whole command line) goes to the
/// gym's stdin in turn with the campaign's.
struct LineWriter(mpsc::UnboundedSender<Vec<u8>>);

impl tokio::io::AsyncWrite for LineWriter {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let sent = self.0.send(buf.to_vec()).map(|()| buf.len());
        Poll::Ready(sent.map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the gym's stdin is closed")))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Hands each finished case's record to the campaign (after the records sink has
/// written it to `cases.jsonl`).
struct Forward(mpsc::UnboundedSender<CaseRecord>);

impl Sink for Forward {
    fn on(&mut self, event: &GymEvent, _: &Seen) -> anyhow::Result<Ask> {
        if let GymEvent::Case { record } = event {
            // The campaign gone (stopped) wants no more.
            let _ = self.0.send((**record).clone());
        }
        Ok(Ask::Continue)
    }
}
