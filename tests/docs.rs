//! The documentation as a reader's renderer shows it: `README.md` and every other
//! Markdown file of the project (`docs/`, `scripts/`, …; not `target/`, not the run
//! directories under `reports/`) parsed as CommonMark with GitHub's tables.
//!
//! Why: a fence with text after it (```` ``` The bench root … ````) does not close its
//! code block in CommonMark, so everything up to the next bare fence renders as code, and
//! a fence never closed swallows the rest of the file; both look right in an editor. A
//! relative link or picture goes stale when a file or section moves. Checked here:
//!
//! - inside a fenced code block no line starts with the block's own fence (a would-be
//!   closing fence carrying text, or an opening one where a closing one was meant);
//! - every fenced code block is closed;
//! - every relative link and picture names a file or folder that exists, and a `#part`
//!   names a heading of its Markdown file (GitHub's anchors).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};

use crate::common::repo;

/// Folders never walked: build output, the venv, the bench root's run directories,
/// queue and learned state (all ignored by git), and hidden ones (`.git`).
const SKIP: &[&str] = &["target", "reports", "state", "__pycache__"];

/// The project's Markdown files, relative to the repository, sorted.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with('.') || (path.is_dir() && SKIP.contains(&name.as_str())) {
                continue;
            }
            if path.is_dir() {
                walk(root, &path, out);
            } else if name.ends_with(".md") {
                out.push(path.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    let root = repo();
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    out
}

fn parse(text: &str) -> impl Iterator<Item = (Event<'_>, Range<usize>)> {
    Parser::new_ext(text, Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH).into_offset_iter()
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset].matches('\n').count() + 1
}

/// A line with its block-quote markers and indentation taken off.
fn bare(line: &str) -> &str {
    line.trim_start_matches(|c: char| c == '>' || c.is_whitespace()).trim_end()
}

/// The fence a line opens or closes with: its character and length.
fn fence_of(line: &str) -> Option<(char, usize)> {
    let line = bare(line);
    let c = line.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let n = line.chars().take_while(|x| *x == c).count();
    (n >= 3).then_some((c, n))
}

/// A fenced code block being read: its fence, its first line, its content's lines.
struct Open {
    fence: (char, usize),
    start: usize,
    lines: Vec<(usize, String)>,
}

/// What is wrong with the fenced code blocks of one file: `line N: …`, in order.
fn fence_problems(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut open: Option<Open> = None;
    let mut blocks = Vec::new();
    for (event, range) in parse(text) {
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(_))) => {
                let first = text[range.clone()].lines().next().unwrap_or("");
                let fence = fence_of(first).expect("a fenced block starts with its fence");
                open = Some(Open { fence, start: line_of(text, range.start), lines: Vec::new() });
                blocks.push(range);
            }
            Event::Text(t) => {
                if let Some(Open { lines, .. }) = &mut open {
                    let at = line_of(text, range.start);
                    lines.extend(t.lines().enumerate().map(|(i, l)| (at + i, l.to_string())));
                }
            }
            Event::End(TagEnd::CodeBlock) => {
                let Some(Open { fence: (c, n), start, lines }) = open.take() else { continue };
                for (line, content) in lines {
                    if fence_of(&content).is_some_and(|(c2, n2)| c2 == c && n2 >= n) {
                        problems.push(format!(
                            "line {line}: {:?} is inside the code block opened at line {start}: a fence with \
                             text after it does not close a block, so the block runs on to the next bare fence",
                            content.trim()
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    for range in blocks {
        let source = &text[range.clone()];
        let (c, n) = fence_of(source.lines().next().unwrap_or("")).unwrap();
        let last = source.trim_end().lines().last().unwrap_or("");
        let closes = source.trim_end().lines().count() > 1
            && fence_of(last).is_some_and(|(c2, n2)| c2 == c && n2 >= n)
            && bare(last).chars().all(|x| x == c);
        if !closes {
            let to = if text[range.end..].trim().is_empty() {
                "the end of the file"
            } else {
                "the end of its list or quote"
            };
            problems.push(format!(
                "line {}: the code block opened here is never closed: it runs to {to}",
                line_of(text, range.start)
            ));
        }
    }
    problems
}

/// GitHub's anchor of a heading's text: lower case, letters, digits, `-` and `_` kept,
/// spaces made `-`, everything else dropped; a repeated one gets `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut heading: Option<String> = None;
    for (event, _) in parse(text) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = &mut heading {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let h = heading.take().unwrap_or_default();
                let slug: String = h
                    .to_lowercase()
                    .chars()
                    .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect();
                let n = seen.entry(slug.clone()).or_default();
                out.insert(if *n == 0 { slug.clone() } else { format!("{slug}-{n}") });
                *n += 1;
            }
            _ => {}
        }
    }
    out
}

/// `a/b/../c` → `a/c`, without asking the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// What is wrong with the relative links and pictures of `file` (relative to `root`).
fn link_problems(root: &Path, file: &Path, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let dir = file.parent().unwrap_or(Path::new(""));
    for (event, range) in parse(text) {
        let dest = match event {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => dest_url,
            _ => continue,
        };
        if dest.contains("://") || dest.starts_with("mailto:") {
            continue;
        }
        let line = line_of(text, range.start);
        let (path, part) = dest.split_once('#').map_or((&*dest, None), |(p, a)| (p, Some(a)));
        let target = if path.is_empty() { file.to_path_buf() } else { normalise(&dir.join(path)) };
        let shown = target.display().to_string();
        if !root.join(&target).exists() {
            problems.push(format!("line {line}: links to {dest}, but {shown} does not exist"));
            continue;
        }
        if let Some(part) = part.filter(|_| shown.ends_with(".md")) {
            let heads = if path.is_empty() {
                anchors(text)
            } else {
                anchors(&std::fs::read_to_string(root.join(&target)).unwrap())
            };
            if !heads.contains(part) {
                problems.push(format!("line {line}: links to {dest}, but {shown} has no heading #{part}"));
            }
        }
    }
    problems
}

/// Every file's problems, `file: line N: …`, one a line.
fn report(check: impl Fn(&Path, &str) -> Vec<String>) -> String {
    let root = repo();
    let mut out = String::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(root.join(&file)).unwrap();
        for problem in check(&file, &text) {
            out.push_str(&format!("{}: {problem}\n", file.display()));
        }
    }
    out
}

