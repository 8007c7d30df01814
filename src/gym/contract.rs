//! The contract with the Python gym as files generated from the Rust code: the JSON
//! Schemas of the request pruefstand writes and of the case record the gym writes back,
//! and the constants the gym builds records and paths with (a case id's scheme, the
//! run files it writes). They are committed under `scripts/pruefstand_gym/schemas/`,
//! where the gym reads them (`schema.py`); the unit test here keeps them equal to the
//! Rust types, so the Python side restates none of it and cannot drift.
//!
//! `PRUEFSTAND_WRITE_SCHEMAS=1 cargo test --bin pruefstand schemas` writes them anew.

use std::path::Path;

use serde_json::{Value, json};

use super::GymRequest;
use pruefstand_core::case::{AgentStats, Case, CaseKind, CaseRecord};
use pruefstand_store::RunFile;

/// Where the contract's files live, relative to `scripts/` (embedded with the gym).
const SCHEMA_DIR: &str = "pruefstand_gym/schemas";

/// Every kind of case, each once.
const KINDS: [CaseKind; 3] = [CaseKind::Clean, CaseKind::Attacked, CaseKind::InjectionGoal];

/// The contract's files by name, as they are to be committed.
fn contract_files() -> Vec<(&'static str, Value)> {
    vec![
        ("case-record.schema.json", record_schema()),
        ("gym-request.schema.json", sorted(schemars::schema_for!(GymRequest))),
        ("constants.json", constants()),
    ]
}

/// A schema with its keys sorted, so the committed files do not follow schemars' order
/// of emitting.
fn sorted(schema: schemars::Schema) -> Value {
    let mut value = schema.to_value();
    value.sort_all_objects();
    value
}

/// The case record's schema, with the order of its fields (`x-field-order`): the schema's
/// own keys are sorted, and the gym writes a record's fields in the struct's order.
fn record_schema() -> Value {
    let mut record = sorted(schemars::schema_for!(CaseRecord));
    let sample = serde_json::to_value(CaseRecord::of(&Case::clean("s", "u"), None, None)).unwrap();
    let order: Vec<&String> = sample.as_object().unwrap().keys().collect();
    record["x-field-order"] = json!(order);
    record
}

/// A case of `kind` whose fields hold their own names in braces (`{suite}`, …): its id
/// is then the id scheme of crates/core/src/case.rs as a Python format string.
fn placeholder_case(kind: CaseKind) -> Case {
    match kind {
        CaseKind::Clean => Case::clean("{suite}", "{user_task}"),
        CaseKind::Attacked => Case::attacked("{suite}", "{user_task}", "{injection_task}", "{attack}"),
        CaseKind::InjectionGoal => Case::injection_goal("{suite}", "{injection_task}"),
    }
}

/// `constants.json`: what the gym spells like pruefstand without a type to hold it.
fn constants() -> Value {
    let case_id: serde_json::Map<String, Value> =
        KINDS.iter().map(|&kind| (kind_name(kind), json!(placeholder_case(kind).id))).collect();
    // The run files the gym's Python side writes itself, as the store names them.
    let run_files: serde_json::Map<String, Value> =
        RunFile::written_by_the_gym().into_iter().map(|(file, name)| (format!("{file:?}"), json!(name))).collect();
    json!({
        "description": "Constants of the contract with the gym, generated from pruefstand's Rust code \
            (src/gym/contract.rs); never edited by hand.",
        "case_id": case_id,
        "run_files": run_files,
        "agent_stats": field_names(&AgentStats::default()),
    })
}

/// The fields of a struct as it serialises, in their order (`AgentStats`: the counters an
/// agent reports, which the gym copies into the record fields of their names).
fn field_names(value: &impl serde::Serialize) -> Vec<String> {
    serde_json::to_value(value).unwrap().as_object().unwrap().keys().cloned().collect()
}

/// A kind as the records spell it.
fn kind_name(kind: CaseKind) -> String {
    serde_json::to_value(kind).unwrap().as_str().unwrap().to_string()
}

#[test]
fn the_committed_schemas_are_the_rust_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join(SCHEMA_DIR);
    for (name, content) in contract_files() {
        let text = serde_json::to_string_pretty(&content).unwrap() + "\n";
        let path = dir.join(name);
        if std::env::var_os("PRUEFSTAND_WRITE_SCHEMAS").is_some() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &text).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == text,
            "{} differs from the Rust code: run PRUEFSTAND_WRITE_SCHEMAS=1 cargo test --bin pruefstand schemas",
            path.display()
        );
    }
    let request = sorted(schemars::schema_for!(GymRequest));
    assert_eq!(request["properties"]["max_in_flight"]["maximum"], pruefstand_core::settings::MAX_IN_FLIGHT);
}

/// The id scheme covers every kind the record schema names, and each placeholder field
/// holds its own name (a constructor's arguments in the wrong order would not).
#[test]
fn the_id_scheme_is_complete_and_its_placeholders_are_their_fields() {
    let schema = record_schema();
    let kinds: Vec<&str> =
        schema["$defs"]["CaseKind"]["oneOf"].as_array().unwrap().iter().map(|k| k["const"].as_str().unwrap()).collect();
    assert_eq!(kinds, KINDS.map(kind_name));
    for kind in KINDS {
        let case = serde_json::to_value(placeholder_case(kind)).unwrap();
        for (field, value) in case.as_object().unwrap() {
            if let (Some(text), false) = (value.as_str(), ["id", "kind"].contains(&field.as_str())) {
                assert_eq!(text, format!("{{{field}}}"), "{kind:?}: `{field}`");
            }
        }
    }
}

/// Every counter an agent reports fills a record field of its name, and the agent's
/// reply carries each of them.
#[test]
fn the_agents_counters_are_record_fields() {
    let stats = field_names(&AgentStats::default());
    let record = serde_json::to_value(CaseRecord::of(&Case::clean("s", "u"), None, None)).unwrap();
    let missing: Vec<&String> = stats.iter().filter(|name| !record.as_object().unwrap().contains_key(*name)).collect();
    assert!(missing.is_empty(), "counters without a record field: {missing:?}");
    assert_eq!(stats.len(), 12, "{stats:?}");
}
