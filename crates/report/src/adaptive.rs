//! The report's adaptive-attacker section (docs/attacks.md): who wrote the attempts, the
//! budget curve drawn (search pairs broken within k attempts, for every k up to K), the
//! transfer figure, and the frozen attempts with the pairs each broke — the found
//! templates an operator may turn into a family. Not for judging (`judge`'s R2) or
//! for running the search (the binary's `adaptive`).

use std::fmt::Write;

use super::html::esc;
use pruefstand_core::record::{NotRun, Proposal, SearchLog};
use pruefstand_core::util::pct;
use pruefstand_judge::Judgement;

use super::svg::{self, Level};

/// The longest template text the page shows.
const TEMPLATE_SHOWN: usize = 800;

/// The HTML section; nothing when the run did not search.
pub fn html(b: &mut String, log: &SearchLog, j: &Judgement) {
    let who = match &log.attacker {
        Some(a) => format!(
            "attacker model {}{}{}",
            a.model,
            a.url.as_deref().map(|u| format!(" at {u}")).unwrap_or_default(),
            a.prompt_sha256
                .as_deref()
                .map(|h| format!(", system prompt sha256 {}", &h[..12.min(h.len())]))
                .unwrap_or_default()
        ),
        None => format!("the family grammars ({})", log.families.join(", ")),
    };
    let feedback = if log.feedback { "with feedback" } else { "without feedback (blind proposals)" };
    let _ = write!(
        b,
        "<h2 id=\"adaptive-attacker\">Adaptive attacker</h2><p>Attempts written by {}, {feedback}.",
        esc(&who)
    );
    let refused: Vec<&NotRun> = log.pairs.iter().flat_map(|p| &p.attempts).filter_map(|a| a.refused.as_ref()).collect();
    if !refused.is_empty() {
        let count = |kind: fn(&NotRun) -> bool| refused.iter().filter(|r| kind(r)).count();
        let kinds = [
            (count(|r| matches!(r, NotRun::Declined(_))), "declined by the attacker model"),
            (count(|r| matches!(r, NotRun::Rejected(_))), "replies refused by our checks"),
            (count(|r| matches!(r, NotRun::Failed(_))), "failures of its endpoint"),
        ];
        let said: Vec<String> = kinds.iter().filter(|(n, _)| *n > 0).map(|(n, what)| format!("{n} {what}")).collect();
        let _ = write!(
            b,
            " {} attempt(s) never reached the target (they count against the budget): {}.",
            refused.len(),
            said.join(", ")
        );
    }
    b.push_str("</p>");
    curve(b, log, j);
    found(b, log);
}

/// Pairs broken within k attempts, k = 1..=K: drawn as steps, with the transfer
/// figure and R2's adaptive maximum across; the numbers below, folded, one row per k
/// where the count changed (a flat curve is one row, not K columns).
fn curve(b: &mut String, log: &SearchLog, j: &Judgement) {
    let n = log.pairs.len();
    let broken = log.curve();
    let (transferred, held_out) = log.transfer();
    let mut levels = Vec::new();
    if held_out > 0 {
        let rate = transferred as f64 / held_out as f64;
        levels.push(Level {
            value: rate,
            label: format!("transfer {transferred}/{held_out} ({})", pct(rate)),
            dash: "2 3",
        });
    }
    if let Some(max) = j.thresholds.r2.asr_adaptive_max {
        levels.push(Level { value: max, label: format!("R2 ≤ {}", pct(max)), dash: "6 3" });
    }
    b.push_str(&svg::budget_chart(
        "budget-curve-chart",
        &format!("Search pairs broken within k attempts ({n} pairs, K = {})", log.attempts),
        &broken,
        n,
        &levels,
    ));
    let _ = write!(
        b,
        "<details id=\"budget-curve-numbers\"><summary>the curve in numbers</summary><table id=\"budget-curve\">\
         <tr><th>attempts k</th><th>search pairs broken within k</th></tr>"
    );
    let mut last = None;
    for (i, &count) in broken.iter().enumerate() {
        if last == Some(count) {
            continue;
        }
        let rate = if n == 0 { 0.0 } else { count as f64 / n as f64 };
        let _ = write!(b, "<tr><td>{}</td><td>{count}/{n} ({})</td></tr>", k_span(&broken, i), pct(rate));
        last = Some(count);
    }
    b.push_str("</table><p class=\"note\">One row where the count changed; it holds until the next row.</p></details>");
    if held_out > 0 {
        let _ = write!(
            b,
            "<p id=\"transfer\"><b>Transfer</b>: the {} frozen attempt(s) broke {transferred} of {held_out} held-out \
             pairs (never searched; R2's adaptive figure).</p>",
            log.frozen.len()
        );
    }
}

/// The attempts a table row covers: "3" or "3–19" (up to the next change, or K).
fn k_span(broken: &[usize], i: usize) -> String {
    let end = (i + 1..broken.len()).take_while(|&e| broken[e] == broken[i]).last().unwrap_or(i) + 1;
    if end == i + 1 { end.to_string() } else { format!("{}–{end}", i + 1) }
}

/// The frozen attempts: what each injects and the pairs it broke.
fn found(b: &mut String, log: &SearchLog) {
    if log.frozen.is_empty() {
        return;
    }
    // Pair keys (`banking/user_task_0/injection_task_0`) break anywhere: the table
    // fits a phone's width.
    b.push_str("<div class=\"scroll\"><table id=\"found-templates\"><tr><th>#</th><th>attempt</th><th>search pairs broken</th><th>held-out pairs broken</th></tr>");
    for (j, frozen) in log.frozen.iter().enumerate() {
        let text = match &frozen.proposal {
            Proposal::Template(t) => super::svg::truncate(t, TEMPLATE_SHOWN),
            Proposal::Wording(w) => format!("{} wording {:?}", w.family, w.choices),
        };
        let name = format!("transfer_{}", j + 1);
        let transferred: Vec<String> = log
            .held_out
            .iter()
            .filter(|p| p.attempts.iter().any(|a| a.case_id.contains(&format!("/{name}/")) && a.landed == Some(true)))
            .map(|p| p.key())
            .collect();
        let _ = write!(
            b,
            "<tr><td>{}</td><td><pre class=\"template\">{}</pre></td><td>{}</td><td>{}</td></tr>",
            j + 1,
            esc(&text),
            esc(&frozen.broke.join(", ")),
            esc(&transferred.join(", "))
        );
    }
    b.push_str("</table></div>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_curves_numbers_are_a_row_per_change() {
        assert_eq!(k_span(&[12, 12, 12], 0), "1–3", "a flat curve is one row");
        assert_eq!(k_span(&[1, 2, 2, 5], 1), "2–3");
        assert_eq!(k_span(&[1, 2, 2, 5], 3), "4");
    }
}
