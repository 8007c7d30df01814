//! `serve`'s `/reports/…`: the files under the bench root's `reports/`, read-only. A
//! request path is decoded once and checked before anything is opened: no `.`/`..`
//! or hidden segment, no empty segment, no NUL or backslash; what it names must
//! resolve (symlinks followed) inside `reports/` and be a regular file (a folder
//! shows its listing, pages first). Not the routing or the live view
//! (`serve`, `serve::live`), nor the Content-Security-Policy (`serve::csp`).

use std::path::{Path, PathBuf};

use pruefstand_store::{RunDir, RunDocument, RunFile};

/// The largest file served (a run's traces and records are far smaller).
const MAX_BYTES: u64 = 256 << 20;

/// A file's content: made here (a folder's listing), or a file opened, streamed to the
/// client in chunks as it reads them, so a client that stops reading holds one chunk,
/// not the whole file.
#[derive(Debug)]
pub(crate) enum Content {
    Bytes(Vec<u8>),
    Open(std::fs::File),
}

impl PartialEq for Content {
    fn eq(&self, other: &Content) -> bool {
        matches!((self, other), (Content::Bytes(a), Content::Bytes(b)) if a == b)
    }
}

/// What a request under `/reports` comes to.
#[derive(Debug, PartialEq)]
pub(super) enum Lookup {
    File {
        content: Content,
        content_type: &'static str,
        csp: &'static str,
    },
    /// A folder asked for without its trailing slash (relative links need it).
    Redirect(String),
    /// A path that cannot name a file here (`..`, a hidden segment, bad escapes).
    BadPath,
    NotFound,
}

/// Resolves `raw` — the request's path as sent, still percent-encoded, starting with
/// `/reports` — against `reports` (canonical) and reads the file.
pub(crate) fn find(reports: &Path, raw: &str) -> Lookup {
    let Some(decoded) = percent_decode(raw) else { return Lookup::BadPath };
    let Some(rest) = decoded.strip_prefix("/reports") else { return Lookup::NotFound };
    if rest.is_empty() {
        return Lookup::Redirect("/reports/".into());
    }
    let Some(rest) = rest.strip_prefix('/') else { return Lookup::NotFound };
    let (segments, folder) = match rest.strip_suffix('/') {
        Some(inner) => (inner, true),
        None => (rest, rest.is_empty()),
    };
    let mut path = reports.to_path_buf();
    if !segments.is_empty() {
        for segment in segments.split('/') {
            if !plain_segment(segment) {
                return Lookup::BadPath;
            }
            path.push(segment);
        }
    }
    // Symlinks resolved: whatever the path went through, it must end inside reports/.
    let Ok(real) = path.canonicalize() else { return Lookup::NotFound };
    if !real.starts_with(reports) {
        return Lookup::NotFound;
    }
    if real.is_dir() {
        if !folder {
            return Lookup::Redirect(format!("{}/", raw));
        }
        // Every folder its listing, a run's too: its pages (report, compare) first,
        // then its files, so that nothing a run holds is out of reach.
        return listing(reports, &real, &decoded);
    }
    if folder {
        return Lookup::NotFound;
    }
    read_file(&real).unwrap_or(Lookup::NotFound)
}

