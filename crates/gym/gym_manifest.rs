//! Reads `scripts/gym.manifest`, the allow-list of the files the binary embeds as the
//! gym: one path relative to `scripts/` a line, `#` starts a comment. Shared by
//! `build.rs` (which embeds exactly these files and fails naming one that is missing)
//! and the crate's tests (which check the embedded list against it), so both read the
//! list the same way. Not what the gym does with the files (`pyenv`).

use std::path::Path;

/// The listed paths, in the manifest's order, or the first bad line as
/// `gym.manifest:LINE: why`. A path must stay inside `scripts/` (relative, no `..`) and
/// be listed once.
pub fn parse(text: &str) -> Result<Vec<String>, String> {
    let mut paths: Vec<String> = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = index + 1;
        if line.starts_with('/') || line.split('/').any(|part| part.is_empty() || part == "." || part == "..") {
            return Err(format!("gym.manifest:{at}: {line:?} is not a plain path inside scripts/"));
        }
        if paths.iter().any(|seen| seen == line) {
            return Err(format!("gym.manifest:{at}: {line:?} is listed twice"));
        }
        paths.push(line.to_string());
    }
    if paths.is_empty() {
        return Err("gym.manifest lists no file".to_string());
    }
    Ok(paths)
}

/// The first listed path that is not a file under `scripts`, as an error naming it.
pub(crate) fn check_present(scripts: &Path, paths: &[String]) -> Result<(), String> {
    match paths.iter().find(|rel| !scripts.join(rel).is_file()) {
        Some(missing) => {
            Err(format!("scripts/gym.manifest lists {missing}, but {} is not a file", scripts.join(missing).display()))
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_come_in_order_without_comments_or_blank_lines() {
        let text = "# the gym\ngym.py\n\n  pruefstand_gym/runner.py  # the runner\nrequirements.txt\n";
        assert_eq!(parse(text).unwrap(), ["gym.py", "pruefstand_gym/runner.py", "requirements.txt"]);
    }

    #[test]
    fn a_path_out_of_scripts_or_listed_twice_is_refused_by_its_line() {
        for (text, line) in
            [("gym.py\n../Cargo.toml\n", 2), ("/etc/passwd\n", 1), ("a//b.py\n", 1), ("gym.py\n# x\ngym.py\n", 3)]
        {
            let err = parse(text).unwrap_err();
            assert!(err.starts_with(&format!("gym.manifest:{line}: ")), "{text:?}: {err}");
        }
        assert!(parse("# nothing\n\n").is_err(), "an empty list would ship no gym");
    }

    #[test]
    fn a_listed_file_that_is_missing_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("gym.py"), "").unwrap();
        std::fs::create_dir(dir.path().join("pkg")).unwrap();
        assert!(check_present(dir.path(), &["gym.py".into()]).is_ok());
        let err = check_present(dir.path(), &["gym.py".into(), "pkg".into(), "gone.py".into()]).unwrap_err();
        assert!(err.contains("lists pkg,"), "a folder is not a file: {err}");
    }
}
