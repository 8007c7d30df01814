//! Reports of a judged run — `judgement.json`, `judgement.md` and one self-contained
//! `report.html` (inline CSS, SVG and one small inline script for the case table's
//! filters and sort; no network, no external file; without the script everything is
//! shown, unfiltered) — and the trend index `reports/index.html` over all judged runs.
//! Presentation only: every figure comes from the [`Judgement`], the case records or
//! their traces; nothing here decides anything.

// What a judged run hands on besides its reports: its conversations as training data.
pub mod export;

mod adaptive;
mod cases;
pub mod colours;
mod compare;
mod conversation;
mod families;
mod index;
mod publish;
mod svg;
pub mod html;
pub mod lineage;

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use pruefstand_core::case::{CaseKind, CaseRecord};
use pruefstand_core::record::{RuleStatus, Verdict};
use pruefstand_core::util::{self, pct};
use pruefstand_core::words::{self, BoundSide};
use pruefstand_judge::{Estimate, JudgeInput, Judged, JudgedRecords, Judgement};
use pruefstand_store::{RunDir, RunFile};

use colours::{CANDIDATE, REFERENCE};
pub use compare::{compare_dirs, write_compare};
use html::{esc, safe_href};
pub use index::INDEX_FILE;
use index::write_index;
pub use publish::write;
use svg::{Bar, BarRow, HeatCell, IntervalRow, MatrixBlock};

/// Writes `judgement.json`, `judgement.md` and `report.html` into the run directory
/// (atomic replacements; `cases.jsonl` is never touched).
pub(crate) fn write_run_report(run: &RunDir, judged: &Judged) -> anyhow::Result<()> {
    let judgement = &judged.judgement;
    run.write(judgement)?;
    util::write_atomic(&run.judgement_markdown_path(), markdown(judgement).as_bytes())?;
    util::write_atomic(&run.report_path(), html(judged, Some(run)).as_bytes())
        .with_context(|| format!("writing the report of run {}", judgement.run_id))
}

fn status_word(s: RuleStatus) -> &'static str {
    s.as_str()
}

/// A table cell of Markdown: no `|` that ends it, no line break.
fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The Markdown twin of the report: verdict, rules, outlook, headline figures.
pub fn markdown(j: &Judgement) -> String {
    let cell = md_cell;
    let mut md = format!("# {} on {} — **{}**\n\n", cell(&j.version), cell(&j.plan), j.verdict.as_str());
    let _ = writeln!(md, "{}\n", cell(&j.summary));
    let _ = writeln!(md, "- run: `{}`, plan hash `{}`", cell(&j.run_id), cell(&j.plan_hash));
    if let Some(r) = &j.reference_run_id {
        let _ = writeln!(md, "- reference: `{}` ({})", cell(r), cell(j.reference_version.as_deref().unwrap_or("?")));
    }
    if let Some(sha) = &j.cases_sha256 {
        let _ = writeln!(md, "- judged `cases.jsonl` sha256 `{sha}`");
    }
    if let Some(sha) = &j.reference_cases_sha256 {
        let _ = writeln!(md, "- the reference's `cases.jsonl` sha256 `{sha}`");
    }
    if let Some(why) = &j.cases_untrusted {
        let _ = writeln!(md, "- **{why}**");
    }
    let _ = writeln!(md, "- judged at {}\n", j.judged_at);
    md.push_str("| rule | name | status | reason |\n|---|---|---|---|\n");
    for r in &j.rules {
        let _ = writeln!(md, "| {} | {} | {} | {} |", r.id, r.name, status_word(r.status), cell(&r.reason));
    }
    md.push('\n');
    if let Some(line) = j.decisive_line() {
        let _ = writeln!(md, "**{}**\n", cell(&line));
    }
    markdown_figures(&mut md, j);
    if let Some(note) = words::overflow_note(j.figures.asr_overflows, j.figures.asr.map_or(0, |e| e.x)) {
        let _ = writeln!(md, "**{}.**\n", cell(&note));
    }
    families::markdown(&mut md, j);
    if !j.outlook.is_empty() {
        md.push_str("## Would `voll` decide?\n\n");
        for o in &j.outlook {
            let decides = if o.voll_decides { "likely yes" } else { "likely no" };
            let _ = writeln!(md, "- {} {}: {decides} — {}", o.rule, o.figure, cell(&o.note));
        }
    }
    md
}

/// Both one-sided bounds in words, each at its α.
fn md_bounds((lower, upper): (f64, f64), (alpha_lower, alpha_upper): (f64, f64)) -> String {
    format!(
        "{} · {}",
        words::bound(BoundSide::Lower, alpha_lower, lower),
        words::bound(BoundSide::Upper, alpha_upper, upper)
    )
}

/// A headline figure's row of the Markdown table.
fn md_figure_row(name: &str, e: &Option<Estimate>, alphas: (f64, f64)) -> String {
    match e {
        Some(e) => format!(
            "| {name} | {} | {}/{}{} | {}{} | {:.2} |\n",
            pct(e.rate),
            e.x,
            e.n,
            errors_note(e),
            md_bounds((e.lower, e.upper), alphas),
            without_errors_note(e),
            e.deff
        ),
        None => format!("| {name} | – | – | – | – |\n"),
    }
}

