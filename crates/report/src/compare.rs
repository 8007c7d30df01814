//! Two runs side by side: `pruefstand compare RUN_A RUN_B` writes one self-contained
//! `compare.html` — what differs between the two versions and plans (spec, plan hash,
//! profile), their headline figures with the rules' bounds, R4's pairing of B against
//! A, and every case whose outcome changed with both conversations beside each other.
//! A is taken as the reference, B as the candidate: each is judged against the other by
//! the judge ([`pruefstand_judge::judge_against_each_other`], which its caller runs);
//! nothing is decided here.
//!
//! `compare RUN_A RUN_B RUN_C …` (three or more runs) writes one page of the same
//! parts: an overview of every run, then this page's comparison of each further run
//! with the first ([`many`]).
//!
//! [`side_by_side`] is the one way a case of two runs is shown beside each other, here
//! and in a run's report. Not for the conversation itself (`conversation`).

mod many;

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Component, Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

use super::conversation;
use super::html::{esc, safe_href};
use super::page;
use super::svg::{self, IntervalRow};
use pruefstand_core::case::{CaseKind, CaseRecord};
use pruefstand_core::record::{Provenance, Verdict};
use pruefstand_core::util::{self, pct};
use pruefstand_judge::rules::r4::Comparison;
use pruefstand_judge::{Estimate, JudgeInput, Judged, JudgedRecords, Judgement, RuleId, StoredJudgement, Thresholds};
use pruefstand_store::{PlanFile, RunDir, RunFile, VersionFile};

/// Every compare page carries this mark in its head: a file at the page's path without
/// it is someone else's and is never written over.
const COMPARE_MARK: &str = r#"<meta name="generator" content="pruefstand compare page">"#;

/// The CSS [`side_by_side`] needs: two columns, stacked below 760 px.
pub(crate) const SIDE_BY_SIDE_CSS: &str = "\
.sbs{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:.8rem;margin:.4rem 0}\
@media (max-width:760px){.sbs{grid-template-columns:minmax(0,1fr)}}\
.side{border:1px solid #e0e0e0;border-radius:.3rem;padding:.3rem .5rem;min-width:0}\
.side-ref{background:#fafafa} .side-h{margin:.2rem 0;font-size:.9rem;overflow-wrap:anywhere}";

/// The compare page's own CSS beside the report's.
const COMPARE_CSS: &str = "\
tr.d td{background:#fff8e1} .ne{color:#c62828;font-weight:700} #spec-h~details>summary{font-size:.9rem;cursor:pointer} table.spec td{overflow-wrap:anywhere}\
table.spec{width:100%;table-layout:fixed} table.spec th:first-child{width:30%}\
@media (max-width:600px){table.spec,table.spec tbody{display:block}table.spec tr{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr)}\
table.spec th:first-child,table.spec td.k{grid-column:1/-1;width:auto}}";

/// One side of a case shown beside the other's.
pub struct Side<'a> {
    /// Whose case it is, as the page names it ("A: v1", "reference: base").
    pub label: &'a str,
    /// The run directory its trace is read from; None: no conversation shown.
    pub run_dir: Option<&'a RunDir>,
    /// That run directory as a link from the page: "" when the page lies in it,
    /// "../../base/schnell/run-0/" for another one ([`relative_dir`]); None: no links.
    pub href_base: Option<&'a str>,
    pub record: &'a CaseRecord,
    /// The bytes its conversation may take ([`conversation::room_per_conversation`]).
    pub room: usize,
}

/// A case of two runs beside each other: the reference's on the left, the candidate's
/// on the right (stacked on a narrow screen; the page needs [`SIDE_BY_SIDE_CSS`]), each
/// with its outcome above its conversation and a link to its raw trace.
pub(crate) fn side_by_side(candidate: &Side, reference: &Side) -> String {
    let mut out = String::from(r#"<div class="sbs">"#);
    for (side, class) in [(reference, "side-ref"), (candidate, "side-cand")] {
        let _ = write!(
            out,
            r#"<section class="side {class}"><p class="side-h"><b>{}</b> — {}</p>"#,
            esc(side.label),
            esc(&outcome(side.record))
        );
        out.push_str(&conversation::of_case(side.run_dir, side.record, side.room));
        let link =
            side.href_base.zip(side.record.trace.as_deref()).and_then(|(base, t)| safe_href(&(base.to_string() + t)));
        if let Some(href) = link {
            let _ = write!(out, r#"<p class="note"><a href="{href}">raw trace (AgentDojo JSON)</a></p>"#);
        }
        out.push_str("</section>");
    }
    out + "</div>"
}

/// A case's outcome in words: "attacked: utility yes, injection landed no".
fn outcome(r: &CaseRecord) -> String {
    if r.is_error() {
        return format!("error: {}", r.error.as_deref().unwrap_or("?"));
    }
    let yes_no = |v: Option<bool>| match v {
        Some(true) => "yes",
        Some(false) => "no",
        None => "–",
    };
    let kind = match r.kind {
        CaseKind::Clean => "clean",
        CaseKind::Attacked => "attacked",
        CaseKind::InjectionGoal => "injection goal",
    };
    let landed =
        if r.kind == CaseKind::Attacked { format!(", injection landed {}", yes_no(r.security)) } else { String::new() };
    format!("{kind}: utility {}{landed}", yes_no(r.utility))
}

/// `to_dir` as a relative link from a page in `from_dir` ("" for the same folder, else
/// ending in '/'); both absolute. None when a part of the way is not plain UTF-8.
pub(crate) fn relative_dir(from_dir: &Path, to_dir: &Path) -> Option<String> {
    let parts = |p: &Path| -> Option<Vec<String>> {
        p.components()
            .filter(|c| !matches!(c, Component::RootDir | Component::CurDir))
            .map(|c| match c {
                Component::Normal(s) => s.to_str().map(str::to_string),
                _ => None,
            })
            .collect()
    };
    if !from_dir.is_absolute() || !to_dir.is_absolute() {
        return None;
    }
    let (from, to) = (parts(from_dir)?, parts(to_dir)?);
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut out = String::new();
    for _ in common..from.len() {
        out.push_str("../");
    }
    for part in &to[common..] {
        out.push_str(part);
        out.push('/');
    }
    Some(out)
}

/// Whether `path` holds no file, or a compare page pruefstand wrote: only then may it be
/// (re)written. Never through a link.
pub(crate) fn compare_is_ours(path: &Path) -> bool {
    match std::fs::symlink_metadata(path) {
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        Ok(meta) if !meta.is_file() => false,
        Ok(_) => {
            let mut head = Vec::new();
            let read = std::fs::File::open(path)
                .and_then(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, 8192), &mut head));
            read.is_ok() && String::from_utf8_lossy(&head).contains(COMPARE_MARK)
        }
    }
}

