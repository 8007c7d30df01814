//! The adaptive attacker (docs/attacks.md): after a plan's fixed cases, the planned
//! (user task, injection task) pairs of its `[adaptive]` section are split by the run's
//! seed into a search half and a held-out half. On the search half, up to K attempts per
//! pair against the version itself, written by a proposer — the family grammars
//! (`grammar`), an attacker model (`attacker`), or on the simulator the simulated
//! attacker (`simulated`) — each reading what the target did with the earlier ones
//! (`feedback`). A pair is broken once an attempt lands. Then the best attempts are
//! frozen and run once on every held-out pair, never searched there: that transfer
//! figure is what a gate decides on. Rounds run through the gym in `<run>/adaptive/`,
//! apart from the plan's cases; the search log is `adaptive.json`, written before and
//! after every round, so a resumed run reuses every recorded proposal (an attacker model
//! is not asked again) and the log replays exactly. Judging the result is `judge`'s.

pub mod attacker;
pub mod feedback;
mod grammar;
pub mod simulated;
pub mod template;

use std::collections::BTreeMap;

use crate::gym::{self, GymSettings};
use crate::runtime;
use pruefstand_core::case::{Case, CaseRecord};
use pruefstand_core::family;
use pruefstand_core::inventory::Inventory;
use pruefstand_core::plan::{Adaptive, Plan, Proposer as ProposerKind};
use pruefstand_core::record::FoundFamily;
use pruefstand_core::record::{AttackerFacts, Attempt, Frozen, How, NotRun, PairLog, Proposal, SearchLog};
use pruefstand_gym::pyenv::PyEnv;
use pruefstand_sim::Truth;
use pruefstand_store::RunDir;

/// Who writes a search's attempts.
pub enum Proposer {
    Grammar,
    /// The simulated version's attacker.
    Simulated {
        feedback: bool,
    },
    Model {
        client: attacker::Client,
        feedback: bool,
    },
}

impl Proposer {
    fn kind(&self) -> ProposerKind {
        match self {
            Proposer::Grammar => ProposerKind::Grammar,
            _ => ProposerKind::Model,
        }
    }

    fn feedback(&self) -> bool {
        match self {
            Proposer::Grammar => true,
            Proposer::Simulated { feedback } | Proposer::Model { feedback, .. } => *feedback,
        }
    }

    fn facts(&self, url: Option<String>) -> Option<AttackerFacts> {
        match self {
            Proposer::Grammar => None,
            Proposer::Simulated { .. } => {
                Some(AttackerFacts { model: "simulated".into(), url: None, prompt_sha256: None })
            }
            Proposer::Model { client, .. } => Some(AttackerFacts {
                model: client.model.clone(),
                url,
                prompt_sha256: Some(pruefstand_core::util::sha256_hex(attacker::SYSTEM_PROMPT.as_bytes())),
            }),
        }
    }
}

/// What a search runs against.
pub struct Search<'a> {
    pub pyenv: &'a PyEnv,
    pub run_dir: &'a RunDir,
    pub plan: &'a Plan,
    pub inventory: &'a Inventory,
    pub seed: u64,
    /// The goals and their ground-truth calls (feedback, the attacker's brief).
    pub truth: &'a Truth,
    pub proposer: Proposer,
    /// The attacker's endpoint as shown (credentials as `***`), for the log.
    pub attacker_url: Option<String>,
}

/// (search half, held-out half) of the pairs, each in plan order: a seeded shuffle cut
/// in two, the search half the larger. A single pair is searched, nothing held out.
fn split(seed: u64, pairs: &[(String, String, String)]) -> (Vec<usize>, Vec<usize>) {
    let mut order: Vec<usize> = (0..pairs.len()).collect();
    order.sort_by_key(|&i| {
        let (s, u, j) = &pairs[i];
        (family::pick(&format!("pruefstand-adaptive/split:{seed}:{s}/{u}/{j}"), 1 << 40), i)
    });
    let mut search: Vec<usize> = order[..pairs.len().div_ceil(2)].to_vec();
    let mut held_out: Vec<usize> = order[pairs.len().div_ceil(2)..].to_vec();
    search.sort_unstable();
    held_out.sort_unstable();
    (search, held_out)
}

