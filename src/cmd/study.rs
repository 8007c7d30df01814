//! `pruefstand study`: the error-rate studies of R2 and R3 (docs/statistics.md) — how
//! often the rule approves or fails a version whose true rate sits exactly at the
//! threshold, and how often it passes a clearly good one, on a plan's real shape.

use std::path::PathBuf;
use std::process::ExitCode;

use pruefstand_core::plan::Profile;
use pruefstand_core::root::Root;
use pruefstand_core::settings::thresholds::{R2, R4, Thresholds};
use pruefstand_judge::study::{self, EarlyRow, GridRow, Method, PairedRow, Setting, Shape};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Simulated versions to judge (per setting).
    #[arg(long, default_value_t = 2000)]
    pub(crate) replicates: u32,
    /// Intra-cluster correlation of the latent per-user-task susceptibility (without
    /// --grid).
    #[arg(long, default_value_t = 0.1)]
    pub(crate) rho: f64,
    /// Seed of the simulated versions: the same seed gives the same figures.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// The profile whose shape and thresholds are studied (a name under profiles/ or a
    /// path).
    #[arg(long, default_value = "voll")]
    pub(crate) profile: String,
    /// Crossed effects: logit(p) = μ + U(user task) + V(injection task) with sd_U ∈
    /// {0.5, 1, 1.5} × sd_V ∈ {0, 0.5, 1}; false approvals and false failures at the
    /// threshold, passes at a third of it.
    #[arg(long)]
    pub(crate) grid: bool,
    /// With --grid: R3's utility under attack instead of R2's ASR (threshold
    /// utility_under_attack_min; power 10 points above it).
    #[arg(long, requires = "grid")]
    pub(crate) utility: bool,
    /// With --grid: also the candidate methods that were compared, not only the
    /// profile's clustering options.
    #[arg(long, requires = "grid")]
    pub(crate) candidates: bool,
    /// The early-stop study: R2 decided by betting tests on user-task means, user tasks
    /// in random order, stopping at the first look that decides (the full plan's fixed
    /// rule otherwise): wrong decisions at the threshold over the crossed grid, and the
    /// mean share of cases run at ASR 0.01, 0.05 and 0.30.
    #[arg(long, conflicts_with = "grid")]
    pub(crate) early_stop: bool,
    /// With --early-stop: a candidate with a reference — R4's sequential test on paired
    /// user-task differences (one comparison; reference rate 0.10, as a reference's ASR or
    /// failed-task share): early approvals at a regression exactly at the margin and
    /// false rejections at none over the crossed grid, and the share of the plan run for
    /// a candidate equal to its reference and for clearly better ones.
    #[arg(long, requires = "early_stop")]
    pub(crate) reference: bool,
    /// Overrides the profile's alpha_pass (R2) or alpha (R3), to compare.
    #[arg(long)]
    pub(crate) alpha: Option<f64>,
}

pub(crate) fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let (_, profile, _) = Profile::load_named(&root.path, &args.profile)?;
    let t = thresholds(&profile, args.alpha)?;
    let findings = run(&profile, &args, &t);
    show(&findings, &args);
    Ok(ExitCode::SUCCESS)
}

/// The profile's rules, with `--alpha` in place of R2's alpha_pass and R3's alpha.
fn thresholds(profile: &Profile, alpha: Option<f64>) -> anyhow::Result<Thresholds> {
    let mut t = profile.rules.clone();
    if let Some(alpha) = alpha {
        anyhow::ensure!(alpha > 0.0 && alpha < 0.5, "--alpha {alpha}: must lie in (0, 0.5)");
        t.r2.alpha_pass = alpha;
        t.r3.alpha = alpha;
    }
    Ok(t)
}

/// What a study found, with what its tables name.
enum Findings {
    Boundary { what: String, result: study::StudyResult },
    Grid(GridFindings),
    EarlyStop(EarlyFindings),
    Paired(PairedFindings),
}

/// `--grid`: R2 (or R3 as R2) over the crossed settings, at the threshold and at a good
/// rate.
struct GridFindings {
    what: String,
    rule: &'static str,
    figure: &'static str,
    /// The rule as studied (R3 as its failure rate's R2).
    r2: R2,
    /// The threshold and the good value, in the rule's own figure.
    threshold: f64,
    good: f64,
    /// The same two as the simulated rates of bad cases.
    boundary_rate: f64,
    good_rate: f64,
    methods: Vec<Method>,
    rows: Vec<GridRow>,
}

