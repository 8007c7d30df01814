//! `reports/index.html`: the trend index over every judged run below a reports folder —
//! each version's latest verdict per plan with why (the rules that failed or stayed
//! undecided), and per plan the ASR R2 judged (held-out families where the plan holds any
//! out), the utility under attack and the clean utility — and, with an adaptive attacker,
//! its transfer and search ASR — over time, one line per version
//! with its one-sided bounds as a band (a single line through all runs would zig-zag
//! between versions) and the rules' limits drawn across. Every point and every run links
//! its report, and its compare page where it holds one; a version filter (CSS only, no script) hides versions. A run
//! made as a candidate's reference shows as "reference", not by its verdict. Reads each
//! `judgement.json` as a judgement of any age ([`StoredJudgement`]), so an older or
//! foreign judgement is shown with what it has instead of breaking the index; an
//! unreadable one is listed as skipped.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::html::esc;
use super::svg;
use super::{colours, page, verdict_badge};
use pruefstand_core::record::{RuleId, RuleStatus, Verdict};
use pruefstand_core::util::{self, pct};
use pruefstand_judge::{StoredJudgement, StoredRule};
use pruefstand_store::{RunDir, RunDocument, RunFile};

/// The trend index's file in a reports folder.
pub const INDEX_FILE: &str = "index.html";

/// How deep below the reports folder judgements are looked for
/// (reports/<version>/<plan>/<run>/judgement.json is 3).
const MAX_DEPTH: usize = 6;

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    run_id: String,
    version: String,
    plan: String,
    verdict: Option<Verdict>,
    /// started_at, else judged_at (RFC 3339 sorts as text).
    when: String,
    /// The ASR R2 judged: its measured figure (held-out families where the plan holds
    /// any out), else the overall figure, else telemetry's.
    asr: Option<Band>,
    /// Which ASR `asr` is.
    asr_kind: AsrKind,
    utility: Option<Band>,
    utility_under_attack: Option<Band>,
    /// The adaptive attacker's figures as R2 measured them: the search half's pairs
    /// broken within K attempts, and the held-out pairs the frozen attempts broke.
    adaptive: Option<Band>,
    transfer: Option<Band>,
    /// The candidate version this run was made as the reference of (`run.json`): it was
    /// judged, but only ever shown as that candidate's reference — no verdict was asked
    /// of it, so the index shows it as "reference".
    reference_for: Option<String>,
    /// report.html relative to the reports folder, '/'-separated.
    link: Option<String>,
    /// compare.html the same way, where the run directory holds one (`pruefstand compare`).
    compare_link: Option<String>,
    limits: Limits,
    /// The rules that kept the run from approval: failed or undecided, each with its
    /// one-line reason.
    why: Vec<Why>,
}

/// Which ASR a run's point shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AsrKind {
    /// R2's figure over the held-out families.
    HeldOut,
    /// R2's figure over every attacked case (the plan holds no family out).
    Judged,
    /// Not R2's (an older judgement, R2 not judged, telemetry): every attacked case.
    Overall,
}

impl AsrKind {
    fn words(self) -> &'static str {
        match self {
            AsrKind::HeldOut => "held-out ASR",
            AsrKind::Judged => "ASR",
            AsrKind::Overall => "ASR (all attacked cases; not R2's)",
        }
    }
}

/// The rules' limits a run was judged with, as far as its judgement says.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Limits {
    asr_max: Option<f64>,
    /// R2's adaptive maximum, on the transfer figure where the run has one, else on the
    /// search figure.
    asr_adaptive_max: Option<f64>,
    utility_min: Option<f64>,
    utility_under_attack_min: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
struct Why {
    /// None: an id this version does not know.
    rule: Option<RuleId>,
    status: String,
    reason: String,
}

/// A rate with its bounds; a figure from telemetry alone has none (lower = upper = rate).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Band {
    rate: f64,
    lower: f64,
    upper: f64,
}

impl Band {
    fn point(rate: f64) -> Band {
        Band { rate, lower: rate, upper: rate }
    }
}

/// Every index pruefstand writes carries this mark in its head: an `index.html` without
/// it (nor the heading indexes of earlier versions open with) is someone else's.
const INDEX_MARK: &str = r#"<meta name="generator" content="pruefstand trend index">"#;
const INDEX_HEADING: &str = "<h1>pruefstand — verdicts and trends</h1>";

/// Whether `reports_dir` holds no index, or one pruefstand wrote: only then may it be
/// (re)written.
pub(crate) fn index_is_ours(reports_dir: &Path) -> bool {
    let path = reports_dir.join(INDEX_FILE);
    match std::fs::symlink_metadata(&path) {
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        // Never through a link: what it points at is not provably ours.
        Ok(meta) if !meta.is_file() => false,
        Ok(_) => {
            let mut head = Vec::new();
            let read = std::fs::File::open(&path)
                .and_then(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, 8192), &mut head));
            let head = String::from_utf8_lossy(&head);
            read.is_ok() && (head.contains(INDEX_MARK) || head.contains(INDEX_HEADING))
        }
    }
}

