//! The layering of the workspace, checked from the source — what the compiler cannot say.
//! The crates depend on each other in one direction (`CRATES`, leaves first: a crate
//! names only crates listed before it), and the synchronous ones pull in no async
//! runtime. Inside the crates, two rules:
//!
//! - The core's `lib.rs` and the binary's `main.rs` declare their top-level modules in
//!   the order of the flow, leaves first, and a module may use only modules declared
//!   above it. So there is no cycle between top-level modules, and nothing reaches up
//!   into `cmd`.
//! - Inside a crate or a module's folder (`pruefstand-judge`, `report/`, …) the files —
//!   sibling modules — form no import cycle: no two import each other, directly or
//!   through a third.
//! - No command imports another (`cmd::wait` does not borrow from `cmd::start`): what
//!   commands share is the `client` module's, declared above `cmd`, save the few
//!   commands made of another that [`COMPOSED`] names.
//!
//! Reads every path that starts with `crate::`, `super::` or `self::` (grouped
//! `use a::{b, c::{d}}` included, also over several lines), resolved against the module
//! it is written in, inline `mod tests { … }` included; and a folder's own `use child::…`
//! imports, so a sibling reaching another through the parent's re-export counts. Not
//! followed: names a glob import (`use super::*`) brings in. No parser, no dependency.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// Paths found in a text, each with where it is (a byte offset, or once resolved a line)
/// and its segments.
type Paths = Vec<(usize, Vec<String>)>;

/// A file of a crate's `src/`: its path as shown, the module it is, and its text.
struct Source {
    name: String,
    module: Vec<String>,
    text: String,
}

/// Top-level modules in declaration order (`mod x;` or `pub mod x;`).
fn declared_modules(root_rs: &str) -> Vec<String> {
    root_rs
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            line.strip_prefix("pub ").unwrap_or(line).strip_prefix("mod ")?.strip_suffix(';').map(str::to_string)
        })
        .collect()
}

/// Modules declared for tests only (`#[cfg(test)]`, or `#[cfg(any(test, feature =
/// "test-support"))]` for other crates' tests): not part of the flow; in the binary (none
/// now: tests sit beside their code) below `cmd`, so they may use every module.
fn test_only_modules(root_rs: &str) -> Vec<String> {
    let lines: Vec<&str> = root_rs.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter(|pair| pair[0] == "#[cfg(test)]" || pair[0] == "#[cfg(any(test, feature = \"test-support\"))]")
        .filter_map(|pair| {
            let declared = pair[1].strip_prefix("pub ").unwrap_or(pair[1]);
            declared.strip_prefix("mod ")?.strip_suffix(';').map(str::to_string)
        })
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The text without `//` comments (doc comments cite modules freely), line for line.
/// String literals are left as they are (paths in strings are not imports, but none
/// spells one).
fn strip_comments(text: &str) -> String {
    let code: Vec<&str> = text.lines().map(|line| line.find("//").map_or(line, |at| &line[..at])).collect();
    code.join("\n")
}

/// The path or use tree at byte `at` of `code`, each of its expansions appended to `out`
/// after `prefix` (`a::{b, c::{d, e}}` → a::b, a::c::d, a::c::e; `self` and `*` kept as
/// segments, `as` renames skipped). Returns where it ends.
fn use_tree(code: &str, mut at: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    loop {
        let rest = &code[at..];
        let word: String = rest.chars().take_while(|&c| is_ident(c)).collect();
        if !word.is_empty() {
            at += word.len();
            path.push(word);
        } else if rest.starts_with('*') {
            at += 1;
            path.push("*".into());
        } else if rest.starts_with('{') {
            at += 1;
            loop {
                at += code[at..].len() - code[at..].trim_start().len();
                if at >= code.len() || code[at..].starts_with('}') {
                    return (at + 1).min(code.len());
                }
                at = use_tree(code, at, &path, out);
                // Past an `as` rename, to the next item.
                while let Some(c) = code[at..].chars().next().filter(|&c| c != ',' && c != '}') {
                    at += c.len_utf8();
                }
                if code[at..].starts_with(',') {
                    at += 1;
                }
            }
        }
        if !code[at..].starts_with("::") {
            break;
        }
        at += 2;
    }
    if path.len() > prefix.len() {
        out.push(path);
    }
    at
}

/// Every path in `code` that starts with `crate::` (`$crate::` in macros too),
/// `super::` or `self::`, expanded, with the byte offset where it starts.
fn rooted_paths(code: &str) -> Paths {
    let mut found = Vec::new();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let after_word = code[..at].chars().next_back().is_some_and(|c| is_ident(c) || c == ':');
        if !after_word && ["crate::", "super::", "self::"].iter().any(|root| rest.starts_with(root)) {
            let (start, mut paths) = (at, Vec::new());
            at = use_tree(code, at, &[], &mut paths);
            found.extend(paths.into_iter().map(|p| (start, p)));
        } else {
            at += rest.chars().next().map_or(1, char::len_utf8);
        }
    }
    found
}

