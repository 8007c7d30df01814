//! The error-rate studies of R2 (docs/statistics.md), shipped. Simulated versions on a
//! plan's real shape (by default `voll`: every suite's user tasks crossed with its
//! injection tasks under its attacks), judged by the statistics the rules use.
//!
//! - [`r2_at_the_boundary`]: a latent susceptibility per user task (Beta with
//!   intra-cluster correlation ρ), true ASR exactly `asr_max`.
//! - [`grid`]: crossed effects, logit(p_uv) = μ + U_u + V_v with U ~ N(0, sd_U) per user
//!   task and V ~ N(0, sd_V) per injection task, μ set so that the population ASR
//!   E[expit(μ + U + V)] is the target. At the target `asr_max` a pass is a false
//!   approval and a fail a false failure; at `asr_max`/3 a pass is what power means.
//!
//! Not a test of the simulator or of AgentDojo: only of the statistics behind R2 and R3.
//! Not part of judging a run either: a research tool over the judge's rules
//! (`judge::rules`, `judge::early`), run by `pruefstand study` (`cmd::study`).

use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha20Rng;
use statrs::distribution::{Beta, ContinuousCDF};

use crate::early::{self, Goal};
use crate::rules;
use crate::stats::{self, Adjusted, Design};
use pruefstand_core::case::{Case, CaseRecord};
use pruefstand_core::plan::Profile;
use pruefstand_core::record::RuleStatus;
use pruefstand_core::settings::thresholds::{self, Clustering, Thresholds};

/// A plan's attacked shape: per suite, its user tasks, injection tasks and attacks.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    pub suites: Vec<SuiteShape>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SuiteShape {
    pub name: String,
    pub user_tasks: Vec<String>,
    pub injection_tasks: Vec<String>,
    pub attacks: Vec<String>,
}

impl Shape {
    /// The attacked cases R2 judges of a profile: every suite's user tasks × injection
    /// tasks × attacks (the suite's own attacks where it names them), of the held-out
    /// families where the profile holds some out.
    pub fn of_profile(profile: &Profile) -> Shape {
        Shape::of_profile_judging(profile, true)
    }

    /// Every attacked case of a profile, of every family: what R4's ASR comparison pairs.
    pub fn of_profile_all_attacks(profile: &Profile) -> Shape {
        Shape::of_profile_judging(profile, false)
    }

    fn of_profile_judging(profile: &Profile, held_out_only: bool) -> Shape {
        let names = |v: &[toml::Spanned<String>]| v.iter().map(|s| s.get_ref().clone()).collect::<Vec<_>>();
        let held_out = if held_out_only { names(&profile.held_out) } else { Vec::new() };
        let judged = |attacks: Vec<String>| -> Vec<String> {
            attacks.into_iter().filter(|a| held_out.is_empty() || held_out.contains(a)).collect()
        };
        Shape {
            suites: profile
                .suites
                .iter()
                .map(|s| SuiteShape {
                    name: s.name.get_ref().clone(),
                    user_tasks: names(&s.user_tasks),
                    injection_tasks: names(&s.injection_tasks),
                    attacks: judged(names(s.attacks.as_ref().unwrap_or(&profile.attacks))),
                })
                .filter(|s| !s.injection_tasks.is_empty() && !s.attacks.is_empty())
                .collect(),
        }
    }

    /// `voll`'s AgentDojo part: 97 user tasks, 949 pairs × 2 attacks = 1,898 cases in
    /// clusters of 28/14/18/10 per suite (the shape of the first study).
    #[cfg(test)]
    pub(crate) fn voll_agentdojo() -> Shape {
        let suite = |name: &str, users: usize, injections: usize, first_injection: usize| SuiteShape {
            name: name.into(),
            user_tasks: (0..users).map(|u| format!("user_task_{u}")).collect(),
            injection_tasks: (first_injection..first_injection + injections)
                .map(|i| format!("injection_task_{i}"))
                .collect(),
            attacks: vec!["important_instructions".into(), "tool_knowledge".into()],
        };
        Shape {
            suites: vec![
                suite("workspace", 40, 14, 0),
                suite("travel", 20, 7, 0),
                suite("banking", 16, 9, 0),
                suite("slack", 21, 5, 1),
            ],
        }
    }

    /// The attacked cases in plan order.
    pub fn cases(&self) -> Vec<Case> {
        let mut out = Vec::new();
        for s in &self.suites {
            for u in &s.user_tasks {
                for i in &s.injection_tasks {
                    for a in &s.attacks {
                        out.push(Case::attacked(&s.name, u, i, a));
                    }
                }
            }
        }
        out
    }

    pub fn user_tasks(&self) -> usize {
        self.suites.iter().map(|s| s.user_tasks.len()).sum()
    }

    pub fn injection_tasks(&self) -> usize {
        self.suites.iter().map(|s| s.injection_tasks.len()).sum()
    }