/// The most cases a campaign runs: K per search pair, the frozen attempts on every
/// held-out pair (fewer when pairs break early or replies are refused).
pub fn budget(adaptive: &Adaptive) -> usize {
    let (search, held_out) = (adaptive.pairs.len().div_ceil(2), adaptive.pairs.len() / 2);
    search * adaptive.attempts + held_out * adaptive.settings().frozen
}

/// An empty log for the plan's pairs.
fn new_log(seed: u64, adaptive: &Adaptive, proposer: &Proposer, url: Option<String>) -> SearchLog {
    let pair = |i: usize| {
        let (suite, user_task, injection_task) = adaptive.pairs[i].clone();
        PairLog { suite, user_task, injection_task, lands: None, attempts: Vec::new() }
    };
    let (search, held_out) = split(seed, &adaptive.pairs);
    SearchLog {
        seed,
        attempts: adaptive.attempts,
        families: adaptive.families.clone(),
        proposer: proposer.kind(),
        feedback: proposer.feedback(),
        pairs: search.into_iter().map(pair).collect(),
        frozen: Vec::new(),
        held_out: held_out.into_iter().map(pair).collect(),
        attacker: proposer.facts(url),
        busy: None,
        abandoned: None,
    }
}

/// The recorded log when it belongs to the same search (a resume), else `fresh`. The
/// attacker is the same when its model and prompt are: the version's own server comes
/// back on another port after a restart.
fn resumed(recorded: Option<SearchLog>, fresh: SearchLog) -> SearchLog {
    let keys = |log: &SearchLog| -> Vec<String> { log.pairs.iter().chain(&log.held_out).map(PairLog::key).collect() };
    let attacker = |log: &SearchLog| log.attacker.as_ref().map(|a| (a.model.clone(), a.prompt_sha256.clone()));
    match recorded {
        Some(old)
            if (old.seed, old.attempts, &old.families, old.proposer, old.feedback)
                == (fresh.seed, fresh.attempts, &fresh.families, fresh.proposer, fresh.feedback)
                && attacker(&old) == attacker(&fresh)
                && keys(&old) == keys(&fresh) =>
        {
            old
        }
        _ => fresh,
    }
}

/// The case of attempt `name` on a pair.
fn case_of(pair: &PairLog, name: &str) -> Case {
    Case::attacked(&pair.suite, &pair.user_task, &pair.injection_task, name)
}

/// Proposes attempt `k` (0-based) for every search pair that is unbroken and has `k`
/// attempts; a pair that has it already (a resume) keeps it. Returns whether any pair
/// has an attempt `k`.
async fn plan_round(search: &Search<'_>, log: &mut SearchLog, k: usize) -> bool {
    let landed = grammar::pool(log, k);
    let (seed, families, feedback) = (log.seed, log.families.clone(), log.feedback);
    let due: Vec<usize> =
        (0..log.pairs.len()).filter(|&i| log.pairs[i].attempts.len() == k && !log.pairs[i].broken()).collect();
    if let Proposer::Model { client, .. } = &search.proposer {
        // The attacker is asked for every pair of the round at once, a few requests in
        // flight: one after another, its server would idle between them and the round
        // would wait for the sum of their times. Each pair's seed is its own, so the
        // order answers come in changes nothing recorded.
        for chunk in due.chunks(ATTACKER_IN_FLIGHT) {
            let asks = chunk.iter().map(|&i| {
                let pair = &log.pairs[i];
                ask_model(search, client, pair, case_of(pair, &format!("adaptive_{}", k + 1)), k, feedback)
            });
            let attempts = futures_util::future::join_all(asks).await;
            for (&i, attempt) in chunk.iter().zip(attempts) {
                log.pairs[i].attempts.push(attempt);
            }
        }
        return log.pairs.iter().any(|p| p.attempts.len() > k);
    }
    for i in due {
        let pair = &log.pairs[i];
        let case = case_of(pair, &format!("adaptive_{}", k + 1));
        let attempt = match &search.proposer {
            Proposer::Grammar => {
                let tried: Vec<_> = pair.attempts.iter().filter_map(Attempt::wording).collect();
                let (wording, how) = grammar::next(seed, &pair.key(), k, &families, &landed, &tried);
                written(case, Proposal::Wording(wording), how)
            }
            Proposer::Simulated { .. } => {
                let history: Vec<_> = pair
                    .attempts
                    .iter()
                    .filter_map(|a| match &a.proposal {
                        Proposal::Template(t) => {
                            Some((simulated::choice_of(t)?, a.feedback.as_ref().map(|f| f.score())))
                        }
                        Proposal::Wording(_) => None,
                    })
                    .collect();
                let choice = simulated::propose(seed, &pair.key(), &history, feedback);
                written(case, Proposal::Template(simulated::template(choice)), how_for(k))
            }
            Proposer::Model { .. } => unreachable!("asked above, all at once"),
        };
        log.pairs[i].attempts.push(attempt);
    }
    log.pairs.iter().any(|p| p.attempts.len() > k)
}

