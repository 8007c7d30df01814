//! The executor of `pruefstand gym`: the gym with an agent command of the caller's and
//! no model server of pruefstand's — nothing to start, check or stop here; the plan's
//! cases in flight (or `--jobs`), the gym's own dispatch order or a seeded shuffle.
//! Not here: the gym itself (`gym`), a version's model server (`local`).

use futures_util::future::BoxFuture;

use super::{Executor, RunRequest, Served, Session};
use crate::concurrency::Concurrency;
use crate::gym::{self, Executed, GymSettings};
use pruefstand_core::order;
use pruefstand_store::Claimed;

/// Runs a version that is only an agent command ([`pruefstand_core::spec::Version::of_agent_command`]).
#[derive(Default)]
pub(crate) struct AgentOnly {
    /// Start the cases in an order drawn from the run's seed instead of the gym's own
    /// (the baseline the gym's order is measured against).
    pub(crate) shuffled: bool,
    /// Per-case wall-time limit (None: the plan's).
    pub(crate) case_timeout_s: Option<f64>,
    /// Variables the agent gets beside its minimal environment (a server's API key);
    /// they travel to the gym on its stdin, never in its own environment or argv.
    pub(crate) agent_env: Vec<(String, String)>,
}

impl Executor for AgentOnly {
    fn check(&self, request: &RunRequest) -> anyhow::Result<()> {
        anyhow::ensure!(
            request.agent.agent_cmd.is_some(),
            "version {} has no agent_cmd: the gym needs the agent to run",
            request.version.name
        );
        Ok(())
    }

    fn runs_here(&self) -> bool {
        false
    }

    fn execute<'a>(
        &'a self,
        session: &'a Session,
        request: &'a RunRequest,
        claimed: &'a Claimed,
    ) -> BoxFuture<'a, anyhow::Result<(Executed, Served)>> {
        Box::pin(async move {
            let (plan, agent) = (&request.plan, &request.agent);
            let settings = GymSettings {
                agent_cmd: agent.agent_cmd.clone().unwrap_or_default(),
                // No model server to ask: a fixed number of cases in flight.
                concurrency: Concurrency::Fixed(request.jobs.unwrap_or(plan.jobs)),
                metrics_url: None,
                display_name: agent.display_name.clone(),
                case_timeout_s: self.case_timeout_s.unwrap_or(plan.case_timeout_s),
                seed: claimed.seed,
                defence: None,
                detector: None,
                agent_env: self.agent_env.clone(),
                control: Some(session.control.gym.clone()),
                order: self.shuffled.then(|| order::shuffled(&plan.cases, claimed.seed)),
                sinks: Vec::new(),
                wording: Default::default(),
                templates: Default::default(),
                frame: None,
            };
            let executed = gym::execute(&session.pyenv, &claimed.dir, plan, &request.inventory, settings).await?;
            Ok((executed, Served { started_at: chrono::Utc::now().to_rfc3339(), ..Served::default() }))
        })
    }
}
