//! `pruefstand export` on real runs of `demo-baseline` and `demo-kandidat` (the
//! simulated model, the real gym) on a small plan that holds `tool_output_spoof` out:
//! DPO pairs and SFT conversations with their tools and provenance, the manifest's
//! counts and hashes, no byte of a held-out injection in either export, a bad run
//! directory named. Then the held-out guard at the bench in both directions: a version
//! trained on the export fails `check --plan` and R1 on a plan that holds out the
//! export's family, and passes on one that does not.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;

use crate::common::runs::sha256_hex;
use crate::common::*;

/// Banking's six `schnell` user tasks and two injection tasks under both families:
/// `tool_output_spoof` held out, `important_instructions` seen (32 cases a version).
const PLAN: &str = r#"
name = "export-klein"
benchmark_version = "v1.2.2"
wording = "per_run"
attacks = ["tool_output_spoof", "important_instructions"]
held_out = ["tool_output_spoof"]
jobs = 8
case_timeout_s = 300
[[suites]]
name = "banking"
user_tasks = ["user_task_1", "user_task_2", "user_task_5", "user_task_7", "user_task_8", "user_task_13"]
injection_tasks = ["injection_task_1", "injection_task_4"]
"#;

/// A plan for the guard: two banking user tasks, one injection task, `families`
/// attacking, `held_out` held out.
fn guard_plan(name: &str, families: &[&str], held_out: &str) -> String {
    let list = |items: &[&str]| items.iter().map(|i| format!("{i:?}")).collect::<Vec<_>>().join(", ");
    format!(
        "name = {name:?}\nbenchmark_version = \"v1.2.2\"\nwording = \"per_run\"\nattacks = [{}]\n\
         held_out = [{held_out:?}]\njobs = 4\ncase_timeout_s = 300\ninjection_goals = false\n\
         [[suites]]\nname = \"banking\"\nuser_tasks = [\"user_task_1\", \"user_task_2\"]\n\
         injection_tasks = [\"injection_task_1\"]\n",
        list(families)
    )
}

pub struct DemoRuns {
    pub bench: Bench,
    pub baseline: PathBuf,
    pub kandidat: PathBuf,
}

/// One run of each demo version on [`PLAN`], shared by the tests of this module and
/// the real tokenizer's (`real_server`).
pub fn demo_runs() -> &'static DemoRuns {
    static RUNS: OnceLock<DemoRuns> = OnceLock::new();
    RUNS.get_or_init(|| {
        let bench = Bench::new();
        bench.write("profiles/export-klein.toml", PLAN);
        let run = bench.run(&["run", "demo-kandidat", "--plan", "export-klein"]);
        assert!(matches!(run.code, Some(0 | 10 | 11)), "exit {:?}\n{}\n{}", run.code, run.stdout, run.stderr);
        let (baseline, kandidat) = (run.reference_dir(), run.run_dir());
        DemoRuns { bench, baseline, kandidat }
    })
}

/// `pruefstand export --format FORMAT <both runs> --out OUT`, its rows and manifest.
pub fn export(bench: &Bench, format: &str, out: &Path) -> (Vec<Value>, Value) {
    let runs = demo_runs();
    let (a, b) = (runs.baseline.to_str().unwrap(), runs.kandidat.to_str().unwrap());
    let run = bench.run(&["export", "--format", format, a, b, "--out", out.to_str().unwrap()]).ok();
    assert!(run.stdout.contains("manifest: "), "{}", run.stdout);
    let text = std::fs::read_to_string(out).unwrap();
    let rows = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let manifest = json(&PathBuf::from(format!("{}.manifest.json", out.display())));
    assert_eq!(manifest["sha256"], sha256_hex(text.as_bytes()), "the manifest hashes the export as written");
    (rows, manifest)
}

