//! Embeds the Python gym into the binary, so an installed `pruefstand` needs no
//! checkout: the files are written out next to the managed venv on first use. Exactly
//! the files `scripts/gym.manifest` lists are embedded (an allow-list: a tool dropped
//! into `scripts/` never ships); a listed file that is missing fails the build.

use std::fmt::Write as _;
use std::path::PathBuf;

#[path = "gym_manifest.rs"]
mod gym_manifest;

fn main() {
    // The repository root, two folders above this crate.
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../..");
    let scripts = root.join("scripts");
    let manifest_path = scripts.join("gym.manifest");
    println!("cargo:rerun-if-changed={}", manifest_path.display());
    println!("cargo:rerun-if-changed=gym_manifest.rs");
    let text =
        std::fs::read_to_string(&manifest_path).unwrap_or_else(|e| panic!("reading {}: {e}", manifest_path.display()));
    let files = gym_manifest::parse(&text).unwrap_or_else(|e| panic!("scripts/{e}"));
    if let Err(e) = gym_manifest::check_present(&scripts, &files) {
        panic!("{e}");
    }
    let mut out = String::from(
        "/// (path relative to scripts/, contents) of every gym file, in `scripts/gym.manifest`'s order.\npub const GYM_FILES: &[(&str, &[u8])] = &[\n",
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
