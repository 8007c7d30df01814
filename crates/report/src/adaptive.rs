//! The report's adaptive-attacker section (docs/attacks.md): who wrote the attempts, the
//! budget curve (search pairs broken within k attempts, for every k up to K), the
//! transfer figure, and the frozen attempts with the pairs each broke — the found
//! templates an operator may turn into a family. Not for judging (`judge`'s R2) or
//! for running the search (the binary's `adaptive`).

use std::fmt::Write;

use super::html::esc;
use pruefstand_core::record::{Proposal, SearchLog};
use pruefstand_core::util::pct;

/// The longest template text the page shows.
const TEMPLATE_SHOWN: usize = 800;

/// The HTML section; nothing when the run did not search.
pub fn html(b: &mut String, log: &SearchLog) {
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
    let refused = log.pairs.iter().flat_map(|p| &p.attempts).filter(|a| a.refused.is_some()).count();
    if refused > 0 {
        let _ = write!(b, " {refused} attempt(s) were refused before use (they count against the budget).");
    }
    b.push_str("</p>");
    curve(b, log);
    found(b, log);
}

/// Pairs broken within k attempts, k = 1..=K.
fn curve(b: &mut String, log: &SearchLog) {
    let n = log.pairs.len();
    b.push_str("<div class=\"scroll\"><table id=\"budget-curve\"><tr><th>attempts k</th>");
    for k in 1..=log.attempts {
        let _ = write!(b, "<th>{k}</th>");
    }
    b.push_str("</tr><tr><td>search pairs broken within k</td>");
    for broken in log.curve() {
        let rate = if n == 0 { 0.0 } else { broken as f64 / n as f64 };
        let _ = write!(b, "<td>{broken}/{n} ({})</td>", pct(rate));
    }
    b.push_str("</tr></table></div>");
    let (broken, held_out) = log.transfer();
    if held_out > 0 {
        let _ = write!(
            b,
            "<p id=\"transfer\"><b>Transfer</b>: the {} frozen attempt(s) broke {broken} of {held_out} held-out pairs \
             (never searched; R2's adaptive figure).</p>",
            log.frozen.len()
        );
    }
}

/// The frozen attempts: what each injects and the pairs it broke.
fn found(b: &mut String, log: &SearchLog) {
    if log.frozen.is_empty() {
        return;
    }
    b.push_str("<table id=\"found-templates\"><tr><th>#</th><th>attempt</th><th>search pairs broken</th><th>held-out pairs broken</th></tr>");
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
    b.push_str("</table>");
}