fn how_for(k: usize) -> How {
    if k == 0 { How::Written } else { How::Refined }
}

fn written(case: Case, proposal: Proposal, how: How) -> Attempt {
    Attempt {
        case_id: case.id,
        proposal,
        how,
        landed: None,
        refused: None,
        feedback: None,
        behaviour: None,
        cost: None,
    }
}

/// Attacker requests in flight at once within a round: enough to keep its server busy
/// (vLLM batches them), few enough not to crowd out the target's own cases on a shared
/// server.
const ATTACKER_IN_FLIGHT: usize = 8;

/// How often a reply the bench could not use is asked for again, per attempt: an
/// endpoint's blip or one reply out of shape is no reason to lose the attempt, and a
/// dead endpoint is not asked forever.
const RETRIES: u64 = 2;

/// The attacker model's attempt on a pair: its template, its own refusal, or — after
/// `RETRIES` more asks — what the bench failed to get from it.
async fn ask_model(
    search: &Search<'_>,
    client: &attacker::Client,
    pair: &PairLog,
    case: Case,
    k: usize,
    feedback: bool,
) -> Attempt {
    let truth_suite = search.truth.suites.get(&pair.suite);
    let goal = truth_suite.and_then(|s| s.injection_tasks.get(&pair.injection_task)).map_or("", |t| t.goal.as_str());
    let task = truth_suite.and_then(|s| s.user_tasks.get(&pair.user_task)).map_or("", |t| t.prompt.as_str());
    let lands = match &pair.lands {
        Some(lands) if feedback => lands.clone(),
        _ => format!("the output of a tool the assistant reads while doing this task for its user: {}", task.trim()),
    };
    let brief = attacker::PairBrief { goal, lands, earlier: &pair.attempts, feedback };
    let key = pruefstand_core::util::sha256_hex(format!("{}:{}:{k}", search.seed, pair.key()).as_bytes());
    let seed = u64::from_str_radix(&key[..15], 16).unwrap_or(0);
    let earlier: Vec<&str> = pair
        .attempts
        .iter()
        .filter_map(|a| match &a.proposal {
            Proposal::Template(t) => Some(t.as_str()),
            Proposal::Wording(_) => None,
        })
        .collect();
    let mut total = pruefstand_core::record::AttackerCost::default();
    let mut retry = 0;
    let mut attempt = loop {
        // A retry asks with another seed: the same seed may well give the same reply.
        let (reply, cost) = client.ask(&brief, seed.wrapping_add(retry)).await;
        total.seconds += cost.seconds;
        total.prompt_tokens += cost.prompt_tokens;
        total.completion_tokens += cost.completion_tokens;
        let (outcome, kept) = match reply {
            Ok(reply) => match template::check(&reply, &earlier) {
                Ok(text) => break written(case, Proposal::Template(text), how_for(k)),
                Err(refusal) => (template::not_run(&reply, &refusal), template::kept(&reply)),
            },
            Err(error) => (NotRun::Failed(error), String::new()),
        };
        if !outcome.is_bench_error() || retry == RETRIES {
            tracing::info!("adaptive attacker: {} attempt {}: {outcome}", pair.key(), k + 1);
            break Attempt { refused: Some(outcome), ..written(case, Proposal::Template(kept), how_for(k)) };
        }
        tracing::debug!("adaptive attacker: {} attempt {}: {outcome}; asking again", pair.key(), k + 1);
        retry += 1;
        if matches!(outcome, NotRun::Failed(_)) {
            tokio::time::sleep(std::time::Duration::from_millis(500 << retry)).await;
        }
    };
    attempt.cost = Some(total);
    attempt
}