#[test]
fn the_walk_finds_the_readme_the_docs_and_the_scripts_readme() {
    let files = markdown_files();
    for must in ["README.md", "docs/development.md", "docs/statistics.md", "scripts/README.md"] {
        assert!(files.contains(&PathBuf::from(must)), "{must} not among {files:?}");
    }
    assert!(!files.iter().any(|f| f.starts_with("target") || f.starts_with("reports")), "{files:?}");
}

#[test]
fn every_code_block_of_the_markdown_is_closed_by_a_bare_fence() {
    let problems = report(|_, text| fence_problems(text));
    assert!(problems.is_empty(), "code blocks that do not render as written:\n{problems}");
}

#[test]
fn every_relative_link_of_the_markdown_names_a_file_and_heading_that_exist() {
    let root = repo();
    let problems = report(|file, text| link_problems(&root, file, text));
    assert!(problems.is_empty(), "links that lead nowhere:\n{problems}");
}

#[test]
fn the_fence_check_finds_text_after_a_closing_fence_and_a_fence_left_open() {
    let fine = "# t\n\n```sh\nls\n```\n\n- a list\n\n  ```toml\n  a = 1\n  ```\n\n~~~md\n```\nshown\n```\n~~~\n";
    assert_eq!(fence_problems(fine), Vec::<String>::new());

    // The README's old mistake: the paragraph after it and the next block's opening
    // fence are code; the next bare fence closes it, and the file ends in order.
    let trailing = "```sh\nls\n``` The bench root is\nfound.\n\n```toml\na = 1\n```\n";
    let problems = fence_problems(trailing);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].starts_with(r#"line 3: "``` The bench root is" is inside the code block opened at line 1"#),
        "{problems:?}"
    );
    assert!(problems[1].starts_with(r#"line 6: "```toml" is inside"#), "{problems:?}");

    let unclosed = "# t\n\n```sh\nls\n\n## the rest\n";
    assert_eq!(
        fence_problems(unclosed),
        ["line 3: the code block opened here is never closed: it runs to the end of the file"]
    );
    let in_a_list = "- a\n\n  ```sh\n  ls\n\nafter\n";
    assert_eq!(
        fence_problems(in_a_list),
        ["line 3: the code block opened here is never closed: it runs to the end of its list or quote"]
    );
}

#[test]
fn the_link_check_finds_a_missing_file_and_a_missing_heading() {
    let root = repo();
    let text = "# Top part\n\n[ok](#top-part) [ok](docs/statistics.md#stopping-early) [ok](src/)\n\
                [gone](docs/nothing.md) [gone](#bottom) [gone](docs/statistics.md#no-such-part)\n\
                [out](https://example.org/x.md) ![pending](docs/compare.png)\n";
    let problems = link_problems(&root, Path::new("README.md"), text);
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(problems[0].contains("docs/nothing.md does not exist"), "{problems:?}");
    assert!(problems[1].contains("README.md has no heading #bottom"), "{problems:?}");
    assert!(problems[2].contains("docs/statistics.md has no heading #no-such-part"), "{problems:?}");
}