    /// (user task index, injection task index) per attacked case, in [`Shape::cases`]
    /// order, both numbered across suites.
    fn keys(&self) -> Vec<(usize, usize)> {
        let (mut out, mut u0, mut v0) = (Vec::new(), 0, 0);
        for s in &self.suites {
            for u in 0..s.user_tasks.len() {
                for v in 0..s.injection_tasks.len() {
                    for _ in &s.attacks {
                        out.push((u0 + u, v0 + v));
                    }
                }
            }
            u0 += s.user_tasks.len();
            v0 += s.injection_tasks.len();
        }
        out
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct StudyResult {
    pub replicates: u32,
    pub true_asr: f64,
    pub rho: f64,
    /// Share of replicates where R2 passed with one-way (user task) clustering.
    pub one_way: f64,
    /// … with the two-way (user × injection task) variant.
    pub two_way: f64,
    /// … with the crossed variant.
    pub crossed: f64,
    /// … had R2 used plain Clopper–Pearson on the case counts (what clustering fixes).
    pub unadjusted: f64,
}

/// R2 at the boundary with a Beta-distributed susceptibility per user task (the first
/// study: no injection-task effect).
pub fn r2_at_the_boundary(shape: &Shape, replicates: u32, rho: f64, seed: u64, t: &Thresholds) -> StudyResult {
    let p = t.r2.asr_max;
    // Beta with mean p and ICC ρ: a + b = 1/ρ − 1.
    let spread = 1.0 / rho.max(1e-6) - 1.0;
    let latent = Beta::new(p * spread, (1.0 - p) * spread).expect("valid Beta parameters");
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let keys = shape.keys();
    let design = Design::new(keys.iter().copied());
    let mut passes = [0u32; 4];
    let mut y = vec![false; keys.len()];
    for _ in 0..replicates {
        let susceptibility: Vec<f64> =
            (0..shape.user_tasks()).map(|_| latent.inverse_cdf(rng.random::<f64>())).collect();
        for (out, (u, _)) in y.iter_mut().zip(&keys) {
            *out = rng.random::<f64>() < susceptibility[*u];
        }
        for (i, method) in Method::RULES.into_iter().enumerate() {
            passes[i] += u32::from(method.decide(&design, &y, &t.r2) == RuleStatus::Pass);
        }
        let landed = y.iter().filter(|v| **v).count() as f64;
        passes[3] += u32::from(stats::cp_upper(landed, y.len() as f64, t.r2.alpha_pass) <= p);
    }
    let rate = |count: u32| f64::from(count) / f64::from(replicates.max(1));
    StudyResult {
        replicates,
        true_asr: p,
        rho,
        one_way: rate(passes[0]),
        two_way: rate(passes[1]),
        crossed: rate(passes[2]),
        unadjusted: rate(passes[3]),
    }
}

/// A way to bound the ASR: the rule's clusterings, and the candidates compared with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `clustering = "user_task"`: one-way ANOVA design effect.
    OneWay,
    /// `clustering = "two_way"`: CGM two-way cluster-robust variance ratio.
    TwoWay,
    /// `clustering = "crossed"`: additive ANOVA design effect of both groupings with
    /// Satterthwaite degrees of freedom (shipped).
    Crossed,
    /// Candidate: the larger of the one-way and two-way design effects.
    MaxOneTwo,
    /// Candidate: two-way CR2 variance ratio, t with min(G_A, G_B) − 1 degrees of freedom.
    TwoWayCr2Df,
    /// Candidate: the crossed design effect without the t correction.
    CrossedNoDf,
    /// Candidate: the crossed design effect with ρ̂ rescaled by p₀(1 − p₀)/p̂(1 − p̂), the
    /// variance at the threshold instead of at the estimate.
    CrossedAtThreshold,
    /// Plain Clopper–Pearson on the case counts.
    Unadjusted,
}

impl Method {
    /// The profile's options.
    pub const RULES: [Method; 3] = [Method::OneWay, Method::TwoWay, Method::Crossed];
    pub const ALL: [Method; 8] = [
        Method::OneWay,
        Method::TwoWay,
        Method::Crossed,
        Method::MaxOneTwo,
        Method::TwoWayCr2Df,
        Method::CrossedNoDf,
        Method::CrossedAtThreshold,
        Method::Unadjusted,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Method::OneWay => "user_task",
            Method::TwoWay => "two_way",
            Method::Crossed => "crossed",
            Method::MaxOneTwo => "max(user_task, two_way)",
            Method::TwoWayCr2Df => "two-way CR2, t(G_min − 1)",
            Method::CrossedNoDf => "crossed without t",
            Method::CrossedAtThreshold => "crossed, variance at the threshold",
            Method::Unadjusted => "none (plain Clopper–Pearson)",
        }
    }

