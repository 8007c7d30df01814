//! `judgement.json` read back: [`StoredJudgement`], the one reader of the file, for
//! everyone who shows or compares a stored verdict (the trend index, the compare page,
//! the live view's listings, `runs`, `judge`, `start --wait`). The judgement is
//! written as a [`Judgement`] (by the report writer); it is read as a
//! [`StoredJudgement`], which takes a file of any age: the fields every age has, each
//! optional, and the judgement in full when the file is of this build's layout.
//!
//! Not here: writing it (`pruefstand_report`), judging (the crate's root).

use serde::Deserialize;
use serde_json::Value;

use super::Judgement;
use pruefstand_core::record::{RuleId, RuleStatus, Verdict};
use pruefstand_store::{RunDir, RunDocument, RunFile};

/// A `judgement.json` of any age, as its readers take it. Each field is None (or
/// empty) where the file lacks it or holds something this build does not read as its
/// type, so an older or foreign judgement still reads; the figures and thresholds stay
/// JSON, as their sets have grown over time and each reader takes what each has.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "Value")]
pub struct StoredJudgement {
    pub run_id: Option<String>,
    pub version: Option<String>,
    pub plan: Option<String>,
    pub verdict: Option<Verdict>,
    pub started_at: Option<String>,
    pub judged_at: Option<String>,
    pub reference_run_id: Option<String>,
    pub reference_version: Option<String>,
    pub figures: Value,
    pub thresholds: Value,
    pub rules: Vec<StoredRule>,
    /// The judgement in full, when the file is one this build writes (None: an older
    /// layout, read only for the fields above).
    pub current: Option<Judgement>,
}

/// A rule of a judgement of any age: its id and status as this build knows them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StoredRule {
    /// None: an id this build does not know.
    #[serde(default, deserialize_with = "lenient")]
    pub id: Option<RuleId>,
    #[serde(default, deserialize_with = "lenient")]
    pub status: Option<RuleStatus>,
    #[serde(default, deserialize_with = "lenient")]
    pub reason: Option<String>,
    /// What the rule measured (R2: `asr` with its bounds in an older judgement).
    #[serde(default)]
    pub measured: Value,
}

impl StoredJudgement {
    /// The run's `judgement.json`: None when the run was not judged; an error naming
    /// the file when it cannot be read or is not a JSON object.
    pub fn read(run: &RunDir) -> anyhow::Result<Option<StoredJudgement>> {
        run.read::<StoredJudgement>()
    }

    /// When the run started (else when it was judged): RFC 3339, which sorts as text.
    pub fn started(&self) -> Option<&str> {
        self.started_at.as_deref().or(self.judged_at.as_deref())
    }
}

impl RunDocument for StoredJudgement {
    const FILE: RunFile = RunFile::Judgement;
}

/// The fields every age of the file has, each read leniently.
#[derive(Deserialize)]
struct Fields {
    #[serde(default, deserialize_with = "lenient")]
    run_id: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    version: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    plan: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    verdict: Option<Verdict>,
    #[serde(default, deserialize_with = "lenient")]
    started_at: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    judged_at: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    reference_run_id: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    reference_version: Option<String>,
    #[serde(default)]
    figures: Value,
    #[serde(default)]
    thresholds: Value,
    #[serde(default, deserialize_with = "lenient_list")]
    rules: Vec<StoredRule>,
}

impl TryFrom<Value> for StoredJudgement {
    type Error = String;

    fn try_from(value: Value) -> Result<StoredJudgement, String> {
        if !value.is_object() {
            return Err(format!("a judgement is a JSON object, not {value}"));
        }
        let current = serde_json::from_value::<Judgement>(value.clone()).ok();
        let f: Fields = serde_json::from_value(value).map_err(|e| e.to_string())?;
        Ok(StoredJudgement {
            run_id: f.run_id,
            version: f.version,
            plan: f.plan,
            verdict: f.verdict,
            started_at: f.started_at,
            judged_at: f.judged_at,
            reference_run_id: f.reference_run_id,
            reference_version: f.reference_version,
            figures: f.figures,
            thresholds: f.thresholds,
            rules: f.rules,
            current,
        })
    }
}

/// A field read as None where it holds something this build does not read as `T`.
fn lenient<'de, D: serde::Deserializer<'de>, T: serde::de::DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    Ok(serde_json::from_value(Value::deserialize(d)?).ok())
}

/// A list whose items this build cannot read is read as empty.
fn lenient_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<StoredRule>, D::Error> {
    Ok(lenient(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(value: Value) -> StoredJudgement {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_judgement_of_this_build_reads_in_full_and_one_of_any_age_for_what_it_has() {
        let judgement = crate::judge(&crate::tests::schnell(0));
        let read = stored(serde_json::to_value(&judgement).unwrap());
        assert_eq!(read.verdict, Some(judgement.verdict));
        assert_eq!(read.run_id.as_deref(), Some(judgement.run_id.as_str()));
        assert_eq!(read.rules.len(), 5);
        assert_eq!(read.current.as_ref(), Some(&judgement));

        // An older layout: a verdict this build knows, a rule it does not, a field of
        // another type; no figures.
        let old = stored(serde_json::json!({
            "verdict": "rejected", "started_at": "2025-01-01T00:00:00Z", "judged_at": 7,
            "rules": [{"id": "R9", "status": "fail"}, {"id": "R2", "status": "pass", "reason": "ok"}],
        }));
        assert_eq!(
            (old.verdict, old.run_id.as_deref(), old.judged_at.as_deref()),
            (Some(Verdict::Rejected), None, None)
        );
        assert_eq!(old.started(), Some("2025-01-01T00:00:00Z"));
        assert_eq!(old.rules[0].id, None);
        assert_eq!(old.rules[1].id, Some(RuleId::R2));
        assert!(old.current.is_none() && old.figures.is_null());
        assert_eq!(stored(serde_json::json!({"verdict": "fail"})).verdict, None, "not a verdict of ours");
        assert!(serde_json::from_value::<StoredJudgement>(serde_json::json!([1])).is_err());
    }
}
