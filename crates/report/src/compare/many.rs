//! The compare page of three or more runs (`compare RUN_1 RUN_2 RUN_3 …`): the first
//! run is the reference. The page opens with an overview, a column per run (what ran,
//! its headline figures with their bounds, R4's result against the first), then holds,
//! for each further run, the two-run page's comparison of it with the first — the same
//! sections, written by the same functions, their ids and headings scoped to it.
//! Not for the two-run page itself (its parent) nor for judging: both runs of every
//! pair come judged.

use std::fmt::Write;

use super::{COMPARE_CSS, Run, SIDE_BY_SIDE_CSS, fig_text, figure_rows, nav, readable, sections};
use crate::html::esc;
use crate::page;
use pruefstand_judge::RuleId;
use pruefstand_store::RunFile;

/// The CSS of the overview and the pairs' sections beside the two-run page's: a
/// scoped spec heading's folds look as the two-run page's do.
const MANY_CSS: &str = "\
section.pair{border-top:3px solid #1565c0;margin-top:2.5rem} section.pair>h2{border-bottom:none}\
table#overview th,table#overview td{min-width:8rem} table#overview td:first-child{min-width:0}\
h3[id$=\"-spec-h\"]~details>summary{font-size:.9rem;cursor:pointer}";

/// The page of `pairs`, each the first run (A) and a further run (B) judged against
/// each other, in the order the runs were named; `index`: the reports folder's index
/// as a link from the page.
pub(super) fn render(pairs: &[(Run, Run)], index: Option<&str>) -> String {
    let Some((reference, _)) = pairs.first() else { return String::new() };
    let runs: Vec<&Run> = std::iter::once(reference).chain(pairs.iter().map(|(_, b)| b)).collect();
    let versions: Vec<&str> = runs.iter().map(|r| r.judgement.version.as_str()).collect();
    let mut body = String::new();
    let _ = write!(
        body,
        r#"<h1>{}</h1><p class="meta">{} runs; run 1 is taken as the reference, each further run as a candidate against it; each run of a pair judged against the other with its own thresholds. Written {}.</p>"#,
        esc(&versions.join(" vs ")),
        runs.len(),
        esc(&chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string()),
    );
    body.push_str(&nav(index));
    overview(&mut body, &runs, pairs);
    for (k, (a, b)) in pairs.iter().enumerate() {
        let n = k + 2;
        let mut section = String::new();
        sections(&mut section, a, b, pairs.len());
        let _ = write!(
            body,
            r#"<section class="pair" id="pair-{n}"><h2>Run {n} against run 1: {} against {}</h2><p class="meta">In this section A is run 1, <code>{}</code> in <code>{}</code>, and B is run {n}, <code>{}</code> in <code>{}</code>.</p>{}</section>"#,
            esc(&b.judgement.version),
            esc(&a.judgement.version),
            esc(&a.judgement.run_id),
            esc(&a.dir.path().display().to_string()),
            esc(&b.judgement.run_id),
            esc(&b.dir.path().display().to_string()),
            scoped(&section, n)
        );
    }
    let title = format!("{} — pruefstand compare", versions.join(" vs "));
    page(&title, &body, "").replacen("</style>", &format!("{SIDE_BY_SIDE_CSS}{COMPARE_CSS}{MANY_CSS}</style>"), 1)
}

/// A pair's sections as part of the page of many: every id prefixed with its run's
/// number (`p3-r4`), its headings one level down, below the pair's own. Text from data
/// is escaped, so neither an id nor a heading comes from a run's content.
fn scoped(section: &str, n: usize) -> String {
    section.replace(r#" id=""#, &format!(r#" id="p{n}-"#)).replace("<h2", "<h3").replace("</h2>", "</h3>")
}

/// The overview: a column per run, run 1 (`runs[0]`, never empty) first; a row per
/// field, a figure's row only where a run has it.
fn overview(b: &mut String, runs: &[&Run], pairs: &[(Run, Run)]) {
    b.push_str(r#"<h2 id="overview-h">Overview</h2><div class="scroll"><table id="overview"><tr><th>run</th>"#);
    for (i, run) in runs.iter().enumerate() {
        let n = i + 1;
        let head = if n == 1 { "1 (reference)".to_string() } else { format!(r##"<a href="#pair-{n}">{n}</a>"##) };
        let report =
            run.link(RunFile::Report).map_or(String::new(), |href| format!(r#" · <a href="{href}">its report</a>"#));
        let _ = write!(b, "<th>{head}{report}</th>");
    }
    b.push_str("</tr>");
    let row = |b: &mut String, field: &str, cells: Vec<String>| {
        let _ = write!(b, "<tr><td>{}</td>", esc(field));
        for cell in cells {
            let _ = write!(b, "<td>{cell}</td>");
        }
        b.push_str("</tr>");
    };
    let each = |f: &dyn Fn(&Run) -> String| runs.iter().map(|r| f(r)).collect::<Vec<_>>();
    row(b, "version", each(&|r| format!("<code>{}</code>", esc(&r.judgement.version))));
    row(b, "plan", each(&|r| esc(&r.judgement.plan)));
    row(b, "run", each(&|r| format!("<code>{}</code>", esc(&r.judgement.run_id))));
    row(b, "started", each(&|r| esc(&r.input.run.started_at.as_deref().map_or("–".into(), readable))));
    row(b, "cases", each(&|r| r.records.run.len().to_string()));
    // The overview draws no limits: the rows' thresholds are only their getters' company.
    for (label, get, _) in figure_rows(&runs[0].judgement.thresholds, &runs[0].judgement) {
        let figures: Vec<_> = runs.iter().map(|r| get(&r.judgement)).collect();
        if figures.iter().any(Option::is_some) {
            row(b, label, figures.into_iter().map(fig_text).collect());
        }
    }
    let mut r4 = vec!["– (the reference)".to_string()];
    for (_, candidate) in pairs {
        r4.push(match candidate.judgement.rule(RuleId::R4) {
            Some(rule) => format!(
                r#"<span class="s s-{0}">{0}</span> <span class="note">{1}</span>"#,
                rule.status.as_str(),
                esc(&rule.reason)
            ),
            None => "–".into(),
        });
    }
    row(b, "R4 against run 1", r4);
    // The verdicts as badges in their colours; R4's status above them quieter.
    let verdicts = each(&|r| match r.stored.as_ref() {
        Some(j) => format!(r#"<span class="vb v-{0}">{0}</span>"#, j.verdict.as_str()),
        None => "not judged".into(),
    });
    row(b, "verdict as judged (its own reference)", verdicts);
    b.push_str(
        r#"</table></div><p class="note">Figures with their one-sided bounds as each pair's section shows them; R4 judges each run as the candidate against run 1. Each run's section below says what differs, its figures beside run 1's, R4's pairing and its changed cases.</p>"#,
    );
}
