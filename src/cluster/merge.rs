//! Merging a clustered run: the shards' records into one `cases.jsonl` in plan order
//! (what a single-host run writes), with the files `judge` reads beside it, and the
//! facts R1 checks — a shard that failed for good, shards whose provenance differs
//! (image, driver, model files), the nodes. Not here: judging (`run`'s path).

use std::collections::BTreeMap;

use serde_json::Value;

use super::{ArrayState, ExitRecord};
use crate::gym;
use crate::run::Served;
use pruefstand_core::inventory::Inventory;
use pruefstand_core::plan::Plan;
use pruefstand_core::record::{EnvCheck, GpuExclusivity, ModelServerFacts, ShardFacts, ShardNode};
use pruefstand_core::record::{Provenance, ShardProvenance};
use pruefstand_store::{PlanFile, RunDir, StoredCases};

/// Writes the merged run into `run_dir` from its shard directories; what the model
/// servers contribute to `run.json`. `failed` names shards that failed for good.
pub(super) fn merge(
    run_dir: &RunDir,
    plan: &Plan,
    inventory: &Inventory,
    state: &ArrayState,
    exits: &BTreeMap<usize, ExitRecord>,
    failed: Vec<String>,
) -> anyhow::Result<Served> {
    let shard_dirs: Vec<RunDir> =
        (0..state.shards).map(|i| RunDir::open(run_dir.shard(i).path())).collect::<anyhow::Result<_>>()?;
    let mut stored = StoredCases { records: BTreeMap::new(), damaged: Vec::new() };
    for shard in &shard_dirs {
        let read = shard.read_cases_lenient()?;
        stored.records.extend(read.records);
        stored.damaged.extend(read.damaged);
    }
    run_dir.write_plan(&PlanFile::new(plan, inventory))?;
    let records = run_dir.compact_cases(&plan.cases, &stored)?;
    gym::write_telemetry(run_dir, plan, &records)?;
    let per_shard = shard_dirs.iter().map(|dir| dir.read_environment_checks().map(Option::unwrap_or_default));
    let checks = merge_checks(per_shard.collect::<anyhow::Result<Vec<_>>>()?);
    run_dir.write_environment_checks(&checks)?;
    for shard in &shard_dirs {
        if run_dir.copy_version_from(shard)? {
            break;
        }
    }
    // A shard whose provenance cannot be read counts as one that recorded nothing.
    let provenances: Vec<(usize, String, Option<Provenance>)> = exits
        .iter()
        .map(|(i, exit)| (*i, exit.node.clone(), shard_dirs[*i].read::<Provenance>().ok().flatten()))
        .collect();
    let key = |p: &Option<Provenance>| provenance_key(p.as_ref().unwrap_or(&Provenance::default()));
    if let Some(mut provenance) = provenances.first().and_then(|(_, _, p)| p.clone()) {
        let shards = provenances.iter().map(|(i, node, p)| ShardProvenance {
            index: *i,
            node: node.clone(),
            provenance: key(p).into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        });
        provenance.shards = Some(shards.collect());
        run_dir.write(&provenance)?;
    }

    let nodes = (0..state.shards)
        .map(|i| ShardNode {
            index: i,
            node: exits.get(&i).map_or_else(|| "?".into(), |e| e.node.clone()),
            cases: shard_dirs[i].read_cases_lenient().map(|s| s.records.len()).unwrap_or(0),
            submissions: state.submissions_of(i),
        })
        .collect();
    let keyed: Vec<(String, BTreeMap<&'static str, Value>)> =
        provenances.iter().map(|(i, node, p)| (format!("shard {i} on {node}"), key(p))).collect();
    let digests: Vec<Option<String>> = exits.values().map(|e| e.image_digest.clone()).collect();
    Ok(Served {
        image_digest: digests.first().cloned().flatten(),
        model_server: merge_servers(exits),
        started_at: state.submitted_at.clone(),
        concurrency: None,
        gpu: Some(merge_gpu(exits)),
        shards: Some(ShardFacts { nodes, failed, differing: differing(&keyed) }),
        early_stop: None,
    })
}

/// GPU exclusivity over the shards: violated on any node (its events named by node),
/// exclusive when every shard observed it, else not observed.
fn merge_gpu(exits: &BTreeMap<usize, ExitRecord>) -> GpuExclusivity {
    let mut events = Vec::new();
    let mut all_exclusive = !exits.is_empty();
    for (i, exit) in exits {
        match &exit.gpu {
            GpuExclusivity::Violated { events: seen } => {
                events.extend(seen.iter().map(|e| format!("shard {i} on {}: {e}", exit.node)));
            }
            GpuExclusivity::Exclusive => {}
            GpuExclusivity::NotObserved => all_exclusive = false,
        }
    }
    if !events.is_empty() {
        GpuExclusivity::Violated { events }
    } else if all_exclusive {
        GpuExclusivity::Exclusive
    } else {
        GpuExclusivity::NotObserved
    }
}

/// The model servers' facts over the shards: None when no shard had a container; else
/// deaths and restarts summed, failed when any failed, events named by shard.
fn merge_servers(exits: &BTreeMap<usize, ExitRecord>) -> Option<ModelServerFacts> {
    let mut merged: Option<ModelServerFacts> = None;
    for (i, exit) in exits {
        let Some(facts) = &exit.model_server else { continue };
        let m = merged.get_or_insert_with(ModelServerFacts::default);
        m.deaths += facts.deaths;
        m.restarts += facts.restarts;
        m.failed |= facts.failed;
        m.events.extend(facts.events.iter().map(|e| format!("shard {i} on {}: {e}", exit.node)));
        if facts.failed {
            m.log_tail = facts.log_tail.clone();
        }
    }
    merged
}

/// What must be the same on every node for the shards to be one run: the image, the
/// driver and CUDA, the GPUs, the model and adapter files.
fn provenance_key(provenance: &Provenance) -> BTreeMap<&'static str, Value> {
    BTreeMap::from([
        ("image", provenance.image.as_ref().map_or(Value::Null, |image| image["id"].clone())),
        ("driver", provenance.driver_version().clone()),
        ("cuda", provenance.gpu["cuda_driver_version"].clone()),
        ("gpus", provenance.gpu["gpus"].clone()),
        ("model files", files_listed(&provenance.files["model"])),
        ("adapter files", files_listed(&provenance.files["adapter"])),
    ])
}