/// The use trees of `use` declarations in `code` as written (`use rules::percentile`
/// stays `rules::percentile`), with the byte offset of each.
fn use_declarations(code: &str) -> Paths {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("use ") {
        if code[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let start = at + "use ".len();
        let mut paths = Vec::new();
        use_tree(code, start, &[], &mut paths);
        found.extend(paths.into_iter().map(|p| (start, p)));
    }
    found
}

/// A path written in module `at`, below the crate root: `crate::` from the root,
/// `self::` and `super::` from `at`, anything else relative to `at` (a `use` of a child);
/// a trailing `self` (`{self, …}`) names the module itself.
fn resolve(at: &[String], path: &[String]) -> Vec<String> {
    let mut out = at.to_vec();
    let mut segments = path.iter().peekable();
    match path.first().map(String::as_str) {
        Some("crate") => {
            out.clear();
            segments.next();
        }
        Some("self") => {
            segments.next();
        }
        _ => {}
    }
    while segments.next_if(|s| *s == "super").is_some() {
        out.pop();
    }
    out.extend(segments.cloned());
    if out.last().is_some_and(|s| s == "self") {
        out.pop();
    }
    out
}

/// For each line of `code`, the inline modules (`mod tests {`) it sits in, read from
/// rustfmt's layout: a block closes at the indentation it opened at.
fn inline_modules(code: &str) -> Vec<Vec<String>> {
    let mut open: Vec<(String, usize)> = Vec::new();
    let mut out = Vec::new();
    for line in code.lines() {
        let indent = line.len() - line.trim_start().len();
        out.push(open.iter().map(|(name, _)| name.clone()).collect());
        if line.trim() == "}" && open.last().is_some_and(|(_, at)| *at == indent) {
            open.pop();
            continue;
        }
        let item = ["pub(crate) ", "pub(super) ", "pub "].iter().find_map(|p| line.trim().strip_prefix(p));
        let name = item.unwrap_or(line.trim()).strip_prefix("mod ").and_then(|rest| rest.strip_suffix(" {"));
        if let Some(name) = name.filter(|n| n.chars().all(is_ident)) {
            open.push((name.to_string(), indent));
        }
    }
    out
}

/// The paths a file names, resolved below the crate root: (line, module path and item).
/// `uses` takes the paths to read from the comment-free code (rooted paths, or `use`
/// declarations); each resolves in the module its line sits in.
fn resolved(file: &Source, uses: fn(&str) -> Paths) -> Paths {
    let code = strip_comments(&file.text);
    let inline = inline_modules(&code);
    let line_starts: Vec<usize> = std::iter::once(0).chain(code.match_indices('\n').map(|(at, _)| at + 1)).collect();
    uses(&code)
        .into_iter()
        .map(|(offset, path)| {
            let line = line_starts.partition_point(|&start| start <= offset);
            let mut module = file.module.clone();
            module.extend(inline.get(line - 1).into_iter().flatten().cloned());
            (line, resolve(&module, &path))
        })
        .collect()
}

/// The module a file under `src/` is: `judge/rules.rs` → judge::rules, `judge/mod.rs`
/// → judge, `main.rs` or `lib.rs` → the crate root (no segment).
fn module_of(relative: &Path) -> Vec<String> {
    let mut module: Vec<String> =
        relative.with_extension("").iter().map(|c| c.to_string_lossy().into_owned()).collect();
    if module.last().is_some_and(|m| m == "mod") || module == ["main"] || module == ["lib"] {
        module.pop();
    }
    module
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The files of the crate whose `src/` is `src`, named from the repository root.
fn read_sources(src: &Path) -> Vec<Source> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let shown = src.strip_prefix(repo()).unwrap();
    files
        .into_iter()
        .map(|path| {
            let relative = path.strip_prefix(src).unwrap();
            Source {
                name: format!("{}/{}", shown.display(), relative.display()),
                module: module_of(relative),
                text: std::fs::read_to_string(&path).unwrap(),
            }
        })
        .collect()
}

/// Every use of a module declared at or below the user's own place: `file:line: a -> b`.
/// `order` is the crate's top-level modules, leaves first — for the binary, the core's
/// modules (which it imports under their own names) before its own.
fn violations(order: &[String], files: &[Source]) -> Vec<String> {
    let rank: BTreeMap<&str, usize> = order.iter().enumerate().map(|(i, m)| (m.as_str(), i)).collect();
    let mut found = Vec::new();
    for file in files {
        let Some(module) = file.module.first() else { continue };
        let Some(&own) = rank.get(module.as_str()) else {
            found.push(format!("{}: module {module} is not declared at the crate's root", file.name));
            continue;
        };
        for (line, path) in resolved(file, rooted_paths) {
            let Some(used) = path.first().filter(|used| *used != module && *used != "*") else { continue };
            match rank.get(used.as_str()) {
                Some(&other) if other < own => {}
                Some(_) => found.push(format!("{}:{line}: {module} -> {used} (declared below it)", file.name)),
                None => found.push(format!("{}:{line}: {module} -> {used} (not a top-level module)", file.name)),
            }
        }
    }
    found
}

/// The child of `folder` that `module` (a module or an item's path) lies in.
fn child_of<'a>(folder: &[String], module: &'a [String]) -> Option<&'a String> {
    module.get(folder.len()).filter(|_| module.starts_with(folder))
}