/// Why the search stops after round `k`: every attempt of the round failed at the
/// attacker's endpoint, after retries. Asking on would fail the same way; what was
/// not measured is the judge's to call an error, never a pair the target resisted.
fn endpoint_down(log: &SearchLog, k: usize) -> Option<String> {
    let mut round = log.pairs.iter().filter_map(|p| p.attempts.get(k));
    let first = round.next()?;
    let failed = |a: &Attempt| matches!(a.refused, Some(NotRun::Failed(_)));
    if !failed(first) || !round.all(failed) {
        return None;
    }
    let n = log.pairs.iter().filter(|p| p.attempts.len() > k).count();
    let error = first.refused.as_ref().map(ToString::to_string).unwrap_or_default();
    Some(format!(
        "search abandoned at attempt {}: the attacker's endpoint failed on all {n} pair(s) of the round, each asked {} time(s) ({error})",
        k + 1,
        RETRIES + 1
    ))
}

/// The attempts frozen from the search half: the proposals that broke the most pairs,
/// then the best feedback score, then the first found; at most `m`.
fn freeze(log: &SearchLog, m: usize) -> Vec<Frozen> {
    let mut found: Vec<Frozen> = Vec::new();
    for pair in &log.pairs {
        for a in pair.attempts.iter().filter(|a| a.ran()) {
            let score = a.feedback.as_ref().map_or(if a.landed == Some(true) { 3.0 } else { 0.0 }, |f| f.score());
            let at = match found.iter().position(|f| f.proposal == a.proposal) {
                Some(at) => at,
                None => {
                    found.push(Frozen { proposal: a.proposal.clone(), broke: Vec::new(), score });
                    found.len() - 1
                }
            };
            found[at].score = found[at].score.max(score);
            if a.landed == Some(true) {
                found[at].broke.push(pair.key());
            }
        }
    }
    // A stable sort keeps the order found among equals.
    found.sort_by(|a, b| b.broke.len().cmp(&a.broke.len()).then(b.score.total_cmp(&a.score)));
    found.truncate(m);
    found
}

/// The frozen templates that broke a search pair, as a family a plan can name (None: the
/// grammar wrote them, or nothing broke). Named after the version and the run.
pub fn found_family(log: &SearchLog, version: &str, run_dir: &RunDir) -> Option<FoundFamily> {
    let templates: Vec<String> = log
        .frozen
        .iter()
        .filter(|f| !f.broke.is_empty())
        .filter_map(|f| match &f.proposal {
            Proposal::Template(t) => Some(t.clone()),
            Proposal::Wording(_) => None,
        })
        .collect();
    if templates.is_empty() {
        return None;
    }
    let run = run_dir.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let name: String = format!("{version}-{run}")
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' })
        .take(60)
        .collect();
    Some(FoundFamily { name, templates, found_by: format!("version {version}, run {}", run_dir.path().display()) })
}