/// A folder's fingerprint without the clocks: each file's path with its size and
/// sha256 (mtimes left out, a copy to another node changes them), so that a
/// difference names the file.
fn files_listed(fingerprint: &Value) -> Value {
    let Some(files) = fingerprint["files"].as_array() else { return Value::Null };
    let listed = files.iter().map(|f| {
        let path = f["path"].as_str().map_or_else(|| f["path"].to_string(), str::to_string);
        (path, serde_json::json!([f["size"], f["sha256"]]))
    });
    let mut listed: serde_json::Map<String, Value> = listed.collect();
    if let Some(folder) = fingerprint["path"].as_str() {
        listed.insert(".".into(), Value::from(folder));
    }
    Value::Object(listed)
}

/// The files (by path in their folder) on which two listings differ.
fn differing_files(first: &Value, other: &Value) -> Option<Vec<String>> {
    let (Some(first), Some(other)) = (first.as_object(), other.as_object()) else { return None };
    let names: std::collections::BTreeSet<&String> = first.keys().chain(other.keys()).collect();
    Some(names.into_iter().filter(|n| first.get(*n) != other.get(*n)).map(|n| n.to_string()).collect())
}

/// Each provenance field on which a shard differs from the first, in words.
fn differing(keyed: &[(String, BTreeMap<&'static str, Value>)]) -> Vec<String> {
    let Some((first_name, first)) = keyed.first() else { return Vec::new() };
    let mut found = Vec::new();
    for (name, key) in &keyed[1..] {
        for (field, value) in key {
            if first.get(field) == Some(value) {
                continue;
            }
            match differing_files(&first[field], value) {
                Some(files) => found.push(format!(
                    "{field}: {name} has other files than {first_name} in {}: {}",
                    value["."].as_str().unwrap_or("?"),
                    files.join(", ")
                )),
                None => found.push(format!("{field}: {first_name} has {}, {name} has {value}", first[field])),
            }
        }
    }
    found
}

/// Environment checks over the shards: one per (suite, injection task); a failure
/// anywhere wins.
fn merge_checks(per_shard: Vec<Vec<EnvCheck>>) -> Vec<EnvCheck> {
    let mut merged: BTreeMap<(String, String), EnvCheck> = BTreeMap::new();
    for check in per_shard.into_iter().flatten() {
        let key = (check.suite.clone(), check.injection_task.clone());
        match merged.get(&key) {
            Some(kept) if kept.status == pruefstand_core::record::EnvStatus::Failed => {}
            _ => {
                merged.insert(key, check);
            }
        }
    }
    merged.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pruefstand_core::record::EnvStatus;

    fn provenance(image: &str, driver: &str) -> Provenance {
        serde_json::from_value(
            serde_json::json!({"image": {"id": image}, "gpu": {"driver_version": driver, "gpus": ["Thor"]},
                           "files": {"model": {"files": [{"path": "w.safetensors", "size": 5, "sha256": null,
                                                          "mtime": "2026-01-01"}]}}}),
        )
        .unwrap()
    }

    #[test]
    fn the_same_provenance_everywhere_differs_nowhere() {
        let a = provenance("sha256:1", "580.1");
        let mut b = a.clone();
        // A copy of the model files elsewhere has another mtime: still the same files.
        b.files["model"]["files"][0]["mtime"] = "2026-02-02".into();
        let keyed = vec![("shard 0 on a".into(), provenance_key(&a)), ("shard 1 on b".into(), provenance_key(&b))];
        assert!(differing(&keyed).is_empty());
    }

    #[test]
    fn another_image_or_driver_on_one_node_is_named() {
        let keyed = vec![
            ("shard 0 on a".into(), provenance_key(&provenance("sha256:1", "580.1"))),
            ("shard 1 on b".into(), provenance_key(&provenance("sha256:1", "580.1"))),
            ("shard 2 on c".into(), provenance_key(&provenance("sha256:2", "575.0"))),
        ];
        let found = differing(&keyed);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().any(|f| f.starts_with("driver: shard 0 on a has \"580.1\", shard 2 on c has \"575.0\"")));
        assert!(found.iter().any(|f| f.starts_with("image:") && f.contains("shard 2 on c")));
    }

    #[test]
    fn a_node_with_another_copy_of_a_file_is_named_with_the_file() {
        let a = provenance("sha256:1", "580.1");
        let mut b = a.clone();
        b.files["model"]["path"] = "/models/m".into();
        b.files["model"]["files"][0]["sha256"] = "ff".into();
        let mut a = a;
        a.files["model"]["path"] = "/models/m".into();
        let keyed = vec![("shard 0 on n1".into(), provenance_key(&a)), ("shard 1 on n2".into(), provenance_key(&b))];
        assert_eq!(
            differing(&keyed),
            ["model files: shard 1 on n2 has other files than shard 0 on n1 in /models/m: w.safetensors"]
        );
    }

    fn exit(node: &str, gpu: GpuExclusivity) -> ExitRecord {
        ExitRecord { node: node.into(), gpu, ..ExitRecord::default() }
    }

    #[test]
    fn gpu_exclusivity_is_violated_anywhere_or_exclusive_everywhere() {
        let all =
            BTreeMap::from([(0, exit("a", GpuExclusivity::Exclusive)), (1, exit("b", GpuExclusivity::Exclusive))]);
        assert_eq!(merge_gpu(&all), GpuExclusivity::Exclusive);
        let one_unobserved =
            BTreeMap::from([(0, exit("a", GpuExclusivity::Exclusive)), (1, exit("b", GpuExclusivity::NotObserved))]);
        assert_eq!(merge_gpu(&one_unobserved), GpuExclusivity::NotObserved);
        let violated = BTreeMap::from([
            (0, exit("a", GpuExclusivity::Exclusive)),
            (1, exit("b", GpuExclusivity::Violated { events: vec!["pid 9 (python)".into()] })),
        ]);
        assert_eq!(
            merge_gpu(&violated),
            GpuExclusivity::Violated { events: vec!["shard 1 on b: pid 9 (python)".into()] }
        );
    }

    #[test]
    fn environment_checks_merge_to_one_per_task_with_failures_kept() {
        let check = |task: &str, status| EnvCheck {
            suite: "banking".into(),
            injection_task: task.into(),
            status,
            detail: None,
        };
        let merged = merge_checks(vec![
            vec![check("injection_task_1", EnvStatus::Failed), check("injection_task_4", EnvStatus::Ok)],
            vec![check("injection_task_1", EnvStatus::Ok), check("injection_task_4", EnvStatus::Ok)],
        ]);
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0].status, EnvStatus::Failed);
    }
}