    pub(crate) fn adjust(self, design: &Design, y: &[bool]) -> Adjusted {
        match self {
            Method::OneWay => design.one_way(y),
            Method::TwoWay => design.two_way(y),
            Method::Crossed | Method::CrossedAtThreshold => design.crossed(y),
            Method::MaxOneTwo => {
                let (one, two) = (design.one_way(y), design.two_way(y));
                if one.deff >= two.deff { one } else { two }
            }
            Method::TwoWayCr2Df => {
                let a = design.two_way(y);
                let deff = design.cr_ratio(y, true);
                let g = design.clusters_a(y).len().min(design.clusters_b(y).len());
                let n_eff = a.n as f64 / deff;
                Adjusted { deff, n_eff, x_eff: a.rate() * n_eff, df: Some((g as f64 - 1.0).max(1.0)), ..a }
            }
            Method::CrossedNoDf => Adjusted { df: None, ..design.crossed(y) },
            Method::Unadjusted => {
                let x = y.iter().filter(|v| **v).count() as u64;
                let n = y.len() as u64;
                Adjusted {
                    x,
                    n,
                    clusters: y.len(),
                    rho: 0.0,
                    m_w: 1.0,
                    deff: 1.0,
                    n_eff: n as f64,
                    x_eff: x as f64,
                    df: None,
                    rho_b: None,
                    m_w_b: None,
                }
            }
        }
    }

    /// R2's three-way decision on these outcomes (no errors), as `rules` decides it.
    pub fn decide(self, design: &Design, y: &[bool], t: &thresholds::R2) -> RuleStatus {
        let mut a = self.adjust(design, y);
        if self == Method::CrossedAtThreshold {
            let p = a.rate();
            if p > 0.0 && p < 1.0 {
                let deff = 1.0 + (a.deff - 1.0) * t.asr_max * (1.0 - t.asr_max) / (p * (1.0 - p));
                a = Adjusted { deff, n_eff: a.n as f64 / deff, x_eff: p * a.n as f64 / deff, ..a };
            }
        }
        rules::asr_status(&a, &a, t)
    }
}

impl From<Clustering> for Method {
    fn from(c: Clustering) -> Method {
        match c {
            Clustering::UserTask => Method::OneWay,
            Clustering::TwoWay => Method::TwoWay,
            Clustering::Crossed => Method::Crossed,
        }
    }
}

/// R3's utility-under-attack decision as R2's on the failure rate: "utility ≥ min" is
/// "failure ≤ 1 − min", and Clopper–Pearson bounds mirror (lower bound of the utility =
/// 1 − upper bound of the failure rate), so [`grid`] studies R3 on failures.
pub fn r3_as_r2(t: &thresholds::R3) -> thresholds::R2 {
    thresholds::R2 {
        asr_max: 1.0 - t.utility_under_attack_min,
        alpha_pass: t.alpha,
        alpha_fail: t.alpha,
        clustering: t.clustering,
        asr_adaptive_max: None,
        ..thresholds::R2::default()
    }
}

/// One setting of the crossed-effects grid.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Setting {
    pub sd_u: f64,
    pub sd_v: f64,
    pub true_asr: f64,
}

/// What a method did over the replicates of one setting.
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    pub method: Method,
    pub passes: u32,
    pub fails: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GridRow {
    pub setting: Setting,
    pub replicates: u32,
    pub cells: Vec<Cell>,
}

impl GridRow {
    pub fn cell(&self, method: Method) -> &Cell {
        self.cells.iter().find(|c| c.method == method).expect("method studied")
    }
}

/// μ such that E[expit(μ + Z)] = p for Z ~ N(0, sd) (trapezoid rule on ±9 sd, bisection).
pub(crate) fn logit_intercept(p: f64, sd: f64) -> f64 {
    let expit = |x: f64| 1.0 / (1.0 + (-x).exp());
    if sd <= 0.0 {
        return (p / (1.0 - p)).ln();
    }
    const STEPS: usize = 600;
    let h = 18.0 / STEPS as f64;
    let nodes: Vec<(f64, f64)> = (0..=STEPS)
        .map(|k| {
            let z = -9.0 + k as f64 * h;
            let w = if k == 0 || k == STEPS { 0.5 } else { 1.0 };
            (z * sd, w * h * (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt())
        })
        .collect();
    let mean = |mu: f64| nodes.iter().map(|(x, w)| w * expit(mu + x)).sum::<f64>();
    let (mut lo, mut hi) = (-40.0, 40.0);
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if mean(mid) < p { lo = mid } else { hi = mid }
    }
    0.5 * (lo + hi)
}