/// A folder's entries as a page: sub-folders and regular files that resolve inside
/// `reports/` and that `find` would serve (plain names), newest first (by modification
/// time); a run folder (one with a `judgement.json`) shows its verdict. Every name is
/// HTML-escaped and every link percent-encoded.
fn listing(reports: &Path, folder: &Path, shown: &str) -> Lookup {
    let Ok(entries) = std::fs::read_dir(folder) else { return Lookup::NotFound };
    let mut rows: Vec<(bool, std::time::SystemTime, String)> = Vec::new();
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
        if !plain_segment(&name) {
            continue;
        }
        let Ok(real) = entry.path().canonicalize() else { continue };
        if !real.starts_with(reports) {
            continue;
        }
        let Ok(meta) = std::fs::metadata(&real) else { continue };
        let modified = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
        let Some(href) = url_of(reports, &folder.join(&name)) else { continue };
        let esc = pruefstand_report::html::esc;
        let row = if meta.is_dir() {
            // A verdict in its colour (the reports' own); a run made as a candidate's
            // reference as "reference", as the index shows it.
            let verdict = match (verdict_of(&real), reference_for(&real)) {
                (Some(_), Some(candidate)) => format!(
                    r#" <span class="verdict vb v-reference" title="run as the reference of {}">reference</span>"#,
                    esc(&candidate)
                ),
                (Some(v), None) => format!(r#" <span class="verdict vb v-{0}">{0}</span>"#, esc(v)),
                (None, _) => String::new(),
            };
            format!(r#"<li><a href="{}/">{}/</a>{verdict}</li>"#, esc(&href), esc(&name))
        } else if meta.is_file() {
            format!(r#"<li><a href="{}">{}</a></li>"#, esc(&href), esc(&name))
        } else {
            continue;
        };
        let page = meta.is_file() && name.ends_with(".html");
        rows.push((page, modified, row));
    }
    // Pages first, then newest first.
    rows.sort_by_key(|row| std::cmp::Reverse((row.0, row.1)));
    let up = if folder == reports { String::new() } else { r#"<p><a href="../">up</a></p>"#.to_string() };
    let items: String = rows.into_iter().map(|(_, _, row)| row).collect();
    let empty = if items.is_empty() { "<p>nothing here yet</p>" } else { "" };
    let title = pruefstand_report::html::esc(shown);
    let html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title>\
<style>body{{font-family:sans-serif;margin:2rem}}li{{margin:.2rem 0}}.verdict{{margin-left:.6rem}}{}</style></head>\
<body><p><a href=\"/\">live view</a></p><h1>{title}</h1>{up}{empty}<ul id=\"entries\">{items}</ul></body></html>",
        pruefstand_report::colours::css()
    );
    Lookup::File { content: Content::Bytes(html.into_bytes()), content_type: HTML, csp: super::csp::STRICT }
}

/// A run folder's verdict, from its `judgement.json` of any age (a listing shows the
/// folder, not a judgement it could not read).
fn verdict_of(dir: &Path) -> Option<&'static str> {
    Some(pruefstand_judge::StoredJudgement::read(&RunDir::open(dir).ok()?).ok()??.verdict?.as_str())
}

/// What a listing reads of `run.json`: the candidate a reference run was made for.
#[derive(serde::Serialize, serde::Deserialize)]
struct ReferenceFor {
    #[serde(default)]
    reference_for: Option<String>,
}

impl RunDocument for ReferenceFor {
    const FILE: RunFile = RunFile::RunMeta;
}

/// The candidate a run folder was made as the reference of, from its `run.json`.
fn reference_for(dir: &Path) -> Option<String> {
    RunDir::open(dir).ok()?.read::<ReferenceFor>().ok()??.reference_for
}

/// A segment that names an entry of its folder: not empty, not `.`/`..` or another
/// hidden name, no backslash or NUL.
fn plain_segment(segment: &str) -> bool {
    !segment.is_empty() && !segment.starts_with('.') && !segment.contains(['\\', '\0'])
}

/// Opens without following a symlink and without blocking on a FIFO, and reads only a
/// regular file (checked on the open file, so a swap after the check cannot give a
/// FIFO or a device).
fn read_file(real: &PathBuf) -> Option<Lookup> {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(flags.bits()).open(real).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_BYTES {
        return None;
    }
    let content_type = content_type(real);
    // Whatever the file declares itself: the policy is serve's (`serve::csp`).
    let csp = super::csp::of_file(content_type);
    Some(Lookup::File { content: Content::Open(file), content_type, csp })
}

const HTML: &str = "text/html; charset=utf-8";

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => HTML,
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "css" => "text/css; charset=utf-8",
        "md" | "txt" | "log" | "jsonl" | "sha256" | "lock" | "toml" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// `%XX` escapes decoded (a `+` stays a `+`); None for a broken escape or a result
/// that is not UTF-8.
fn percent_decode(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A path below `reports/` as a URL path under `/reports/`, each segment
/// percent-encoded but for the unreserved characters.
pub(super) fn url_of(reports: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(reports).ok()?;
    let mut url = String::from("/reports");
    for part in rel.components() {
        let std::path::Component::Normal(part) = part else { return None };
        url.push('/');
        for b in part.to_str()?.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                url.push(b as char);
            } else {
                url.push_str(&format!("%{b:02X}"));
            }
        }
    }
    Some(url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn reports() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let reports = dir.path().join("reports");
        std::fs::create_dir_all(reports.join("v/plan/run")).unwrap();
        std::fs::write(dir.path().join("secret.toml"), "secret").unwrap();
        std::fs::write(reports.join("index.html"), "<html><head><meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'sha256-abc='\"></head><body>index</body></html>").unwrap();
        std::fs::write(RunDir::new(reports.join("v/plan/run")).report_path(), "<html><head></head>run</html>").unwrap();
        std::fs::write(reports.join("v/plan/run/chart.svg"), "<svg/>").unwrap();
        std::fs::write(reports.join(".hidden"), "x").unwrap();
        let reports = reports.canonicalize().unwrap();
        (dir, reports)
    }

    fn body(found: Lookup) -> String {
        match found {
            Lookup::File { content: Content::Bytes(bytes), .. } => String::from_utf8(bytes).unwrap(),
            Lookup::File { content: Content::Open(mut file), .. } => {
                let mut text = String::new();
                file.read_to_string(&mut text).unwrap();
                text
            }
            other => panic!("not a file: {other:?}"),
        }
    }

    #[test]
    fn serves_files_and_folders_inside_reports() {
        let (_dir, reports) = reports();
        assert!(body(find(&reports, "/reports/index.html")).contains("index"));
        let top = body(find(&reports, "/reports/"));
        assert!(top.contains(r#"<a href="/reports/index.html">index.html</a>"#), "reports/ lists its files: {top}");
        assert!(top.contains(r#"<a href="/reports/v/">v/</a>"#), "and its folders: {top}");
        assert!(!top.contains(".hidden"), "but no hidden name: {top}");
        assert!(
            body(find(&reports, "/reports/v/plan/")).contains(r#"href="/reports/v/plan/run/""#),
            "a plan lists runs"
        );
        let run = body(find(&reports, "/reports/v/plan/run/"));
        let (page, file) = (run.find(r#"href="/reports/v/plan/run/report.html""#), run.find("chart.svg"));
        assert!(page.is_some() && file.is_some() && page < file, "a run folder lists its pages first: {run}");
        assert!(body(find(&reports, "/reports/v/pl%61n/run/report.html")).contains("run"), "escapes decoded");
        assert_eq!(find(&reports, "/reports"), Lookup::Redirect("/reports/".into()));
        assert_eq!(find(&reports, "/reports/v/plan/run"), Lookup::Redirect("/reports/v/plan/run/".into()));
        match find(&reports, "/reports/v/plan/run/chart.svg") {
            Lookup::File { content_type, csp, .. } => {
                assert_eq!(content_type, "image/svg+xml");
                assert_eq!(csp, crate::serve::csp::STRICT);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_html_file_is_sent_with_serves_policy_whatever_it_declares() {
        let (_dir, reports) = reports();
        let Lookup::File { csp, .. } = find(&reports, "/reports/index.html") else { panic!() };
        assert_eq!(csp, crate::serve::csp::REPORT_PAGE.as_str(), "not the sha256-abc= the page declares");
        let Lookup::File { csp, .. } = find(&reports, "/reports/v/plan/run/report.html") else { panic!() };
        assert_eq!(csp, crate::serve::csp::REPORT_PAGE.as_str());
        let Lookup::File { csp, .. } = find(&reports, "/reports/v/plan/") else { panic!() };
        assert_eq!(csp, crate::serve::csp::STRICT, "a listing runs no script");
    }

    #[test]
    fn nothing_outside_reports_and_nothing_but_files() {
        let (dir, reports) = reports();
        for path in [
            "/reports/../secret.toml",
            "/reports/%2e%2e/secret.toml",
            "/reports/%2E%2E%2Fsecret.toml",
            "/reports/v/../../secret.toml",
            "/reports/./index.html",
            "/reports/.hidden",
            "/reports//index.html",
            "/reports/index.html%00",
            "/reports/..%5csecret.toml",
            "/reports/%zz",
            "/reports/%ff",
        ] {
            assert_eq!(find(&reports, path), Lookup::BadPath, "{path}");
        }
        std::os::unix::fs::symlink(dir.path().join("secret.toml"), reports.join("out.toml")).unwrap();
        std::os::unix::fs::symlink(dir.path(), reports.join("up")).unwrap();
        assert_eq!(find(&reports, "/reports/out.toml"), Lookup::NotFound, "a symlink out");
        assert_eq!(find(&reports, "/reports/up/secret.toml"), Lookup::NotFound, "a folder symlink out");
        std::os::unix::fs::symlink(reports.join("index.html"), reports.join("alias.html")).unwrap();
        assert!(body(find(&reports, "/reports/alias.html")).contains("index"), "a symlink within is fine");
        nix::unistd::mkfifo(&reports.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(find(&reports, "/reports/fifo"), Lookup::NotFound, "a FIFO is no file (and does not block)");
        assert_eq!(find(&reports, "/reports/missing.html"), Lookup::NotFound);
        assert_eq!(find(&reports, "/reports/index.html/"), Lookup::NotFound);
        assert_eq!(find(&reports, "/elsewhere"), Lookup::NotFound);
    }

    #[test]
    fn a_listing_puts_the_newest_run_first_with_its_verdict_and_escapes_names() {
        let (_dir, reports) = reports();
        let plan = reports.join("v/plan");
        std::fs::create_dir(plan.join("<b>new&")).unwrap();
        let judged = |dir: &str| RunDir::new(plan.join(dir)).test_file(RunFile::Judgement);
        std::fs::write(judged("<b>new&"), r#"{"verdict":"rejected"}"#).unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::open(plan.join("run")).unwrap().set_modified(old).unwrap();
        std::fs::write(judged("run"), r#"{"verdict":"approved"}"#).unwrap();
        std::fs::File::open(plan.join("run")).unwrap().set_modified(old).unwrap();
        let page = body(find(&reports, "/reports/v/plan/"));
        let new = page.find("&lt;b&gt;new&amp;/</a>").unwrap_or_else(|| panic!("escaped: {page}"));
        let run = page.find(">run/</a>").unwrap();
        assert!(new < run, "newest first: {page}");
        assert!(page.contains(r#"href="/reports/v/plan/%3Cb%3Enew%26/""#), "{page}");
        assert!(page.contains(">rejected</span>") && page.contains(">approved</span>"), "verdicts: {page}");
        assert!(!page.contains("<b>"), "{page}");
    }

    #[test]
    fn urls_of_run_folders_are_escaped() {
        let reports = Path::new("/r/reports");
        assert_eq!(url_of(reports, Path::new("/r/reports/v 1/p/run")).as_deref(), Some("/reports/v%201/p/run"));
        assert_eq!(url_of(reports, Path::new("/elsewhere/run")), None);
    }
}