/// The headline figures' table: first the figure R2 judged.
fn markdown_figures(md: &mut String, j: &Judgement) {
    let (f, t) = (&j.figures, &j.thresholds);
    md.push_str("| figure | rate | count | one-sided bounds | DEFF |\n|---|---|---|---|---|\n");
    let asr_alphas = (t.r2.alpha_fail, t.r2.alpha_pass);
    match &f.decisive {
        Some(d) if d.name != words::ASR_ALL => {
            let errors = if d.errors == 0 { String::new() } else { format!(", {} errored", d.errors) };
            let _ = writeln!(
                md,
                "| {} (judged by {}) | {} | {}/{}{errors} | {} | {:.2} |",
                d.name,
                d.rule,
                pct(d.rate),
                d.hits,
                d.cases,
                md_bounds((d.lower, d.upper), (d.alpha_lower, d.alpha_upper)),
                d.deff
            );
            *md += &md_figure_row(&format!("{} (not judged)", words::ASR_ALL), &f.asr, asr_alphas);
        }
        Some(d) => *md += &md_figure_row(&format!("{} (judged by {})", words::ASR_ALL, d.rule), &f.asr, asr_alphas),
        None => *md += &md_figure_row(words::ASR_ALL, &f.asr, asr_alphas),
    }
    *md += &md_figure_row(words::UTILITY_CLEAN, &f.utility_clean, (t.r3.alpha, t.r3.alpha));
    *md += &md_figure_row(words::UTILITY_UNDER_ATTACK, &f.utility_under_attack, (t.r3.alpha, t.r3.alpha));
    *md += &md_figure_row(words::INJECTION_GOAL_UTILITY, &f.injection_goal_utility, (0.05, 0.05));
    md.push('\n');
}

/// ", 12 errors" after a count when the figure had errored cases.
fn errors_note(e: &Estimate) -> String {
    if e.errors == 0 { String::new() } else { format!(", {} errored", e.errors) }
}

/// The bounds with errors left out, when counting the errors against the version moved
/// them: both are shown, the decision uses the first.
fn without_errors_note(e: &Estimate) -> String {
    match e.without_errors {
        Some((lo, hi)) => format!(" (errors left out: lower {}, upper {})", pct(lo), pct(hi)),
        None => String::new(),
    }
}