/// `--early-stop`: R2 with early stopping at the threshold and at clear rates.
struct EarlyFindings {
    what: String,
    r2: R2,
    at_threshold: Vec<EarlyRow>,
    clear: Vec<EarlyRow>,
}

/// `--early-stop --reference`: R4's sequential test at the margin, at no regression,
/// and for a candidate equal to or clearly better than its reference.
struct PairedFindings {
    plan: String,
    shape: Shape,
    r4: R4,
    at_margin: Vec<PairedRow>,
    none: Vec<PairedRow>,
    clear: Vec<(&'static str, PairedRow)>,
}

/// Runs the study the flags ask for.
fn run(profile: &Profile, args: &Args, t: &Thresholds) -> Findings {
    if args.early_stop && args.reference {
        let shape = Shape::of_profile_all_attacks(profile);
        return Findings::Paired(paired(shape, &profile.name, args, &t.r4));
    }
    // R3 judges utility under attack on every attacked case, of every family; only R2
    // narrows to the held-out families.
    if args.utility {
        let shape = Shape::of_profile_all_attacks(profile);
        return Findings::Grid(grid(&shape, described(profile, &shape), args, t));
    }
    let shape = Shape::of_profile(profile);
    let what = described(profile, &shape);
    if args.early_stop {
        return Findings::EarlyStop(early_stop(&shape, what, args, &t.r2));
    }
    if !args.grid {
        let result = study::r2_at_the_boundary(&shape, args.replicates, args.rho, args.seed, t);
        return Findings::Boundary { what, result };
    }
    Findings::Grid(grid(&shape, what, args, t))
}

/// The shape studied, in words, for the first line of a study's output.
fn described(profile: &Profile, shape: &Shape) -> String {
    format!(
        "{}'s shape ({} user tasks, {} injection tasks, {} attacked cases)",
        profile.name,
        shape.user_tasks(),
        shape.injection_tasks(),
        shape.cases().len()
    )
}

fn grid(shape: &Shape, what: String, args: &Args, t: &Thresholds) -> GridFindings {
    let methods: Vec<Method> = if args.candidates { Method::ALL.to_vec() } else { Method::RULES.to_vec() };
    // R3 is studied on its failure rate, where its decision is R2's (study::r3_as_r2).
    let (rule, figure, r2, threshold, good) = if args.utility {
        let r2 = study::r3_as_r2(&t.r3);
        let min = t.r3.utility_under_attack_min;
        ("R3", "utility under attack", r2, min, min + 0.1)
    } else {
        let p = t.r2.asr_max;
        ("R2", "ASR", t.r2.clone(), p, p / 3.0)
    };
    let (boundary_rate, good_rate) = if args.utility { (1.0 - threshold, 1.0 - good) } else { (threshold, good) };
    let settings = study::standard_settings(&[boundary_rate, good_rate]);
    let rows = study::grid(shape, &settings, &methods, args.replicates, args.seed, &r2);
    GridFindings { what, rule, figure, r2, threshold, good, boundary_rate, good_rate, methods, rows }
}

/// The early-stop study (docs/statistics.md, "Stopping early").
fn early_stop(shape: &Shape, what: String, args: &Args, r2: &R2) -> EarlyFindings {
    let boundary = study::standard_settings(&[r2.asr_max]);
    let at_threshold = study::early_stop(shape, &boundary, args.replicates, args.seed, r2);
    let clear: Vec<Setting> = [0.01, 0.05, 0.30]
        .into_iter()
        .flat_map(|true_asr| [0.0, 0.5, 1.0].map(|sd_v| Setting { sd_u: 1.0, sd_v, true_asr }))
        .collect();
    let clear = study::early_stop(shape, &clear, args.replicates, args.seed, r2);
    EarlyFindings { what, r2: r2.clone(), at_threshold, clear }
}

/// The paired early-stop study of R4 (docs/statistics.md, "Stopping early").
fn paired(shape: Shape, plan: &str, args: &Args, t: &R4) -> PairedFindings {
    let grid = |difference: f64| -> Vec<study::PairedSetting> {
        let mut out = Vec::new();
        for sd_u in [0.5, 1.0, 1.5] {
            for sd_v in [0.0, 0.5, 1.0] {
                out.push(study::PairedSetting { sd_u, sd_v, reference_rate: 0.10, difference, uneven: true });
            }
        }
        out
    };
    let at_margin = study::paired_early_stop(&shape, &grid(t.margin), args.replicates, args.seed, t);
    let none = study::paired_early_stop(&shape, &grid(0.0), args.replicates, args.seed, t);
    let clear = [
        ("equal to its reference (the same outcomes)", 0.10, 0.0, false),
        ("clearly better: 0.10 → 0.05", 0.10, -0.05, true),
        ("clearly better: 0.10 → 0.03", 0.10, -0.07, true),
        ("clearly better: 0.40 → 0.01", 0.40, -0.39, true),
    ]
    .into_iter()
    .map(|(label, reference_rate, difference, uneven)| {
        let setting = study::PairedSetting { sd_u: 1.0, sd_v: 0.5, reference_rate, difference, uneven };
        let mut rows = study::paired_early_stop(&shape, &[setting], args.replicates, args.seed, t);
        (label, rows.remove(0))
    })
    .collect();
    PairedFindings { plan: plan.to_string(), shape, r4: t.clone(), at_margin, none, clear }
}

fn show(findings: &Findings, args: &Args) {
    match findings {
        Findings::Boundary { what, result } => show_boundary(what, result),
        Findings::Grid(grid) => {
            show_grid_table(grid, args);
            show_grid_summary(grid);
        }
        Findings::EarlyStop(early) => show_early_stop(early, args),
        Findings::Paired(paired) => {
            show_paired_grid(paired, args);
            show_paired_clear(paired);
        }
    }
}

fn show_boundary(what: &str, result: &study::StudyResult) {
    outln!(
        "R2 at the boundary on {what}: true ASR = asr_max = {:.2}, ρ = {}, {} simulated versions:",
        result.true_asr,
        result.rho,
        result.replicates
    );
    outln!("  false approvals, one-way clustering (user task):       {:.1} %", result.one_way * 100.0);
    outln!("  false approvals, two-way clustering (user × injection): {:.1} %", result.two_way * 100.0);
    outln!("  false approvals, crossed clustering:                   {:.1} %", result.crossed * 100.0);
    outln!("  false approvals without the cluster adjustment:        {:.1} %", result.unadjusted * 100.0);
}

impl GridFindings {
    /// Each setting at the threshold with the same setting at the good rate.
    fn pairs(&self) -> Vec<(&GridRow, &GridRow)> {
        let rows = &self.rows;
        rows.iter()
            .filter(|r| r.setting.true_asr == self.boundary_rate)
            .filter_map(|b| {
                let same = |r: &&GridRow| {
                    r.setting == Setting { true_asr: self.good_rate, sd_u: b.setting.sd_u, sd_v: b.setting.sd_v }
                };
                Some((b, rows.iter().find(same)?))
            })
            .collect()
    }
}

fn show_grid_table(g: &GridFindings, args: &Args) {
    let (rule, figure, what, r2) = (g.rule, g.figure, &g.what, &g.r2);
    outln!(
        "{rule} under crossed effects on {what}; {} simulated versions per setting, seed {}, one-sided α {} (pass) / {} (fail).",
        args.replicates,
        args.seed,
        r2.alpha_pass,
        r2.alpha_fail
    );
    outln!(
        "logit(p) = μ + U(user task) + V(injection task), U ~ N(0, sd_U), V ~ N(0, sd_V), μ such that the population {figure} is {} (the threshold: a pass is a false approval, a fail a false failure) or {} (passes: power). 95 % Wilson intervals.",
        fmt_rate(g.threshold),
        fmt_rate(g.good)
    );
    outln!("");
    outln!(
        "| sd_U | sd_V | method | false approval ({figure} {}) | false failure ({figure} {}) | passes ({figure} {}) |",
        fmt_rate(g.threshold),
        fmt_rate(g.threshold),
        fmt_rate(g.good)
    );
    outln!("|---|---|---|---|---|---|");
    for (boundary, power) in &g.pairs() {
        for method in &g.methods {
            let (b, p) = (boundary.cell(*method), power.cell(*method));
            outln!(
                "| {:.1} | {:.1} | {} | {} | {} | {} |",
                boundary.setting.sd_u,
                boundary.setting.sd_v,
                method.label(),
                share(b.passes, boundary.replicates),
                share(b.fails, boundary.replicates),
                share(p.passes, power.replicates)
            );
        }
    }
}

/// Per method, the worst false approvals and failures and the least power over the grid.
fn show_grid_summary(g: &GridFindings) {
    let pairs = g.pairs();
    outln!("");
    for method in &g.methods {
        let worst = |f: &dyn Fn(&GridRow) -> f64| pairs.iter().map(|(b, _)| f(b)).fold(0.0, f64::max);
        let rate = |count: u32, n: u32| f64::from(count) / f64::from(n.max(1));
        let approval = worst(&|r| rate(r.cell(*method).passes, r.replicates));
        let failure = worst(&|r| rate(r.cell(*method).fails, r.replicates));
        let power = pairs.iter().map(|(_, g)| rate(g.cell(*method).passes, g.replicates)).fold(1.0, f64::min);
        outln!(
            "{}: false approvals ≤ {:.1} %, false failures ≤ {:.1} %, passes ≥ {:.1} %",
            method.label(),
            100.0 * approval,
            100.0 * failure,
            100.0 * power
        );
    }
}

fn show_early_stop(e: &EarlyFindings, args: &Args) {
    let (what, p, rows) = (&e.what, e.r2.asr_max, &e.at_threshold);
    outln!(
        "R2 with early stopping on {what}; {} simulated versions per setting, seed {}, betting tests at α {} (pass) / {} (fail) on user-task means, user tasks in random order; runs not decided before their last user task are judged by the fixed-sample rule. Beside each rate: the same versions judged on the whole plan without stopping early. 95 % Wilson intervals.",
        args.replicates,
        args.seed,
        e.r2.alpha_pass,
        e.r2.alpha_fail
    );
    outln!("");
    outln!(
        "| sd_U | sd_V | false approval (ASR {0}) | whole plan | false failure (ASR {0}) | whole plan | decided otherwise than the whole plan | stopped early | cases run |",
        fmt_rate(p)
    );
    outln!("|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        outln!(
            "| {:.1} | {:.1} | {} | {} | {} | {} | {} | {} | {:.1} % |",
            r.setting.sd_u,
            r.setting.sd_v,
            share(r.passes, r.replicates),
            percent(r.full_passes, r.replicates),
            share(r.fails, r.replicates),
            percent(r.full_fails, r.replicates),
            share(r.changed, r.replicates),
            percent(r.stopped_early, r.replicates),
            100.0 * r.mean_fraction
        );
    }
    show_early_stop_clear(&e.clear);
    // At the threshold each decision is an error of its own one-sided test: a pass claims
    // ASR below it, a fail above it.
    let worst = |count: fn(&EarlyRow) -> u32| {
        rows.iter().map(|r| f64::from(count(r)) / f64::from(r.replicates.max(1))).fold(0.0, f64::max) * 100.0
    };
    outln!("");
    outln!(
        "at the threshold, worst over the grid: false approvals {:.1} % (whole plan {:.1} %), false failures {:.1} % (whole plan {:.1} %), decided otherwise than the whole plan {:.1} %",
        worst(|r| r.passes),
        worst(|r| r.full_passes),
        worst(|r| r.fails),
        worst(|r| r.full_fails),
        worst(|r| r.changed)
    );
}