/// Rewrites `reports_dir/index.html` from every `judgement.json` below it; refuses to
/// replace an `index.html` it did not write.
pub(crate) fn write_index(reports_dir: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        index_is_ours(reports_dir),
        "{} is not pruefstand's trend index: left as it is",
        reports_dir.join(INDEX_FILE).display()
    );
    // A run written elsewhere (`--out`) into a root without runs yet still gets an index.
    std::fs::create_dir_all(reports_dir).with_context(|| format!("creating {}", reports_dir.display()))?;
    let mut runs = Vec::new();
    find_judged_runs(reports_dir, 0, &mut runs).with_context(|| format!("scanning {}", reports_dir.display()))?;
    let mut entries = Vec::new();
    let mut skipped = Vec::new();
    for dir in runs {
        match RunDir::open(&dir).and_then(|run| read_entry(reports_dir, &run)) {
            Ok(e) => entries.push(e),
            Err(err) => {
                let file = RunDir::new(dir).shown(RunFile::Judgement);
                tracing::warn!("index: skipping {file}: {err:#}");
                skipped.push(format!("{file}: {err:#}"));
            }
        }
    }
    entries.sort_by(|a, b| (&a.when, &a.run_id).cmp(&(&b.when, &b.run_id)));
    let html = render(&entries, &skipped).replacen("<head>", &format!("<head>{INDEX_MARK}"), 1);
    util::write_atomic(&reports_dir.join(INDEX_FILE), html.as_bytes())
}

/// The judged runs in `dir` and the folders below it (a run folder holding a plain
/// `judgement.json`, [`RunDir::is_judged_run`]), in the order of their names.
fn find_judged_runs(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if depth > MAX_DEPTH {
        return Ok(());
    }
    let mut children: Vec<_> = std::fs::read_dir(dir)?.filter_map(Result::ok).collect();
    children.sort_by_key(|e| e.file_name());
    if RunDir::is_judged_run(dir) {
        out.push(dir.to_path_buf());
    }
    for child in children {
        let path = child.path();
        // Symlinks are not followed: a loop or a link out of the reports folder must
        // not end up in the index.
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if meta.is_dir() {
            find_judged_runs(&path, depth + 1, out)?;
        }
    }
    Ok(())
}

/// A rate from telemetry: a number, or an object with `rate`/`value`/`mean`.
fn rate_of(v: Option<&Value>) -> Option<f64> {
    let v = v?;
    v.as_f64().or_else(|| ["rate", "value", "mean"].iter().find_map(|k| v.get(k)?.as_f64()))
}

/// A field read as None where it holds something this version does not read as `T`.
fn lenient<'de, D: serde::Deserializer<'de>, T: serde::de::DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    Ok(serde_json::from_value(Value::deserialize(d)?).ok())
}

/// What the index reads of `run.json`: whether the run was made as a candidate's
/// reference (absent in runs from before it was recorded: shown as their verdict).
#[derive(Serialize, Deserialize)]
struct RunFacts {
    #[serde(default, deserialize_with = "lenient")]
    reference_for: Option<String>,
}

impl RunDocument for RunFacts {
    const FILE: RunFile = RunFile::RunMeta;
}

/// A `telemetry.json` of any age: its headline rates, as numbers or as objects.
#[derive(Serialize, Deserialize)]
#[serde(transparent)]
struct TelemetryOfAnyAge(Value);

impl RunDocument for TelemetryOfAnyAge {
    const FILE: RunFile = RunFile::Telemetry;
}

fn read_entry(reports_dir: &Path, run: &RunDir) -> anyhow::Result<Entry> {
    let j = StoredJudgement::read(run)?.context("no judgement")?;
    let run_id = j.run_id.clone().context("no run_id")?;
    let telemetry: Option<Value> = run.read::<TelemetryOfAnyAge>().ok().flatten().map(|t| t.0);
    let reference_for = run.read::<RunFacts>().ok().flatten().and_then(|f| f.reference_for);
    let (adaptive, transfer) = adaptive_figures(&j.rules);
    let figure = |k: &str| {
        let e = j.figures.get(k)?;
        let rate = e.get("rate")?.as_f64()?;
        let bound = |b: &str| e.get(b).and_then(Value::as_f64).unwrap_or(rate);
        Some(Band { rate, lower: bound("lower"), upper: bound("upper") })
    };
    let tele = |k: &str| rate_of(telemetry.as_ref().and_then(|t| t.get(k))).map(Band::point);
    let relative = |page: PathBuf| {
        page.strip_prefix(reports_dir).ok().map(|rel| {
            rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("/")
        })
    };
    let link = relative(run.report_path());
    // A plain file only: a link could lead out of the reports folder.
    let compare = run.compare_path();
    let compare_link =
        std::fs::symlink_metadata(&compare).is_ok_and(|m| m.is_file()).then(|| relative(compare)).flatten();
    let (asr, asr_kind) = match decisive_figure(j.figures.get("decisive")).or_else(|| r2_figure(&j.rules)) {
        Some((band, kind)) => (Some(band), kind),
        None => (figure("asr").or_else(|| tele("asr")), AsrKind::Overall),
    };
    let limit = |rule: RuleId, k: &str| j.thresholds.get(rule.as_str())?.get(k)?.as_f64();
    Ok(Entry {
        version: j.version.clone().unwrap_or_else(|| "?".into()),
        plan: j.plan.clone().unwrap_or_else(|| "?".into()),
        verdict: j.verdict,
        when: j.started_at.clone().or_else(|| j.judged_at.clone()).unwrap_or_default(),
        asr,
        asr_kind,
        utility: figure("utility_clean").or_else(|| tele("utility")),
        utility_under_attack: figure("utility_under_attack").or_else(|| tele("utility_under_attack")),
        adaptive,
        transfer,
        reference_for,
        link,
        compare_link,
        limits: Limits {
            asr_max: limit(RuleId::R2, "asr_max"),
            asr_adaptive_max: limit(RuleId::R2, "asr_adaptive_max"),
            utility_min: limit(RuleId::R3, "utility_min"),
            utility_under_attack_min: limit(RuleId::R3, "utility_under_attack_min"),
        },
        why: why(&j.rules),
        run_id,
    })
}