/// The imports between the modules of `folder` (its children): `from → to` with the
/// first `file:line` that shows it. A path to an item the folder's own file imports
/// from a child (`pub use rules::percentile` in `judge/mod.rs`) leads to that child.
fn folder_edges(folder: &[String], files: &[Source]) -> BTreeMap<(String, String), String> {
    let depth = folder.len();
    let children: BTreeSet<&String> = files.iter().filter_map(|f| child_of(folder, &f.module)).collect();
    let mut through: BTreeMap<String, String> = BTreeMap::new();
    for parent in files.iter().filter(|f| f.module == folder) {
        for (_, path) in resolved(parent, use_declarations) {
            if let (Some(child), Some(name)) = (child_of(folder, &path), path.last())
                && children.contains(child)
                && path.len() > depth + 1
                && name != "*"
            {
                through.insert(name.clone(), child.clone());
            }
        }
    }
    let mut edges = BTreeMap::new();
    for file in files.iter().filter(|f| child_of(folder, &f.module).is_some()) {
        let from = &file.module[depth];
        for (line, path) in resolved(file, rooted_paths) {
            let Some(named) = child_of(folder, &path) else { continue };
            let to = if children.contains(named) {
                named
            } else if let Some(c) = through.get(named) {
                c
            } else {
                continue;
            };
            if to != from {
                edges.entry((from.clone(), to.clone())).or_insert_with(|| format!("{}:{line}", file.name));
            }
        }
    }
    edges
}

/// The commands: the files of `src/cmd/` that `main.rs` names (`cmd::run::main`,
/// `cmd::start::Args`); the others there (`runs`) are helpers of the commands.
fn commands(main_rs: &str, files: &[Source]) -> BTreeSet<String> {
    let code = strip_comments(main_rs);
    files
        .iter()
        .filter_map(|f| match f.module.as_slice() {
            [cmd, name] if cmd == "cmd" && code.contains(&format!("cmd::{name}::")) => Some(name.clone()),
            _ => None,
        })
        .collect()
}

