//! The reference's run on a candidate's plan, for R4: reused when one exists for the
//! same spec hash, plan hash and AgentDojo with every case recorded, else made now
//! (resuming one cut short), always in full, by the candidate's executor (on this
//! machine, or as a job array on the cluster). Two
//! candidates needing the same reference share one run of it: the second waits on the
//! reference lock, then finds it complete.

use std::path::{Path, PathBuf};

use anyhow::bail;

use super::{RunRequest, Session};
use crate::lock_wait::{self, Waited};
use pruefstand_core::inventory::Inventory;
use pruefstand_core::plan::Plan;
use pruefstand_core::spec::Version;
use pruefstand_store::{Reading, RunDir, RunLock};

use super::Executor;

impl Session {
    /// The reference's run for `request` (the reference's own request), made by
    /// `executor` (here, or the candidate's cluster): its directory, and whether it was
    /// made now.
    pub(super) async fn reference_run(
        &self,
        request: &RunRequest,
        executor: &dyn Executor,
    ) -> anyhow::Result<(PathBuf, bool)> {
        let (reports, plan, reference) = (self.root.reports(), &request.plan, &request.version);
        let _shared = self.reference_lock(request).await?;
        if let Some(dir) = find_reference_run(&reports, reference, plan, &request.inventory) {
            tracing::info!(
                "reference: reusing {}'s run {} (same spec, plan and agentdojo)",
                reference.name,
                dir.display()
            );
            return Ok((dir, false));
        }
        tracing::info!("reference: no current run of {} on plan {} — running it first", reference.name, plan.name);
        // A reference run cut short (daemon killed, job interrupted) is resumed, so none
        // of its finished cases runs twice.
        let unfinished = newest_run(&reports, reference, plan, |run| !complete(run, plan));
        let path = unfinished.unwrap_or_else(|| self.root.new_run_dir(&reference.name, &plan.name));
        let identity = request.identity();
        let claimed = crate::runtime::blocking(move || RunDir::claim(&path, &identity)).await?;
        let run_dir = &claimed.dir;
        let (executed, served) = executor.execute(self, request, &claimed).await?;
        let failed = served.model_server.as_ref().is_some_and(|f| f.failed);
        if !failed && executed.gym.records.len() != plan.cases.len() {
            bail!("the reference run {} is incomplete", run_dir.path().display());
        }
        let families = request.attack_families(super::trained_exports(&request.version).await?);
        self.record_and_judge(run_dir, request, None, served, families).await?;
        if failed {
            bail!(
                "the reference run {} is invalid: its model server failed (see its report)",
                run_dir.path().display()
            );
        }
        Ok((run_dir.path().to_path_buf(), true))
    }

    /// The lock on the reference's runs of this plan, waited for (saying for whom) while
    /// another run makes the reference; a stop ends the wait.
    async fn reference_lock(&self, request: &RunRequest) -> anyhow::Result<RunLock> {
        let (reference, plan) = (&request.version, &request.plan);
        let path = self.root.lock_file(&format!("reference-{}-{}", reference.name, plan.name))?;
        let mut said = false;
        let waiting = |holder: &str| {
            if !said {
                tracing::info!("reference: waiting for the run of {} that {holder} is making", reference.name);
                said = true;
            }
        };
        match lock_wait::wait(|| RunLock::try_take(&path), waiting, self.control.until_stopped()).await? {
            Waited::Taken(lock) => Ok(lock),
            Waited::Stopped(()) => bail!("interrupted while waiting for the reference run"),
        }
    }
}

/// The newest complete run of `reference` under `reports/<name>/<plan>/` whose spec
/// hash, plan hash and agentdojo version match.
pub(super) fn find_reference_run(
    reports: &Path,
    reference: &Version,
    plan: &Plan,
    inventory: &Inventory,
) -> Option<PathBuf> {
    newest_run(reports, reference, plan, |run| {
        complete(run, plan)
            && RunDir::new(run).read_run_meta().is_ok_and(|meta| {
                meta.plan_hash == plan.hash && meta.agentdojo_version.as_ref() == Some(&inventory.agentdojo_version)
            })
    })
}

fn complete(run: &Path, plan: &Plan) -> bool {
    RunDir::open(run)
        .and_then(|dir| dir.read_cases(Reading::Strict))
        .map(|r| r.records.len() == plan.cases.len())
        .unwrap_or(false)
}

/// The newest run of `reference` on `plan` (same spec hash, same plan hash in its
/// `plan.json`) that `accept` takes.
fn newest_run(reports: &Path, reference: &Version, plan: &Plan, accept: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    let dir = reports.join(&reference.name).join(&plan.name);
    let mut runs: Vec<PathBuf> =
        std::fs::read_dir(&dir).ok()?.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    runs.sort();
    runs.into_iter().rev().find(|run| {
        // A run in a newer store format than this build reads is no reference here.
        let Ok(dir) = RunDir::open(run.as_path()) else { return false };
        let (Ok(Some(version)), Ok(Some(claimed))) = (dir.read_version(), dir.read_plan()) else { return false };
        version.hash == reference.hash && claimed.hash == plan.hash && accept(run)
    })
}
