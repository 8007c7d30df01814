//! The report's attack-family section: ASR per family with R2's bounds, the candidate's
//! beside the reference's, which families R2 judged (held out) and which the version
//! has seen, and the generalisation gap (docs/attacks.md). Not for computing them
//! (`judge::families`).

use std::fmt::Write;

use super::html::esc;
use pruefstand_core::case::CaseRecord;
use pruefstand_core::family;
use pruefstand_core::util::pct;
use pruefstand_core::words;
use pruefstand_judge::families::{self as judged_families, FamilyAsr, FamilyFigures};
use pruefstand_judge::{JudgeInput, Judgement, RuleId};

/// The reference's ASR per family, by the candidate's families (its held-out and seen
/// ones) and R2's bounds, from the reference's records as judged: what the table shows
/// beside the candidate's.
pub fn of_reference(input: &JudgeInput, reference: Option<&[CaseRecord]>) -> Option<FamilyFigures> {
    let records = reference?;
    let scope = judged_families::scope(&input.run.attack_families, records);
    judged_families::figures(records, &scope, &input.thresholds.r2)
}

/// A family's figure in one cell: the rate, the count, R2's bounds below.
fn cell(f: Option<&FamilyAsr>) -> String {
    match f {
        Some(f) => format!(
            "<b>{}</b> {}/{}<br><span class=\"note\">{} · {}</span>",
            pct(f.rate),
            f.x,
            f.n,
            pct(f.lower),
            pct(f.upper)
        ),
        None => "–".into(),
    }
}

fn role(f: &FamilyAsr) -> &'static str {
    match (f.held_out, f.seen) {
        (true, _) => "held out (R2 judges it)",
        (false, true) => "seen",
        (false, false) => "other",
    }
}

/// The HTML section; nothing when no attacked case belongs to a family. `reference`:
/// the reference's figures per family ([`of_reference`]), shown beside the candidate's.
pub fn html(b: &mut String, j: &Judgement, reference: Option<&FamilyFigures>) {
    let Some(families) = &j.figures.families else { return };
    let reference_head = match (reference, &j.reference_version) {
        (Some(_), Some(name)) => format!("<th>{} (reference)</th>", esc(name)),
        (Some(_), None) => "<th>reference</th>".into(),
        (None, _) => String::new(),
    };
    let _ = write!(
        b,
        "<h2 id=\"families\">Attack families</h2><div class=\"scroll\"><table id=\"family-asr\"><tr><th>family</th><th>origin</th><th>role</th><th>{} (candidate)</th>{reference_head}</tr>",
        esc(&j.version)
    );
    for (name, f) in &families.per_family {
        let beside = reference.map_or(String::new(), |r| format!("<td>{}</td>", cell(r.per_family.get(name))));
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{beside}</tr>",
            esc(name),
            family::family(name).map_or("", |f| f.origin.as_str()),
            role(f),
            cell(Some(f)),
        );
    }
    let _ = write!(
        b,
        "</table></div><p class=\"note\">Each cell: the ASR, landed of attacked cases, and below it the {}.</p>",
        bounds_head(j)
    );
    let _ = write!(b, "<p id=\"gap\"><b>Generalisation gap</b> (held-out ASR minus seen ASR): {}</p>", gap_text(j));
    if let Some(adaptive) = adaptive_text(j) {
        let _ = write!(b, "<p id=\"adaptive\"><b>Adaptive attacker</b>: {}</p>", esc(&adaptive));
    }
    b.push_str(
        "<p class=\"note\">Each attacked case is worded in one family; with per-run wording its text is drawn from \
         the family's grammar with the run's seed, so a version cannot pass by recognising a text. A large positive \
         gap means the version resists what it has seen and not what it has not.</p>",
    );
}

fn gap_text(j: &Judgement) -> String {
    match j.figures.families.as_ref().and_then(|f| f.gap.as_ref()) {
        Some(g) => format!(
            "{:+.1} points, between {:+.1} and {:+.1} ({} of {} held out, {} of {} seen)",
            100.0 * g.gap,
            100.0 * g.lower,
            100.0 * g.upper,
            pct(g.held_out.rate),
            g.held_out.n,
            pct(g.seen.rate),
            g.seen.n
        ),
        None => "not measured (the plan needs attacked cases both held out and seen)".to_string(),
    }
}

/// R2's adaptive figure in words, when the run searched.
fn adaptive_text(j: &Judgement) -> Option<String> {
    let a = j.rule(RuleId::R2)?.measured.r2()?.adaptive.as_ref()?;
    let transfer = a.transfer.as_ref().map_or(String::new(), |t| {
        format!(
            "; transfer to the held-out pairs {} of {} broken by {} frozen attempt(s), ASR {}, {}",
            t.broken,
            t.pairs,
            t.frozen,
            pct(t.asr),
            bounds(j, t.lower, t.upper)
        )
    });
    Some(format!(
        "{} of {} pairs broken within {} attempts ({} attempts made); adaptive ASR {}, {}{transfer}",
        a.broken,
        a.pairs,
        a.attempts_max,
        a.attempts,
        pct(a.asr),
        bounds(j, a.lower, a.upper)
    ))
}

/// A figure's two bounds at R2's levels, in words.
fn bounds(j: &Judgement, lower: f64, upper: f64) -> String {
    format!(
        "{}, {}",
        words::bound(words::BoundSide::Lower, j.thresholds.r2.alpha_fail, lower),
        words::bound(words::BoundSide::Upper, j.thresholds.r2.alpha_pass, upper)
    )
}

/// The bounds column's head: each bound's level and side, as R2 draws them.
fn bounds_head(j: &Judgement) -> String {
    let r2 = &j.thresholds.r2;
    format!("{} lower bound · {} upper bound", words::level(r2.alpha_fail), words::level(r2.alpha_pass))
}

/// The Markdown twin (the candidate's figures; the reference's are in the report).
pub fn markdown(md: &mut String, j: &Judgement) {
    let Some(families) = &j.figures.families else { return };
    let _ = write!(md, "| family | role | ASR | landed | {} |\n|---|---|---|---|---|\n", bounds_head(j));
    for (name, f) in &families.per_family {
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {}/{} | {} · {} |",
            role(f),
            pct(f.rate),
            f.x,
            f.n,
            pct(f.lower),
            pct(f.upper)
        );
    }
    let _ = writeln!(md, "\nGeneralisation gap: {}\n", gap_text(j));
    if let Some(adaptive) = adaptive_text(j) {
        let _ = writeln!(md, "Adaptive attacker: {adaptive}\n");
    }
}
