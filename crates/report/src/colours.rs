//! The one place the pages' colours are defined: a verdict's colour (the run report's
//! badge, the index, the compare page, `serve`'s live page and listings all take it from
//! here), the quieter colours of a rule's status, and the colours of the versions' lines
//! and bars — none of which is a verdict's, so a line never reads as "rejected". Not for
//! the charts' shapes (`svg`).

use pruefstand_core::record::Verdict;

/// Each verdict's colour: solid, white text on it.
pub const APPROVED: &str = "#2e7d32";
pub const REJECTED: &str = "#c62828";
pub const INCONCLUSIVE: &str = "#ef8f00";
pub(crate) const INVALID: &str = "#6a1b9a";

/// A verdict's colour.
pub fn verdict(v: Verdict) -> &'static str {
    match v {
        Verdict::Approved => APPROVED,
        Verdict::Rejected => REJECTED,
        Verdict::Inconclusive => INCONCLUSIVE,
        Verdict::Invalid => INVALID,
    }
}

/// The candidate's bars and marks in a run's report, and the first candidate's line in
/// the index: the same blue.
pub(crate) const CANDIDATE: &str = "#1565c0";
/// The candidate's figures with errors left out, a lighter blue.
pub(crate) const CANDIDATE_LIGHT: &str = "#90caf9";
/// The reference's bars and marks: grey, as its lines in the index.
pub(crate) const REFERENCE: &str = "#757575";

/// Versions' lines in the index, in order: the candidate's blue first, then hues no
/// verdict has (no red, green, amber or purple).
pub(crate) const SERIES: [&str; 8] =
    ["#1565c0", "#00838f", "#6d4c41", "#283593", "#0288d1", "#546e7a", "#8d6e63", "#006064"];
/// Lines of versions only ever run as a reference: greys, as the report draws a reference.
pub(crate) const REFERENCE_SERIES: [&str; 3] = ["#757575", "#9e9e9e", "#424242"];

/// The CSS of verdict badges (`<span class="vb v-rejected">`, and the report's big
/// `#verdict`), of a reference run's neutral badge (`v-reference`: it was judged only as
/// some candidate's reference, no verdict was asked of it), and of rule status badges
/// (`<span class="s s-pass">`): tinted and outlined, quieter than any verdict.
pub fn css() -> String {
    let mut css = String::from(
        ".vb{display:inline-block;font-weight:800;border-radius:.25rem;padding:0 .45rem;white-space:nowrap;color:#fff;letter-spacing:.02em}\
         .v-reference{background:#fff;color:#455a64;border:1px dashed #90a4ae;font-weight:600}\
         .s{font-weight:600;border-radius:.25rem;padding:0 .35rem;white-space:nowrap;border:1px solid}",
    );
    for v in [Verdict::Approved, Verdict::Rejected, Verdict::Inconclusive, Verdict::Invalid] {
        css.push_str(&format!(".v-{}{{background:{};color:#fff}}", v.as_str(), verdict(v)));
    }
    // A rule's status: a light tint of its colour, the text dark.
    for (status, tint, ink) in [
        ("pass", "#e8f5e9", "#1b5e20"),
        ("fail", "#ffebee", "#b71c1c"),
        ("inconclusive", "#fff3e0", "#8a4b00"),
        ("not_applicable", "#f5f5f5", "#616161"),
    ] {
        css.push_str(&format!(".s-{status}{{background:{tint};color:{ink};border-color:{ink}55}}"));
    }
    css
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_line_takes_a_verdicts_colour_and_every_verdict_has_its_class() {
        let verdicts = [APPROVED, REJECTED, INCONCLUSIVE, INVALID];
        for c in SERIES.iter().chain(&REFERENCE_SERIES).chain([&CANDIDATE, &REFERENCE]) {
            assert!(!verdicts.contains(c), "{c} is a verdict's colour");
        }
        assert_eq!(SERIES[0], CANDIDATE, "the report's candidate and the index's first line are one blue");
        let css = css();
        for v in ["approved", "rejected", "inconclusive", "invalid"] {
            assert!(css.contains(&format!(".v-{v}{{background:#")), "{v}");
        }
        assert!(css.contains(".s-pass{background:#e8f5e9;"), "rule badges tinted: {css}");
    }
}