/// Commands made of another command, with why: not news to [`command_imports`].
const COMPOSED: [(&str, &str, &str); 3] = [
    ("train", "run", "`train` judges the version it made as `pruefstand run` does, by running it"),
    ("start_training", "train", "`start-training` queues what `train` does: it takes `train`'s arguments"),
    ("start_night", "train", "`start-night` queues a training as `train` does: it takes `train`'s knobs"),
];

/// Every path by which a command names another command: `file:line: cmd::a -> cmd::b`.
fn command_imports(main_rs: &str, files: &[Source]) -> Vec<String> {
    let commands = commands(main_rs, files);
    let mut found = Vec::new();
    for file in files {
        let [cmd, own] = file.module.as_slice() else { continue };
        if cmd != "cmd" || !commands.contains(own) {
            continue;
        }
        for (line, path) in resolved(file, rooted_paths) {
            let Some(other) = path.get(1).filter(|other| path[0] == "cmd" && *other != own) else { continue };
            let composed = COMPOSED.iter().any(|(from, to, _)| from == own && to == other);
            if commands.contains(other) && !composed {
                found.push(format!("{}:{line}: cmd::{own} -> cmd::{other}", file.name));
            }
        }
    }
    found
}

/// The cycles among a folder's modules: for each module on no cycle reported yet, the
/// shortest way from it back to itself (first and last element the same).
fn cycles(edges: &BTreeMap<(String, String), String>) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = edges.keys().map(|(from, _)| from).collect();
    let mut on_cycle: BTreeSet<&String> = BTreeSet::new();
    let mut found = Vec::new();
    for &start in &nodes {
        if on_cycle.contains(start) {
            continue;
        }
        // Breadth first from `start`; `came_from` leads back along the shortest way.
        let mut came_from: BTreeMap<&String, &String> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        while let Some(node) = queue.pop_front() {
            let next = edges.keys().filter(|(from, _)| from == node).map(|(_, to)| to);
            if let Some(back) = next.clone().find(|to| *to == start) {
                let mut cycle = vec![back.clone(), node.clone()];
                let mut at = node;
                while at != start {
                    at = came_from[at];
                    cycle.push(at.clone());
                }
                cycle.reverse();
                on_cycle.extend(nodes.iter().copied().filter(|n| cycle.contains(*n)));
                found.push(cycle);
                break;
            }
            for to in next {
                if !came_from.contains_key(to) && to != start {
                    came_from.insert(to, node);
                    queue.push_back(to);
                }
            }
        }
    }
    found
}

/// Every import cycle between sibling modules of a folder under `src/`, as
/// `crates/judge/src: early -> rules (…/early.rs:23) -> early (…/rules.rs:10)`.
fn sibling_cycles(files: &[Source]) -> Vec<String> {
    let folders: BTreeSet<&[String]> = files.iter().flat_map(|f| (1..f.module.len()).map(|n| &f.module[..n])).collect();
    let mut found = Vec::new();
    for folder in folders {
        let edges = folder_edges(folder, files);
        for cycle in cycles(&edges) {
            let crate_src = files[0].name.rsplit_once("src/").map_or("", |(dir, _)| dir);
            let mut text = format!("{crate_src}src/{}: {}", folder.join("/"), cycle[0]);
            for pair in cycle.windows(2) {
                text += &format!(" -> {} ({})", pair[1], edges[&(pair[0].clone(), pair[1].clone())]);
            }
            found.push(text);
        }
    }
    found
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The library crates, leaves first: a crate depends only on crates above it. The first
/// five are synchronous (no async runtime); the binary, `pruefstand`, comes after all.
const CRATES: [(&str, &str); 7] = [
    ("pruefstand-core", "crates/core"),
    ("pruefstand-store", "crates/store"),
    ("pruefstand-gym", "crates/gym"),
    ("pruefstand-judge", "crates/judge"),
    ("pruefstand-report", "crates/report"),
    ("pruefstand-sim", "crates/sim"),
    ("pruefstand-agent", "crates/agent"),
];
const SYNCHRONOUS: usize = 5;

/// The `pruefstand-*` crates a manifest names, dev-dependencies left out.
fn workspace_dependencies(manifest: &str) -> Vec<String> {
    let mut section = "";
    let mut found = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[dependencies]" && line.starts_with("pruefstand-") {
            found.push(line.split([' ', '.', '=']).next().unwrap_or_default().to_string());
        }
    }
    found
}