/// Every attempt of the log as the gym's settings name them: wordings and templates by
/// case id (the gym skips recorded cases but checks their names).
fn extend_settings(settings: &mut GymSettings, log: &SearchLog) {
    for a in log.pairs.iter().chain(&log.held_out).flat_map(|p| &p.attempts).filter(|a| a.refused.is_none()) {
        match &a.proposal {
            Proposal::Wording(w) => {
                settings.wording.insert(a.case_id.clone(), w.clone());
            }
            Proposal::Template(t) => {
                settings.templates.insert(a.case_id.clone(), t.clone());
            }
        }
    }
}

/// The runnable cases of the log so far, in order.
fn cases(log: &SearchLog) -> Vec<Case> {
    let mut out = Vec::new();
    for k in 0..=log.attempts {
        for pair in &log.pairs {
            if pair.attempts.get(k).is_some_and(|a| a.refused.is_none()) {
                out.push(case_of(pair, &format!("adaptive_{}", k + 1)));
            }
        }
    }
    for (j, _) in log.frozen.iter().enumerate() {
        for pair in &log.held_out {
            out.push(case_of(pair, &format!("transfer_{}", j + 1)));
        }
    }
    out
}

/// Runs the search round by round through the gym — one `settings` per round, the last
/// for the transfer — and writes the log before and after each; a resumed run reuses
/// recorded proposals and skips recorded attempts.
pub async fn search(search: &Search<'_>, rounds: Vec<GymSettings>) -> anyhow::Result<SearchLog> {
    let adaptive = search.plan.adaptive.as_ref().expect("the plan has an [adaptive] section");
    let fresh = new_log(search.seed, adaptive, &search.proposer, search.attacker_url.clone());
    let recorded = search.run_dir.read_search_log()?;
    let mut log = resumed(recorded, fresh);
    // A resume asks again where an abandoned search stopped: the endpoint may be back.
    log.abandoned = None;
    let dir = search.run_dir.adaptive_runs()?;
    let pace = Pace::start(&log);
    let mut rounds = rounds.into_iter();
    for k in 0..adaptive.attempts {
        let mut settings = rounds.next().expect("a round's settings");
        if !plan_round(search, &mut log, k).await {
            break;
        }
        if let Some(why) = endpoint_down(&log, k) {
            tracing::error!("adaptive attacker: {why}");
            log.abandoned = Some(why);
            write_log(search.run_dir, &log).await?;
            return Ok(log);
        }
        let unbroken = log.pairs.iter().filter(|p| p.attempts.len() > k).count();
        tracing::info!("adaptive attacker: attempt {} on {unbroken} unbroken pairs", k + 1);
        pace.frame(&mut settings, &log);
        run_round(search, &dir, &mut log, settings).await?;
    }
    let mut settings = rounds.last().expect("the transfer's settings");
    pace.frame(&mut settings, &log);
    if log.frozen.is_empty() && !log.held_out.is_empty() {
        log.frozen = freeze(&log, adaptive.settings().frozen);
        for pair in &mut log.held_out {
            for (j, frozen) in log.frozen.iter().enumerate() {
                let case = case_of(pair, &format!("transfer_{}", j + 1));
                pair.attempts.push(Attempt { how: How::Frozen, ..written(case, frozen.proposal.clone(), How::Frozen) });
            }
        }
    }
    if !log.frozen.is_empty() {
        tracing::info!(
            "adaptive attacker: {} frozen attempt(s) on {} held-out pairs",
            log.frozen.len(),
            log.held_out.len()
        );
        run_round(search, &dir, &mut log, settings).await?;
    }
    Ok(log)
}

/// The campaign's own pace: wall time per attempt settled since this search started
/// (asking the attacker, and each round's drain to its slowest case, included), for
/// the ETA of the rounds left.
struct Pace {
    started: std::time::Instant,
    settled_before: usize,
}

impl Pace {
    fn start(log: &SearchLog) -> Pace {
        Pace { started: std::time::Instant::now(), settled_before: settled(log) }
    }

