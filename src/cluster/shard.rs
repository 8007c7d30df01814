//! One shard of a clustered job, on its node (`pruefstand shard <job> <i>/<N>`): the
//! plan's fixed slice for shard `i` of `N`, run as an ordinary run into
//! `<run dir>/shards/<i>/` — its own model server, the node's GPU and busy-unit guards
//! first, the same durable writes and resume — and an exit record at the end.
//!
//! [`slice`] cuts a plan: whole user tasks together (R4 pairs a user task's clean case
//! with its attacked ones), balanced by case count, longest first. Not here: submitting
//! and following the array, merging (`cluster`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};

use super::{ArrayState, ExitRecord};
use crate::guard::{Guards, OwnProcesses, Watch};
use crate::gym;
use crate::run::{Extent, LocalGym, ReferencePolicy, RunControl, RunRequest, Session};
use pruefstand_core::case::Case;
use pruefstand_core::queue::Queue;
use pruefstand_core::root::Root;
use pruefstand_core::util;
use pruefstand_store::RunDir;
use pruefstand_store::benchlock;

/// Which shard each case goes to, for `count` shards: the cases of one user task (and
/// each injection goal on its own) form a group; groups go, largest first (ties by
/// name), to the shard with the fewest cases so far (ties: the lowest index). The
/// result depends only on the case list, so every node computes the same cut.
pub(crate) fn slice(cases: &[Case], count: usize) -> Vec<usize> {
    let mut groups: BTreeMap<String, usize> = BTreeMap::new();
    for case in cases {
        *groups.entry(group_key(case)).or_default() += 1;
    }
    let mut order: Vec<(&String, &usize)> = groups.iter().collect();
    order.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    let mut load = vec![0usize; count.max(1)];
    let mut shard_of: BTreeMap<&str, usize> = BTreeMap::new();
    for (key, size) in order {
        let (shard, _) = load.iter().enumerate().min_by_key(|(i, l)| (**l, *i)).expect("at least one shard");
        load[shard] += size;
        shard_of.insert(key, shard);
    }
    cases.iter().map(|case| shard_of[group_key(case).as_str()]).collect()
}

/// How many shards a plan can use: no more than it has groups to spread.
pub(super) fn usable_shards(cases: &[Case], wanted: usize) -> usize {
    let groups: std::collections::BTreeSet<String> = cases.iter().map(group_key).collect();
    wanted.clamp(1, groups.len().max(1))
}

fn group_key(case: &Case) -> String {
    match &case.user_task {
        Some(user_task) => format!("{}/{user_task}", case.suite),
        None => format!("{}/goal/{}", case.suite, case.injection_task.as_deref().unwrap_or_default()),
    }
}

/// `i/N` as the batch script passes it.
pub(crate) fn parse_index(text: &str) -> anyhow::Result<(usize, usize)> {
    let parsed = text.split_once('/').and_then(|(i, n)| Some((i.parse::<usize>().ok()?, n.parse::<usize>().ok()?)));
    match parsed {
        Some((i, n)) if i < n => Ok((i, n)),
        _ => bail!("{text:?}: expected SHARD/COUNT with SHARD < COUNT, e.g. 0/4"),
    }
}

/// Runs shard `index` of `count` of job `job` — of its reference's run in `reference`
/// when given — and leaves its exit record (also when it fails; a killed shard leaves
/// none, which the daemon reads as dead).
pub(crate) async fn run(
    root: &Root,
    job: u64,
    index: usize,
    count: usize,
    reference: Option<&Path>,
) -> anyhow::Result<ExitRecord> {
    let queue = Queue::open(root)?;
    let loaded = queue.load(job)?;
    let run_dir = match reference {
        Some(dir) => dir.to_path_buf(),
        None => loaded.run_dir.clone().with_context(|| format!("job {job} has no run directory yet"))?,
    };
    let run = RunDir::open(&run_dir)?;
    let state = ArrayState::load(&run)?.with_context(|| format!("job {job} was not submitted as an array"))?;
    if state.shards != count {
        bail!("job {job} is cut into {} shards, not {count}", state.shards);
    }
    let shard = run.shard(index);
    let started = chrono::Utc::now().to_rfc3339();
    let part = Part { run: &run, shard_dir: shard.path(), index, count, reference: reference.is_some() };
    let result = execute(root, &queue, &loaded, part).await;
    let node = node_name();
    let mut record = ExitRecord {
        index,
        node,
        slurm_job: std::env::var("SLURM_JOB_ID").ok(),
        started_at: started,
        ended_at: chrono::Utc::now().to_rfc3339(),
        ..ExitRecord::default()
    };
    match result {
        Ok(ran) => {
            record.cases = ran.cases;
            record.skipped = ran.skipped;
            record.image_digest = ran.image_digest;
            record.gpu = ran.gpu;
            record.model_server = ran.model_server;
        }
        Err(err) => {
            record.code = 1;
            record.error = Some(format!("{err:#}"));
        }
    }
    record.store(&shard)?;
    Ok(record)
}