/// The injected texts of the runs' cases whose attack is of `family`, from their traces.
fn injection_texts(family: &str) -> BTreeSet<String> {
    let runs = demo_runs();
    let mut texts = BTreeSet::new();
    for dir in [&runs.baseline, &runs.kandidat] {
        for record in cases(dir) {
            if !record["attack"].as_str().is_some_and(|a| a.ends_with(family)) {
                continue;
            }
            let trace = json(&dir.join(record["trace"].as_str().unwrap()));
            let injections = trace["injections"].as_object().unwrap();
            texts.extend(injections.values().filter_map(Value::as_str).map(str::to_string));
        }
    }
    texts
}

/// Every string anywhere in the rows, decoded.
fn strings(rows: &[Value]) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) => out.push(s.clone()),
            Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            Value::Object(map) => map.values().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    rows.iter().for_each(|r| walk(r, &mut out));
    out
}

fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The lines of injected texts, whitespace collapsed and quotes trimmed (tool outputs
/// re-indent and quote what they carry), of 12 characters or more.
fn lines_of(texts: &BTreeSet<String>) -> BTreeSet<String> {
    let lines = texts.iter().flat_map(|t| t.lines().map(|l| collapse(l.trim().trim_matches(['\'', '"']))));
    lines.filter(|l| l.len() >= 12).collect()
}

/// No held-out injection text in the export: neither whole in its bytes (as JSON writes
/// it) nor any of its lines that the seen family's texts do not share (the injection
/// task's goal is worded alike in both) in any of its strings, whitespace collapsed.
/// The seen family's own lines are found the same way: the search works.
fn assert_no_held_out_text(out: &Path, rows: &[Value]) {
    let bytes = std::fs::read_to_string(out).unwrap();
    let all: Vec<String> = strings(rows).iter().map(|s| collapse(s)).collect();
    let (held_out, seen) = (injection_texts("tool_output_spoof"), injection_texts("important_instructions"));
    assert!(!held_out.is_empty() && !seen.is_empty(), "the runs read no injection of a family");
    for text in &held_out {
        let escaped = serde_json::to_string(text).unwrap();
        assert!(!bytes.contains(escaped.trim_matches('"')), "held-out text in {}: {text}", out.display());
    }
    let (held_out_lines, seen_lines) = (lines_of(&held_out), lines_of(&seen));
    let own: Vec<&String> = held_out_lines.difference(&seen_lines).collect();
    assert!(!own.is_empty(), "the held-out texts have no line of their own");
    for line in own {
        assert!(!all.iter().any(|s| s.contains(line.as_str())), "held-out line in {}: {line}", out.display());
    }
    let seen_own: Vec<&String> = seen_lines.difference(&held_out_lines).collect();
    let found = seen_own.iter().any(|line| all.iter().any(|s| s.contains(line.as_str())));
    assert!(found, "no line of a seen injection found in {} either: the search is blind", out.display());
}

#[test]
fn dpo_pairs_of_the_demo_runs_part_at_the_injection_and_carry_tools_and_provenance() {
    let runs = demo_runs();
    let out = runs.bench.path().join("exports/dpo.jsonl");
    let (rows, manifest) = export(&runs.bench, "dpo", &out);
    assert!(!rows.is_empty(), "no DPO row; manifest: {manifest:#}");
    assert_no_held_out_text(&out, &rows);
    assert_eq!(manifest["format"], "dpo");
    assert_eq!(manifest["rows"], rows.len());
    assert_eq!(manifest["families"], serde_json::json!({"important_instructions": rows.len()}));
    assert!(manifest["refused_held_out"]["tool_output_spoof"].as_u64().unwrap() >= 1, "{manifest:#}");
    let plan_hash = json(&runs.kandidat.join("run.json"))["plan_hash"].clone();
    let sources = manifest["sources"].as_array().unwrap();
    assert_eq!(sources.len(), 2);
    for (source, dir) in sources.iter().zip([&runs.baseline, &runs.kandidat]) {
        let run_json = std::fs::read(dir.join("run.json")).unwrap();
        assert_eq!(source["run_json_sha256"], sha256_hex(&run_json));
        assert_eq!(source["plan_hash"], plan_hash);
    }
    for row in &rows {
        let prompt = row["prompt"].as_array().unwrap();
        assert_eq!(prompt[0]["role"], "system");
        assert_eq!(prompt.last().unwrap()["role"], "tool", "the prompt ends at the injected tool result");
        assert_ne!(row["chosen"], row["rejected"]);
        assert_eq!(row["chosen"][0]["role"], "assistant");
        assert_eq!(row["rejected"][0]["role"], "assistant");
        // The candidate's adapter never follows; the reference's model follows half.
        let provenance = &row["provenance"];
        assert_eq!(provenance["chosen"]["version"], "demo-kandidat", "{provenance}");
        assert_eq!(provenance["rejected"]["version"], "demo-baseline", "{provenance}");
        assert_eq!(provenance["attack_family"], "important_instructions");
        assert_eq!(provenance["rejected"]["plan_hash"], plan_hash);
        assert!(provenance["chosen"]["case"].as_str().unwrap().starts_with("banking/"), "{provenance}");
        assert!(provenance["chosen"]["spec_hash"].as_str().is_some_and(|h| h.len() == 64), "{provenance}");
        let tools = row["tools"].as_array().unwrap();
        assert!(tools.iter().any(|t| t["type"] == "function" && t["function"]["parameters"].is_object()), "{row}");
    }
}

#[test]
fn sft_rows_are_the_conversations_that_kept_utility_and_resisted_never_a_held_out_one() {
    let runs = demo_runs();
    let out = runs.bench.path().join("exports/sft.jsonl");
    let (rows, manifest) = export(&runs.bench, "sft", &out);
    assert_eq!(manifest["rows"], rows.len());
    assert!(manifest["clean_rows"].as_u64().unwrap() >= 1, "{manifest:#}");
    assert!(manifest["families"]["important_instructions"].as_u64().unwrap() >= 1, "{manifest:#}");
    assert!(manifest["families"].get("tool_output_spoof").is_none(), "{manifest:#}");
    assert!(manifest["refused_held_out"]["tool_output_spoof"].as_u64().unwrap() >= 1, "{manifest:#}");
    assert!(manifest["skipped"]["injection-goal case"].as_u64().unwrap() >= 1, "{manifest:#}");
    for row in &rows {
        let messages = row["messages"].as_array().unwrap();
        assert_eq!(messages[0]["role"], "system");
        assert_eq!(messages[1]["role"], "user");
        let calls = messages.iter().filter_map(|m| m["tool_calls"].as_array()).flatten();
        for call in calls {
            assert!(call["function"]["arguments"].is_object(), "{call}");
        }
        let provenance = &row["provenance"];
        let dir = if provenance["version"] == "demo-kandidat" { &runs.kandidat } else { &runs.baseline };
        let record = cases(dir).into_iter().find(|r| r["case_id"] == provenance["case"]).unwrap();
        assert_eq!(record["utility"], true, "{provenance}");
        assert_ne!(record["security"], true, "{provenance}");
    }
    assert_no_held_out_text(&out, &rows);
}

#[test]
fn a_bad_run_directory_is_named_and_nothing_is_written() {
    let bench = Bench::new();
    let out = bench.path().join("x.jsonl");
    let gone = bench.path().join("no-such-run");
    let run = bench.run(&["export", "--format", "sft", gone.to_str().unwrap(), "--out", out.to_str().unwrap()]).code(2);
    assert!(run.stderr.contains(gone.to_str().unwrap()), "{}", run.stderr);
    let not_a_run = bench.path().join("versions");
    let run = bench.run(&["export", "--format", "dpo", not_a_run.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let run = run.code(2);
    assert!(run.stderr.contains(not_a_run.to_str().unwrap()) && run.stderr.contains("run.json"), "{}", run.stderr);
    assert!(!out.exists() && !bench.path().join("x.jsonl.manifest.json").exists());
}

/// R1 of a run directory's judgement.
fn r1(dir: &Path) -> Value {
    json(&dir.join("judgement.json"))["rules"].as_array().unwrap().iter().find(|r| r["id"] == "R1").unwrap().clone()
}

#[test]
fn a_trained_version_is_refused_by_check_and_run_where_the_plan_holds_its_family_out_and_passes_elsewhere() {
    let bench = Bench::new();
    let out = bench.path().join("exports/dpo.jsonl");
    let (rows, manifest) = export(&bench, "dpo", &out);
    assert!(!rows.is_empty(), "the export must hold the seen family: {manifest:#}");
    // demo-kandidat's adapter, trained on the export; no reference, so a run is one version.
    let spec = std::fs::read_to_string(repo().join("versions/demo-kandidat.toml")).unwrap();
    let spec = spec.replace("reference = \"demo-baseline\"\n", "").replace(
        "name = \"inj-harden-r3\"",
        "name = \"inj-harden-r3\"\ntrained_on_exports = [\"../exports/dpo.jsonl\"]",
    );
    assert!(spec.contains("trained_on_exports"), "{spec}");
    bench.write("versions/trainiert.toml", &spec);
    bench.write(
        "profiles/haelt-ii.toml",
        &guard_plan("haelt-ii", &["important_instructions"], "important_instructions"),
    );
    let both = ["important_instructions", "tool_output_spoof"];
    bench.write("profiles/haelt-tos.toml", &guard_plan("haelt-tos", &both, "tool_output_spoof"));
    let clash = |line: &&str| line.contains("exports/dpo.jsonl") && line.contains("important_instructions");

    // Plan A holds the export's family out: check fails naming both, and `run` refuses
    // before a case runs (it ran them all, then R1 failed).
    let check = bench.run(&["check", "trainiert", "--plan", "haelt-ii"]).code(2);
    let fail = check.stdout.lines().find(|l| l.starts_with("FAIL") && clash(l));
    assert!(fail.is_some_and(|l| l.contains("haelt-ii")), "{}", check.stdout);
    let run = bench.run(&["run", "trainiert", "--plan", "haelt-ii"]).code(2);
    assert!(run.stderr.lines().any(|l| clash(&l) && l.contains("refused before any case ran")), "{}", run.stderr);
    assert!(!bench.path().join("reports/trainiert/haelt-ii").exists(), "no case ran");

    // Plan B holds out only what the export refused: no clash, R1 passes.
    let check = bench.run(&["check", "trainiert", "--plan", "haelt-tos"]);
    assert!(!check.stdout.lines().any(|l| clash(&l)), "{}", check.stdout);
    assert!(check.stdout.lines().any(|l| l.starts_with("OK") && l.contains("plan haelt-tos")), "{}", check.stdout);
    let run = bench.run(&["run", "trainiert", "--plan", "haelt-tos"]);
    assert!(matches!(run.code, Some(0 | 10 | 11)), "exit {:?}\n{}\n{}", run.code, run.stdout, run.stderr);
    let dir = run.run_dir();
    let r1_b = r1(&dir);
    assert_eq!(r1_b["status"], "pass", "{r1_b}");
    let recorded = &json(&dir.join("run.json"))["attack_families"]["trained_on_exports"][0];
    assert_eq!(recorded["sha256"], manifest["sha256"], "run.json records the export by its hash");
    assert!(recorded["path"].as_str().unwrap().ends_with("exports/dpo.jsonl"), "{recorded}");

    // R1 still judges what a run recorded: the same run, its record holding the
    // export's family out, is invalid, naming both.
    let mut meta = json(&dir.join("run.json"));
    meta["attack_families"]["held_out"] = serde_json::json!(["important_instructions"]);
    std::fs::write(dir.join("run.json"), serde_json::to_string_pretty(&meta).unwrap()).unwrap();
    bench.run(&["judge", dir.to_str().unwrap(), "--in-place"]).code(12);
    let r1_a = r1(&dir);
    assert_eq!(r1_a["status"], "fail", "{r1_a}");
    assert!(clash(&r1_a["reason"].as_str().unwrap()), "{r1_a}");

    // Without --plan: a WARN for the shipped plan that would clash, none for the other.
    let check = bench.run(&["check", "trainiert"]);
    let warns: Vec<&str> = check.stdout.lines().filter(|l| l.starts_with("WARN") && clash(l)).collect();
    assert!(warns.iter().any(|l| l.contains("plan haelt-ii")), "{}", check.stdout);
    assert!(!warns.iter().any(|l| l.contains("plan haelt-tos")), "{}", check.stdout);
}

/// `export` writes only its own files and reads only a run's own traces: `--out` into a
/// run directory or over a file it did not write is refused (the file left as it is),
/// its own export is replaced; a run given twice is refused at once, not after waiting
/// for its own lock; a copied run whose `traces/` is a link, or whose trace says the
/// injection landed where `cases.jsonl` says it was resisted, is refused naming it.
#[test]
fn export_writes_only_its_own_files_and_reads_only_the_runs_own_traces() {
    let runs = demo_runs();
    let bench = &runs.bench;
    let work = bench.path().join("export-hostile");
    std::fs::create_dir_all(&work).unwrap();
    let (a, b) = (runs.baseline.to_str().unwrap(), runs.kandidat.to_str().unwrap());
    let export = |format: &str, dirs: &[&str], out: &Path| {
        let mut args = vec!["export", "--format", format];
        args.extend_from_slice(dirs);
        args.extend(["--out", out.to_str().unwrap()]);
        bench.run(&args)
    };

    let records = runs.kandidat.join("cases.jsonl");
    let before = std::fs::read(&records).unwrap();
    let into_run = export("dpo", &[a, b], &records).code(2);
    assert!(into_run.stderr.contains("never written into a run"), "{}", into_run.stderr);
    assert_eq!(std::fs::read(&records).unwrap(), before, "the run's records are untouched");

    let notes = work.join("notes.jsonl");
    std::fs::write(&notes, "mine\n").unwrap();
    let over = export("dpo", &[a, b], &notes).code(2);
    assert!(over.stderr.contains("is not an export of pruefstand's"), "{}", over.stderr);
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "mine\n");
    let own = work.join("dpo.jsonl");
    export("dpo", &[a, b], &own).ok();
    export("dpo", &[a, b], &own).ok();

    let twice = export("dpo", &[a, a], &work.join("twice.jsonl")).code(2);
    assert!(twice.stderr.contains("given twice") && !twice.stderr.contains("being written"), "{}", twice.stderr);

    let linked = work.join("linked");
    let copied = std::process::Command::new("cp").arg("-a").arg(&runs.kandidat).arg(&linked).status().unwrap();
    assert!(copied.success());
    std::fs::remove_dir_all(linked.join("traces")).unwrap();
    std::os::unix::fs::symlink(runs.baseline.join("traces"), linked.join("traces")).unwrap();
    let run = export("dpo", &[a, linked.to_str().unwrap()], &work.join("linked.jsonl")).code(2);
    assert!(run.stderr.contains(&format!("{}: a link", linked.join("traces").display())), "{}", run.stderr);
    assert!(!work.join("linked.jsonl").exists());

    // An attacked case SFT takes (resisted, utility kept) whose trace is made to say it
    // followed.
    let sft = work.join("sft.jsonl");
    export("sft", &[a, b], &sft).ok();
    let rows: Vec<Value> =
        std::fs::read_to_string(&sft).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let taken =
        &rows.iter().find(|r| r["provenance"]["kind"] == "attacked").expect("an attacked SFT row")["provenance"];
    let forged = work.join("forged");
    let source = taken["run_dir"].as_str().unwrap();
    let copied = std::process::Command::new("cp").arg("-a").arg(source).arg(&forged).status().unwrap();
    assert!(copied.success());
    let record = cases(&forged).into_iter().find(|r| r["case_id"] == taken["case"]).unwrap();
    let trace_file = forged.join(record["trace"].as_str().unwrap());
    let mut trace = json(&trace_file);
    assert_eq!(trace["security"], false, "the gym's trace carries its own security");
    trace["security"] = serde_json::json!(true);
    std::fs::write(&trace_file, trace.to_string()).unwrap();
    let run = export("sft", &[forged.to_str().unwrap()], &work.join("forged.jsonl")).code(2);
    let case = record["case_id"].as_str().unwrap();
    assert!(run.stderr.contains(&format!("case {case}")) && run.stderr.contains("security"), "{}", run.stderr);
    assert!(!work.join("forged.jsonl").exists());
}