/// The figure R2 judged as the judgement names it (`figures.decisive`: its name, rate
/// and bounds); None for a judgement from before it was named.
fn decisive_figure(decisive: Option<&Value>) -> Option<(Band, AsrKind)> {
    let d = decisive?;
    let band =
        Band { rate: d.get("rate")?.as_f64()?, lower: d.get("lower")?.as_f64()?, upper: d.get("upper")?.as_f64()? };
    let held_out = d.get("name").and_then(Value::as_str) == Some(pruefstand_core::words::ASR_HELD_OUT);
    Some((band, if held_out { AsrKind::HeldOut } else { AsrKind::Judged }))
}

/// The ASR R2 judged, as an older judgement's R2 `measured` holds it (`asr` with the `lower` and `upper`
/// bounds it decided on), and whether that was over held-out families
/// (`judged_families`, docs/attacks.md). None when R2 measured nothing (not judged, or a
/// judgement from before these figures).
fn r2_figure(rules: &[StoredRule]) -> Option<(Band, AsrKind)> {
    let m = &rules.iter().find(|r| r.id == Some(RuleId::R2))?.measured;
    let band =
        Band { rate: m.get("asr")?.as_f64()?, lower: m.get("lower")?.as_f64()?, upper: m.get("upper")?.as_f64()? };
    let held_out = m.get("judged_families").and_then(Value::as_array).is_some_and(|f| !f.is_empty());
    Some((band, if held_out { AsrKind::HeldOut } else { AsrKind::Judged }))
}

/// The adaptive attacker's two figures from R2's `measured.adaptive`: the search
/// half's (pairs broken within K attempts) and the transfer to the held-out half, each
/// with the bounds R2 drew.
fn adaptive_figures(rules: &[StoredRule]) -> (Option<Band>, Option<Band>) {
    let Some(a) = rules.iter().find(|r| r.id == Some(RuleId::R2)).and_then(|r| r.measured.get("adaptive")) else {
        return (None, None);
    };
    let band = |v: &Value| {
        Some(Band { rate: v.get("asr")?.as_f64()?, lower: v.get("lower")?.as_f64()?, upper: v.get("upper")?.as_f64()? })
    };
    (band(a), a.get("transfer").and_then(band))
}

/// The rules that failed or stayed undecided, with their reasons.
fn why(rules: &[StoredRule]) -> Vec<Why> {
    rules
        .iter()
        .filter_map(|r| {
            let status = r.status.filter(|s| matches!(s, RuleStatus::Fail | RuleStatus::Inconclusive))?;
            Some(Why { rule: r.id, status: status.as_str().to_string(), reason: r.reason.clone().unwrap_or_default() })
        })
        .collect()
}

/// The longest reason the "why" column shows; the whole one is its tooltip.
const WHY_CHARS: usize = 220;