/// What the page shows of a run's own `judgement.json` (of any age): its verdict and
/// against which reference (its version) it was reached.
struct OwnVerdict {
    verdict: Verdict,
    reference_version: Option<String>,
}

/// One run as the page shows it: judged against the other run, with its stored files.
struct Run {
    dir: RunDir,
    judgement: Judgement,
    input: JudgeInput,
    /// Its records as judged (the last of each case) and the other run's as its reference.
    records: JudgedRecords,
    version: Option<VersionFile>,
    plan: Option<PlanFile>,
    provenance: Option<Provenance>,
    /// `judgement.json` as the run left it: its verdict against its own reference.
    stored: Option<OwnVerdict>,
    /// The run directory as a link from the page.
    href: Option<String>,
    /// "A: name" / "B: name".
    label: String,
}

impl Run {
    /// Run `run` as `judged` against the other, with its descriptive files.
    fn load(run: &RunDir, judged: Judged, page_dir: &Path, letter: &str) -> Run {
        let Judged { judgement, input, records } = judged;
        // Descriptive files: one that cannot be read leaves its rows empty. (Both runs
        // were opened, their store format checked, when they were judged.)
        let stored = StoredJudgement::read(run)
            .ok()
            .flatten()
            .and_then(|own| Some(OwnVerdict { verdict: own.verdict?, reference_version: own.reference_version }));
        Run {
            dir: run.clone(),
            label: format!("{letter}: {}", input.run.version),
            version: run.read_version().ok().flatten(),
            plan: run.read_plan().ok().flatten(),
            provenance: run.read::<Provenance>().ok().flatten(),
            stored,
            href: relative_dir(page_dir, run.path()),
            judgement,
            input,
            records,
        }
    }

    /// A link to one of the run's files, as the page reaches it.
    fn link(&self, file: RunFile) -> Option<String> {
        safe_href(&file.href(self.href.as_deref()?))
    }
}

/// Run directories resolved for a compare page, in their order, each opened: each
/// must exist (an error names the first that does not) and be named once.
pub fn compare_dirs(dirs: &[PathBuf]) -> anyhow::Result<Vec<RunDir>> {
    anyhow::ensure!(dirs.len() >= 2, "a compare page needs two runs or more, got {}", dirs.len());
    let mut resolved: Vec<RunDir> = Vec::with_capacity(dirs.len());
    for dir in dirs {
        let real = dir.canonicalize().with_context(|| format!("run directory {}", dir.display()))?;
        if resolved.iter().any(|run| run.path() == real) {
            match dirs.len() {
                2 => anyhow::bail!("{} is compared with itself: name two runs", real.display()),
                _ => anyhow::bail!("{} is named twice: name each run once", real.display()),
            }
        }
        resolved.push(RunDir::open(real)?);
    }
    Ok(resolved)
}

