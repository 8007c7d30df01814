//! The held-out guard at the bench: a version whose adapter was trained on an export
//! (`[adapter] trained_on_exports`, docs/training.md) holding rows of a family the plan
//! holds out has seen that family, and its held-out ASR bounds nothing. R1 fails on it;
//! `pruefstand check --plan` says the same before the run. A family the version
//! declares `trained_on` is seen for it, not held out (as R2 takes it), so no clash.
//!
//! Pure: the exports' families come from their manifests, read when the run was
//! recorded (`export::trained_exports`); nothing is read here.

use pruefstand_core::record::{AttackFamilies, TrainedExport};

/// One export holding a family the plan holds out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Clash {
    /// The export, or the manifest of the environment the adapter was trained online in.
    pub export: String,
    pub family: String,
    pub online: bool,
}

impl Clash {
    /// The clash in words, naming both the export (or environment manifest) and the family.
    pub fn describe(&self) -> String {
        match self.online {
            false => format!(
                "the adapter was trained on export {}, which holds rows of the held-out family {}",
                self.export, self.family
            ),
            true => format!(
                "the adapter was trained online in the environment of manifest {}, which offered cases of the held-out family {}",
                self.export, self.family
            ),
        }
    }
}

/// Every (export, family) where an export holds a family of `held_out`, in the order
/// the exports are listed.
pub fn clashes(held_out: &[String], exports: &[TrainedExport]) -> Vec<Clash> {
    exports
        .iter()
        .flat_map(|export| {
            export.families.iter().filter(|family| held_out.contains(family)).map(|family| Clash {
                export: export.path.clone(),
                family: family.clone(),
                online: export.online,
            })
        })
        .collect()
}

/// The families a plan holds out from a version: the plan's `held_out` less what the
/// version declares `trained_on` (declared, a family is seen, as R2 takes it; the
/// guard is against training on one that is still taken for held out).
pub fn held_out_for(held_out: &[String], trained_on: &[String]) -> Vec<String> {
    held_out.iter().filter(|f| !trained_on.contains(f)).cloned().collect()
}

/// What to do about a clash, as `check --plan` and a refused `run` or `start` say it.
pub const FIX: &str = "train on an export of runs whose plans hold this family out (`pruefstand export` refuses their held-out families) or in an environment of such a plan (`pruefstand_env` leaves them out), or run a plan that does not hold it out";

/// Why `version` may not run on `plan` at all: the clashes `check --plan` fails on, in
/// its words, and the fix; None without one. `run` and `start` refuse on it before a
/// case runs (R1 would find the run invalid after all of them).
pub fn refusal(
    plan: &str,
    version: &str,
    held_out: &[String],
    trained_on: &[String],
    exports: &[TrainedExport],
) -> Option<String> {
    let clashes = clashes(&held_out_for(held_out, trained_on), exports);
    if clashes.is_empty() {
        return None;
    }
    let lines: Vec<String> =
        clashes.iter().map(|clash| format!("plan {plan}: {} (version {version})", clash.describe())).collect();
    Some(format!("{} → {FIX}", lines.join("; ")))
}

/// R1's problems for a run's families: one line per clash.
pub fn problems(families: &AttackFamilies) -> Vec<String> {
    let held_out = held_out_for(&families.held_out, &families.trained_on);
    clashes(&held_out, &families.trained_on_exports).iter().map(Clash::describe).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export(path: &str, families: &[&str]) -> TrainedExport {
        TrainedExport {
            path: path.into(),
            sha256: "ab".into(),
            families: families.iter().map(|f| f.to_string()).collect(),
            online: false,
        }
    }

    #[test]
    fn an_environment_that_offered_a_held_out_family_clashes_naming_its_manifest() {
        let online = TrainedExport {
            online: true,
            ..export("envs/n1/dataset.jsonl.manifest.json", &["important_instructions", "roleplay"])
        };
        let families = AttackFamilies {
            held_out: vec!["roleplay".into()],
            trained_on: Vec::new(),
            trained_on_exports: vec![online],
        };
        let problems = problems(&families);
        assert_eq!(
            problems,
            ["the adapter was trained online in the environment of manifest envs/n1/dataset.jsonl.manifest.json, \
              which offered cases of the held-out family roleplay"]
        );
    }

    #[test]
    fn a_refusal_names_the_plan_each_clash_and_the_fix_and_a_declared_family_is_none() {
        let exports = [export("a.jsonl", &["roleplay", "authority"])];
        let held_out = ["roleplay".to_string(), "authority".to_string()];
        let said = refusal("nacht", "v", &held_out, &[], &exports).unwrap();
        assert!(said.starts_with("plan nacht: the adapter was trained on export a.jsonl, which holds rows of the held-out family roleplay (version v); plan nacht: "), "{said}");
        assert!(said.ends_with(&format!(" → {FIX}")), "{said}");
        let declared = ["roleplay".to_string(), "authority".to_string()];
        assert_eq!(refusal("nacht", "v", &held_out, &declared, &exports), None);
    }

    #[test]
    fn an_export_holding_a_held_out_family_clashes_naming_both() {
        let families = AttackFamilies {
            held_out: vec!["authority".into(), "roleplay".into()],
            trained_on: Vec::new(),
            trained_on_exports: vec![export("a.jsonl", &["important_instructions"]), export("b.jsonl", &["roleplay"])],
        };
        let problems = problems(&families);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("b.jsonl") && problems[0].contains("roleplay"), "{}", problems[0]);
    }

    #[test]
    fn a_family_the_version_declares_trained_on_is_seen_not_a_clash() {
        let families = AttackFamilies {
            held_out: vec!["roleplay".into()],
            trained_on: vec!["roleplay".into()],
            trained_on_exports: vec![export("b.jsonl", &["roleplay"])],
        };
        assert!(problems(&families).is_empty());
    }

    #[test]
    fn exports_of_seen_families_only_do_not_clash() {
        let exports = [export("a.jsonl", &["important_instructions"])];
        assert!(clashes(&["roleplay".into()], &exports).is_empty());
        assert_eq!(clashes(&["important_instructions".into()], &exports).len(), 1, "the other direction clashes");
    }
}