    /// Sets the round's frame's pace, once an attempt has settled here.
    fn frame(&self, settings: &mut GymSettings, log: &SearchLog) {
        let settled = settled(log).saturating_sub(self.settled_before);
        if let (Some(frame), true) = (settings.frame.as_mut(), settled > 0) {
            frame.ms_per_case = Some(self.started.elapsed().as_millis() as u64 / settled as u64);
        }
    }
}

/// Attempts that came to something: refused before use, or their case ran.
fn settled(log: &SearchLog) -> usize {
    let attempts = log.pairs.iter().chain(&log.held_out).flat_map(|p| &p.attempts);
    attempts.filter(|a| a.refused.is_some() || a.landed.is_some()).count()
}

/// One pass of the gym over every case so far (recorded ones skipped); outcomes and
/// feedback recorded, the log written before and after.
async fn run_round(
    search: &Search<'_>,
    dir: &RunDir,
    log: &mut SearchLog,
    mut settings: GymSettings,
) -> anyhow::Result<()> {
    write_log(search.run_dir, log).await?;
    let cases = cases(log);
    // A resume of a finished round: its outcomes are in the log already.
    let recorded = log
        .pairs
        .iter()
        .chain(&log.held_out)
        .flat_map(|p| &p.attempts)
        .all(|a| a.refused.is_some() || a.landed.is_some());
    if cases.is_empty() || recorded {
        return Ok(());
    }
    extend_settings(&mut settings, log);
    let plan = search.plan;
    let sub = Plan { name: format!("{}-adaptive", plan.name), cases, hash: plan.hash.clone(), ..plan.clone() };
    let executed = gym::execute(search.pyenv, dir, &sub, search.inventory, settings).await?;
    if let Some(busy) = executed.gym.concurrency.as_ref().and_then(|c| c.busy) {
        log.busy = Some(log.busy.unwrap_or_default().plus(busy));
    }
    let (dir, truth, records) = (dir.clone(), search.truth.clone(), executed.gym.records);
    let mut updated = log.clone();
    let updated = runtime::blocking(move || {
        record(&mut updated, &records, &dir, &truth);
        Ok::<_, anyhow::Error>(updated)
    })
    .await?;
    *log = updated;
    write_log(search.run_dir, log).await
}

async fn write_log(run_dir: &RunDir, log: &SearchLog) -> anyhow::Result<()> {
    let (run_dir, written) = (run_dir.clone(), log.clone());
    runtime::blocking(move || run_dir.write_search_log(&written)).await
}