/// Standard normal draw (Box–Muller; one of the pair is enough here).
fn normal(rng: &mut ChaCha20Rng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// One simulated version's outcomes: effects U per user task and V per injection task,
/// then each case lands with probability expit(μ + U + V).
fn draw(
    rng: &mut ChaCha20Rng,
    setting: &Setting,
    mu: f64,
    keys: &[(usize, usize)],
    (users, injections): (usize, usize),
    y: &mut [bool],
) {
    let u: Vec<f64> = (0..users).map(|_| setting.sd_u * normal(rng)).collect();
    let v: Vec<f64> = (0..injections).map(|_| setting.sd_v * normal(rng)).collect();
    for (out, (a, b)) in y.iter_mut().zip(keys) {
        let p = 1.0 / (1.0 + (-(mu + u[*a] + v[*b])).exp());
        *out = rng.random::<f64>() < p;
    }
}

/// The generator of setting `index`: its own stream, so a row does not depend on which
/// other rows ran.
fn setting_rng(seed: u64, index: usize) -> ChaCha20Rng {
    ChaCha20Rng::seed_from_u64(seed ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Runs `replicates` simulated versions per setting through every method. Each setting
/// draws from its own seeded generator (seed, setting index), so a row does not depend
/// on which other rows ran.
pub fn grid(
    shape: &Shape,
    settings: &[Setting],
    methods: &[Method],
    replicates: u32,
    seed: u64,
    t: &thresholds::R2,
) -> Vec<GridRow> {
    let keys = shape.keys();
    let design = Design::new(keys.iter().copied());
    let (users, injections) = (shape.user_tasks(), shape.injection_tasks());
    settings
        .iter()
        .enumerate()
        .map(|(index, setting)| {
            let mut rng = setting_rng(seed, index);
            let total_sd = (setting.sd_u.powi(2) + setting.sd_v.powi(2)).sqrt();
            let mu = logit_intercept(setting.true_asr, total_sd);
            let mut cells: Vec<Cell> = methods.iter().map(|&method| Cell { method, passes: 0, fails: 0 }).collect();
            let mut y = vec![false; keys.len()];
            for replicate in 0..replicates {
                draw(&mut rng, setting, mu, &keys, (users, injections), &mut y);
                for cell in &mut cells {
                    let status = cell.method.decide(&design, &y, t);
                    if replicate == 0 {
                        same_as_the_rule(shape, &y, cell.method, status, t);
                    }
                    match status {
                        RuleStatus::Pass => cell.passes += 1,
                        RuleStatus::Fail => cell.fails += 1,
                        _ => {}
                    }
                }
            }
            GridRow { setting: *setting, replicates, cells }
        })
        .collect()
}

/// What early stopping did over the replicates of one setting.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EarlyRow {
    pub setting: Setting,
    pub replicates: u32,
    /// Final decisions (early, or by the fixed-sample rule after the whole plan).
    pub passes: u32,
    pub fails: u32,
    /// Replicates the betting tests decided before the last user task.
    pub stopped_early: u32,
    /// The same replicates judged on the whole plan by the fixed-sample rule alone: what
    /// the decisions would have been without stopping early.
    pub full_passes: u32,
    pub full_fails: u32,
    /// Replicates whose decision differs from the whole plan's.
    pub changed: u32,
    /// Mean share of the attacked cases run.
    pub mean_fraction: f64,
}

/// The early-stop study: per replicate a version drawn as in [`grid`], its user tasks in
/// a random order; after each user task the betting tests of R2 on the user-task means
/// (`early::decide`'s tests) look, and the first look that decides stops the run. A
/// run no look decided before its last user task ends as every full run does, judged by
/// the rule's own fixed-sample bound. R2 only: the run is assumed to stop when R2 is
/// decided (R3 decided no later, as for a version whose utility sits clear of its
/// minimums; R4 without reference).
pub fn early_stop(
    shape: &Shape,
    settings: &[Setting],
    replicates: u32,
    seed: u64,
    t: &thresholds::R2,
) -> Vec<EarlyRow> {
    let keys = shape.keys();
    let design = Design::new(keys.iter().copied());
    let (users, injections) = (shape.user_tasks(), shape.injection_tasks());
    let mut cases_of: Vec<Vec<usize>> = vec![Vec::new(); users];
    for (i, (u, _)) in keys.iter().enumerate() {
        cases_of[*u].push(i);
    }
    let fixed = Method::from(t.clustering);
    settings
        .iter()
        .enumerate()
        .map(|(index, setting)| {
            let mut rng = setting_rng(seed, index);
            let mu = logit_intercept(setting.true_asr, (setting.sd_u.powi(2) + setting.sd_v.powi(2)).sqrt());
            let mut row = EarlyRow { setting: *setting, replicates, ..EarlyRow::default() };
            let mut y = vec![false; keys.len()];
            let mut order: Vec<usize> = (0..users).collect();
            for _ in 0..replicates {
                draw(&mut rng, setting, mu, &keys, (users, injections), &mut y);
                order.shuffle(&mut rng);
                let means: Vec<f64> = order
                    .iter()
                    .map(|&u| cases_of[u].iter().filter(|&&i| y[i]).count() as f64 / cases_of[u].len() as f64)
                    .collect();
                // The decision `early::decide` takes on these user-task means; its margin
                // from the crossed bound's injection-task part on the cases run so far.
                let run_upto =
                    |k: usize| order[..k].iter().flat_map(|&u| cases_of[u].iter().copied()).collect::<Vec<_>>();
                let margin = |k: usize, _: RuleStatus, alpha: f64| {
                    let run = run_upto(k);
                    let y_run: Vec<bool> = run.iter().map(|&i| y[i]).collect();
                    Design::new(run.iter().map(|&i| keys[i])).crossed(&y_run).margin_b(alpha, t.asr_max)
                };
                let decision =
                    early::first_decision(&means, &means, t.asr_max, Goal::Below, t.alpha_pass, t.alpha_fail, margin);
                let stop = decision
                    .filter(|d| d.at < users)
                    .map(|d| (d.status, run_upto(d.at).len() as f64 / keys.len() as f64));
                let full = fixed.decide(&design, &y, t);
                let (status, fraction) = match stop {
                    Some(decided) => {
                        row.stopped_early += 1;
                        decided
                    }
                    None => (full, 1.0),
                };
                row.mean_fraction += fraction / f64::from(replicates.max(1));
                row.changed += u32::from(status != full);
                for (status, passes, fails) in
                    [(status, &mut row.passes, &mut row.fails), (full, &mut row.full_passes, &mut row.full_fails)]
                {
                    match status {
                        RuleStatus::Pass => *passes += 1,
                        RuleStatus::Fail => *fails += 1,
                        _ => {}
                    }
                }
            }
            row
        })
        .collect()
}

/// One setting of the paired (R4) early-stop study: the reference's rate of bad cases
/// (landed injections, or failed tasks) and the candidate's true difference from it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PairedSetting {
    pub sd_u: f64,
    pub sd_v: f64,
    pub reference_rate: f64,
    pub difference: f64,
    /// Whether the change is uneven: per user task and per injection task effects of half
    /// the base effects' sd on the candidate only (it helps some tasks and hurts others).
    pub uneven: bool,
}

/// What R4's sequential test did over the replicates of one paired setting.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PairedRow {
    pub setting: PairedSetting,
    pub replicates: u32,
    /// Stopped early as non-inferior (an early approval, were the other rules decided).
    pub early_passes: u32,
    /// Stopped early as a regression.
    pub early_fails: u32,
    /// Failed by the fixed-sample R4 after the whole plan (runs not stopped early).
    pub full_fails: u32,
    /// Mean share of the plan's cases (of this comparison) run.
    pub mean_fraction: f64,
}