#[test]
fn every_crate_depends_only_on_crates_listed_before_it() {
    let names: Vec<&str> = CRATES.iter().map(|(name, _)| *name).collect();
    for (at, (name, dir)) in CRATES.iter().enumerate() {
        let manifest = std::fs::read_to_string(repo().join(dir).join("Cargo.toml")).unwrap();
        for dependency in workspace_dependencies(&manifest) {
            let rank = names.iter().position(|n| *n == dependency);
            assert!(rank.is_some_and(|r| r < at), "{name} depends on {dependency}, not a crate listed before it");
        }
    }
    let on_disk = std::fs::read_dir(repo().join("crates")).unwrap().count();
    assert_eq!(on_disk, CRATES.len(), "every folder of crates/ is listed in CRATES");
    let binary = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    assert!(workspace_dependencies(&binary).len() == CRATES.len(), "the binary depends on every library crate");
    assert_eq!(
        workspace_dependencies(
            "[dependencies]\npruefstand-a = { path = \"x\" }\n[dev-dependencies]\npruefstand-b.workspace = true\n"
        ),
        ["pruefstand-a"]
    );
}

/// The core's `src/` and its top-level modules, leaves first.
fn core() -> (PathBuf, Vec<String>) {
    let src = repo().join("crates/core/src");
    let order = declared_modules(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    (src, order)
}

/// The binary's `src/`, `main.rs` and its own top-level modules, leaves first.
fn binary() -> (PathBuf, String, Vec<String>) {
    let src = repo().join("src");
    let main_rs = std::fs::read_to_string(src.join("main.rs")).unwrap();
    let order = declared_modules(&main_rs);
    (src, main_rs, order)
}

#[test]
fn every_module_uses_only_modules_declared_above_it() {
    let (core_src, core_order) = core();
    let found = violations(&core_order, &read_sources(&core_src));
    assert!(found.is_empty(), "imports against the flow of crates/core/src/lib.rs:\n{}", found.join("\n"));
    let (src, _, order) = binary();
    let found = violations(&[core_order, order].concat(), &read_sources(&src));
    assert!(found.is_empty(), "imports against the flow of src/main.rs:\n{}", found.join("\n"));
}

#[test]
fn no_two_files_of_a_folder_import_each_other() {
    let libraries = CRATES.iter().map(|(_, dir)| repo().join(dir).join("src"));
    for src in libraries.chain([binary().0]) {
        let found = sibling_cycles(&read_sources(&src));
        assert!(found.is_empty(), "import cycles between the files of a module folder:\n{}", found.join("\n"));
    }
}

#[test]
fn no_command_imports_another() {
    let (src, main_rs, _) = binary();
    let found = command_imports(&main_rs, &read_sources(&src));
    assert!(
        found.is_empty(),
        "commands importing another command (what they share belongs in `client`):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_command_importing_another_is_reported() {
    let main_rs = "fn d() { cmd::start::main(); cmd::wait::main(); cmd::train::main(); cmd::run::main(); }";
    let files = [
        source("cmd/mod.rs", "pub mod runs;\npub mod start;\npub mod wait;\n"),
        source("cmd/start.rs", "pub fn wait_final() {}\n"),
        source("cmd/runs.rs", "pub fn resolve() {}\n"),
        source(
            "cmd/wait.rs",
            "use crate::cmd::start::wait_final;\nuse crate::cmd::runs;\nfn f() { super::start::x(); }\n",
        ),
        source("cmd/train.rs", "fn f() { crate::cmd::run::main(); }\n"),
        source("cmd/run.rs", "use crate::client::print_judgement;\n"),
    ];
    assert_eq!(commands(main_rs, &files), ["run", "start", "train", "wait"].map(String::from).into());
    // `runs` is no command; `train` running `run` is composed on purpose.
    assert_eq!(
        command_imports(main_rs, &files),
        ["src/cmd/wait.rs:1: cmd::wait -> cmd::start", "src/cmd/wait.rs:3: cmd::wait -> cmd::start"]
    );
}

#[test]
fn the_order_puts_leaves_first_and_commands_last() {
    let (_, core_order) = core();
    let (_, main_rs, order) = binary();
    let tests_only = test_only_modules(&main_rs);
    // The debug check for blocking work comes first: util's writes and locks call it.
    assert_eq!(core_order.iter().take(2).map(String::as_str).collect::<Vec<_>>(), ["blocking", "util"]);
    // Test-only modules come after everything; the last module of the binary is `cmd`.
    let product: Vec<&String> = order.iter().filter(|m| !tests_only.contains(m)).collect();
    assert!(order.ends_with(&tests_only), "test-only modules {tests_only:?} must be declared last");
    assert_eq!(product.last().map(|m| m.as_str()), Some("cmd"));
    // The flow: in the core spec → queue → order; in the binary guard → model → gym →
    // hooks → run → daemon → serve (the store, the judge and the report are crates).
    let flows: [(&[String], &[&str]); 2] = [
        (&core_order, &["spec", "queue", "telemetry", "order"]),
        (&order, &["guard", "model", "gym", "hooks", "run", "daemon", "serve"]),
    ];
    for (order, flow) in flows {
        let at = |m: &str| order.iter().position(|o| o == m).unwrap_or_else(|| panic!("{m} not declared"));
        for pair in flow.windows(2) {
            assert!(at(pair[0]) < at(pair[1]), "{} must come before {}", pair[0], pair[1]);
        }
    }
}

/// The modules docs/architecture.md's module tables name (`| \`name\` | … |` rows of
/// its "Modules" section), in the page's order.
fn documented_modules(page: &str) -> Vec<String> {
    let section = page.split("\n## Modules").nth(1).unwrap_or_default();
    let section = section.split("\n## ").next().unwrap_or_default();
    section
        .lines()
        .filter_map(|line| line.strip_prefix("| `")?.split_once('`').map(|(name, _)| name.to_string()))
        .collect()
}

#[test]
fn the_architecture_page_lists_every_module_in_the_declared_order() {
    let (_, core_order) = core();
    let (_, main_rs, order) = binary();
    let tests_only = test_only_modules(&main_rs);
    let libraries = CRATES[1..].iter().flat_map(|(_, dir)| {
        let lib = std::fs::read_to_string(repo().join(dir).join("src/lib.rs")).unwrap();
        let for_tests = test_only_modules(&lib);
        declared_modules(&lib).into_iter().filter(move |m| !for_tests.contains(m))
    });
    let declared: Vec<String> =
        core_order.into_iter().chain(libraries).chain(order.into_iter().filter(|m| !tests_only.contains(m))).collect();
    let page = std::fs::read_to_string(repo().join("docs/architecture.md")).unwrap();
    assert_eq!(
        documented_modules(&page),
        declared,
        "docs/architecture.md's module tables must name each crate's modules (its lib.rs), in the order of \
         CRATES, then the binary's (src/main.rs), each in its order"
    );
    assert_eq!(documented_modules("# p\n## Modules\n| `a` | x |\n| b | y |\n## Next\n| `c` | z |\n"), ["a"]);
}

fn source(name: &str, text: &str) -> Source {
    Source { name: format!("src/{name}"), module: module_of(Path::new(name)), text: text.to_string() }
}

fn joined(paths: Paths) -> Vec<String> {
    paths.into_iter().map(|(_, path)| path.join("::")).collect()
}

#[test]
fn the_checker_sees_grouped_imports_and_ignores_comments() {
    let paths = |code: &str| joined(rooted_paths(code));
    assert_eq!(
        paths("use crate::{agent, judge::{self, X}, util};"),
        ["crate::agent", "crate::judge::self", "crate::judge::X", "crate::util"]
    );
    assert_eq!(
        paths("let x = crate::gym::Control::new(); crate::util::f()"),
        ["crate::gym::Control::new", "crate::util::f"]
    );
    assert_eq!(
        paths("use super::{\n    Estimate,\n    checks as c,\n};\nuse self::x::*;"),
        ["super::Estimate", "super::checks", "self::x::*"]
    );
    assert_eq!(
        paths("$crate::console::emit(); myself::no; super::super::families::scope(&f)"),
        ["crate::console::emit", "super::super::families::scope"]
    );
    assert_eq!(
        joined(use_declarations("pub use load::{a, b};\nfn f() { let reuse = cause::x; }")),
        ["load::a", "load::b"]
    );
    let file = source("run.rs", "// crate::daemon is mentioned here\nuse crate::run;");
    assert_eq!(resolved(&file, rooted_paths), [(2, vec!["run".to_string()])]);
}

#[test]
fn paths_resolve_in_the_module_they_are_written_in() {
    let file = source(
        "judge/load.rs",
        "use super::{JudgeInput, early::Track};\nuse self::inner::X;\n\n#[cfg(test)]\nmod tests {\n    use super::*;\n    \
         use super::super::checks::f;\n}\nuse crate::util;\n",
    );
    let got: Vec<(usize, String)> = resolved(&file, rooted_paths).into_iter().map(|(l, p)| (l, p.join("::"))).collect();
    let want = [
        (1, "judge::JudgeInput"),
        (1, "judge::early::Track"),
        (2, "judge::load::inner::X"),
        (6, "judge::load::*"),
        (7, "judge::checks::f"),
        (9, "util"),
    ];
    assert_eq!(got, want.map(|(l, p)| (l, p.to_string())));
    assert_eq!(module_of(Path::new("judge/mod.rs")), ["judge"]);
    assert!(module_of(Path::new("main.rs")).is_empty());
}

#[test]
fn an_upward_import_is_reported() {
    let files = [
        source("util.rs", "use crate::run::Thing;\n"),
        source("run.rs", "use crate::util;\n"),
        source("cmd/mod.rs", "use crate::{run, util};\n"),
        source("cmd/x.rs", "use super::super::run;\n"),
    ];
    let found = violations(&declared_modules("pub mod util;\nmod run;\nmod cmd;\n"), &files);
    assert_eq!(found, ["src/util.rs:1: util -> run (declared below it)"]);
}

#[test]
fn a_cycle_between_siblings_is_reported_with_its_files() {
    let mut files = vec![
        source("main.rs", "mod m;\n"),
        source("m/mod.rs", "mod a;\nmod b;\nmod c;\npub use c::Helper;\n"),
        source("m/a.rs", "use super::b::Thing;\n"),
        // Through the parent's re-export of `c::Helper`.
        source("m/b.rs", "pub struct Thing;\nfn f() -> super::Helper {\n    todo!()\n}\n"),
        source("m/c.rs", "pub struct Helper;\n"),
    ];
    assert!(sibling_cycles(&files).is_empty(), "a -> b -> c is no cycle");
    // c's tests use a: a -> b -> c -> a.
    files[4].text += "\n#[cfg(test)]\nmod tests {\n    use crate::m::a;\n}\n";
    assert_eq!(sibling_cycles(&files), ["src/m: a -> b (src/m/a.rs:1) -> c (src/m/b.rs:2) -> a (src/m/c.rs:5)"]);
    // Two cycles through one module are both reported.
    files.push(source("m/d.rs", "use super::a;\n"));
    files[2].text += "use super::d;\n";
    assert_eq!(sibling_cycles(&files).len(), 2, "{:?}", sibling_cycles(&files));
}

/// The boundary the manifests draw: no async runtime (nor anything that brings one) among
/// what the synchronous crates depend on, as `cargo tree` resolves it.
#[test]
fn the_synchronous_crates_depend_on_no_async_runtime() {
    for (name, _) in &CRATES[..SYNCHRONOUS] {
        let out = std::process::Command::new(env!("CARGO"))
            .args(["tree", "--locked", "--offline", "-p", name, "-e", "normal", "--prefix", "none"])
            .current_dir(repo())
            .output()
            .expect("running cargo tree");
        assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
        let tree = String::from_utf8(out.stdout).unwrap();
        assert!(tree.lines().any(|line| line.starts_with("serde ")), "cargo tree printed {name}'s tree:\n{tree}");
        let runtimes: Vec<&str> = tree
            .lines()
            .filter(|line| ["tokio ", "async-", "futures"].iter().any(|name| line.starts_with(name)))
            .collect();
        assert!(runtimes.is_empty(), "{name} depends on {runtimes:?}");
    }
}