fn show_early_stop_clear(clear: &[EarlyRow]) {
    outln!("");
    outln!("| true ASR | sd_U | sd_V | cases run (mean) | stopped early | passes | fails |");
    outln!("|---|---|---|---|---|---|---|");
    for r in clear {
        let pct = |c: u32| 100.0 * f64::from(c) / f64::from(r.replicates.max(1));
        outln!(
            "| {} | {:.1} | {:.1} | {:.1} % | {:.1} % | {:.1} % | {:.1} % |",
            fmt_rate(r.setting.true_asr),
            r.setting.sd_u,
            r.setting.sd_v,
            100.0 * r.mean_fraction,
            pct(r.stopped_early),
            pct(r.passes),
            pct(r.fails)
        );
    }
}

/// The paired study's grids: at the margin and at no regression.
fn show_paired_grid(f: &PairedFindings, args: &Args) {
    let (plan, shape, t) = (&f.plan, &f.shape, &f.r4);
    let (alpha_pass, alpha_fail) = pruefstand_judge::paired::alphas(t);
    outln!(
        "R4's sequential test on {plan}'s attacked cases ({} user tasks, {} injection tasks, {} cases, every attack); {} simulated candidate/reference pairs per setting, seed {}; reference rate 0.10; betting tests on paired user-task differences at α {alpha_pass} (not worse by more than the margin {}) and α {alpha_fail} (worse), user tasks in random order; runs not decided before their last user task are judged by the fixed-sample R4. 95 % Wilson intervals.",
        shape.user_tasks(),
        shape.injection_tasks(),
        shape.cases().len(),
        args.replicates,
        args.seed,
        t.margin
    );
    outln!("");
    outln!("At a regression exactly at the margin (+{:.0} pt, uneven change):", 100.0 * t.margin);
    outln!("");
    outln!("| sd_U | sd_V | approved early (false approval) | rejected early | stopped early | cases run |");
    outln!("|---|---|---|---|---|---|");
    for r in &f.at_margin {
        outln!(
            "| {:.1} | {:.1} | {} | {} | {} | {:.1} % |",
            r.setting.sd_u,
            r.setting.sd_v,
            share(r.early_passes, r.replicates),
            percent(r.early_fails, r.replicates),
            percent(r.early_passes + r.early_fails, r.replicates),
            100.0 * r.mean_fraction
        );
    }
    outln!("");
    outln!("At no regression (equal on average, uneven change):");
    outln!("");
    outln!(
        "| sd_U | sd_V | false rejection (early or whole plan) | rejected early | rejected by the whole plan's R4 | approved early | cases run |"
    );
    outln!("|---|---|---|---|---|---|---|");
    for r in &f.none {
        outln!(
            "| {:.1} | {:.1} | {} | {} | {} | {} | {:.1} % |",
            r.setting.sd_u,
            r.setting.sd_v,
            share(r.early_fails + r.full_fails, r.replicates),
            percent(r.early_fails, r.replicates),
            percent(r.full_fails, r.replicates),
            percent(r.early_passes, r.replicates),
            100.0 * r.mean_fraction
        );
    }
}

