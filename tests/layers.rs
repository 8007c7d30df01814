//! The crate's layering, checked from the source: `src/main.rs` declares the top-level
//! modules in the order of the flow, leaves first, and a module may use only modules
//! declared above it. So there is no cycle between top-level modules, and the core never
//! reaches up into `cmd` or the orchestration. Reads the `crate::…` paths of every file
//! (grouped `use crate::{a, b::c}` included); no parser, no dependency.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Top-level modules in declaration order.
fn declared_modules(main_rs: &str) -> Vec<String> {
    main_rs.lines().filter_map(|line| line.trim().strip_prefix("mod ")?.strip_suffix(';').map(str::to_string)).collect()
}

/// Modules declared under `#[cfg(test)]` (the fuzzing harness): they sit below `cmd`
/// so they may use every module, and are not part of the flow.
fn test_only_modules(main_rs: &str) -> Vec<String> {
    let lines: Vec<&str> = main_rs.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter(|pair| pair[0] == "#[cfg(test)]")
        .filter_map(|pair| pair[1].strip_prefix("mod ")?.strip_suffix(';').map(str::to_string))
        .collect()
}

/// Code without `//` comments (doc comments cite modules freely) and string literals
/// left as they are (paths in strings are not imports, but none spells `crate::`).
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().map(|(i, line)| {
        let code = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        (i + 1, code)
    })
}

/// The top-level modules a piece of code names through `crate::`.
fn referenced_modules(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            // `crate::{a, b::c, d::{e, f}}`: the first segment of each top-level item.
            let mut depth = 0;
            let mut item_start = true;
            let mut word = String::new();
            for ch in group.chars() {
                if item_start && (ch.is_alphanumeric() || ch == '_') {
                    word.push(ch);
                    continue;
                }
                if item_start && !word.is_empty() {
                    found.push(std::mem::take(&mut word));
                    item_start = false;
                }
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    _ => {}
                }
            }
            if item_start && !word.is_empty() {
                found.push(word);
            }
        } else {
            let word: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !word.is_empty() {
                found.push(word);
            }
        }
        rest = after;
    }
    found
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

/// The top-level module a file under `src/` belongs to (`None` for `main.rs`).
fn owner(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next()?.as_os_str().to_str()?.to_string();
    match first.strip_suffix(".rs") {
        Some("main") => None,
        Some(name) => Some(name.to_string()),
        None => Some(first),
    }
}

/// Every use of a module declared at or below the user's own place: `file:line: a -> b`.
fn violations(src: &Path) -> Vec<String> {
    let order = declared_modules(&std::fs::read_to_string(src.join("main.rs")).unwrap());
    let rank: BTreeMap<&str, usize> = order.iter().enumerate().map(|(i, m)| (m.as_str(), i)).collect();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let Some(module) = owner(src, &file) else { continue };
        let Some(&own) = rank.get(module.as_str()) else {
            found.push(format!("{}: module {module} is not declared in main.rs", file.display()));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, code) in code_lines(&text) {
            for used in referenced_modules(code) {
                if used == module {
                    continue;
                }
                match rank.get(used.as_str()) {
                    Some(&other) if other < own => {}
                    Some(_) => found.push(format!("{}:{line}: {module} -> {used} (declared below it)", file.display())),
                    None => {
                        found.push(format!("{}:{line}: {module} -> {used} (not a top-level module)", file.display()))
                    }
                }
            }
        }
    }
    found
}

#[test]
fn every_module_uses_only_modules_declared_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = violations(&src);
    assert!(found.is_empty(), "imports against the flow of src/main.rs:\n{}", found.join("\n"));
}

#[test]
fn the_order_puts_leaves_first_and_commands_last() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let main_rs = std::fs::read_to_string(src.join("main.rs")).unwrap();
    let tests_only = test_only_modules(&main_rs);
    let order = declared_modules(&main_rs);
    let at = |m: &str| order.iter().position(|o| o == m).unwrap_or_else(|| panic!("{m} not declared"));
    assert_eq!(order.first().map(String::as_str), Some("util"));
    // Test-only modules come after everything; the last module of the binary is `cmd`.
    let product: Vec<&String> = order.iter().filter(|m| !tests_only.contains(m)).collect();
    assert!(order.ends_with(&tests_only), "test-only modules {tests_only:?} must be declared last");
    assert_eq!(product.last().map(|m| m.as_str()), Some("cmd"));
    // The flow: spec → queue → guard → model → gym → agent → judge → report → hooks.
    let flow = ["spec", "queue", "guard", "model", "gym", "agent", "judge", "report", "hooks", "run", "daemon"];
    for pair in flow.windows(2) {
        assert!(at(pair[0]) < at(pair[1]), "{} must come before {}", pair[0], pair[1]);
    }
}

#[test]
fn the_checker_sees_grouped_imports_and_ignores_comments() {
    assert_eq!(referenced_modules("use crate::{agent, judge::{self, X}, util};"), ["agent", "judge", "util"]);
    assert_eq!(referenced_modules("let x = crate::gym::Control::new(); crate::util::f()"), ["gym", "util"]);
    let text = "// crate::daemon is mentioned here\nuse crate::run;";
    let used: Vec<String> = code_lines(text).flat_map(|(_, code)| referenced_modules(code)).collect();
    assert_eq!(used, ["run"]);
}

#[test]
fn an_upward_import_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(src.join("main.rs"), "mod util;\nmod run;\nmod cmd;\n").unwrap();
    std::fs::write(src.join("util.rs"), "use crate::run::Thing;\n").unwrap();
    std::fs::write(src.join("run.rs"), "use crate::util;\n").unwrap();
    std::fs::create_dir(src.join("cmd")).unwrap();
    std::fs::write(src.join("cmd/mod.rs"), "use crate::{run, util};\n").unwrap();
    let found = violations(src);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].ends_with("util.rs:1: util -> run (declared below it)"), "{found:?}");
}