const CSS: &str = r#"
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;max-width:1100px;padding:0 1rem;color:#222}
h1{font-size:1.4rem;margin-bottom:.2rem} h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd}
#verdict{display:inline-block;font-size:2.6rem;font-weight:800;letter-spacing:.05em;text-transform:uppercase;padding:.3rem 1.2rem;border-radius:.4rem;color:#fff;margin:.6rem 0}
.meta{color:#555;font-size:.9rem} table{border-collapse:collapse;margin:.6rem 0;font-size:.9rem} td,th{border:1px solid #ddd;padding:.25rem .5rem;vertical-align:top;text-align:left}
pre{font-size:.75rem;background:#f6f6f6;padding:.4rem;overflow:auto;margin:0;white-space:pre-wrap;overflow-wrap:anywhere} svg.chart{display:block;margin:1rem 0 .2rem;max-width:100%;height:auto}
.note{color:#555;font-size:.85rem} code{overflow-wrap:anywhere}
.scroll{overflow-x:auto;max-width:100%} td{overflow-wrap:break-word}
ul.legend{list-style:none;padding:0;margin:0 0 1rem;font-size:.85rem;display:flex;flex-wrap:wrap;gap:.3rem 1.2rem} ul.legend li{overflow-wrap:anywhere}
.sw{display:inline-block;width:.8rem;height:.8rem;margin-right:.3rem;vertical-align:middle;border-radius:2px}
dl.kv{margin:0;font-size:.8rem;display:grid;grid-template-columns:auto auto;gap:0 .6rem} dl.kv dt{color:#555} dl.kv dd{margin:0}
.t-event{border-left:4px solid #b45309;background:#fff7ed;font-size:.9rem;overflow-wrap:anywhere} .ev-human_approval{border-left-color:#15803d;background:#f0fdf4} #case-filter{margin:.5rem 0;font-size:.9rem} th.sort{cursor:pointer} tr[hidden]{display:none}
details.case{border-top:1px solid #eee;padding:.2rem 0} details.case summary{cursor:pointer;overflow-wrap:anywhere}
ol.conv{list-style:none;padding:0;margin:.4rem 0} .turn{margin:.3rem 0;padding:.3rem .5rem;border-left:4px solid #ccc}
.t-system{border-color:#9e9e9e}.t-user{border-color:#1565c0}.t-assistant{border-color:#2e7d32}.t-tool{border-color:#ef8f00}
.call{font-size:.85rem;margin:.2rem 0} mark{background:#ffcdd2} .err{color:#c62828} .gap{color:#777}
#found-templates td{overflow-wrap:anywhere} #found-templates td:first-child{overflow-wrap:normal}
"#;

/// The page around a body; `script` (no data in it) goes last, inline. A strict
/// Content-Security-Policy comes first: nothing loads from anywhere, and the one script
/// that runs is the page's own, allowed by its hash — text that slipped through as
/// markup could still not run.
fn page(title: &str, body: &str, script: &str) -> String {
    let (script_tag, script_src) = if script.is_empty() {
        (String::new(), "'none'".to_string())
    } else {
        (format!("<script>{script}</script>"), format!("'sha256-{}'", sha256_base64(script.as_bytes())))
    };
    let csp = format!(
        "default-src 'none'; script-src {script_src}; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
    );
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\"><meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>{}</title><style>{CSS}{}</style></head><body>\n{body}\n{script_tag}</body></html>\n",
        esc(title),
        colours::css()
    )
}

/// Every script a page of ours runs (inline, allowed by its hash): what a server that
/// serves these pages may allow, and nothing else.
pub const PAGE_SCRIPTS: &[&str] = &[cases::SCRIPT];

/// The links from a run's report to the pages around it, each only where it can be
/// reached: the reports folder's index (written right after the report), the
/// reference's report (`<reports>/<reference>/<plan>/<run id>/`) and a compare page
/// beside this report.
fn nav(run: Option<&RunDir>, j: &Judgement) -> String {
    let Some(run) = run else { return String::new() };
    let Ok(run_dir) = run.path().canonicalize() else { return String::new() };
    let mut links: Vec<(String, &str)> = Vec::new();
    let reports = publish::find_reports_dir(&run_dir);
    if let Some(reports) = &reports
        && let Some(up) = compare::relative_dir(&run_dir, reports)
    {
        links.push((format!("{up}{INDEX_FILE}"), "all runs (index)"));
    }
    if let (Some(reports), Some(id), Some(version)) = (&reports, &j.reference_run_id, &j.reference_version) {
        let reference = RunDir::new(reports.join(version).join(&j.plan).join(id));
        if reference.has_report()
            && let Some(dir) = compare::relative_dir(&run_dir, reference.path())
        {
            links.push((RunFile::Report.href(&dir), "the reference's report"));
        }
    }
    if run.has_compare_page() {
        links.push((RunFile::Compare.href(""), "compared with another run"));
    }
    let links: Vec<String> = links
        .into_iter()
        .filter_map(|(href, text)| Some(format!(r#"<a href="{}">{text}</a>"#, safe_href(&href)?)))
        .collect();
    if links.is_empty() { String::new() } else { format!(r#"<p class="meta" id="nav">{}</p>"#, links.join(" · ")) }
}

/// The base64 of a sha256, as a CSP hash source spells it.
pub fn sha256_base64(bytes: &[u8]) -> String {
    use sha2::Digest;
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let digest = sha2::Sha256::digest(bytes);
    let mut out = String::new();
    for chunk in digest.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The self-contained run report; conversations are read from the traces below
/// the run directory when given.
pub fn html(judged: &Judged, run_dir: Option<&RunDir>) -> String {
    let (j, input) = (&judged.judgement, &judged.input);
    let mut b = String::new();
    let _ = write!(
        b,
        r#"<h1>{} on {}</h1><div id="verdict" class="v-{v}">{v}</div><p id="summary">{}</p><p class="meta">run <code>{}</code> · plan hash <code>{}</code> · judged {}{}</p>"#,
        esc(&j.version),
        esc(&j.plan),
        esc(&j.summary),
        esc(&j.run_id),
        esc(&j.plan_hash),
        esc(&j.judged_at),
        match &j.reference_run_id {
            Some(r) =>
                format!(" · reference <code>{}</code> ({})", esc(r), esc(j.reference_version.as_deref().unwrap_or("?"))),
            None => " · no reference".into(),
        },
        v = j.verdict.as_str(),
    );
    b.push_str(&nav(run_dir, j));
    if let Some(candidate) = &input.run.reference_for {
        let _ = write!(
            b,
            r#"<p class="meta" id="reference-for">Made as the reference of <b>{}</b>'s run: judged as any run is, but no verdict was asked of it (the index shows it as "reference").</p>"#,
            esc(candidate)
        );
    }
    if let Some(line) = j.decisive_line() {
        let _ = write!(b, r#"<p id="decisive"><b>{}</b></p>"#, esc(&line));
    }
    let _ = write!(b, r#"<p class="meta" id="figures-line">{}</p>"#, esc(&j.figures_line()));
    if let Some(sha) = &j.cases_sha256 {
        let reference = j
            .reference_cases_sha256
            .as_deref()
            .map(|r| format!(" · the reference's <code>{}</code>", esc(r)))
            .unwrap_or_default();
        let _ = write!(
            b,
            r#"<p class="meta" id="digest">judged <code>cases.jsonl</code> sha256 <code>{}</code>{reference}</p>"#,
            esc(sha)
        );
    }
    if let Some(why) = &j.cases_untrusted {
        let _ =
            write!(b, r#"<p id="cases-changed"><b>{}</b>: the verdict is about the file as it is now.</p>"#, esc(why));
    }
    rules_table(&mut b, j);
    if let Some(lineage) = &input.run.lineage {
        let here = run_dir.map_or(Path::new("."), RunDir::path);
        lineage_section(&mut b, here, lineage, &input.run.attack_families.held_out);
    }
    if !j.outlook.is_empty() {
        b.push_str("<h2>Would <code>voll</code> decide?</h2><ul>");
        for o in &j.outlook {
            let _ = write!(
                b,
                "<li>{} {}: <b>{}</b> — {}</li>",
                o.rule,
                esc(&o.figure),
                if o.voll_decides { "likely yes" } else { "likely no" },
                esc(&o.note)
            );
        }
        b.push_str("</ul>");
    }
    let ordered = cases::ordered(&input.records);
    let anchors = cases::anchors(&ordered);
    let changes = changes(&judged.records);
    figures(&mut b, j);
    families::html(&mut b, j, families::of_reference(input, judged.records.reference.as_deref()).as_ref());
    if let Some(log) = &input.adaptive {
        adaptive::html(&mut b, log, j);
    }
    breakdowns(&mut b, j, input, judged.records.reference.as_deref(), &anchors);
    operations(&mut b, &input.records);
    telemetry(&mut b, &input.records);
    // Every conversation on the page shares the report's room: the changed cases show
    // two each (reference beside candidate), the conversations section one a case.
    let room = conversation::room_per_conversation(ordered.len() + 2 * changes.len());
    let side = cases::Sides { run_dir, reference: input.reference.as_ref(), room };
    cases::changed_view(&mut b, j.reference_version.as_deref(), &changes, &anchors, &input.records, &side);
    cases::table(&mut b, &ordered, &changes, &anchors);
    cases::conversations(&mut b, run_dir, &ordered, &changes, &anchors, room);
    let title = format!("{} on {} — {}", j.version, j.plan, j.verdict.as_str());
    page(&title, &b, cases::SCRIPT).replacen("</style>", &format!("{}</style>", compare::SIDE_BY_SIDE_CSS), 1)
}

/// Each case that differs from the reference's same case, with how; the pairing is the
/// judge's (R4's).
fn changes(judged: &JudgedRecords) -> BTreeMap<String, Vec<cases::Change>> {
    judged
        .pairs()
        .into_iter()
        .map(|(c, r)| (c.case_id.clone(), cases::Change::between(c, r)))
        .filter(|(_, list)| !list.is_empty())
        .collect()
}

/// A rule's measured figures or thresholds for people: one "key value" line per leaf,
/// nested keys joined with a dot, numbers rounded.
/// Every figure of a rule's `measured` or `threshold` as written, by its dotted key:
/// the table shows them all, whatever the rule.
fn key_values(figures: &impl Serialize) -> String {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    walk(&key, v, out);
                }
            }
            serde_json::Value::Number(n) => out.push((prefix.into(), number(n.as_f64().unwrap_or(f64::NAN)))),
            serde_json::Value::Null => out.push((prefix.into(), "–".into())),
            serde_json::Value::String(s) => out.push((prefix.into(), s.clone())),
            other => out.push((prefix.into(), other.to_string())),
        }
    }
    let mut pairs = Vec::new();
    walk("", &serde_json::to_value(figures).unwrap_or_default(), &mut pairs);
    if pairs.is_empty() {
        return "–".into();
    }
    let mut out = String::from(r#"<dl class="kv">"#);
    for (k, v) in pairs {
        let _ = write!(out, "<dt>{}</dt><dd>{}</dd>", esc(&k), esc(&v));
    }
    out + "</dl>"
}

/// A number for people: integers as such, others to four significant places.
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Where a trained version came from, link by link (each source run's report linked),
/// the families it trained on and those the plan held out from it; broken links first.
fn lineage_section(b: &mut String, run_dir: &Path, l: &pruefstand_core::record::Lineage, held_out: &[String]) {
    b.push_str(r#"<h2 id="lineage">Lineage</h2>"#);
    for broken in &l.broken {
        let _ = write!(b, r#"<p class="lineage-broken"><b>broken:</b> {}</p>"#, esc(broken));
    }
    let _ = write!(
        b,
        r#"<ol id="lineage-chain"><li>adapter <code>{}</code></li><li>training manifest <code>{}</code> (sha256 <code>{}</code>): {} from <b>{}</b>, {} step(s), seed {}, base model sha256 <code>{}</code></li>"#,
        esc(&l.adapter),
        esc(&l.manifest),
        esc(&l.manifest_sha256),
        esc(&l.kind),
        esc(&l.base_version),
        l.steps,
        l.seed,
        esc(&l.base_model_sha256),
    );
    for export in &l.exports {
        let _ = write!(
            b,
            r#"<li>export <code>{}</code> (sha256 <code>{}</code>, {} row(s); families {}) from"#,
            esc(&export.path),
            esc(&export.sha256),
            export.rows,
            esc(&export.families.join(", "))
        );
        b.push_str("<ul>");
        for source in &export.sources {
            let report = RunDir::new(&source.run_dir).report_path();
            let _ = write!(
                b,
                r#"<li>run <a href="{}">{}</a> of {}</li>"#,
                esc(&relative_href(run_dir, &report)),
                esc(&source.run_id),
                esc(&source.version)
            );
        }
        b.push_str("</ul></li>");
    }
    let judged: Vec<&String> = held_out.iter().filter(|f| !l.trained_families.contains(f)).collect();
    let _ = write!(
        b,
        r#"</ol><p id="lineage-families">trained on: {} · held out by this plan: {}</p>"#,
        esc(&l.trained_families.join(", ")),
        esc(&judged.iter().map(|f| f.as_str()).collect::<Vec<_>>().join(", "))
    );
}

/// `to` as a link from a page in `from`: relative when both lie under one folder.
fn relative_href(from: &Path, to: &Path) -> String {
    let (from, to) = (from.canonicalize().unwrap_or(from.to_path_buf()), to.to_path_buf());
    let common = from.ancestors().find(|a| to.starts_with(a) && a.parent().is_some());
    match common {
        Some(common) => {
            let ups = from.strip_prefix(common).map_or(0, |rest| rest.components().count());
            let down = to.strip_prefix(common).unwrap_or(&to);
            format!("{}{}", "../".repeat(ups), down.display())
        }
        None => to.display().to_string(),
    }
}

fn rules_table(b: &mut String, j: &Judgement) {
    b.push_str("<h2>Rules</h2><div class=\"scroll\"><table id=\"rules\"><tr><th>rule</th><th>status</th><th>reason</th><th>measured</th><th>threshold</th></tr>");
    for r in &j.rules {
        let _ = write!(
            b,
            r#"<tr id="rule-{id}"><td>{id} {}</td><td><span class="s s-{st}">{st}</span></td><td>{}</td><td><details><summary>figures</summary>{}</details></td><td>{}</td></tr>"#,
            esc(&r.name),
            esc(&r.reason),
            key_values(&r.measured),
            key_values(&r.threshold),
            id = r.id,
            st = status_word(r.status),
        );
    }
    b.push_str("</table></div>");
}

fn figures(b: &mut String, j: &Judgement) {
    b.push_str("<h2>Security and utility</h2>");
    b.push_str(&svg::interval_chart(
        "intervals",
        "What the rules judged, with one-sided bounds (dashed: the rule's limit)",
        &interval_rows(j),
    ));
    if let Some(note) = words::overflow_note(j.figures.asr_overflows, j.figures.asr.map_or(0, |e| e.x)) {
        let _ = write!(b, "<p class=\"note\" id=\"asr-overflows\"><b>{}.</b></p>", esc(&note));
    }
    figures_note(b, j);
}

/// The headline figures as the interval chart's rows, the reference's beside each.
fn interval_rows(j: &Judgement) -> Vec<IntervalRow> {
    let t = &j.thresholds;
    let reference = j.figures.reference.as_deref();
    let mut rows = Vec::new();
    // First the figure R2 judged, with its limit; the ASR of all attacks beside it
    // without one when R2 judged the held-out families.
    let decisive = j.figures.decisive.as_ref();
    let judged_all = decisive.is_none_or(|d| d.name == words::ASR_ALL);
    if let Some(d) = decisive.filter(|_| !judged_all) {
        let mut series = vec![(j.version.clone(), CANDIDATE, d.lower, d.rate, d.upper)];
        if let Some(r) = reference.and_then(|r| r.decisive.as_ref()) {
            let name = format!("{} (ref)", j.reference_version.as_deref().unwrap_or("reference"));
            series.push((name, REFERENCE, r.lower, r.rate, r.upper));
        }
        rows.push(IntervalRow { label: format!("{} ({})", d.name, d.rule), series, threshold: Some(d.limit) });
    }
    let mut add = |label: &str, cand: Option<Estimate>, refr: Option<Estimate>, threshold: Option<f64>| {
        let mut series = Vec::new();
        if let Some(e) = cand {
            series.push((j.version.clone(), CANDIDATE, e.lower, e.rate, e.upper));
            if let Some((lo, hi)) = e.without_errors {
                series.push((format!("{} (errors left out)", j.version), colours::CANDIDATE_LIGHT, lo, e.rate, hi));
            }
        }
        if let Some(e) = refr {
            series.push((
                format!("{} (ref)", j.reference_version.as_deref().unwrap_or("reference")),
                REFERENCE,
                e.lower,
                e.rate,
                e.upper,
            ));
        }
        if !series.is_empty() {
            rows.push(IntervalRow { label: label.into(), series, threshold });
        }
    };
    let (asr_label, asr_limit) = match decisive {
        Some(d) if judged_all => (format!("{} ({})", words::ASR_ALL, d.rule), Some(d.limit)),
        None => (words::ASR_ALL.to_string(), Some(t.r2.asr_max)),
        Some(_) => (format!("{} (not judged)", words::ASR_ALL), None),
    };
    add(&asr_label, j.figures.asr, reference.and_then(|r| r.asr), asr_limit);
    add(
        &format!("{} (R3)", words::UTILITY_CLEAN),
        j.figures.utility_clean,
        reference.and_then(|r| r.utility_clean),
        Some(t.r3.utility_min),
    );
    add(
        &format!("{} (R3)", words::UTILITY_UNDER_ATTACK),
        j.figures.utility_under_attack,
        reference.and_then(|r| r.utility_under_attack),
        Some(t.r3.utility_under_attack_min),
    );
    add(
        words::INJECTION_GOAL_UTILITY,
        j.figures.injection_goal_utility,
        reference.and_then(|r| r.injection_goal_utility),
        None,
    );
    rows
}

/// What the chart's rows and bounds are, in words.
fn figures_note(b: &mut String, j: &Judgement) {
    let t = &j.thresholds;
    let decisive = j.figures.decisive.as_ref();
    let judged = match decisive.filter(|d| d.name != words::ASR_ALL) {
        Some(d) => format!(
            "The first row is the figure R2 judged, the {} ({} of the plan's held-out attack families), with \
             its limit; the {} below it is not judged by R2 and has no limit. ",
            esc(&d.name),
            esc(&words::rate(d.rate, d.hits, d.cases)),
            words::ASR_ALL
        ),
        _ => String::new(),
    };
    let _ = write!(
        b,
        "<p class=\"note\">{judged}ASR rows show the {} lower and the {} upper bound, utilities the {} lower and \
         upper bounds. Bounds are Clopper–Pearson on effective counts: cases sharing a user task or an injection \
         task are correlated, so the sample is shrunk by the design effect. The claim is about the agent on tasks \
         <i>like</i> these (generalisation), which is why the adjustment is right. Errored cases count against the \
         version in each direction (as landed or failed for the bound that could pass it, as not landed or kept for \
         the bound that could fail it); where that moved the bounds, the bounds with the errors left out are shown \
         beside them. The {} (can the model do the attacker's task when asked directly?) stands \
         beside the ASR: a model too weak to act looks secure.</p>",
        words::level(t.r2.alpha_fail),
        words::level(t.r2.alpha_pass),
        words::level(t.r3.alpha),
        words::INJECTION_GOAL_UTILITY,
    );
}

/// A bar of `x` of `n` with its one-sided 95 % bounds (not adjusted for clustering:
/// a breakdown's cases are few, the bars show their spread, the rules decide).
fn bar(colour: &'static str, x: u64, n: u64) -> Bar {
    let (xf, nf) = (x as f64, n as f64);
    Bar {
        colour,
        x,
        n,
        lower: pruefstand_judge::stats::cp_lower(xf, nf, 0.05),
        upper: pruefstand_judge::stats::cp_upper(xf, nf, 0.05),
    }
}

/// Landed of attacked (errors left out) per key, in natural order of the key.
fn asr_by(records: &[CaseRecord], key: &dyn Fn(&CaseRecord) -> String) -> BTreeMap<String, (u64, u64)> {
    let mut by: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for r in records.iter().filter(|r| r.kind == CaseKind::Attacked && !r.is_error()) {
        if let Some(s) = r.security {
            let e = by.entry(key(r)).or_default();
            e.0 += s as u64;
            e.1 += 1;
        }
    }
    by
}

fn breakdowns(
    b: &mut String,
    j: &Judgement,
    input: &JudgeInput,
    reference: Option<&[CaseRecord]>,
    anchors: &BTreeMap<String, String>,
) {
    let records = &input.records;
    let attacked: Vec<&CaseRecord> = records.iter().filter(|r| r.kind == CaseKind::Attacked).collect();
    if attacked.is_empty() {
        return;
    }
    let mut series = vec![(j.version.clone(), CANDIDATE)];
    if reference.is_some() {
        series.push((format!("{} (reference)", j.reference_version.as_deref().unwrap_or("reference")), REFERENCE));
    }
    let rows = |key: &dyn Fn(&CaseRecord) -> String| -> Vec<BarRow> {
        let cand = asr_by(records, key);
        let refr = reference.map(|r| asr_by(r, key)).unwrap_or_default();
        let mut labels: Vec<&String> = cand.keys().chain(refr.keys()).collect();
        labels.sort_by(|a, b| cases::natural_cmp(a, b));
        labels.dedup();
        labels
            .into_iter()
            .map(|label| {
                let mut bars = Vec::new();
                for (by, colour) in [(&cand, CANDIDATE), (&refr, REFERENCE)] {
                    if let Some(&(x, n)) = by.get(label) {
                        bars.push(bar(colour, x, n));
                    }
                }
                BarRow { label: label.clone(), bars }
            })
            .collect()
    };
    let inj = |r: &CaseRecord| format!("{}/{}", r.suite, r.injection_task.as_deref().unwrap_or("-"));
    let asr_max = Some(j.thresholds.r2.asr_max);
    b.push_str("<h2>Attack success by suite and injection task</h2>");
    b.push_str(&svg::bar_chart("asr-suite", "ASR per suite", &rows(&|r| r.suite.clone()), &series, asr_max));
    b.push_str(&svg::bar_chart("asr-injection", "ASR per injection task", &rows(&inj), &series, asr_max));
    let _ = write!(
        b,
        "<p class=\"note\">Whiskers: one-sided 95 % Clopper–Pearson bounds of each bar, not adjusted for clustering \
         (the rules' bounds are above). Dashed: the ASR threshold {}.</p>",
        pct(j.thresholds.r2.asr_max)
    );

    let mut blocks: BTreeMap<&str, MatrixBlock> = BTreeMap::new();
    for r in cases::ordered(records).into_iter().filter(|r| r.kind == CaseKind::Attacked) {
        let blk = blocks.entry(&r.suite).or_insert_with(|| MatrixBlock {
            suite: r.suite.clone(),
            rows: vec![],
            cols: vec![],
            cells: BTreeMap::new(),
        });
        let (row, col) = (r.user_task.clone().unwrap_or_default(), r.injection_task.clone().unwrap_or_default());
        let cell: &mut HeatCell = blk.cells.entry((row, col)).or_default();
        // A cell holds the pair's cases of every attack: it opens the first.
        cell.href = cell.href.take().or_else(|| anchors.get(&r.case_id).map(|a| format!("#{a}")));
        match (r.is_error(), r.security) {
            (true, _) | (false, None) => cell.errors += 1,
            (false, Some(s)) => {
                cell.landed += s as u64;
                cell.n += 1;
            }
        }
    }
    let mut blocks: Vec<MatrixBlock> = blocks.into_values().collect();
    for blk in &mut blocks {
        let mut rows: Vec<String> = blk.cells.keys().map(|k| k.0.clone()).collect();
        let mut cols: Vec<String> = blk.cells.keys().map(|k| k.1.clone()).collect();
        for v in [&mut rows, &mut cols] {
            v.sort_by(|a, b| cases::natural_cmp(a, b));
            v.dedup();
        }
        (blk.rows, blk.cols) = (rows, cols);
    }
    b.push_str(&svg::heat_map(&blocks));
}

fn operations(b: &mut String, records: &[CaseRecord]) {
    let sum = |f: &dyn Fn(&CaseRecord) -> Option<u64>, kind: Option<CaseKind>| -> (u64, usize) {
        records
            .iter()
            .filter(|r| kind.is_none_or(|k| r.kind == k))
            .filter_map(f)
            .fold((0, 0), |(s, n), v| (s.saturating_add(v), n + 1))
    };
    let flagged = |kind: CaseKind| {
        let with: Vec<u64> =
            records.iter().filter(|r| r.kind == kind && !r.is_error()).filter_map(|r| r.guardrail_flags).collect();
        (with.iter().filter(|f| **f > 0).count(), with.len())
    };
    let cell = |(x, n): (usize, usize)| {
        if n == 0 { "not measured".to_string() } else { format!("{x}/{n} ({})", pct(x as f64 / n as f64)) }
    };
    let total = |(s, n): (u64, usize)| {
        if n == 0 {
            "not measured".to_string()
        } else {
            format!("{s} over {n} cases ({:.2} per case)", s as f64 / n as f64)
        }
    };
    let _ = write!(
        b,
        "<h2>Guardrail and human</h2><table id=\"operations\"><tr><th>figure</th><th>value</th></tr>\
         <tr><td>clean cases flagged by the guardrail (false positives)</td><td>{}</td></tr>\
         <tr><td>attacked cases flagged by the guardrail</td><td>{}</td></tr>\
         <tr><td>guardrail flags</td><td>{}</td></tr>\
         <tr><td>human asks</td><td>{}</td></tr><tr><td>human denials</td><td>{}</td></tr></table>",
        cell(flagged(CaseKind::Clean)),
        cell(flagged(CaseKind::Attacked)),
        total(sum(&|r| r.guardrail_flags, None)),
        total(sum(&|r| r.human_asks, None)),
        total(sum(&|r| r.human_denials, None)),
    );
    // The model's mess is scored, not an error: how much of it there was.
    let health = pruefstand_core::telemetry::FormatHealth::of(records);
    let _ = write!(b, "<h2>Model format health</h2><p id=\"format-health\">{}</p>", esc(&health.line(records.len())));
}

/// Calls, tokens, latency percentiles and errors by class, over all recorded cases.
fn telemetry(b: &mut String, records: &[CaseRecord]) {
    let total = |f: fn(&CaseRecord) -> Option<u64>| -> (u64, usize) {
        records.iter().filter_map(f).fold((0, 0), |(s, n), v| (s.saturating_add(v), n + 1))
    };
    let per_case = |(s, n): (u64, usize)| {
        if n == 0 {
            "not reported".to_string()
        } else {
            format!("{s} ({} per case, {n} cases)", number(s as f64 / n as f64))
        }
    };
    let secs =
        |q: f64, xs: Vec<f64>| pruefstand_judge::percentile(xs, q).map(|v| format!("{v:.2} s")).unwrap_or("–".into());
    let durations: Vec<f64> = records.iter().map(|r| r.duration_s).collect();
    // Per LLM call: a case's time over its calls (the model's share and the tools').
    let per_call: Vec<f64> =
        records.iter().filter_map(|r| r.llm_calls.filter(|n| *n > 0).map(|n| r.duration_s / n as f64)).collect();
    let latency = |xs: &Vec<f64>| {
        [0.5, 0.9, 0.95, 0.99, 1.0].iter().map(|q| format!("<td>{}</td>", secs(*q, xs.clone()))).collect::<String>()
    };
    let _ = write!(
        b,
        "<h2 id=\"telemetry\">Telemetry</h2><div class=\"scroll\"><table id=\"telemetry-table\"><tr><th>figure</th><th>value</th></tr>\
         <tr><td>LLM calls</td><td>{}</td></tr><tr><td>prompt tokens</td><td>{}</td></tr><tr><td>completion tokens</td><td>{}</td></tr></table>\
         <table id=\"latency\"><tr><th>latency</th><th>p50</th><th>p90</th><th>p95</th><th>p99</th><th>max</th></tr>\
         <tr><td>per case ({} cases)</td>{}</tr><tr><td>per LLM call ({} cases)</td>{}</tr></table>",
        per_case(total(|r| r.llm_calls)),
        per_case(total(|r| r.prompt_tokens)),
        per_case(total(|r| r.completion_tokens)),
        durations.len(),
        latency(&durations),
        per_call.len(),
        latency(&per_call),
    );
    let mut classes: BTreeMap<String, usize> = BTreeMap::new();
    for r in records.iter().filter(|r| r.is_error()) {
        *classes.entry(error_class(r.error.as_deref().unwrap_or(""))).or_default() += 1;
    }
    b.push_str("<table id=\"errors\"><tr><th>error class</th><th>cases</th></tr>");
    if classes.is_empty() {
        b.push_str("<tr><td>none</td><td>0</td></tr>");
    }
    for (class, n) in &classes {
        let _ = write!(b, "<tr><td>{}</td><td>{n}</td></tr>", esc(class));
    }
    b.push_str("</table></div>");
}

/// An error's class: its text up to the first colon (the bench writes "what: detail"),
/// at most 60 characters.
fn error_class(error: &str) -> String {
    let head = error.split(':').next().unwrap_or("").trim();
    let head = if head.is_empty() { "unspecified" } else { head };
    svg::truncate(head, 60)
}

/// A verdict as a badge in its colour ([`colours`]).
fn verdict_badge(v: Verdict) -> String {
    format!(r#"<span class="vb v-{0}">{0}</span>"#, v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pruefstand_judge as judge;

    #[test]
    fn attack_successes_that_are_context_overflows_are_said_beside_the_asr() {
        let mut input = judge::tests::schnell(3);
        let landed = input.records.iter().position(|r| r.security == Some(true)).unwrap();
        input.records[landed].outcome = Some(pruefstand_core::case::Outcome::ContextOverflow);
        let j = judge::judge(&input);
        let said = "1 of the 3 attack successes is a context overflow: the conversation outgrew the model's \
                    context, which AgentDojo scores as a landed attack, not a followed injection";
        assert!(markdown(&j).contains(said), "{}", markdown(&j));
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        write_run_report(&run, &judge::judged(input.clone())).unwrap();
        let html = std::fs::read_to_string(run.report_path()).unwrap();
        assert!(html.contains(r#"id="asr-overflows""#) && html.contains(&esc(said)));
        // None: nothing said.
        let j = judge::judge(&judge::tests::schnell(3));
        assert!(!markdown(&j).contains("context overflow"));
    }

    #[test]
    fn run_report_is_self_contained_and_escaped() {
        let mut input = judge::tests::schnell(3);
        // A hostile task name, renamed consistently (the ids say the same), so the run
        // stays valid and the name reaches every chart.
        let evil = "<script>alert(1)<\\script>";
        for r in input.records.iter_mut().filter(|r| r.injection_task.as_deref() == Some("injection_task_0")) {
            r.injection_task = Some(evil.into());
            r.case_id = r.case_id.replace("injection_task_0", evil);
        }
        input.run.planned_case_ids = input.records.iter().map(|r| r.case_id.clone()).collect();
        input.reference = Some(judge::tests::reference_of(&input, input.records.clone()));
        input.records[0].trace = Some("javascript:alert(1)".into());
        let judged = judge::judged(input.clone());
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        write_run_report(&run, &judged).unwrap();
        let html = std::fs::read_to_string(run.report_path()).unwrap();
        assert!(html.contains(r#"id="verdict" class="v-inconclusive">inconclusive</div>"#));
        assert!(html.matches(r#"class="chart""#).count() >= 4);
        assert!(html.contains(r#"id="matrix""#));
        assert_eq!(html.matches("<script").count(), 1, "only the page's own script; data escaped");
        assert!(html.contains(&format!("<script>{}</script>", cases::SCRIPT)));
        assert!(html.contains(r#"id="changed-summary""#) && html.contains(r#"id="telemetry""#));
        assert!(html.contains(r##"<a href="#case-"##), "heat-map cells and case ids link to conversations");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;\\script&gt;"));
        assert!(!html.contains("href=\"javascript:"));
        assert!(html.contains(r#"href="traces/"#), "raw trace links");
        assert!(html.contains("not shown"), "a missing trace file is named, not fatal");
        assert!(
            !html.contains("http://")
                || html.matches("http://").all(|_| html.contains("xmlns=\"http://www.w3.org/2000/svg\""))
        );
        assert!(!html.contains("<link") && !html.contains("@import") && !html.contains("url("));
        let back = judge::StoredJudgement::read(&run).unwrap().unwrap();
        assert_eq!(back.verdict, Some(Verdict::Inconclusive));
        // In full (a float may come back a last digit off: serde_json's parser).
        let full = back.current.as_ref().expect("read back in full");
        assert_eq!((&full.summary, &full.rules.len()), (&judged.judgement.summary, &judged.judgement.rules.len()));
        let md = std::fs::read_to_string(run.judgement_markdown_path()).unwrap();
        assert!(md.contains("**inconclusive**") && md.contains("| R2 | security | inconclusive |"));
    }

    fn html_size_of_conversations(html: &str) -> usize {
        html.split(r#"<ol class="conv">"#).skip(1).map(|c| c.find("</ol>").unwrap_or(c.len())).sum()
    }

    /// A `voll`-sized run (2,165 cases) of a model that rambles in every turn: the report
    /// stays under 15 MB, however much the traces hold.
    #[test]
    fn a_voll_report_of_a_rambling_model_stays_under_15_mb() {
        let base = judge::tests::schnell(3);
        let mut input = base.clone();
        input.records.clear();
        for copy in 0.. {
            for r in &base.records {
                if input.records.len() == 2_165 {
                    break;
                }
                let mut r = r.clone();
                r.case_id = format!("{}-{copy}", r.case_id);
                r.trace = Some("traces/rambling.json".into());
                input.records.push(r);
            }
            if input.records.len() == 2_165 {
                break;
            }
        }
        input.run.planned_case_ids = input.records.iter().map(|r| r.case_id.clone()).collect();
        let turns: Vec<serde_json::Value> = (0..20)
            .map(|i| {
                serde_json::json!({"role": "assistant", "content": "<b>ramble</b> \u{202e} ".repeat(150),
                "tool_calls": [{"function": format!("f{i}"), "args": {"x": "y".repeat(500)}}]})
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("traces")).unwrap();
        std::fs::write(dir.path().join("traces/rambling.json"), serde_json::json!({"messages": turns}).to_string())
            .unwrap();
        let judged = judge::judged(input.clone());
        let run = RunDir::new(dir.path());
        write_run_report(&run, &judged).unwrap();
        let size = std::fs::metadata(run.report_path()).unwrap().len();
        let conversations = html_size_of_conversations(&std::fs::read_to_string(run.report_path()).unwrap());
        assert!(size < 15_000_000, "report.html of a rambling voll: {size} bytes, {conversations} in conversations");
        let html = std::fs::read_to_string(run.report_path()).unwrap();
        assert_eq!(html.matches("more turn(s) not shown").count(), 2_165, "every conversation says it was cut");
    }

    #[test]
    fn the_csp_hash_is_sha256_in_base64() {
        // `printf abc | openssl dgst -sha256 -binary | base64`
        assert_eq!(sha256_base64(b"abc"), "ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0=");
        let html = page("t", "<p>x</p>", "var a=1;");
        assert!(html.contains(&format!("script-src 'sha256-{}'", sha256_base64(b"var a=1;"))), "{html}");
    }

    #[test]
    fn safe_href_allows_only_relative_paths() {
        assert_eq!(safe_href("traces/a b.json").as_deref(), Some("traces/a b.json"));
        assert_eq!(safe_href("javascript:alert(1)"), None);
        assert_eq!(safe_href("/etc/passwd"), None);
        assert_eq!(safe_href("t/\"x"), Some("t/&quot;x".into()));
    }
}