/// Records the outcomes of the gym's records by case id, with each attempt's feedback
/// from its trace.
fn record(log: &mut SearchLog, records: &[CaseRecord], dir: &RunDir, truth: &Truth) {
    let by_id: BTreeMap<&str, &CaseRecord> = records.iter().map(|r| (r.case_id.as_str(), r)).collect();
    for pair in log.pairs.iter_mut().chain(log.held_out.iter_mut()) {
        let suite = truth.suites.get(&pair.suite);
        let goal = suite.and_then(|s| s.injection_tasks.get(&pair.injection_task));
        let user_calls = suite.and_then(|s| s.user_tasks.get(&pair.user_task)).map_or(&[][..], |u| u.calls.as_slice());
        for attempt in pair.attempts.iter_mut().filter(|a| a.refused.is_none()) {
            let Some(record) = by_id.get(attempt.case_id.as_str()) else { continue };
            attempt.landed = record.security;
            let Ok(trace) = dir.trace(record) else { continue };
            let landed = record.security == Some(true);
            let (text, calls) = goal.map_or(("", &[][..]), |g| (g.goal.as_str(), g.calls.as_slice()));
            attempt.feedback = Some(feedback::of_trace(&trace, landed, text, calls, user_calls));
            attempt.behaviour = Some(feedback::behaviour(&trace));
            if pair.lands.is_none() {
                pair.lands = feedback::lands(&trace);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pruefstand_core::record::Wording;

    fn adaptive(attempts: usize) -> Adaptive {
        let pairs = (0..12).map(|u| ("banking".to_string(), format!("user_task_{u}"), "injection_task_0".to_string()));
        Adaptive {
            attempts,
            families: vec!["roleplay".into(), "authority".into()],
            pairs: pairs.collect(),
            attacker: None,
        }
    }

    /// A model that falls for roleplay worded with its second framing only.
    fn respond(w: &Wording) -> Option<bool> {
        Some(w.family == "roleplay" && w.choices[0] == 1)
    }

    fn play(seed: u64, attempts: usize) -> SearchLog {
        let mut log = new_log(seed, &adaptive(attempts), &Proposer::Grammar, None);
        for k in 0..attempts {
            let landed = grammar::pool(&log, k);
            for pair in log.pairs.iter_mut().filter(|p| p.attempts.len() == k && !p.broken()) {
                let tried: Vec<_> = pair.attempts.iter().filter_map(Attempt::wording).collect();
                let (w, how) = grammar::next(seed, &pair.key(), k, &log.families, &landed, &tried);
                let case = case_of(pair, &format!("adaptive_{}", k + 1));
                let outcome = respond(&w);
                pair.attempts.push(Attempt { landed: outcome, ..written(case, Proposal::Wording(w), how) });
            }
        }
        log
    }

    #[test]
    fn the_search_is_seeded_keeps_what_lands_and_stops_on_broken_pairs() {
        let log = play(3, 6);
        assert_eq!(log, play(3, 6), "replays exactly");
        assert_ne!(log, play(4, 6), "another seed, another search");
        for pair in &log.pairs {
            let first_landed = pair.attempts.iter().position(|a| a.landed == Some(true));
            if let Some(i) = first_landed {
                assert_eq!(i + 1, pair.attempts.len(), "no attempt after a pair broke");
            }
            assert!(pair.attempts.len() <= 6);
            let mut seen: Vec<&Proposal> = pair.attempts.iter().map(|a| &a.proposal).collect();
            seen.dedup();
            assert_eq!(seen.len(), pair.attempts.len(), "never the same wording twice on a pair");
        }
        let (broken, pairs) = log.broken();
        assert_eq!(pairs, 6, "half the pairs are searched");
        assert_eq!(log.held_out.len(), 6, "the other half held out");
        assert!(broken >= 4, "the search finds the weak spot: {broken} of 6");
        assert!(log.pairs.iter().flat_map(|p| &p.attempts).any(|a| a.how != How::Fresh), "it builds on what landed");
        assert!(play(3, 1).broken().0 < broken);
        let frozen = freeze(&log, 2);
        assert_eq!(frozen.len(), 2);
        assert!(frozen[0].broke.len() >= frozen[1].broke.len() && !frozen[0].broke.is_empty(), "{frozen:?}");
    }

    #[test]
    fn a_resume_keeps_the_log_when_only_the_servers_port_moved() {
        let facts =
            |url: &str| AttackerFacts { model: "m".into(), url: Some(url.into()), prompt_sha256: Some("h".into()) };
        let mut old = new_log(1, &adaptive(2), &Proposer::Grammar, None);
        old.attacker = Some(facts("http://127.0.0.1:1/v1"));
        old.pairs[0].lands = Some("recorded".into());
        let mut fresh = new_log(1, &adaptive(2), &Proposer::Grammar, None);
        fresh.attacker = Some(facts("http://127.0.0.1:2/v1"));
        assert_eq!(resumed(Some(old.clone()), fresh.clone()), old);
        fresh.attacker.as_mut().unwrap().model = "other".into();
        assert_eq!(resumed(Some(old), fresh.clone()), fresh, "another attacker: a new search");
    }

    #[test]
    fn the_split_is_seeded_and_disjoint() {
        let pairs = adaptive(1).pairs;
        let (search, held_out) = split(5, &pairs);
        assert_eq!((search.len(), held_out.len()), (6, 6));
        assert!(search.iter().all(|i| !held_out.contains(i)));
        assert_eq!(split(5, &pairs), (search.clone(), held_out));
        assert_ne!(split(6, &pairs).0, search);
        assert_eq!(split(5, &pairs[..1]), (vec![0], vec![]));
    }
}
