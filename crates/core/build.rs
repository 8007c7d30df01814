//! Embeds the Python gym (`scripts/`) into the binary, so an installed `pruefstand`
//! needs no checkout: the files are written out next to the managed venv on first use.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    // The repository root, two folders above this crate.
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../..");
    let scripts = root.join("scripts");
    println!("cargo:rerun-if-changed={}", scripts.display());
    let mut files = Vec::new();
    collect(&scripts, &scripts, &mut files);
    files.sort();
    let mut out = String::from(
        "/// (path relative to scripts/, contents) of every gym file.\npub const GYM_FILES: &[(&str, &[u8])] = &[\n",
    );
    for rel in &files {
        let abs = scripts.join(rel);
        println!("cargo:rerun-if-changed={}", abs.display());
        writeln!(out, "    ({rel:?}, include_bytes!({:?})),", abs.display().to_string()).unwrap();
    }
    out.push_str("];\n");
    let dest = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("gym_files.rs");
    std::fs::write(dest, out).unwrap();
}

fn collect(base: &Path, dir: &Path, files: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        // vllm-cpu/ builds the real-server image; it is no part of the gym.
        if name == "__pycache__" || name == "vllm-cpu" || name.starts_with('.') {
            continue;
        }
        if path.is_dir() {
            println!("cargo:rerun-if-changed={}", path.display());
            collect(base, &path, files);
        } else if [".py", ".txt", ".md", ".json", ".yaml", ".yml"].iter().any(|ext| name.ends_with(ext)) {
            files.push(path.strip_prefix(base).unwrap().to_string_lossy().into_owned());
        }
    }
}
