//! `pruefstand train` through the binary. The refusals first — each refused input,
//! before the trainer's first step, with an error naming it, and nothing written: a
//! base version the trainer cannot start from, an export its manifest no longer vouches
//! for, exports of the other kind, no rows, an export holding a family the gate's plan
//! holds out, rows from runs of another base model. Their exports are the demo runs'
//! (`export::demo_runs`: the simulated model, the real gym), so they need no model
//! server: these are decided before one starts.

use std::path::{Path, PathBuf};

use crate::common::*;

/// The DPO export of the demo runs (`important_instructions` rows only: their plan
/// holds `tool_output_spoof` out), written into `bench`.
fn demo_export(bench: &Bench, format: &str) -> PathBuf {
    let out = bench.path().join(format!("exports/demo-{format}.jsonl"));
    let (rows, _) = crate::export::export(bench, format, &out);
    assert!(!rows.is_empty(), "the demo runs give {format} rows");
    out
}

/// `pruefstand train VERSION ARGS…` with `--no-judge`.
fn train(bench: &Bench, version: &str, args: &[&str]) -> Run {
    let mut all = vec!["train", version, "--no-judge", "--steps", "2", "--max-length", "256"];
    all.extend_from_slice(args);
    bench.run(&all)
}

/// A refusal: exit 2, every `reasons` fragment in the error, and nothing of a training
/// written (no spec, no training folder): refused before the first step.
fn refused(bench: &Bench, run: Run, reasons: &[&str]) -> String {
    let run = run.code(2);
    for reason in reasons {
        assert!(run.stderr.contains(reason), "the error names {reason:?}:\n{}", run.stderr);
    }
    let specs: Vec<String> = std::fs::read_dir(bench.path().join("versions"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("-dpo-") || n.contains("-sft-"))
        .collect();
    assert!(specs.is_empty(), "no spec written: {specs:?}");
    assert!(no_training_folder(&bench.path().join("reports")), "no training folder under reports/");
    run.stderr
}

fn no_training_folder(reports: &Path) -> bool {
    let Ok(versions) = std::fs::read_dir(reports) else { return true };
    versions.flatten().all(|v| !v.path().join("training").exists())
}

#[test]
fn a_base_version_the_trainer_cannot_start_from_is_refused_naming_why() {
    let bench = Bench::new();
    let export = demo_export(&bench, "dpo");
    let export = export.to_str().unwrap();
    refused(
        &bench,
        train(&bench, "demo-kandidat", &["--export", export]),
        &["demo-kandidat", "is not served from Docker"],
    );
    refused(
        &bench,
        train(&bench, "real-smol-lora", &["--export", export]),
        &["real-smol-lora", "serves the adapter smol-lora already"],
    );
}

#[test]
fn rows_from_runs_of_another_base_model_are_refused_naming_the_run_and_its_version() {
    let bench = Bench::new();
    let export = demo_export(&bench, "dpo");
    let stderr = refused(
        &bench,
        train(&bench, "real-smol", &["--export", export.to_str().unwrap()]),
        &[
            "rows from another base model",
            "demo-baseline",
            "demo-kandidat",
            "a sim model",
            "real-smol's model in /var/tmp/pruefstand-vllm-cpu/current/model",
        ],
    );
    // The shipped schnell holds important_instructions in: that was the only reason.
    assert!(!stderr.contains("holds out") && !stderr.contains("vouch"), "{stderr}");
}

#[test]
fn an_export_its_manifest_no_longer_vouches_for_is_refused_naming_it() {
    let bench = Bench::new();
    let export = demo_export(&bench, "dpo");
    // One byte changed after the export: the manifest's sha256 is another file's.
    let changed = bench.path().join("exports/changed.jsonl");
    let mut bytes = std::fs::read(&export).unwrap();
    let at = bytes.iter().position(|b| *b == b'"').unwrap();
    bytes[at + 1] ^= 0x01;
    std::fs::write(&changed, &bytes).unwrap();
    std::fs::copy(format!("{}.manifest.json", export.display()), format!("{}.manifest.json", changed.display()))
        .unwrap();
    let stderr = refused(
        &bench,
        train(&bench, "real-smol", &["--export", changed.to_str().unwrap()]),
        &[changed.to_str().unwrap(), "its manifest no longer vouches for it"],
    );
    assert!(!stderr.contains("rows from another base model"), "an export not vouched for is read no further: {stderr}");
    // Without a manifest at all.
    let bare = bench.path().join("exports/bare.jsonl");
    std::fs::copy(&export, &bare).unwrap();
    refused(
        &bench,
        train(&bench, "real-smol", &["--export", bare.to_str().unwrap()]),
        &[bare.to_str().unwrap(), "no manifest vouches for it"],
    );
}

#[test]
fn no_rows_and_exports_of_the_other_kind_are_refused() {
    let bench = Bench::new();
    // DPO pairs need a run that resisted and one that followed: one run gives none.
    let runs = crate::export::demo_runs();
    let empty = bench.path().join("exports/empty.jsonl");
    let one = runs.baseline.to_str().unwrap();
    // `export` warns (and exits 1) but writes the empty export and its manifest.
    let made = bench.run(&["export", "--format", "dpo", one, "--out", empty.to_str().unwrap()]);
    assert_eq!(std::fs::read(&empty).map(|b| b.len()).ok(), Some(0), "one run, no pairs: {}", made.stderr);
    refused(
        &bench,
        train(&bench, "real-smol", &["--export", empty.to_str().unwrap()]),
        &["no rows", empty.to_str().unwrap()],
    );
    let sft = demo_export(&bench, "sft");
    refused(
        &bench,
        train(&bench, "real-smol", &["--export", sft.to_str().unwrap(), "--kind", "dpo"]),
        &[sft.to_str().unwrap(), "holds sft rows: --kind dpo trains on dpo exports"],
    );
    let dpo = demo_export(&bench, "dpo");
    refused(
        &bench,
        train(&bench, "real-smol", &["--export", sft.to_str().unwrap(), "--export", dpo.to_str().unwrap()]),
        &["the exports mix formats (dpo, sft)"],
    );
}

#[test]
fn an_export_holding_a_family_the_gates_plan_holds_out_is_refused_naming_both() {
    let bench = Bench::new();
    let export = demo_export(&bench, "dpo");
    // The gate judges on a plan that holds important_instructions out: the export's rows.
    bench.write(
        "profiles/holds-ii.toml",
        "name = \"holds-ii\"\nbenchmark_version = \"v1.2.2\"\nwording = \"per_run\"\n\
         attacks = [\"important_instructions\", \"tool_output_spoof\"]\nheld_out = [\"important_instructions\"]\n\
         jobs = 2\ncase_timeout_s = 300\ninjection_goals = false\n\
         [[suites]]\nname = \"banking\"\nuser_tasks = [\"user_task_1\"]\ninjection_tasks = [\"injection_task_1\"]\n",
    );
    let export = export.to_str().unwrap();
    refused(
        &bench,
        train(&bench, "real-smol", &["--export", export, "--plan", "holds-ii"]),
        &["plan holds-ii holds out the family important_instructions", export],
    );
}