/// The node as Slurm names it (`SLURMD_NODENAME`), else the host name.
fn node_name() -> String {
    std::env::var("SLURMD_NODENAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|name| name.trim().to_string())
        .unwrap_or_default()
}

/// The node's own guards, waited on until clear, then watching the run: a foreign GPU
/// user or a busy unit here delays this shard only. (Slurm's GRES allocation keeps other
/// jobs off the GPU; the bench lock is per machine and stays the daemon's.)
async fn node_guards(root: &Root, index: usize) -> std::sync::Mutex<Watch> {
    let guards = Guards::new(&root.config.guard);
    let own = OwnProcesses::none().with_containers_from(crate::container::created_ids);
    let mut last = String::new();
    guards
        .wait_until_clear(&own, |status| {
            let line = status.line();
            if line != last {
                tracing::info!("shard {index}: {line}");
                last = line;
            }
        })
        .await;
    guards.release().await;
    std::sync::Mutex::new(guards.watch(own))
}

/// What a shard's run leaves for its exit record.
struct Ran {
    cases: usize,
    skipped: usize,
    image_digest: Option<String>,
    gpu: pruefstand_core::record::GpuExclusivity,
    model_server: Option<pruefstand_core::record::ModelServerFacts>,
}

/// Which part of which run a shard runs.
struct Part<'a> {
    run: &'a RunDir,
    shard_dir: &'a Path,
    index: usize,
    count: usize,
    /// The job's reference version, not the job's own.
    reference: bool,
}

async fn execute(root: &Root, queue: &Queue, job: &pruefstand_core::queue::Job, part: Part<'_>) -> anyhow::Result<Ran> {
    let Part { run, shard_dir, index, count, reference } = part;
    let (mut version, plan_path) = queue.materialise(root, job)?;
    if reference {
        // The reference as the job snapshotted it at `start`.
        version = version.load_reference().with_context(|| format!("{} names no reference", version.name))??;
    }
    let watch = if benchlock::needs_gpu(&version)? { Some(node_guards(root, index).await) } else { None };
    let watch = Arc::new(watch);
    let observed = watch.clone();
    let control = Arc::new(RunControl::new(
        Arc::new(gym::Control::new()),
        Some(Box::new(move || {
            observed
                .as_ref()
                .as_ref()
                .map_or(pruefstand_core::record::GpuExclusivity::NotObserved, |w| util::lock(w).exclusivity())
        })),
    ));
    let session = Session::open(root.clone(), control.clone()).await?;
    let result = async {
        let plan = plan_path.to_string_lossy();
        // The identity is the job's (version, full plan hash): a shard directory holds
        // one slice of that run, and its seed is the run's.
        let request = RunRequest::builder(&session, version, &plan)
            .cases(move |cases| {
                let assigned = slice(&cases, count);
                cases.into_iter().zip(assigned).filter(|(_, s)| *s == index).map(|(c, _)| c).collect()
            })
            .seed(run.stored_seed())
            .out(Some(shard_dir.to_path_buf()))
            .reference(ReferencePolicy::Skip)
            .extent(Extent::Full)
            .resolve()
            .await?;
        let (_, executed, served) = session.execute(&request, &LocalGym).await?;
        anyhow::Ok(Ran {
            cases: executed.gym.records.len(),
            skipped: executed.gym.skipped,
            image_digest: served.image_digest,
            gpu: control.gpu(),
            model_server: served.model_server,
        })
    }
    .await;
    let shutdown = session.shutdown().await;
    let ran = result?;
    shutdown?;
    Ok(ran)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// mini's shape: 3 user tasks of 3 cases each, and 2 injection goals.
    fn mini() -> Vec<Case> {
        let mut cases = Vec::new();
        for u in ["user_task_1", "user_task_2", "user_task_5"] {
            cases.push(Case::clean("banking", u));
        }
        for u in ["user_task_1", "user_task_2", "user_task_5"] {
            for i in ["injection_task_1", "injection_task_4"] {
                cases.push(Case::attacked("banking", u, i, "important_instructions"));
            }
        }
        for i in ["injection_task_1", "injection_task_4"] {
            cases.push(Case::injection_goal("banking", i));
        }
        cases
    }

    #[test]
    fn a_user_task_stays_in_one_shard_and_the_cut_is_balanced() {
        let cases = mini();
        let assigned = slice(&cases, 4);
        for case in &cases {
            let same: Vec<usize> = cases
                .iter()
                .zip(&assigned)
                .filter(|(c, _)| c.user_task.is_some() && c.user_task == case.user_task)
                .map(|(_, s)| *s)
                .collect();
            assert!(same.windows(2).all(|w| w[0] == w[1]), "{:?} is cut: {same:?}", case.user_task);
        }
        let mut load = [0; 4];
        assigned.iter().for_each(|s| load[*s] += 1);
        // Longest first: three groups of 3 to shards 0–2, both goals to shard 3.
        assert_eq!(load, [3, 3, 3, 2]);
        assert_eq!(slice(&cases, 4), assigned, "deterministic");
        assert_eq!(slice(&cases, 1), vec![0; cases.len()]);
    }

    #[test]
    fn no_more_shards_than_groups() {
        assert_eq!(usable_shards(&mini(), 8), 5);
        assert_eq!(usable_shards(&mini(), 2), 2);
        assert_eq!(usable_shards(&[], 3), 1);
    }

    #[test]
    fn the_shard_argument_is_index_over_count() {
        assert_eq!(parse_index("3/4").unwrap(), (3, 4));
        for bad in ["4/4", "x/4", "3", "-1/4", "/"] {
            assert!(parse_index(bad).is_err(), "{bad}");
        }
    }
}