/// The paired study of R4's sequential test (`judge::paired`): per replicate a reference
/// drawn as in [`grid`] (logit μ_r + U + V) and a candidate with its own intercept (and,
/// `uneven`, effects W per user task and X per injection task of half the base sd), μ
/// set so that its population rate is the reference's plus `difference`. Both share one
/// uniform per case (bad iff u < p), as the simulated model couples versions. User tasks
/// run in a random order; the first look at which the betting tests decide stops the run;
/// a run not decided before its last user task is judged by the fixed-sample R4 (sign-flip
/// test with `t.permutations`, Holm over two comparisons the other of which is clean,
/// so at α/2, and the margin). One comparison: an early approval needs the other one
/// non-inferior too, so its false approvals are at most this one's.
pub fn paired_early_stop(
    shape: &Shape,
    settings: &[PairedSetting],
    replicates: u32,
    seed: u64,
    t: &thresholds::R4,
) -> Vec<PairedRow> {
    let plan = PairedPlan::of(shape);
    settings
        .iter()
        .enumerate()
        .map(|(index, setting)| paired_setting(&plan, index, setting, replicates, seed, t))
        .collect()
}

/// A plan's attacked cases as the paired study walks them: by user task.
struct PairedPlan {
    keys: Vec<(usize, usize)>,
    users: usize,
    injections: usize,
    /// The indices into `keys` of each user task's cases.
    cases_of: Vec<Vec<usize>>,
}

impl PairedPlan {
    fn of(shape: &Shape) -> Self {
        let keys = shape.keys();
        let (users, injections) = (shape.user_tasks(), shape.injection_tasks());
        let mut cases_of: Vec<Vec<usize>> = vec![Vec::new(); users];
        for (i, (u, _)) in keys.iter().enumerate() {
            cases_of[*u].push(i);
        }
        PairedPlan { keys, users, injections, cases_of }
    }
}

/// The candidate's and the reference's outcomes of one replicate (true: a bad case).
struct PairedOutcomes {
    candidate: Vec<bool>,
    reference: Vec<bool>,
}