/// A run's why as HTML: one line per rule that kept it from approval.
fn why_html(e: &Entry) -> String {
    if let Some(candidate) = &e.reference_for {
        return format!(r#"<span class="note">run as the reference of {}</span>"#, esc(candidate));
    }
    if e.why.is_empty() {
        return match e.verdict {
            Some(Verdict::Approved) => r#"<span class="note">every rule passed</span>"#.into(),
            _ => "–".into(),
        };
    }
    let mut out = String::from(r#"<ul class="why">"#);
    for w in &e.why {
        let _ = write!(
            out,
            r#"<li title="{}"><b>{}</b> {}: {}</li>"#,
            esc(&w.reason),
            w.rule.map_or("?", RuleId::as_str),
            esc(&w.status),
            esc(&svg::truncate(&w.reason, WHY_CHARS))
        );
    }
    out + "</ul>"
}

/// A run's badge: its verdict in the verdict's colour, or — for a run made as a
/// candidate's reference — "reference", neutral, its verdict only in the tooltip.
fn badge(e: &Entry) -> String {
    let inner = match (&e.reference_for, e.verdict) {
        (Some(candidate), verdict) => format!(
            r#"<span class="vb v-reference" title="{}">reference</span>"#,
            esc(&format!(
                "run as the reference of {candidate}; judged on its own (no verdict was asked of it): {}",
                verdict.map_or("?", Verdict::as_str)
            ))
        ),
        (None, Some(v)) => verdict_badge(v),
        (None, None) => r#"<span class="vb v-reference">?</span>"#.into(),
    };
    match e.link.as_deref().and_then(super::safe_href) {
        Some(href) => format!(r#"<a href="{href}">{inner}</a>"#),
        None => inner,
    }
}

/// A time for people: "2026-12-01 14:33 UTC"; what does not parse as RFC 3339 as it is.
fn readable(when: &str) -> String {
    match chrono::DateTime::parse_from_rfc3339(when) {
        Ok(t) => t.with_timezone(&chrono::Utc).format("%Y-%m-%d %H:%M UTC").to_string(),
        Err(_) => when.to_string(),
    }
}

fn seconds(when: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(when).ok().map(|t| t.timestamp())
}

/// Where each run sits on a time axis (0–1) and the axis's labels. Runs are placed by
/// time; runs without a readable time, or all at one instant, are spread evenly.
fn time_axis(whens: &[&str]) -> (Vec<f64>, Vec<(f64, String)>) {
    let secs: Vec<Option<i64>> = whens.iter().map(|w| seconds(w)).collect();
    let known: Vec<i64> = secs.iter().flatten().copied().collect();
    let (min, max) = (known.iter().min().copied(), known.iter().max().copied());
    let even = |i: usize| if whens.len() > 1 { i as f64 / (whens.len() - 1) as f64 } else { 0.5 };
    match (min, max) {
        (Some(lo), Some(hi)) if hi > lo && known.len() == whens.len() => {
            let span = (hi - lo) as f64;
            let xs = secs.iter().map(|s| (s.unwrap_or(lo) - lo) as f64 / span).collect();
            // The finest unit the span needs: seconds within an hour, the hour within
            // two days, else the day.
            let format = match hi - lo {
                s if s < 3_600 => "%H:%M:%S",
                s if s < 2 * 86_400 => "%m-%d %H:%M",
                _ => "%Y-%m-%d",
            };
            let mut ticks: Vec<(f64, String)> = Vec::new();
            for k in 0..=4 {
                // Placed at the whole second it names.
                let t = lo + (span * k as f64 / 4.0).round() as i64;
                let x = (t - lo) as f64 / span;
                let label = chrono::DateTime::from_timestamp(t, 0).map(|d| d.format(format).to_string());
                let label = label.unwrap_or_default();
                // A label that repeats its neighbour says nothing.
                if ticks.last().is_none_or(|(_, last)| *last != label) {
                    ticks.push((x, label));
                }
            }
            (xs, ticks)
        }
        _ => {
            let xs: Vec<f64> = (0..whens.len()).map(even).collect();
            let ticks = xs.iter().zip(whens).map(|(x, w)| (*x, readable(w))).collect();
            (xs, ticks)
        }
    }
}

/// The figures shown per plan: (label, chart id part, which band, its limit).
type Pick = fn(&Entry) -> Option<Band>;
type Limit = fn(&Entry) -> Option<(f64, &'static str)>;
const TRENDS: [(&str, &str, Pick, Limit); 5] = [
    ("ASR", "asr", |e| e.asr, |e| e.limits.asr_max.map(|v| (v, "R2 ≤"))),
    // A plan with an adaptive attacker: its transfer figure (what R2's adaptive maximum
    // decides on) and its search figure, pairs broken rather than cases. Drawn only
    // where a run of the plan has them; the limit on the figure it holds.
    (
        "transfer ASR (held-out pairs broken by the frozen attempts)",
        "transfer",
        |e| e.transfer,
        |e| e.limits.asr_adaptive_max.filter(|_| e.transfer.is_some()).map(|v| (v, "R2 ≤")),
    ),
    (
        "adaptive ASR (search pairs broken within K attempts)",
        "adaptive",
        |e| e.adaptive,
        |e| e.limits.asr_adaptive_max.filter(|_| e.transfer.is_none()).map(|v| (v, "R2 ≤")),
    ),
    (
        "utility under attack",
        "utility-under-attack",
        |e| e.utility_under_attack,
        |e| e.limits.utility_under_attack_min.map(|v| (v, "R3 ≥")),
    ),
    ("clean utility", "utility", |e| e.utility, |e| e.limits.utility_min.map(|v| (v, "R3 ≥"))),
];

/// "10 %", "2.5 %": a limit as short as it can be said.
fn short_pct(v: f64) -> String {
    let p = 100.0 * v;
    if (p - p.round()).abs() < 1e-9 { format!("{p:.0} %") } else { pct(v) }
}

/// How a version looks on the page: its colour, line style and the class the filter
/// hides it by.
struct Look {
    colour: &'static str,
    style: svg::LineStyle,
    class: String,
}

/// The ASR chart's label: what the plan's points are.
fn asr_label(runs: &[&Entry]) -> &'static str {
    let kinds: Vec<AsrKind> = runs.iter().filter(|e| e.asr.is_some()).map(|e| e.asr_kind).collect();
    match kinds.first() {
        Some(first) if kinds.iter().all(|k| k == first) => match first {
            AsrKind::HeldOut => "held-out ASR (R2's figure)",
            AsrKind::Judged => "ASR (R2's figure)",
            AsrKind::Overall => "ASR (all attacked cases)",
        },
        Some(_) => "ASR as R2 judged it (held-out families where the plan holds any out)",
        None => "ASR",
    }
}

/// The CSS of the version filter: a version's rows, lines and legend entries hidden
/// while its box is unticked; an unticked version's chip struck through. No script.
fn filter_css(n: usize) -> String {
    let mut css = String::from(
        "input.vf{position:absolute;opacity:0;width:1px;height:1px;margin:0}\
         #vf-bar{margin:.6rem 0;font-size:.85rem;display:flex;flex-wrap:wrap;gap:.3rem .6rem;align-items:center}\
         #vf-bar label{cursor:pointer;border:1px solid #ccc;border-radius:1rem;padding:.1rem .6rem;overflow-wrap:anywhere}\
         svg.key{vertical-align:middle;margin-right:.3rem}\
         ul.why{margin:0;padding-left:1rem;font-size:.8rem} ul.why li{overflow-wrap:break-word}\
         @media (max-width:600px){#latest,#latest tbody{display:block}#latest tr:first-child{display:none}\
         #latest tr{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);border-top:2px solid #ddd}\
         #latest td.why{grid-column:1/-1}}\
         svg.chart a.pt{cursor:pointer}",
    );
    for i in 0..n {
        let _ = write!(
            css,
            "#vf-{i}:not(:checked)~#trends .ver-{i}{{display:none}}\
             #vf-{i}:not(:checked)~#vf-bar label[for=vf-{i}]{{opacity:.45;text-decoration:line-through}}\
             #vf-{i}:focus-visible~#vf-bar label[for=vf-{i}]{{outline:2px solid #1565c0}}"
        );
    }
    css
}

/// Each version's look on the page, by version: its colour, line style and class.
type Looks<'a> = BTreeMap<&'a str, Look>;
/// The latest entry per version and plan.
type Latest<'a> = BTreeMap<&'a str, BTreeMap<&'a str, &'a Entry>>;

fn render(entries: &[Entry], skipped: &[String]) -> String {
    let mut b = String::from("<h1>pruefstand — verdicts and trends</h1>");
    let _ = write!(b, r#"<p class="meta">{} judged run(s)</p>"#, entries.len());
    // Latest verdict per (version, plan): entries are in time order, so the last wins.
    let mut latest: Latest = BTreeMap::new();
    for e in entries {
        latest.entry(&e.version).or_default().insert(&e.plan, e);
    }
    // A version only ever run as a reference is grey, as a run's report draws its
    // reference; the others take the series' colours in order, the candidate's blue
    // first. No line has a verdict's colour.
    let only_reference: Vec<&str> = latest
        .keys()
        .copied()
        .filter(|v| entries.iter().filter(|e| e.version == *v).all(|e| e.reference_for.is_some()))
        .collect();
    let (mut references, mut candidates) = (0, 0);
    let looks: Looks = latest
        .keys()
        .enumerate()
        .map(|(i, v)| {
            let colour = if only_reference.contains(v) {
                references += 1;
                colours::REFERENCE_SERIES[(references - 1) % colours::REFERENCE_SERIES.len()]
            } else {
                candidates += 1;
                colours::SERIES[(candidates - 1) % colours::SERIES.len()]
            };
            (*v, Look { colour, style: svg::LineStyle::nth(i), class: format!("ver-{i}") })
        })
        .collect();
    version_filter(&mut b, &looks);
    b.push_str(r#"<div id="trends">"#);
    latest_table(&mut b, &latest, &looks);
    for p in sorted_unique(entries.iter().map(|e| e.plan.as_str())) {
        plan_section(&mut b, p, entries, &latest, &looks);
    }
    all_runs_table(&mut b, entries, &looks);
    if !skipped.is_empty() {
        b.push_str("<h2>Skipped</h2><ul>");
        for s in skipped {
            let _ = write!(b, "<li>{}</li>", esc(s));
        }
        b.push_str("</ul>");
    }
    b.push_str("</div>");
    // The filter's CSS joins the page's own (style-src allows inline styles).
    page("pruefstand — trends", &b, "").replacen("</style>", &format!("{}</style>", filter_css(looks.len())), 1)
}

fn sorted_unique<'a>(items: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = items.collect();
    v.sort();
    v.dedup();
    v
}

/// The filter: one box per version, before everything it hides (CSS's `~`).
fn version_filter(b: &mut String, looks: &Looks) {
    for i in 0..looks.len() {
        let _ = write!(b, r#"<input type="checkbox" class="vf" id="vf-{i}" checked>"#);
    }
    if !looks.is_empty() {
        b.push_str(r#"<div id="vf-bar"><span>Versions shown (click to hide):</span>"#);
        for (i, (v, look)) in looks.iter().enumerate() {
            let _ = write!(b, r#"<label for="vf-{i}">{}{}</label>"#, svg::swatch(look.style, look.colour), esc(v));
        }
        b.push_str("</div>");
    }
}

fn latest_table(b: &mut String, latest: &Latest, looks: &Looks) {
    b.push_str(
        r#"<h2>Latest verdict per version and plan</h2><div class="scroll"><table id="latest"><tr><th>version</th><th>plan</th><th>verdict</th><th>when</th><th>why</th></tr>"#,
    );
    for (version, by_plan) in latest {
        for e in by_plan.values() {
            let _ = write!(
                b,
                r#"<tr class="{}"><td>{}</td><td>{}</td><td>{}</td><td class="note">{}</td><td class="why">{}</td></tr>"#,
                looks[version].class,
                esc(version),
                esc(&e.plan),
                badge(e),
                esc(&readable(&e.when)),
                why_html(e)
            );
        }
    }
    b.push_str("</table></div>");
}

/// A plan's trend charts (one per figure, a line per version) and their legend.
fn plan_section(b: &mut String, p: &str, entries: &[Entry], latest: &Latest, looks: &Looks) {
    let runs: Vec<&Entry> = entries.iter().filter(|e| e.plan == p).collect();
    let whens: Vec<&str> = runs.iter().map(|e| e.when.as_str()).collect();
    let (xs, ticks) = time_axis(&whens);
    let versions = sorted_unique(runs.iter().map(|e| e.version.as_str()));
    let _ = write!(b, "<h2>Plan {}</h2>", esc(p));
    for (label, id, pick, limit) in TRENDS {
        let label = if id == "asr" { asr_label(&runs) } else { label };
        let series: Vec<svg::TimeSeries> = versions
            .iter()
            .map(|v| svg::TimeSeries {
                name: v.to_string(),
                class: looks[v].class.clone(),
                colour: looks[v].colour,
                style: looks[v].style,
                points: trend_points(&runs, &xs, v, |e| {
                    Some((pick(e)?, if id == "asr" { e.asr_kind.words() } else { label }))
                }),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        if series.is_empty() {
            continue;
        }
        // The limits the plan's runs were judged with (one, unless the profile changed).
        let mut limits: Vec<(f64, &str)> = runs.iter().filter_map(|e| limit(e)).collect();
        limits.sort_by(|a, b| a.0.total_cmp(&b.0));
        limits.dedup_by(|a, b| (a.0 - b.0).abs() < 1e-12);
        let thresholds: Vec<svg::Threshold> = limits
            .iter()
            .map(|(v, rule)| svg::Threshold { value: *v, label: format!("{rule} {}", short_pct(*v)) })
            .collect();
        b.push_str(&svg::time_chart(
            &format!("trend-{p}-{id}"),
            &format!("{label} — {p} (band: one-sided bounds; dashed: limit)"),
            &ticks,
            &series,
            &thresholds,
        ));
    }
    legend(b, p, &versions, latest, looks);
}

/// Version `v`'s points of a trend: each run's figure (`pick`: the band and what it is
/// called) at its place on the time axis `xs`.
fn trend_points(
    runs: &[&Entry],
    xs: &[f64],
    v: &str,
    pick: impl Fn(&Entry) -> Option<(Band, &'static str)>,
) -> Vec<svg::TimePoint> {
    runs.iter()
        .zip(xs)
        .filter(|(e, _)| e.version == v)
        .filter_map(|(e, x)| {
            let (f, what) = pick(e)?;
            Some(svg::TimePoint {
                x: *x,
                rate: f.rate,
                lower: f.lower,
                upper: f.upper,
                href: e.link.as_deref().and_then(super::safe_href),
                tip: format!(
                    "{v}: {what} {} [{}, {}] · {} · {} · run {} (click: its report)",
                    pct(f.rate),
                    pct(f.lower),
                    pct(f.upper),
                    match &e.reference_for {
                        Some(c) => format!("reference of {c}"),
                        None => e.verdict.map_or("?", Verdict::as_str).to_string(),
                    },
                    readable(&e.when),
                    e.run_id
                ),
            })
        })
        .collect()
}

/// The legend names each line's version with its latest verdict on this plan.
fn legend(b: &mut String, p: &str, versions: &[&str], latest: &Latest, looks: &Looks) {
    b.push_str(r#"<ul class="legend">"#);
    for v in versions {
        let last = latest.get(v).and_then(|m| m.get(p));
        let _ = write!(
            b,
            r#"<li class="{}">{}{} {} <span class="note">{}</span></li>"#,
            looks[v].class,
            svg::swatch(looks[v].style, looks[v].colour),
            esc(v),
            last.map(|e| badge(e)).unwrap_or_default(),
            last.map(|e| esc(&readable(&e.when))).unwrap_or_default()
        );
    }
    b.push_str("</ul>");
}

fn all_runs_table(b: &mut String, entries: &[Entry], looks: &Looks) {
    b.push_str(r#"<h2>All runs</h2><div class="scroll"><table id="runs"><tr><th>when</th><th>version</th><th>plan</th><th>verdict</th><th>ASR R2 judged</th><th>utility under attack</th><th>clean utility</th><th>run</th></tr>"#);
    let opt = |v: Option<Band>| v.map(|f| pct(f.rate)).unwrap_or_else(|| "–".into());
    for e in entries.iter().rev() {
        let run = match e.link.as_deref().and_then(super::safe_href) {
            Some(href) => format!(r#"<a href="{href}"><code>{}</code></a>"#, esc(&e.run_id)),
            None => format!("<code>{}</code>", esc(&e.run_id)),
        };
        let compare = match e.compare_link.as_deref().and_then(super::safe_href) {
            Some(href) => format!(r#" · <a class="cmp" href="{href}">compare</a>"#),
            None => String::new(),
        };
        let asr = match (e.asr, e.asr_kind) {
            (Some(_), AsrKind::HeldOut) => format!("{} <span class=\"note\">held out</span>", opt(e.asr)),
            _ => opt(e.asr),
        };
        let _ = write!(
            b,
            r#"<tr class="{}"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{asr}</td><td>{}</td><td>{}</td><td>{run}{compare}</td></tr>"#,
            looks[e.version.as_str()].class,
            esc(&readable(&e.when)),
            esc(&e.version),
            esc(&e.plan),
            badge(e),
            opt(e.utility_under_attack),
            opt(e.utility),
        );
    }
    b.push_str("</table></div>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use pruefstand_judge as judge;

    #[test]
    fn index_shows_latest_verdicts_and_trends() {
        let dir = tempfile::tempdir().unwrap();
        let reports = dir.path();
        for (i, (version, landed)) in [("v1", 0usize), ("v2", 30), ("v1", 3)].into_iter().enumerate() {
            let mut input = judge::tests::schnell(landed);
            input.run.run_id = format!("run-{i}");
            input.run.version = version.into();
            input.run.started_at = Some(format!("2025-01-0{}T00:00:00Z", i + 1));
            let judged = judge::judged(input.clone());
            let run = RunDir::new(reports.join(version).join("schnell").join(&input.run.run_id));
            super::super::write_run_report(&run, &judged).unwrap();
        }
        // A telemetry-only figure and a corrupt judgement.
        std::fs::create_dir_all(reports.join("x/<b>/r")).unwrap();
        std::fs::write(RunDir::new(reports.join("x/<b>/r")).test_file(RunFile::Judgement), "{not json").unwrap();
        write_index(reports).unwrap();
        let html = std::fs::read_to_string(reports.join(INDEX_FILE)).unwrap();
        assert!(html.contains(r#"class="chart""#) && html.contains("<polyline"));
        // One line per version: v1's two runs make a line with its band, v2's single
        // run a point; three figures per plan.
        assert_eq!(html.matches("<polygon").count(), 3, "a band per figure for v1 only");
        for id in ["trend-schnell-asr", "trend-schnell-utility-under-attack", "trend-schnell-utility"] {
            assert!(html.contains(&format!(r#"id="{id}""#)), "{id}");
        }
        assert!(html.contains("2025-01-03 00:00 UTC") && !html.contains("2025-01-03T00:00:00Z"), "readable times");
        assert!(html.contains(">01-02 00:00<") || html.contains(">2025-01-02<"), "a labelled time axis");
        // v1's latest verdict is run-2 (inconclusive), not run-0 (approved).
        let latest = &html[html.find(r#"id="latest""#).unwrap()..html.find("<h2>Plan").unwrap()];
        assert!(latest.contains("inconclusive") && !latest.contains("approved"), "{latest}");
        assert!(latest.contains("rejected"));
        assert!(html.contains(r#"href="v1/schnell/run-0/report.html""#));
        assert!(html.contains("Skipped") && html.contains("&lt;b&gt;"));
    }

    #[test]
    fn index_links_every_point_draws_the_limits_says_why_and_filters_versions() {
        let dir = tempfile::tempdir().unwrap();
        let reports = dir.path();
        // Three versions, the plan holding the attack's family out: two never let an
        // injection land (both lines at 0 %), one is rejected for its ASR.
        for (i, (version, landed)) in [("v1", 0usize), ("v2", 0), ("v3", 30), ("v1", 0)].into_iter().enumerate() {
            let mut input = judge::tests::schnell(landed);
            input.run.run_id = format!("run-{i}");
            input.run.version = version.into();
            input.run.attack_families.held_out = vec!["important_instructions".into()];
            input.run.started_at = Some(format!("2025-01-0{}T00:00:00Z", i + 1));
            let judged = judge::judged(input.clone());
            let run = RunDir::new(reports.join(version).join("schnell").join(&input.run.run_id));
            super::super::write_run_report(&run, &judged).unwrap();
        }
        write_index(reports).unwrap();
        let html = std::fs::read_to_string(reports.join(INDEX_FILE)).unwrap();
        // Every point links its run's report (three charts, four runs), every run row too.
        for (i, v) in ["v1", "v2", "v3", "v1"].iter().enumerate() {
            let href = format!(r#"href="{v}/schnell/run-{i}/report.html""#);
            assert_eq!(html.matches(&format!(r#"<a class="pt" {href}>"#)).count(), 3, "{href}");
            let runs = &html[html.find(r#"id="runs""#).unwrap()..];
            assert!(runs.contains(&format!(r#"<a {href}><code>run-{i}</code></a>"#)), "{href}");
        }
        // The ASR R2 judged, its limit and the utilities' limits.
        assert!(html.contains("held-out ASR (R2&#39;s figure) — schnell"), "the chart says which ASR");
        assert_eq!(html.matches(r#"<g class="threshold">"#).count(), 3);
        assert!(html.contains(">R2 ≤ 10 %<") && html.contains(">R3 ≥ 50 %<") && html.contains(">R3 ≥ 40 %<"));
        // Why: the rejected version's failing rule with its reason, nothing for a pass.
        let latest = &html[html.find(r#"id="latest""#).unwrap()..html.find("<h2>Plan").unwrap()];
        assert!(
            latest.contains("<b>R2</b> fail: held-out families important_instructions: held-out ASR 50.0 %"),
            "{latest}"
        );
        assert!(latest.contains(r#"<th>why</th>"#));
        // The filter: a box per version before what it hides, CSS only.
        for i in 0..3 {
            assert!(html.contains(&format!(r#"<input type="checkbox" class="vf" id="vf-{i}" checked>"#)));
            assert!(html.contains(&format!("#vf-{i}:not(:checked)~#trends .ver-{i}{{display:none}}")));
        }
        assert!(html.find(r#"id="vf-2""#).unwrap() < html.find(r#"<div id="trends">"#).unwrap());
        assert_eq!(html.matches(r#"<tr class="ver-0">"#).count(), 3, "v1's latest row and its two runs");
        assert!(!html.contains("<script"), "no script: script-src stays 'none'");
        // Lines at 0 % are told apart: their own dash, marker and offset off the axis.
        let asr = &html[html.find(r#"id="trend-schnell-asr""#).unwrap()
            ..html.find(r#"id="trend-schnell-utility-under-attack""#).unwrap()];
        assert!(asr.contains(r#"stroke-dasharray="""#), "v1's line, solid");
        assert!(asr.contains("<rect x=") && asr.contains("<circle cx="), "v2's square marker beside v1's round one");
        // The axis at 0 % is y = 198; v1 (first of three) sits 3 px off it, v2 on it.
        assert!(asr.contains(r#"cy="201.0" r="3.8""#) && asr.contains(r#"<rect x="243.4" y="194.8""#), "{asr}");
    }

    #[test]
    fn time_axis_places_runs_by_time_and_labels_it() {
        let (xs, ticks) = time_axis(&["2025-01-01T00:00:00Z", "2025-01-01T01:00:00Z", "2025-01-01T04:00:00Z"]);
        assert_eq!(xs, vec![0.0, 0.25, 1.0]);
        assert_eq!(ticks.len(), 5);
        assert_eq!(ticks[0].1, "01-01 00:00");
        assert_eq!(ticks[4].1, "01-01 04:00");
        let (xs, ticks) = time_axis(&["?", "2025-01-01T00:00:00Z"]);
        assert_eq!(xs, vec![0.0, 1.0], "an unreadable time spreads the runs evenly");
        assert_eq!(ticks[1].1, "2025-01-01 00:00 UTC");
        assert_eq!(time_axis(&["2025-01-01T00:00:00Z"]).0, vec![0.5]);
        let (_, ticks) = time_axis(&["2025-01-01T00:00:00Z", "2025-01-01T00:00:02Z"]);
        let labels: Vec<&str> = ticks.iter().map(|t| t.1.as_str()).collect();
        assert_eq!(labels, ["00:00:00", "00:00:01", "00:00:02"], "seconds within an hour, no label twice");
        let (_, ticks) = time_axis(&["2025-01-01T00:00:00Z", "2025-01-09T00:00:00Z"]);
        assert_eq!(ticks[4].1, "2025-01-09");
    }

    #[test]
    fn telemetry_rates_fill_in() {
        assert_eq!(rate_of(Some(&serde_json::json!(0.25))), Some(0.25));
        assert_eq!(rate_of(Some(&serde_json::json!({"rate": 0.5}))), Some(0.5));
        assert_eq!(rate_of(Some(&serde_json::json!("x"))), None);
    }
}
