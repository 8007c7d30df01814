//! The one place that decides the Content-Security-Policy `serve` sends, as a header,
//! with every answer. Nothing a served file says about its own policy counts: a page
//! under `reports/` (any copied run folder can carry one) gets the policy of
//! pruefstand's own pages — no load from anywhere, no connection, and no script but
//! the ones pruefstand's pages carry, by hash. A `<meta>` policy in the page can only
//! narrow that further (a browser enforces every policy it is given), so a page that
//! declares `script-src * 'unsafe-inline'; connect-src *` still runs nothing of its
//! own and reads nothing. Not the headers beside it (`serve`).

use std::sync::LazyLock;

use pruefstand_report::{PAGE_SCRIPTS, sha256_base64};

/// Everything that is not one of our HTML pages (and a folder's listing): nothing
/// runs, nothing loads (an SVG opened on its own cannot run a script either).
/// `frame-ancestors` only works as a header, so every policy here carries it.
pub(super) const STRICT: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// An HTML file under `reports/`: the scripts of pruefstand's pages by hash, and no
/// `connect-src` (default `'none'`): a report needs no request once loaded.
pub(super) static REPORT_PAGE: LazyLock<String> = LazyLock::new(|| {
    let hashes: Vec<String> =
        PAGE_SCRIPTS.iter().map(|s| format!("'sha256-{}'", sha256_base64(s.as_bytes()))).collect();
    format!(
        "default-src 'none'; script-src {}; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hashes.join(" ")
    )
});

/// The live page (`/`): its own policy, which allows `connect-src 'self'` for `/events`.
pub(super) static LIVE_PAGE: LazyLock<String> =
    LazyLock::new(|| format!("{}; frame-ancestors 'none'", *super::page::CSP));

/// The policy of a file under `reports/` by its content type.
pub(super) fn of_file(content_type: &str) -> &'static str {
    if content_type.starts_with("text/html") { REPORT_PAGE.as_str() } else { STRICT }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_page_runs_our_scripts_only_and_connects_nowhere() {
        for script in PAGE_SCRIPTS {
            assert!(REPORT_PAGE.contains(&sha256_base64(script.as_bytes())));
        }
        assert!(!REPORT_PAGE.contains("unsafe-inline'; s") && !REPORT_PAGE.contains("connect-src"));
        assert!(!REPORT_PAGE.contains('*') && REPORT_PAGE.starts_with("default-src 'none'"));
        assert_eq!(of_file("image/svg+xml"), STRICT);
        assert!(LIVE_PAGE.contains("connect-src 'self'") && LIVE_PAGE.ends_with("frame-ancestors 'none'"));
    }
}