/// The paired study's clear cases and its worst figures over the grid.
fn show_paired_clear(f: &PairedFindings) {
    outln!("");
    outln!("| candidate (sd_U 1, sd_V 0.5) | cases run (mean) | approved early | rejected early |");
    outln!("|---|---|---|---|");
    for (label, r) in &f.clear {
        outln!(
            "| {label} | {:.1} % | {} | {} |",
            100.0 * r.mean_fraction,
            percent(r.early_passes, r.replicates),
            percent(r.early_fails, r.replicates)
        );
    }
    let worst = |rows: &[PairedRow], count: fn(&PairedRow) -> u32| {
        rows.iter().map(|r| f64::from(count(r)) / f64::from(r.replicates.max(1))).fold(0.0, f64::max) * 100.0
    };
    outln!("");
    outln!(
        "worst over the grid: early approvals at the margin {:.1} %, false rejections at no regression {:.1} % ({:.1} % early)",
        worst(&f.at_margin, |r| r.early_passes),
        worst(&f.none, |r| r.early_fails + r.full_fails),
        worst(&f.none, |r| r.early_fails)
    );
}

fn fmt_rate(p: f64) -> String {
    format!("{:.3}", p).trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `count` of `n` as a percentage with one decimal.
fn percent(count: u32, n: u32) -> String {
    format!("{:.1} %", 100.0 * f64::from(count) / f64::from(n.max(1)))
}

fn share(count: u32, n: u32) -> String {
    let (lo, hi) = study::wilson(count, n);
    format!("{:.1} % [{:.1}, {:.1}]", 100.0 * f64::from(count) / f64::from(n.max(1)), 100.0 * lo, 100.0 * hi)
}