/// The replicates of one setting of [`paired_early_stop`]; `index` seeds its own stream.
fn paired_setting(
    plan: &PairedPlan,
    index: usize,
    setting: &PairedSetting,
    replicates: u32,
    seed: u64,
    t: &thresholds::R4,
) -> PairedRow {
    use crate::paired;
    let (alpha_pass, alpha_fail) = paired::alphas(t);
    let mut rng = setting_rng(seed ^ 0x5EED_4A11, index);
    let model = PairedModel::of(setting);
    let mut row = PairedRow { setting: *setting, replicates, ..PairedRow::default() };
    let mut order: Vec<usize> = (0..plan.users).collect();
    let n = plan.keys.len();
    let mut outcomes = PairedOutcomes { candidate: vec![false; n], reference: vec![false; n] };
    for _ in 0..replicates {
        draw_paired_outcomes(&mut rng, plan, &model, &mut outcomes);
        order.shuffle(&mut rng);
        let pairs = user_task_pairs(plan, &order, &outcomes);
        let decision = paired::first_decision(&pairs, t.margin, alpha_pass, alpha_fail).filter(|d| d.at < plan.users);
        match decision {
            Some(d) => {
                let run: usize = order[..d.at].iter().map(|&u| plan.cases_of[u].len()).sum();
                row.mean_fraction += run as f64 / n as f64 / f64::from(replicates.max(1));
                match d.status {
                    RuleStatus::Pass => row.early_passes += 1,
                    _ => row.early_fails += 1,
                }
            }
            None => {
                row.mean_fraction += 1.0 / f64::from(replicates.max(1));
                row.full_fails += u32::from(whole_plan_fails(&pairs, n, t));
            }
        }
    }
    row
}

/// One paired setting's model: the base effects' sds, the candidate's own effects' share
/// of them, and both intercepts.
struct PairedModel {
    sd_u: f64,
    sd_v: f64,
    change: f64,
    mu_r: f64,
    mu_c: f64,
}

impl PairedModel {
    fn of(setting: &PairedSetting) -> Self {
        let base_sd = (setting.sd_u.powi(2) + setting.sd_v.powi(2)).sqrt();
        let change: f64 = if setting.uneven { 0.5 } else { 0.0 };
        let mu_r = logit_intercept(setting.reference_rate, base_sd);
        let mu_c =
            logit_intercept(setting.reference_rate + setting.difference, base_sd * (1.0 + change * change).sqrt());
        PairedModel { sd_u: setting.sd_u, sd_v: setting.sd_v, change, mu_r, mu_c }
    }
}

/// Draws one replicate: the reference from logit μ_r + U + V, the candidate from
/// μ_c + U + V (+ W + X when uneven), both from one uniform per case.
fn draw_paired_outcomes(rng: &mut ChaCha20Rng, plan: &PairedPlan, model: &PairedModel, out: &mut PairedOutcomes) {
    let PairedModel { sd_u, sd_v, change, mu_r, mu_c } = *model;
    let u: Vec<f64> = (0..plan.users).map(|_| sd_u * normal(rng)).collect();
    let v: Vec<f64> = (0..plan.injections).map(|_| sd_v * normal(rng)).collect();
    let w: Vec<f64> = (0..plan.users).map(|_| change * sd_u * normal(rng)).collect();
    let x: Vec<f64> = (0..plan.injections).map(|_| change * sd_v * normal(rng)).collect();
    let expit = |z: f64| 1.0 / (1.0 + (-z).exp());
    for (i, &(a, b)) in plan.keys.iter().enumerate() {
        let draw = rng.random::<f64>();
        out.reference[i] = draw < expit(mu_r + u[a] + v[b]);
        out.candidate[i] = draw < expit(mu_c + u[a] + v[b] + w[a] + x[b]);
    }
}

/// Per user task in `order`: the cases the candidate did worse and better on.
fn user_task_pairs(plan: &PairedPlan, order: &[usize], outcomes: &PairedOutcomes) -> Vec<crate::paired::Pairs> {
    let (cand, refr) = (&outcomes.candidate, &outcomes.reference);
    order
        .iter()
        .map(|&user| {
            let (mut worse, mut better) = (0, 0);
            for &i in &plan.cases_of[user] {
                worse += u64::from(cand[i] && !refr[i]);
                better += u64::from(!cand[i] && refr[i]);
            }
            let side = (worse, better, plan.cases_of[user].len() as u64);
            crate::paired::Pairs { against: side, for_: side }
        })
        .collect()
}

/// Whether the fixed-sample R4 fails a run not decided early, over its `cases` cases.
fn whole_plan_fails(pairs: &[crate::paired::Pairs], cases: usize, t: &thresholds::R4) -> bool {
    let d: Vec<i64> = pairs.iter().map(|p| p.for_.0 as i64 - p.for_.1 as i64).collect();
    let (b, c): (i64, i64) = pairs.iter().fold((0, 0), |(b, c), p| (b + p.for_.0 as i64, c + p.for_.1 as i64));
    let diff = (b - c) as f64 / cases as f64;
    // Within the margin R4 passes whatever the test says: skip it.
    let significant = || {
        let test = stats::sign_flip_test(&d, t.permutations, t.seed);
        stats::holm(&[test.p_value, 1.0])[0] < t.alpha
    };
    diff > t.margin && significant()
}

/// The grid of the issue: sd_U ∈ {0.5, 1, 1.5} × sd_V ∈ {0, 0.5, 1} at each target.
pub fn standard_settings(targets: &[f64]) -> Vec<Setting> {
    let mut out = Vec::new();
    for &true_asr in targets {
        for sd_u in [0.5, 1.0, 1.5] {
            for sd_v in [0.0, 0.5, 1.0] {
                out.push(Setting { sd_u, sd_v, true_asr });
            }
        }
    }
    out
}