/// Writes the compare page of `runs` (two or more, as [`compare_dirs`] resolved them;
/// the first is the reference), with `judged[k]` the first run and run `k + 1` judged
/// each against the other ([`pruefstand_judge::judge_against_each_other`]), to `out`
/// (default: the last run's compare page, `compare.html`; a folder: that name inside
/// it) and returns its path. Two runs make the page of two; more make an overview and a
/// comparison of each with the first. Refuses to write over a file that is not a
/// compare page of pruefstand's. A folder it makes is user-only, the page too (it shows
/// model output). A page in a run directory refreshes the index of the reports folder
/// it lies in, which links it.
pub fn write_compare(runs: &[RunDir], judged: Vec<(Judged, Judged)>, out: Option<&Path>) -> anyhow::Result<PathBuf> {
    anyhow::ensure!(runs.len() >= 2, "a compare page needs two runs or more, got {}", runs.len());
    anyhow::ensure!(judged.len() + 1 == runs.len(), "{} runs but {} pairs judged", runs.len(), judged.len());
    let last = &runs[runs.len() - 1];
    let out = match out {
        None => last.compare_path(),
        // A folder holds the page under the name a run directory gives it.
        Some(p) if p.is_dir() => RunDir::new(p).compare_path(),
        Some(p) => p.to_path_buf(),
    };
    anyhow::ensure!(
        compare_is_ours(&out),
        "{} exists and is not a compare page of pruefstand's: left as it is (choose another --out)",
        out.display()
    );
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !parent.exists() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let page_dir = parent.canonicalize().with_context(|| format!("resolving {}", parent.display()))?;
    let pairs: Vec<(Run, Run)> = runs[1..]
        .iter()
        .zip(judged)
        .map(|(run, (ja, jb))| (Run::load(&runs[0], ja, &page_dir, "A"), Run::load(run, jb, &page_dir, "B")))
        .collect();
    // The index of the reports folder the last run lies in, as a link from the page.
    let index = super::publish::find_reports_dir(last.path())
        .and_then(|reports| Some(format!("{}{}", relative_dir(&page_dir, &reports)?, super::INDEX_FILE)));
    let html = match pairs.as_slice() {
        [(a, b)] => render(a, b, index.as_deref()),
        _ => many::render(&pairs, index.as_deref()),
    };
    let html = html.replacen("<head>", &format!("<head>{COMPARE_MARK}"), 1);
    util::write_atomic(&out, html.as_bytes()).with_context(|| format!("writing {}", out.display()))?;
    refresh_index(&page_dir, &out);
    Ok(out)
}

/// The index links a run's compare page: a page written as a run directory's (one with
/// a judgement) compare page refreshes the index of the reports folder around it. One
/// that cannot be written is said, not fatal: the page stands.
fn refresh_index(page_dir: &Path, page: &Path) {
    let linked = page.file_name().is_some_and(|name| Some(name) == RunDir::new(page_dir).compare_path().file_name());
    if !linked || !RunDir::is_judged_run(page_dir) {
        return;
    }
    if let Some(reports) = super::publish::find_reports_dir(page_dir)
        && let Err(err) = super::write_index(&reports)
    {
        tracing::warn!("index not refreshed: {err:#}");
    }
}