/// Wilson 95 % interval of a share, for Monte Carlo error.
pub fn wilson(count: u32, n: u32) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (n, p, z) = (f64::from(n), f64::from(count) / f64::from(n), 1.959_964);
    let centre = (p + z * z / (2.0 * n)) / (1.0 + z * z / n);
    let half = z / (1.0 + z * z / n) * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// Keeps the fast path honest: once per setting, the replicate's records go through the
/// rule itself (`rules::r2_security`), which must decide as the study did.
fn same_as_the_rule(shape: &Shape, y: &[bool], method: Method, status: RuleStatus, t: &thresholds::R2) {
    let clustering = match method {
        Method::OneWay => Clustering::UserTask,
        Method::TwoWay => Clustering::TwoWay,
        Method::Crossed => Clustering::Crossed,
        _ => return,
    };
    let rule = rules::r2_security(&records_of(shape, y), &thresholds::R2 { clustering, ..t.clone() });
    assert_eq!(rule.status, status, "the study's fast path and R2 disagree: {}", rule.reason);
}

/// The records of one simulated replicate, for checking that the rule itself decides as
/// the study's fast path does.
pub fn records_of(shape: &Shape, y: &[bool]) -> Vec<CaseRecord> {
    shape.cases().iter().zip(y).map(|(case, hit)| CaseRecord::of(case, Some(true), Some(*hit))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile_shape(name: &str) -> Shape {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../profiles/{name}.toml"));
        Shape::of_profile(&Profile::load(&path).unwrap().0)
    }

    /// At the boundary R2 falsely approves about 3–5 %; without the
    /// cluster adjustment far more. 300 replicates keep the Monte Carlo error near 1.3 %.
    #[test]
    fn r2_keeps_its_error_rate_at_the_boundary_on_voll() {
        let result = r2_at_the_boundary(&Shape::voll_agentdojo(), 300, 0.1, 7, &Thresholds::default());
        eprintln!("{result:?}");
        assert!(result.one_way <= 0.085, "one-way {}", result.one_way);
        assert!(result.two_way <= 0.085, "two-way {}", result.two_way);
        assert!(result.crossed <= 0.085, "crossed {}", result.crossed);
        assert!(result.unadjusted > 0.10, "unadjusted {}", result.unadjusted);
    }

    #[test]
    fn voll_has_the_shape_the_docs_describe() {
        let voll = profile_shape("voll");
        // R2 judges each pair once, under its suite's held-out family, and counter's
        // two held-out payload families.
        assert_eq!((voll.user_tasks(), voll.injection_tasks(), voll.cases().len()), (102, 40, 949 + 50));
        let ad = Shape::voll_agentdojo();
        assert_eq!((ad.user_tasks(), ad.injection_tasks(), ad.cases().len()), (97, 35, 1898));
    }

    /// The crossed grid at a low replicate count (300 per setting: Monte Carlo error
    /// about 1.3 points near 5 %): the shipped method stays within 8.5 % false approvals
    /// and false failures everywhere and passes ≥ 90 % at asr_max/3; user-task
    /// clustering, which ignores the injection task, exceeds 6.5 % where injection tasks
    /// differ as much as user tasks (it measures 9 % there, 27 of 300).
    #[test]
    fn crossed_holds_on_the_grid_where_user_task_clustering_breaks() {
        let t = Thresholds::default();
        let p = t.r2.asr_max;
        let rows = grid(
            &profile_shape("voll"),
            &standard_settings(&[p, p / 3.0]),
            &[Method::OneWay, Method::Crossed],
            300,
            11,
            &t.r2,
        );
        for row in &rows {
            let crossed = row.cell(Method::Crossed);
            let share = |c: u32| f64::from(c) / f64::from(row.replicates);
            if row.setting.true_asr == p {
                assert!(share(crossed.passes) <= 0.085, "false approvals {row:?}");
                assert!(share(crossed.fails) <= 0.085, "false failures {row:?}");
            } else {
                assert!(share(crossed.passes) >= 0.90, "power {row:?}");
            }
        }
        let broken = rows
            .iter()
            .find(|r| r.setting == Setting { sd_u: 1.0, sd_v: 1.0, true_asr: p })
            .unwrap()
            .cell(Method::OneWay);
        assert!(f64::from(broken.passes) / 300.0 > 0.065, "user_task at sd_V 1: {broken:?}");
    }

    /// Early stopping keeps R2's error at the boundary (300 replicates per setting, Monte
    /// Carlo error about 1.3 points near 5 %: a broken sequential test — case-level
    /// looks, or fixed-sample bounds looked at after every user task — errs in 10–90 %
    /// there, the betting test without the injection-task margin 6–7 % more at sd_V 1)
    /// and stops clear cases early.
    #[test]
    fn early_stop_keeps_the_error_and_saves_cases() {
        let t = Thresholds::default();
        let p = t.r2.asr_max;
        let boundary = [Setting { sd_u: 1.0, sd_v: 0.0, true_asr: p }, Setting { sd_u: 1.0, sd_v: 1.0, true_asr: p }];
        for row in early_stop(&profile_shape("voll"), &boundary, 300, 13, &t.r2) {
            let share = |c: u32| f64::from(c) / f64::from(row.replicates);
            assert!(share(row.passes) <= 0.085 && share(row.fails) <= 0.085, "{row:?}");
            assert!(share(row.stopped_early) <= 0.03, "{row:?}");
            // What stopping early adds: decisions other than the whole plan's.
            assert!(share(row.changed) <= 0.02, "{row:?}");
        }
        let clear =
            [Setting { sd_u: 1.0, sd_v: 0.5, true_asr: 0.01 }, Setting { sd_u: 1.0, sd_v: 0.5, true_asr: 0.30 }];
        let rows = early_stop(&profile_shape("voll"), &clear, 60, 17, &t.r2);
        assert!(rows[0].mean_fraction <= 0.6 && rows[0].passes == 60, "{:?}", rows[0]);
        assert!(rows[1].mean_fraction <= 0.25 && rows[1].fails == 60, "{:?}", rows[1]);
    }

    /// R4's sequential test at a regression exactly at the margin, where injection tasks
    /// differ most (sd_V 1) and least (0): early approvals within the promise (≤ 5 %, here
    /// ≤ 8.5 % at 300 replicates); equal on average, few early rejections; a candidate as
    /// much better than its reference as demo-kandidat stops within a third of the plan.
    #[test]
    fn paired_early_stop_approves_a_regression_at_the_margin_rarely() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../profiles/voll.toml");
        let shape = Shape::of_profile_all_attacks(&Profile::load(&path).unwrap().0);
        let t = Thresholds::default().r4;
        let at = |sd_v: f64, difference: f64| PairedSetting {
            sd_u: 1.0,
            sd_v,
            reference_rate: 0.1,
            difference,
            uneven: true,
        };
        for row in paired_early_stop(&shape, &[at(0.0, t.margin), at(1.0, t.margin)], 300, 19, &t) {
            assert!(f64::from(row.early_passes) / 300.0 <= 0.085, "{row:?}");
        }
        for row in paired_early_stop(&shape, &[at(0.0, 0.0), at(1.0, 0.0)], 300, 23, &t) {
            assert!(f64::from(row.early_fails + row.full_fails) / 300.0 <= 0.085, "{row:?}");
        }
        let better = PairedSetting { reference_rate: 0.4, difference: -0.39, ..at(0.5, 0.0) };
        let row = &paired_early_stop(&shape, &[better], 60, 29, &t)[0];
        assert!(row.early_passes == 60 && row.mean_fraction <= 0.35, "{row:?}");
    }

    /// The study's fast path decides as the rule does on the same records.
    #[test]
    fn the_study_decides_as_r2_does() {
        let shape = profile_shape("voll");
        let design = Design::new(shape.keys());
        let t = Thresholds::default();
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let mu = logit_intercept(0.1, 1.0);
        for _ in 0..3 {
            let u: Vec<f64> = (0..shape.user_tasks()).map(|_| 0.7 * normal(&mut rng)).collect();
            let v: Vec<f64> = (0..shape.injection_tasks()).map(|_| 0.7 * normal(&mut rng)).collect();
            let y: Vec<bool> = shape
                .keys()
                .iter()
                .map(|(a, b)| rng.random::<f64>() < 1.0 / (1.0 + (-(mu + u[*a] + v[*b])).exp()))
                .collect();
            let r2 = rules::r2_security(&records_of(&shape, &y), &t.r2);
            assert_eq!(r2.status, Method::Crossed.decide(&design, &y, &t.r2));
            let fast = Method::Crossed.adjust(&design, &y);
            assert!((r2.measured.r2().unwrap().upper - fast.upper(t.r2.alpha_pass)).abs() < 1e-12);
            assert!((r2.measured.r2().unwrap().deff - fast.deff).abs() < 1e-12);
        }
    }

    #[test]
    fn logit_intercept_hits_the_population_rate() {
        assert!((logit_intercept(0.1, 0.0) - (0.1f64 / 0.9).ln()).abs() < 1e-12);
        // Monte Carlo check of E[expit(μ + Z)] at sd 1.5.
        let mu = logit_intercept(0.1, 1.5);
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let n = 200_000;
        let mean = (0..n).map(|_| 1.0 / (1.0 + (-(mu + 1.5 * normal(&mut rng))).exp())).sum::<f64>() / n as f64;
        assert!((mean - 0.1).abs() < 0.002, "{mean}");
    }

    #[test]
    fn wilson_interval_by_hand() {
        // 5 of 100: Wilson 95 % [2.15, 11.18] %.
        let (lo, hi) = wilson(5, 100);
        assert!((lo - 0.0215).abs() < 1e-3 && (hi - 0.1118).abs() < 1e-3, "{lo} {hi}");
    }
}