fn render(a: &Run, b: &Run, index: Option<&str>) -> String {
    let mut body = String::new();
    let _ = write!(
        body,
        r#"<h1>{} vs {}</h1><p class="meta">A is taken as the reference, B as the candidate; each run judged against the other with its own thresholds. Written {}.</p><ul class="meta" id="runs">"#,
        esc(&a.judgement.version),
        esc(&b.judgement.version),
        esc(&chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string()),
    );
    for run in [a, b] {
        let report = match run.link(RunFile::Report) {
            Some(href) => format!(r#" · <a href="{href}">its report</a>"#),
            None => String::new(),
        };
        let _ = write!(
            body,
            r#"<li><b>{}</b> on {}, run <code>{}</code> in <code>{}</code>{report}</li>"#,
            esc(&run.label),
            esc(&run.judgement.plan),
            esc(&run.judgement.run_id),
            esc(&run.dir.path().display().to_string()),
        );
    }
    body.push_str("</ul>");
    body.push_str(&nav(index));
    sections(&mut body, a, b, 1);
    let title = format!("{} vs {} — pruefstand compare", a.judgement.version, b.judgement.version);
    page(&title, &body, "").replacen("</style>", &format!("{SIDE_BY_SIDE_CSS}{COMPARE_CSS}</style>"), 1)
}

/// The link to the index of the reports folder (`index`, relative), if any.
fn nav(index: Option<&str>) -> String {
    match index.and_then(safe_href) {
        Some(href) => format!(r#"<p class="meta" id="nav"><a href="{href}">all runs (index)</a></p>"#),
        None => String::new(),
    }
}

/// Run `b` against run `a`: what differs, the figures, R4's pairing and the changed
/// cases. `pairs`: how many such comparisons the page holds, which share the room of
/// its conversations.
fn sections(body: &mut String, a: &Run, b: &Run, pairs: usize) {
    spec_diff(body, a, b);
    figures(body, a, b);
    pairing(body, a, b);
    changed(body, a, b, pairs);
}

/// An RFC 3339 time for people ("2026-12-01 14:33:05 UTC"); anything else as it is.
fn readable(when: &str) -> String {
    chrono::DateTime::parse_from_rfc3339(when)
        .map(|t| t.with_timezone(&chrono::Utc).format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|_| when.to_string())
}

/// A JSON leaf for people: strings as they are, null and empty as "–".
fn leaf(v: &Value) -> String {
    match v {
        Value::Null => "–".into(),
        Value::String(s) if s.is_empty() => "–".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "–".into(),
        Value::Object(o) if o.is_empty() => "–".into(),
        other => other.to_string(),
    }
}

/// Every leaf of a version's spec as ("section.key", value), arrays as one value.
fn flatten(prefix: &str, v: &Value, out: &mut Rows) {
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        other => out.push((prefix.to_string(), leaf(other))),
    }
}

/// The sections of a spec always shown (when either side sets them); the rest (the
/// simulated model's knobs, …) only where they differ.
const SPEC_SHOWN: [&str; 6] = ["model", "adapter", "guardrail", "human", "trained_on", "agent_cmd"];

/// A spec with `--api-key` values in its command lines (`model.args`, `agent_cmd`)
/// redacted, as provenance records them: `version.json` keeps the spec as written.
fn redacted(spec: &Value) -> Value {
    let mut spec = spec.clone();
    for pointer in ["/model/args", "/agent_cmd"] {
        if let Some(v) = spec.pointer_mut(pointer)
            && let Some(argv) =
                v.as_array().map(|a| a.iter().filter_map(|w| w.as_str().map(String::from)).collect::<Vec<_>>())
        {
            *v = Value::from(pruefstand_core::spec::redact(&argv));
        }
    }
    spec
}

/// Rows of a table of one run: (field, value).
type Rows = Vec<(String, String)>;

/// A run's rows: what it is, what ran, then its spec's leaves.
fn spec_rows(r: &Run) -> (Rows, Rows) {
    let run = &r.input.run;
    let opt = |v: Option<&str>| v.filter(|s| !s.is_empty()).unwrap_or("–").to_string();
    let revision = r.provenance.as_ref().map(|p| &p.pruefstand).filter(|p| !p.is_null()).map(|p| {
        let dirty = if p.get("git_dirty").and_then(Value::as_bool) == Some(true) { " (dirty)" } else { "" };
        format!("{}{dirty}", leaf(p.get("git_revision").unwrap_or(&Value::Null)))
    });
    let verdict = r.stored.as_ref().map(|j| match &j.reference_version {
        Some(rv) => format!("{} (against {rv})", j.verdict.as_str()),
        None => format!("{} (no reference)", j.verdict.as_str()),
    });
    let head = vec![
        ("version".to_string(), run.version.clone()),
        ("description".into(), opt(r.version.as_ref().and_then(|v| v.spec.get("description")).and_then(Value::as_str))),
        ("spec hash".into(), opt(r.version.as_ref().map(|v| v.hash.as_str()))),
        ("run".into(), run.run_id.clone()),
        ("started".into(), opt(run.started_at.as_deref().map(readable).as_deref())),
        ("verdict as judged".into(), opt(verdict.as_deref())),
        ("plan".into(), run.plan.clone()),
        ("plan hash".into(), run.plan_hash.clone()),
        ("profile".into(), opt(r.plan.as_ref().map(|p| p.source.display().to_string()).as_deref())),
        ("benchmark version".into(), run.benchmark_version.clone()),
        ("AgentDojo".into(), opt(run.agentdojo_version.as_deref())),
        ("held-out families".into(), opt(Some(&run.attack_families.held_out.join(", ")))),
        ("trained on".into(), opt(Some(&run.attack_families.trained_on.join(", ")))),
        ("image digest".into(), opt(run.image_digest.as_deref())),
        ("pruefstand revision".into(), opt(revision.as_deref())),
    ];
    let mut spec = Vec::new();
    if let Some(v) = &r.version {
        flatten("", &redacted(&v.spec), &mut spec);
    }
    spec.retain(|(k, _)| k != "description");
    (head, spec)
}

/// The spec diff: what differs first (the headline rows and the spec's main sections),
/// then what is equal on both sides, folded and named in one line, and the differences
/// of the rest of the spec (the simulated model's knobs, …), folded.
/// One field of both runs, marked when it differs.
fn spec_row(out: &mut String, key: &str, va: &str, vb: &str) {
    let differs = va != vb;
    let _ = write!(
        out,
        r#"<tr{}><td class="k">{}{}</td><td><code>{}</code></td><td><code>{}</code></td></tr>"#,
        if differs { r#" class="d""# } else { "" },
        if differs { r#"<span class="ne" title="differs">≠</span> "# } else { "" },
        esc(key),
        esc(va),
        esc(vb)
    );
}

/// The union of both specs' leaves as (key, A's value, B's value), "–" where a side has
/// none: A's order first, the main sections first.
fn spec_union<'a>(spec_a: &'a Rows, spec_b: &'a Rows) -> Vec<(&'a str, &'a str, &'a str)> {
    let (map_a, map_b): (BTreeMap<&str, &str>, BTreeMap<&str, &str>) = (
        spec_a.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
        spec_b.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
    );
    let mut keys: Vec<&str> = spec_a.iter().map(|(k, _)| k.as_str()).collect();
    keys.extend(spec_b.iter().map(|(k, _)| k.as_str()).filter(|k| !map_a.contains_key(k)));
    keys.sort_by_key(|k| SPEC_SHOWN.iter().position(|s| *s == spec_section(k)).unwrap_or(SPEC_SHOWN.len()));
    keys.into_iter().map(|k| (k, map_a.get(k).copied().unwrap_or("–"), map_b.get(k).copied().unwrap_or("–"))).collect()
}

fn spec_section(key: &str) -> &str {
    key.split('.').next().unwrap_or("")
}

fn spec_diff(b: &mut String, ra: &Run, rb: &Run) {
    let ((head_a, spec_a), (head_b, spec_b)) = (spec_rows(ra), spec_rows(rb));
    let row = spec_row;
    let head = |id: &str| {
        format!(
            r#"<table class="spec" id="{id}"><tr><th>field</th><th>{}</th><th>{}</th></tr>"#,
            esc(&ra.label),
            esc(&rb.label)
        )
    };
    let (mut differ, mut equal, mut others) = (String::new(), String::new(), String::new());
    let (mut equal_names, mut equal_spec, mut other_sections, mut hidden) = (Vec::new(), 0, Vec::new(), 0);
    for ((key, va), (_, vb)) in head_a.iter().zip(&head_b) {
        if va != vb {
            row(&mut differ, key, va, vb);
        } else {
            row(&mut equal, key, va, vb);
            equal_names.push(key.as_str());
        }
    }
    let section = |k: &str| spec_section(k).to_string();
    for (k, va, vb) in spec_union(&spec_a, &spec_b) {
        let main = SPEC_SHOWN.contains(&section(k).as_str());
        let key = format!("spec: {k}");
        match (va != vb, main) {
            (true, true) => row(&mut differ, &key, va, vb),
            (true, false) => {
                row(&mut others, &key, va, vb);
                if !other_sections.contains(&section(k)) {
                    other_sections.push(section(k));
                }
            }
            (false, true) if va != "–" => {
                row(&mut equal, &key, va, vb);
                equal_spec += 1;
            }
            (false, _) => hidden += 1,
        }
    }
    b.push_str(r#"<h2 id="spec-h">What differs</h2>"#);
    if differ.is_empty() {
        b.push_str(r#"<p class="note">Nothing below differs.</p>"#);
    } else {
        let _ = write!(b, "{}{differ}</table>", head("spec"));
    }
    if !equal.is_empty() {
        if equal_spec > 0 {
            equal_names.push("the spec's model, adapter, guardrail and human fields not listed above");
        }
        let _ = write!(
            b,
            r#"<details id="spec-equal-d"><summary>Equal on both sides: {}</summary>{}{equal}</table></details>"#,
            esc(&equal_names.join(", ")),
            head("spec-equal")
        );
    }
    if !others.is_empty() {
        let _ = write!(
            b,
            r#"<details id="spec-other"><summary>{} further spec field(s) differ ({})</summary>{}{others}</table></details>"#,
            others.matches("<tr").count(),
            esc(&other_sections.join(", ")),
            head("spec-others")
        );
    }
    if ra.version.is_none() || rb.version.is_none() {
        b.push_str(r#"<p class="note">A run without <code>version.json</code> shows no spec rows.</p>"#);
    }
    let _ = write!(b, r#"<p class="note">{hidden} further spec field(s) empty or equal on both sides, not shown.</p>"#);
}

/// A figure of one run: x of n with the bounds its rule decides on.
#[derive(Clone, Copy)]
struct Fig {
    x: u64,
    n: u64,
    rate: f64,
    lower: f64,
    upper: f64,
}

impl From<Estimate> for Fig {
    fn from(e: Estimate) -> Fig {
        Fig { x: e.x, n: e.n, rate: e.rate, lower: e.lower, upper: e.upper }
    }
}

/// R2's own figure when it judged held-out families (docs/attacks.md): its measured
/// ASR with the bounds it decided on.
fn held_out_asr(j: &Judgement) -> Option<Fig> {
    let m = j.rule(RuleId::R2)?.measured.r2()?;
    m.judged_families.as_ref().filter(|f| !f.is_empty())?;
    Some(Fig { x: m.x, n: m.n, rate: m.asr, lower: m.lower, upper: m.upper })
}

fn fig_text(f: Option<Fig>) -> String {
    match f {
        Some(f) => format!("{} ({}/{}) [{}, {}]", pct(f.rate), f.x, f.n, pct(f.lower), pct(f.upper)),
        None => "–".into(),
    }
}

/// The adaptive attacker's search figure, as R2 measured it: searched pairs broken
/// within K attempts, with R2's bounds.
fn adaptive_asr(j: &Judgement) -> Option<Fig> {
    let a = j.rule(RuleId::R2)?.measured.r2()?.adaptive.as_ref()?;
    Some(Fig { x: a.broken, n: a.pairs, rate: a.asr, lower: a.lower, upper: a.upper })
}

/// The transfer figure: held-out pairs broken by the attempts frozen from the search,
/// with R2's bounds — what R2 decides on when the profile sets `asr_adaptive_max`.
fn transfer_asr(j: &Judgement) -> Option<Fig> {
    let t = j.rule(RuleId::R2)?.measured.r2()?.adaptive.as_ref()?.transfer.as_ref()?;
    Some(Fig { x: t.broken, n: t.pairs, rate: t.asr, lower: t.lower, upper: t.upper })
}

/// A figure of a judgement.
type Get = fn(&Judgement) -> Option<Fig>;

/// The figures the page shows of each run, each with the limit its rule holds it to
/// in thresholds `t` (the adaptive maximum only on the figure R2 decides it on, and
/// only when the profile sets one), as judged by `j` (B's judgement).
fn figure_rows(t: &Thresholds, j: &Judgement) -> [(&'static str, Get, Option<f64>); 7] {
    // The adaptive maximum holds the transfer figure where there is one, else the search's.
    let adaptive = |transfer: bool| t.r2.asr_adaptive_max.filter(|_| transfer_asr(j).is_some() == transfer);
    [
        ("ASR, every attacked case", |j| j.figures.asr.map(Fig::from), Some(t.r2.asr_max)),
        ("held-out ASR (what R2 judges)", held_out_asr, Some(t.r2.asr_max)),
        ("adaptive ASR, search pairs", adaptive_asr, adaptive(false)),
        ("transfer ASR, held-out pairs", transfer_asr, adaptive(true)),
        ("utility (clean)", |j| j.figures.utility_clean.map(Fig::from), Some(t.r3.utility_min)),
        (
            "utility under attack",
            |j| j.figures.utility_under_attack.map(Fig::from),
            Some(t.r3.utility_under_attack_min),
        ),
        ("injection-goal utility", |j| j.figures.injection_goal_utility.map(Fig::from), None),
    ]
}

fn figures(b: &mut String, ra: &Run, rb: &Run) {
    let (ja, jb) = (&ra.judgement, &rb.judgement);
    let t = &jb.thresholds;
    let rows = figure_rows(t, jb);
    let mut chart = Vec::new();
    let mut table = String::from(
        r#"<div class="scroll"><table id="figures"><tr><th>figure</th><th>A</th><th>B</th><th>B − A</th></tr>"#,
    );
    for (label, get, threshold) in rows {
        let (fa, fb) = (get(ja), get(jb));
        if fa.is_none() && fb.is_none() {
            continue;
        }
        let mut series = Vec::new();
        for (f, run, colour) in [(fa, ra, super::REFERENCE), (fb, rb, super::CANDIDATE)] {
            if let Some(f) = f {
                series.push((run.label.clone(), colour, f.lower, f.rate, f.upper));
            }
        }
        chart.push(IntervalRow { label: label.into(), series, threshold });
        let diff = match (fa, fb) {
            (Some(fa), Some(fb)) => format!("{:+.1} pt", 100.0 * (fb.rate - fa.rate)),
            _ => "–".into(),
        };
        let _ = write!(
            table,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{diff}</td></tr>",
            esc(label),
            fig_text(fa),
            fig_text(fb)
        );
    }
    table.push_str("</table></div>");
    b.push_str(r#"<h2 id="figures-h">Figures</h2>"#);
    b.push_str(&svg::interval_chart(
        "compare-intervals",
        "Rates with the rules' one-sided bounds (dashed: B's limit)",
        &chart,
    ));
    b.push_str(&table);
    let same = ja.thresholds == jb.thresholds;
    let _ = write!(
        b,
        "<p class=\"note\">Bounds are the ones the rules decide on: R2's upper bound at {} and lower at {}, R3's at {} \
         (one-sided; 95 % unless the profile says otherwise), cluster-adjusted, errored cases counted against the \
         version. The held-out ASR is R2's figure where the plan holds attack families out; a plan with an adaptive \
         attacker adds its figures, pairs broken rather than cases: the search half's within its budget of K \
         attempts, and the held-out half's by the attempts frozen from the search (the one R2's adaptive maximum \
         decides on).{}</p>",
        pct(1.0 - t.r2.alpha_pass),
        pct(1.0 - t.r2.alpha_fail),
        pct(1.0 - t.r3.alpha),
        if same { "" } else { " <b>The two runs were judged with different thresholds</b>; the limits drawn are B's." }
    );
}

/// R4's pairing of B against A: the rule as the judge decided it, and its counts.
fn pairing(b: &mut String, ra: &Run, rb: &Run) {
    b.push_str(r#"<h2 id="pairing">Paired cases (R4)</h2>"#);
    let Some(r4) = rb.judgement.rule(RuleId::R4) else { return };
    let status = r4.status.as_str();
    let _ = write!(
        b,
        r#"<p id="r4">R4 with B as candidate and A as reference: <span class="s s-{status}">{status}</span> — {}</p>"#,
        esc(&r4.reason)
    );
    let measured = r4.measured.r4();
    let rows: Vec<(&str, &str, &str, &Comparison)> = [
        ("ASR", "injection landed in B, not in A", "landed in A, not in B", measured.and_then(|m| m.asr.as_ref())),
        ("utility", "B failed the task, A did it", "A failed, B did it", measured.and_then(|m| m.utility.as_ref())),
    ]
    .into_iter()
    .filter_map(|(label, worse, better, m)| Some((label, worse, better, m?)))
    .collect();
    if !rows.is_empty() {
        b.push_str(
            r#"<div class="scroll"><table id="pairs"><tr><th>figure</th><th>pairs</th><th>b: A better</th><th>c: B better</th><th>net, B against A</th><th>p of "B worse" (one-sided, Holm)</th></tr>"#,
        );
        for (label, worse, better, m) in rows {
            let _ = write!(
                b,
                r#"<tr><td>{label}</td><td>{}</td><td>{} <span class="note">{worse}</span></td><td>{} <span class="note">{better}</span></td><td>{}</td><td>{:.3}</td></tr>"#,
                m.pairs,
                m.b,
                m.c,
                net_words(m.difference),
                m.p_holm,
            );
        }
        b.push_str("</table></div>");
    }
    let _ = write!(
        b,
        r#"<p class="note">Pairs are the cases both runs ran without error, matched by case id. b counts cases where A was secure (or kept its utility) and B was not, c the reverse; R4 tests them per user task (sign flips, Holm over the two). A's own verdict: {}.</p>"#,
        ra.stored.as_ref().map_or("not judged", |j| j.verdict.as_str())
    );
}

/// A paired net difference in R4's words: `difference` > 0 is B worse on net (b − c
/// over the pairs), so the row reads as R4's reason does.
fn net_words(difference: f64) -> String {
    match difference {
        d if d > 0.0 => format!("B worse by {:.1} pt", 100.0 * d),
        d if d < 0.0 => format!("B better by {:.1} pt", -100.0 * d),
        _ => "unchanged".to_string(),
    }
}

/// Every case whose outcome changed from A to B, with both conversations.
/// `pairs`: how many comparisons share the page's room for conversations.
fn changed<'a>(b: &mut String, ra: &'a Run, rb: &'a Run, pairs: usize) {
    // The judge's pairing (R4's), as the run's own report shows changes.
    let changes = super::changes(&rb.records);
    let records_a: BTreeMap<&str, &CaseRecord> = ra.input.records.iter().map(|r| (r.case_id.as_str(), r)).collect();
    let records_b: BTreeMap<&str, (usize, &CaseRecord)> =
        rb.input.records.iter().enumerate().map(|(i, r)| (r.case_id.as_str(), (i, r))).collect();
    let mut list: Vec<(&String, Vec<&'static str>, usize)> = changes
        .iter()
        .map(|(id, kinds)| {
            let words = kinds.iter().map(|c| c.as_str()).collect();
            (id, words, records_b.get(id.as_str()).map_or(usize::MAX, |(i, _)| *i))
        })
        .collect();
    // By change, then in plan order.
    list.sort_by(|x, y| x.1.cmp(&y.1).then(x.2.cmp(&y.2)));
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for word in list.iter().flat_map(|(_, words, _)| words) {
        *counts.entry(word).or_default() += 1;
    }
    let summary: Vec<String> = counts.iter().map(|(w, n)| format!("<b>{n}</b> {w}")).collect();
    let _ = write!(
        b,
        r#"<h2 id="changed">Changed cases</h2><p id="changed-summary">{} case(s) changed from A to B{}.</p>"#,
        list.len(),
        if summary.is_empty() { String::new() } else { format!(": {}", summary.join(" · ")) }
    );
    if list.is_empty() {
        return;
    }
    b.push_str(r#"<p class="note">A on the left, B on the right; injected text <mark>highlighted</mark>.</p>"#);
    let room = conversation::room_per_conversation(2 * list.len() * pairs.max(1));
    for (i, (id, words, _)) in list.iter().enumerate() {
        let (Some(ca), Some((_, cb))) = (records_a.get(id.as_str()), records_b.get(id.as_str())) else { continue };
        let side = |run: &'a Run, record: &'a CaseRecord| Side {
            label: &run.label,
            run_dir: Some(&run.dir),
            href_base: run.href.as_deref(),
            record,
            room,
        };
        let (sa, sb) = (side(ra, ca), side(rb, cb));
        let _ = write!(
            b,
            r#"<details class="case" id="change-{i}"{}><summary><code>{}</code> — {}</summary>{}</details>"#,
            if i == 0 { " open" } else { "" },
            esc(id),
            esc(&words.join(", ")),
            side_by_side(&sb, &sa)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pruefstand_judge::tests::{schnell, write_run_dir};

    /// What `compare` does: judge the two runs against each other, write the page.
    fn compare(a: &Path, b: &Path, out: Option<&Path>) -> anyhow::Result<PathBuf> {
        let runs = compare_dirs(&[a.to_path_buf(), b.to_path_buf()])?;
        write_compare(&runs, vec![pruefstand_judge::judge_against_each_other(&runs[0], &runs[1])?], out)
    }

    #[test]
    fn api_keys_in_a_specs_command_lines_are_redacted() {
        let spec = serde_json::json!({"model": {"args": ["--api-key", "s3cret", "--x=1"]}, "agent_cmd": ["a", "--api-key=s3cret"]});
        let mut rows = Vec::new();
        flatten("", &redacted(&spec), &mut rows);
        let text = format!("{rows:?}");
        assert!(!text.contains("s3cret") && text.contains("<redacted>") && text.contains("--x=1"), "{text}");
    }

    #[test]
    fn relative_dirs_climb_and_descend() {
        let rel = |a: &str, b: &str| relative_dir(Path::new(a), Path::new(b));
        assert_eq!(rel("/r/cand/p/run-1", "/r/cand/p/run-1").as_deref(), Some(""));
        assert_eq!(rel("/r/cand/p/run-1", "/r/base/p/run-0").as_deref(), Some("../../../base/p/run-0/"));
        assert_eq!(rel("/tmp/out", "/r/x").as_deref(), Some("../../r/x/"));
        assert_eq!(rel("rel", "/r"), None, "only absolute paths");
    }

    #[test]
    fn only_a_missing_file_or_a_compare_page_is_written_over() {
        let dir = tempfile::tempdir().unwrap();
        let page = dir.path().join("c.html");
        assert!(compare_is_ours(&page));
        std::fs::write(&page, "<html><head><title>mine</title></head></html>").unwrap();
        assert!(!compare_is_ours(&page));
        std::fs::write(&page, format!("<html><head>{COMPARE_MARK}</head></html>")).unwrap();
        assert!(compare_is_ours(&page));
        let link = dir.path().join("l.html");
        std::os::unix::fs::symlink(&page, &link).unwrap();
        assert!(!compare_is_ours(&link), "never through a link");
        assert!(!compare_is_ours(dir.path()), "a folder is not a page");
    }

    #[test]
    fn side_by_side_puts_the_reference_left_and_refuses_traces_outside() {
        let input = schnell(0);
        let (mut cand, refr) = (input.records[30].clone(), input.records[30].clone());
        cand.security = Some(true);
        cand.trace = Some("../../etc/passwd".into());
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        let html = side_by_side(
            &Side { label: "B: <cand>", run_dir: Some(&run), href_base: Some(""), record: &cand, room: 1 << 16 },
            &Side { label: "A: base", run_dir: None, href_base: Some("../base/"), record: &refr, room: 1 << 16 },
        );
        let (left, right) = (html.find("A: base").unwrap(), html.find("B: &lt;cand&gt;").unwrap());
        assert!(left < right, "the reference left: {html}");
        assert!(html.contains("injection landed yes") && html.contains("injection landed no"));
        assert!(html.contains("refused (not inside the run directory)"));
        assert!(html.contains(&format!(r#"href="../base/{}""#, refr.trace.as_deref().unwrap())));
        assert_eq!(html.matches(r#"<section class="side"#).count(), 2);
    }

    #[test]
    fn the_compare_page_diffs_specs_shows_figures_pairs_and_changed_cases() {
        let tmp = tempfile::tempdir().unwrap();
        let (dir_a, dir_b) =
            (tmp.path().join("reports/base/schnell/run-0"), tmp.path().join("reports/cand/schnell/run-1"));
        let mut a = schnell(30);
        a.run.run_id = "run-0".into();
        a.run.version = "base".into();
        write_run_dir(&dir_a, &a, None);
        let mut b = schnell(0);
        b.run.version = "cand<i>".into();
        write_run_dir(&dir_b, &b, None);
        // A trace for one changed case, on both sides.
        let changed = a.records.iter().find(|r| r.security == Some(true)).unwrap();
        let trace = changed.trace.clone().unwrap();
        for (dir, text) in [(&dir_a, "A said this"), (&dir_b, "B said that")] {
            let path = dir.join(&trace);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let t = serde_json::json!({"messages": [{"role": "assistant", "content": text}]});
            std::fs::write(path, t.to_string()).unwrap();
        }
        let out = compare(&dir_a, &dir_b, None).unwrap();
        assert_eq!(out, RunDir::new(dir_b.canonicalize().unwrap()).compare_path());
        let html = std::fs::read_to_string(&out).unwrap();
        assert!(html.contains(COMPARE_MARK) && html.contains("Content-Security-Policy"));
        assert!(!html.contains("<script"), "no script");
        let spec = &html[html.find(r#"id="spec""#).unwrap()..html.find(r#"id="spec-equal-d""#).unwrap()];
        assert!(spec.contains("A: base") && spec.contains("B: cand&lt;i&gt;"), "{spec}");
        assert!(spec.contains(r#"<tr class="d"><td class="k"><span class="ne" title="differs">≠</span> version</td>"#));
        assert!(!spec.contains("plan hash"), "only what differs");
        let equal = &html[html.find(r#"id="spec-equal-d""#).unwrap()..html.find(r#"id="figures-h""#).unwrap()];
        assert!(
            equal.contains("Equal on both sides: ")
                && equal.contains(" plan, plan hash,")
                && equal.contains(r#"<tr><td class="k">plan hash</td>"#)
        );
        assert!(html.contains(r#"id="compare-intervals""#) && html.contains("ASR, every attacked case"));
        assert!(html.contains("50.0 % (30/60)") && html.contains("0.0 % (0/60)"), "both ASRs with counts");
        assert!(html.contains("-50.0 pt"));
        // R4: 30 pairs where A let the injection land and B did not.
        let pairs = &html[html.find(r#"id="pairs""#).unwrap()..];
        assert!(pairs.contains("<td>ASR</td><td>60</td><td>0 <span") && pairs.contains("<td>30 <span"), "{pairs:.600}");
        assert!(html.contains("<b>30</b> newly blocked"));
        assert_eq!(html.matches(r#"<details class="case""#).count(), 30);
        assert!(html.contains("A said this") && html.contains("B said that"), "both conversations");
        assert!(
            html.contains(&format!(r#"href="../../../base/schnell/run-0/{trace}""#)),
            "A's raw trace from B's folder"
        );
        let report = RunFile::Report.href("");
        assert!(
            html.contains(&format!(r#"href="{report}""#))
                && html.contains(&format!(r#"href="../../../base/schnell/run-0/{report}""#))
        );

        // Written again over its own page; never over someone else's, nor a run with itself.
        assert!(compare(&dir_a, &dir_b, None).is_ok());
        let foreign = tmp.path().join("notes.html");
        std::fs::write(&foreign, "my notes").unwrap();
        let err = compare(&dir_a, &dir_b, Some(&foreign)).unwrap_err().to_string();
        assert!(err.contains("not a compare page"), "{err}");
        assert_eq!(std::fs::read_to_string(&foreign).unwrap(), "my notes");
        assert!(compare(&dir_a, &dir_a, None).unwrap_err().to_string().contains("with itself"));
        // A new folder for --out is user-only; so is the page.
        use std::os::unix::fs::PermissionsExt;
        let out = compare(&dir_a, &dir_b, Some(&tmp.path().join("new/sub/c.html"))).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(out.parent().unwrap()), mode(&out)), (0o700, 0o600));
    }
}
