//! Plans and profiles: `profiles/NAME.toml` holds a fixed, explicit case list (suites
//! with their user tasks and injection tasks, crossed with the attacks) plus the
//! thresholds of R1–R5. Resolving a profile yields the ordered case list and its hash,
//! recorded in every run so two versions are compared on identical cases.
//!
//! Names are checked against the installed AgentDojo's inventory (`inventory::Inventory`),
//! with errors that point at the profile's line. Running the cases is `gym`'s job.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::case::Case;
#[cfg(test)]
use crate::case::CaseKind;
use crate::family;
use crate::files;
use crate::input;
use crate::inventory::Inventory;
use crate::record::FoundFamily;
use crate::settings::thresholds::Thresholds;
use crate::settings::url::SecretUrl;
use crate::util;

#[derive(Deserialize, Serialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    #[serde(deserialize_with = "plan_name")]
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// AgentDojo benchmark version, e.g. "v1.2.2".
    pub benchmark_version: Spanned<String>,
    /// Attacks every attacked pair runs under, unless a suite names its own.
    pub attacks: Vec<Spanned<String>>,
    /// Cases in flight for `pruefstand gym`, and where a run of a model never run
    /// before starts (the model server steers it from there; `--jobs` holds it).
    #[serde(default = "default_jobs", deserialize_with = "jobs")]
    pub jobs: usize,
    /// Wall-time limit of one case; past it the case is an error.
    #[serde(default = "default_case_timeout", deserialize_with = "case_timeout_s")]
    pub case_timeout_s: f64,
    /// Also run each planned injection task's goal as a direct prompt (the model's own
    /// injection-task utility, reported beside ASR).
    #[serde(default = "yes")]
    pub injection_goals: bool,
    /// Stop as soon as the verdict is decided (docs/statistics.md, "Stopping early"):
    /// user tasks run whole in a seeded random order and betting tests look after each.
    /// Reference runs and `run --full` always run the whole plan.
    #[serde(default)]
    pub early_stop: bool,
    /// How attack families are worded: drawn per run from their grammars, or each
    /// family's fixed text (AgentDojo's template, the payload bank's). docs/attacks.md.
    #[serde(default)]
    pub wording: WordingMode,
    /// Families no version may train on: R2 judges these (docs/attacks.md).
    #[serde(default)]
    pub held_out: Vec<Spanned<String>>,
    pub suites: Vec<SuitePlan>,
    /// The adaptive attacker (docs/attacks.md): opt in with this section.
    #[serde(default)]
    pub adaptive: Option<AdaptiveSection>,
    /// Families an attacker found (`found-family.json` of an earlier run), each pinned by
    /// its sha256: every planned pair runs attacked under each.
    #[serde(default)]
    pub found: Vec<FoundSection>,
    #[serde(default)]
    pub rules: Thresholds,
}

/// `[[found]]`: a found family a plan runs.
#[derive(Deserialize, Serialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct FoundSection {
    /// The family file, relative to the plan file's folder.
    pub file: Spanned<String>,
    /// The file's sha256, as the run that found it printed it.
    pub sha256: Spanned<String>,
    /// Held out: R2 judges it and no export trains on it; else seen.
    #[serde(default)]
    pub held_out: bool,
}

/// `[adaptive]`: K attempts per planned (user task, injection task) pair, after the
/// fixed cases.
#[derive(Deserialize, Serialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveSection {
    /// Attempts per pair (K).
    #[serde(deserialize_with = "attempts")]
    pub attempts: usize,
    /// Families the search words attempts in (default: every family).
    #[serde(default)]
    pub families: Vec<Spanned<String>>,
    /// Suites whose planned pairs are searched (default: every suite of the plan).
    #[serde(default)]
    pub suites: Vec<Spanned<String>>,
    /// Who writes the attempts: the family grammars, or an attacker model.
    #[serde(default)]
    pub proposer: Proposer,
    /// The attacker model's OpenAI-compatible base URL (`…/v1`); default: the version's
    /// own model server.
    #[serde(default)]
    pub url: Option<Spanned<String>>,
    /// The name the attacker model is served under; default: the version's base model
    /// (`model.served_name`, no adapter).
    #[serde(default)]
    pub model: Option<Spanned<String>>,
    /// Whether the attacker sees what the target did after each attempt; `false` is
    /// the ablation (blind proposals).
    #[serde(default = "yes")]
    pub feedback: bool,
    /// How many of the search half's best attempts are frozen and run on the held-out
    /// half.
    #[serde(default = "frozen_default", deserialize_with = "frozen")]
    pub frozen: usize,
}

fn frozen_default() -> usize {
    FROZEN_DEFAULT
}

/// Who writes the adaptive attacker's attempts (a record's word, `record::Proposer`).
pub use crate::record::Proposer;

/// A resolved `[adaptive]` section (recorded in `plan.json`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Adaptive {
    pub attempts: usize,
    pub families: Vec<String>,
    /// (suite, user task, injection task), in plan order.
    pub pairs: Vec<(String, String, String)>,
    /// The attacker's settings; absent for the grammar search with its defaults, so
    /// that such plans keep their hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attacker: Option<AttackerSettings>,
}

/// `[adaptive]`'s proposer settings, resolved.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AttackerSettings {
    pub proposer: Proposer,
    /// The attacker model's endpoint, parsed once here. It carries no credentials (a
    /// plan naming some is refused: the plan is a file of the run); the key is read
    /// with the run's request, from PRUEFSTAND_ATTACKER_API_KEY.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<SecretUrl>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub feedback: bool,
    pub frozen: usize,
}

impl Adaptive {
    /// The proposer settings, the grammar's defaults when the section set none.
    pub fn settings(&self) -> AttackerSettings {
        self.attacker.clone().unwrap_or(AttackerSettings {
            proposer: Proposer::Grammar,
            url: None,
            model: None,
            feedback: true,
            frozen: FROZEN_DEFAULT,
        })
    }
}

/// Attempts frozen after the search, by default.
pub(crate) const FROZEN_DEFAULT: usize = 3;

/// More attempts per pair than this are a typo (each is a case).
pub(crate) const ATTEMPTS_MAX: usize = 50;

fn attempts<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    input::bounded_count(d, "attempts", (1, ATTEMPTS_MAX))
}

fn frozen<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    input::bounded_count(d, "frozen", (1, 10))
}

/// How a plan words its attacks.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum WordingMode {
    /// Each family's fixed text; `attacks` may also name any registered attack.
    #[default]
    Fixed,
    /// Each attacked case's wording is drawn from its family's grammar with the run's
    /// seed: attack `fresh_<family>`.
    PerRun,
}

#[derive(Deserialize, Serialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct SuitePlan {
    pub name: Spanned<String>,
    /// Each runs clean, and attacked with every listed injection task.
    pub user_tasks: Vec<Spanned<String>>,
    #[serde(default)]
    pub injection_tasks: Vec<Spanned<String>>,
    /// Overrides the profile's attacks for this suite (e.g. the counter suite's payload
    /// bank).
    #[serde(default)]
    pub attacks: Option<Vec<Spanned<String>>>,
}

fn default_jobs() -> usize {
    4
}

/// The plan's name names its folder under `reports/<version>/`.
fn plan_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let name = String::deserialize(d)?;
    input::check_name(&name).map_err(|why| serde::de::Error::custom(format!("name: {why}")))?;
    Ok(name)
}

/// Cases in flight to begin with, bounded as every count of them is.
fn jobs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    crate::settings::in_flight_field(d, "jobs")
}

/// A day: anything longer is a typo (milliseconds?) that would stall a run.
fn case_timeout_s<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    input::bounded(d, "case_timeout_s", (0.0, 86_400.0, true), "a number of seconds")
}
fn default_case_timeout() -> f64 {
    300.0
}
fn yes() -> bool {
    true
}

/// A profile whose case list has been resolved and checked.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub name: String,
    pub source: PathBuf,
    pub benchmark_version: String,
    pub jobs: usize,
    pub case_timeout_s: f64,
    pub cases: Vec<Case>,
    /// Families marked held out (each attacks some case).
    pub held_out: Vec<String>,
    pub adaptive: Option<Adaptive>,
    /// sha256 of the benchmark version and the ordered case ids.
    pub hash: String,
    /// The found families the plan runs (their cases are among `cases`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub found: Vec<FoundFamily>,
    #[serde(skip)]
    pub profile: Profile,
}

/// Narrows a plan from the command line (`--suite`, `--user-task`, …).
#[derive(Clone, Debug, Default)]
pub struct Filters {
    pub suites: Vec<String>,
    pub user_tasks: Vec<String>,
    pub injection_tasks: Vec<String>,
    pub attacks: Vec<String>,
}

impl Profile {
    /// A plan given on the command line: a name from `<root>/profiles/` or a path
    /// (`input::Named`); its file, the profile and its text.
    pub fn load_named(root: &Path, name_or_path: &str) -> anyhow::Result<(PathBuf, Profile, String)> {
        let dir = root.join("profiles");
        let named = input::Named::new("plan", name_or_path, &dir);
        let text = named.read()?;
        let profile = Profile::parse(&named.path, &text)?;
        Ok((named.path, profile, text))
    }

    pub fn load(path: &Path) -> anyhow::Result<(Profile, String)> {
        if let (false, Some(dir), Some(name)) = (path.exists(), path.parent(), path.file_stem())
            && let Some(message) = input::unknown_name("plan", &name.to_string_lossy(), dir)
        {
            anyhow::bail!("{message}");
        }
        let text = input::read_config(path).with_context(|| format!("plan file {}", path.display()))?;
        Ok((Profile::parse(path, &text)?, text))
    }

    /// A plan file's text, parsed and its rules checked (errors at `path:line:col`).
    pub(crate) fn parse(path: &Path, text: &str) -> anyhow::Result<Profile> {
        let profile: Profile = input::parse_toml(path, text)?;
        if let Err(invalid) = profile.rules.validate() {
            let table = format!("rules.{}", invalid.rule);
            return Err(match input::table_key_offset(text, &table, invalid.field) {
                Some(offset) => input::at(path, text, offset, &invalid.message),
                None => anyhow::anyhow!(
                    "{}: {} (a default that another value contradicts)",
                    path.display(),
                    invalid.message
                ),
            });
        }
        Ok(profile)
    }
}

impl Plan {
    /// Loads, checks every name against the inventory, and resolves the case list.
    pub fn resolve(path: &Path, inventory: &Inventory, filters: &Filters) -> anyhow::Result<Plan> {
        let (profile, text) = Profile::load(path)?;
        let bad = |spanned_start: usize, message: String| input::at(path, &text, spanned_start, &message);
        let version = profile.benchmark_version.get_ref();
        if version != &inventory.benchmark_version {
            return Err(bad(
                profile.benchmark_version.span().start,
                format!("benchmark version {version:?} does not match the inventory ({})", inventory.benchmark_version),
            ));
        }
        let mut cases = Vec::new();
        let mut seen_suites = BTreeSet::new();
        for suite in &profile.suites {
            let suite_name = suite.name.get_ref();
            if !seen_suites.insert(suite_name.clone()) {
                return Err(bad(suite.name.span().start, format!("suite {suite_name:?} is listed twice")));
            }
            cases.extend(suite_cases(suite, &profile, inventory, &bad)?);
        }
        let mut unique = BTreeSet::new();
        if let Some(dup) = cases.iter().find(|case| !unique.insert(case.id.clone())) {
            bail!("{}: case {} is planned twice (a task is listed twice)", path.display(), dup.id);
        }
        let mut held_out = held_out_families(&profile, &cases, &bad)?;
        let found: Vec<FoundFamily> = read_found(path, &profile, &text)?.into_iter().map(|f| f.family).collect();
        for (family, section) in found.iter().zip(&profile.found) {
            cases.extend(found_cases(&profile, &family.attack()));
            if section.held_out {
                held_out.push(family.attack());
            }
        }
        let adaptive = match &profile.adaptive {
            Some(section) => Some(resolve_adaptive(section, &profile).map_err(|(at, message)| bad(at, message))?),
            None => None,
        };
        filters.check(inventory)?;
        let cases: Vec<Case> = cases.into_iter().filter(|case| filters.keeps(case)).collect();
        if cases.is_empty() {
            bail!("{}: no case is left after the filters", path.display());
        }
        Ok(Plan {
            name: profile.name.clone(),
            source: path.to_path_buf(),
            benchmark_version: version.clone(),
            jobs: profile.jobs,
            case_timeout_s: profile.case_timeout_s,
            hash: hash_of(version, &cases, adaptive.as_ref()),
            cases,
            held_out,
            adaptive,
            found,
            profile,
        })
    }

    #[cfg(test)]
    pub fn count(&self, kind: CaseKind) -> usize {
        self.cases.iter().filter(|case| case.kind == kind).count()
    }
}

/// One suite's cases, in the plan's fixed order (clean, attacked, injection goals), its
/// names checked against the inventory.
fn suite_cases(
    suite: &SuitePlan,
    profile: &Profile,
    inventory: &Inventory,
    bad: &dyn Fn(usize, String) -> anyhow::Error,
) -> anyhow::Result<Vec<Case>> {
    let suite_name = suite.name.get_ref();
    let Some(known) = inventory.suites.get(suite_name) else {
        return Err(bad(
            suite.name.span().start,
            format!("unknown suite {suite_name:?}; valid: {}", inventory.suite_names()),
        ));
    };
    let listed = suite.attacks.as_ref().unwrap_or(&profile.attacks);
    let mut attacks = Vec::new();
    for attack in listed {
        let name = attack_name(attack.get_ref(), profile.wording, inventory)
            .map_err(|message| bad(attack.span().start, message))?;
        attacks.push(name);
    }
    for (kind, tasks, valid) in
        [("user", &suite.user_tasks, &known.user_tasks), ("injection", &suite.injection_tasks, &known.injection_tasks)]
    {
        if let Some(task) = tasks.iter().find(|task| !valid.contains(task.get_ref())) {
            return Err(bad(
                task.span().start,
                format!("unknown {kind} task {:?} in suite {suite_name}; valid: {}", task.get_ref(), valid.join(", ")),
            ));
        }
    }
    let mut cases: Vec<Case> = suite.user_tasks.iter().map(|u| Case::clean(suite_name, u.get_ref())).collect();
    for user_task in &suite.user_tasks {
        for injection_task in &suite.injection_tasks {
            for attack in &attacks {
                cases.push(Case::attacked(suite_name, user_task.get_ref(), injection_task.get_ref(), attack));
            }
        }
    }
    if profile.injection_goals {
        for injection_task in &suite.injection_tasks {
            cases.push(Case::injection_goal(suite_name, injection_task.get_ref()));
        }
    }
    Ok(cases)
}

/// One `[[found]]` family as its plan names it: the file on this machine, its bytes
/// (whose sha256 the plan pins) and the family they hold.
#[derive(Clone, Debug)]
pub struct FoundFile {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    pub family: FoundFamily,
}

/// The `[[found]]` families of the plan file at `path` (its `profile`, parsed from
/// `text`), each read from its file (relative to the plan's folder) and checked against
/// its pinned sha256; errors at the plan's line. A file is read only when it is a
/// regular file of at most [`files::MAX_FOUND_FAMILY_BYTES`]: a plan may name anything,
/// `/dev/zero` or a FIFO included.
pub(crate) fn read_found(path: &Path, profile: &Profile, text: &str) -> anyhow::Result<Vec<FoundFile>> {
    let bad = |at: usize, message: String| input::at(path, text, at, &message);
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut out: Vec<FoundFile> = Vec::new();
    for section in &profile.found {
        let file = dir.join(section.file.get_ref());
        let at = section.file.span().start;
        let bytes = files::read_regular(&file, files::MAX_FOUND_FAMILY_BYTES, "a found family")
            .map_err(|e| bad(at, format!("found: {e:#}")))?;
        let actual = util::sha256_hex(&bytes);
        if !actual.eq_ignore_ascii_case(section.sha256.get_ref()) {
            let message =
                format!("found: {} has sha256 {actual}, the plan pins {}", file.display(), section.sha256.get_ref());
            return Err(bad(section.sha256.span().start, message));
        }
        let family: FoundFamily = serde_json::from_slice(&bytes)
            .map_err(|e| bad(at, format!("found: {} is no found family: {e}", file.display())))?;
        family.check().map_err(|e| bad(at, format!("found: {}: {e}", file.display())))?;
        if out.iter().any(|f| f.family.name == family.name) {
            return Err(bad(at, format!("found: family {:?} is named twice", family.name)));
        }
        out.push(FoundFile { path: file, bytes, family });
    }
    Ok(out)
}

/// A found family's cases: every planned pair attacked under it.
fn found_cases(profile: &Profile, attack: &str) -> Vec<Case> {
    let mut cases = Vec::new();
    for suite in &profile.suites {
        for user_task in &suite.user_tasks {
            for injection_task in &suite.injection_tasks {
                cases.push(Case::attacked(suite.name.get_ref(), user_task.get_ref(), injection_task.get_ref(), attack));
            }
        }
    }
    cases
}

/// The plan's `held_out` families, each known and attacking a case of the plan.
fn held_out_families(
    profile: &Profile,
    cases: &[Case],
    bad: &dyn Fn(usize, String) -> anyhow::Error,
) -> anyhow::Result<Vec<String>> {
    let attacked: BTreeSet<&str> = cases.iter().filter_map(|c| family::of_attack(c.attack.as_deref()?)).collect();
    let mut held_out = Vec::new();
    for family in &profile.held_out {
        let name = family.get_ref();
        if family::family(name).is_none() {
            let message = format!("held_out: unknown family {name:?}; valid: {}", family::names().join(", "));
            return Err(bad(family.span().start, message));
        }
        if !attacked.contains(name.as_str()) {
            let message = format!("held_out: family {name:?} attacks no case of the plan (add it to `attacks`)");
            return Err(bad(family.span().start, message));
        }
        held_out.push(name.clone());
    }
    Ok(held_out)
}

/// The pairs and families of an `[adaptive]` section; errors carry their offset.
fn resolve_adaptive(section: &AdaptiveSection, profile: &Profile) -> Result<Adaptive, (usize, String)> {
    let mut families = Vec::new();
    for f in &section.families {
        if family::family(f.get_ref()).is_none() {
            let message =
                format!("adaptive.families: unknown family {:?}; valid: {}", f.get_ref(), family::names().join(", "));
            return Err((f.span().start, message));
        }
        families.push(f.get_ref().clone());
    }
    if families.is_empty() {
        families = family::names().into_iter().map(str::to_string).collect();
    }
    for s in &section.suites {
        if !profile.suites.iter().any(|p| p.name.get_ref() == s.get_ref()) {
            return Err((s.span().start, format!("adaptive.suites: suite {:?} is not in the plan", s.get_ref())));
        }
    }
    let chosen = |name: &String| section.suites.is_empty() || section.suites.iter().any(|s| s.get_ref() == name);
    let pairs = profile
        .suites
        .iter()
        .filter(|s| chosen(s.name.get_ref()))
        .flat_map(|s| {
            s.user_tasks.iter().flat_map(move |u| {
                s.injection_tasks
                    .iter()
                    .map(move |i| (s.name.get_ref().clone(), u.get_ref().clone(), i.get_ref().clone()))
            })
        })
        .collect();
    Ok(Adaptive { attempts: section.attempts, families, pairs, attacker: attacker_settings(section)? })
}

/// The proposer settings when they differ from the grammar's defaults.
fn attacker_settings(section: &AdaptiveSection) -> Result<Option<AttackerSettings>, (usize, String)> {
    for field in [&section.url, &section.model].into_iter().flatten() {
        if section.proposer == Proposer::Grammar {
            let message = "adaptive: `url` and `model` name the attacker model; they need proposer = \"model\"";
            return Err((field.span().start, message.to_string()));
        }
    }
    // The plan is recorded in the run: a key for the attacker comes from the
    // environment (PRUEFSTAND_ATTACKER_API_KEY), never from the URL.
    let url = match &section.url {
        Some(url) => {
            let parsed =
                SecretUrl::parse(url.get_ref()).map_err(|e| (url.span().start, format!("adaptive.url: {e}")))?;
            if parsed.has_secrets() {
                let message = format!(
                    "adaptive.url: {parsed} carries credentials; give the attacker's key in PRUEFSTAND_ATTACKER_API_KEY instead"
                );
                return Err((url.span().start, message));
            }
            Some(parsed)
        }
        None => None,
    };
    let settings = AttackerSettings {
        proposer: section.proposer,
        url,
        model: section.model.as_ref().map(|m| m.get_ref().clone()),
        feedback: section.feedback,
        frozen: section.frozen,
    };
    let defaults = section.proposer == Proposer::Grammar && section.feedback && section.frozen == FROZEN_DEFAULT;
    Ok(if defaults { None } else { Some(settings) })
}

/// The attack a plan's `attacks` entry names: per run, a family's `fresh_` attack;
/// fixed, a family's fixed attack or any registered attack.
fn attack_name(listed: &str, wording: WordingMode, inventory: &Inventory) -> Result<String, String> {
    let known = family::family(listed);
    match (wording, known) {
        (WordingMode::PerRun, Some(f)) => Ok(format!("{}{}", family::PER_RUN_PREFIX, f.name)),
        (WordingMode::PerRun, None) => Err(format!(
            "unknown attack family {listed:?} (wording = \"per_run\" draws from family grammars); valid: {}",
            family::names().join(", ")
        )),
        (WordingMode::Fixed, Some(f)) => Ok(f.fixed_attack.clone()),
        (WordingMode::Fixed, None) if inventory.attacks.iter().any(|a| a == listed) && listed != "none" => {
            Ok(listed.to_string())
        }
        (WordingMode::Fixed, None) => Err(format!(
            "unknown attack {listed:?}; valid: {} (or a family: {})",
            inventory.attacks.join(", "),
            family::names().join(", ")
        )),
    }
}

/// The plan's hash: [`plan_hash`], and with an `[adaptive]` section its settings too
/// (what the search measures depends on them; its draws are the run's, not the plan's).
pub fn hash_of(benchmark_version: &str, cases: &[Case], adaptive: Option<&Adaptive>) -> String {
    match adaptive {
        Some(a) => {
            util::sha256_hex(format!("{}{}", plan_hash(benchmark_version, cases), serde_json::json!(a)).as_bytes())
        }
        None => plan_hash(benchmark_version, cases),
    }
}

/// The hash two runs must share to be compared case by case.
pub fn plan_hash(benchmark_version: &str, cases: &[Case]) -> String {
    let ids: Vec<&str> = cases.iter().map(|case| case.id.as_str()).collect();
    let canonical = serde_json::json!({ "benchmark_version": benchmark_version, "cases": ids });
    util::sha256_hex(canonical.to_string().as_bytes())
}

impl Filters {
    /// A filter narrows only the cases that have that dimension; for `--attack`, clean
    /// and goal cases count as attack `none`.
    fn keeps(&self, case: &Case) -> bool {
        let passes = |filter: &[String], value: Option<&String>| match value {
            _ if filter.is_empty() => true,
            Some(value) => filter.contains(value),
            None => true,
        };
        let attack = case.attack.clone().unwrap_or_else(|| "none".to_string());
        passes(&self.suites, Some(&case.suite))
            && passes(&self.user_tasks, case.user_task.as_ref())
            && passes(&self.injection_tasks, case.injection_task.as_ref())
            && passes(&self.attacks, Some(&attack))
    }

    fn check(&self, inventory: &Inventory) -> anyhow::Result<()> {
        for suite in &self.suites {
            if !inventory.suites.contains_key(suite) {
                bail!("unknown suite {suite:?} in --suite; valid: {}", inventory.suite_names());
            }
        }
        let in_scope = |name: &str| self.suites.is_empty() || self.suites.iter().any(|s| s == name);
        let all_user: BTreeSet<&String> =
            inventory.suites.iter().filter(|(n, _)| in_scope(n)).flat_map(|(_, s)| &s.user_tasks).collect();
        for task in &self.user_tasks {
            if !all_user.contains(task) {
                bail!("unknown user task {task:?} in --user-task; valid: {}", join(&all_user));
            }
        }
        let all_injection: BTreeSet<&String> =
            inventory.suites.iter().filter(|(n, _)| in_scope(n)).flat_map(|(_, s)| &s.injection_tasks).collect();
        for task in &self.injection_tasks {
            if !all_injection.contains(task) {
                bail!("unknown injection task {task:?} in --injection-task; valid: {}", join(&all_injection));
            }
        }
        for attack in &self.attacks {
            // `fresh_<family>` is the gym's own: an inventory cached before it knows none.
            let per_run = attack.starts_with(family::PER_RUN_PREFIX) && family::of_attack(attack).is_some();
            if !inventory.attacks.contains(attack) && !per_run {
                bail!("unknown attack {attack:?} in --attack; valid: {}", inventory.attacks.join(", "));
            }
        }
        Ok(())
    }
}

fn join(names: &BTreeSet<&String>) -> String {
    names.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
}

#[cfg(any(test, feature = "test-support"))]
#[cfg_attr(not(test), allow(dead_code, unused_imports))]
pub mod tests {
    use super::*;
    use crate::inventory::SuiteInventory;

    pub fn inventory() -> Inventory {
        let suite = |users: &[&str], injections: &[&str]| SuiteInventory {
            user_tasks: users.iter().map(|s| s.to_string()).collect(),
            injection_tasks: injections.iter().map(|s| s.to_string()).collect(),
            injection_tasks_with_ground_truth: injections.iter().map(|s| s.to_string()).collect(),
        };
        Inventory {
            agentdojo_version: "0.1.35".into(),
            benchmark_version: "v1.2.2".into(),
            benchmark_versions: vec!["v1.2.2".into()],
            suites: [
                (
                    "banking".to_string(),
                    suite(&["user_task_0", "user_task_1"], &["injection_task_0", "injection_task_1"]),
                ),
                ("slack".to_string(), suite(&["user_task_0"], &["injection_task_1"])),
            ]
            .into(),
            attacks: vec!["important_instructions".into(), "tool_knowledge".into(), "none".into()],
        }
    }

    fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    const PLAN: &str = r#"
name = "mini"
benchmark_version = "v1.2.2"
attacks = ["important_instructions", "tool_knowledge"]
[[suites]]
name = "banking"
user_tasks = ["user_task_0", "user_task_1"]
injection_tasks = ["injection_task_0", "injection_task_1"]
[[suites]]
name = "slack"
user_tasks = ["user_task_0"]
injection_tasks = ["injection_task_1"]
attacks = ["important_instructions"]
"#;

    #[test]
    fn resolves_clean_attacked_and_goal_cases_in_a_fixed_order() {
        let (_dir, path) = write(PLAN);
        let plan = Plan::resolve(&path, &inventory(), &Filters::default()).unwrap();
        assert_eq!(plan.count(CaseKind::Clean), 3);
        assert_eq!(plan.count(CaseKind::Attacked), 2 * 2 * 2 + 1);
        assert_eq!(plan.count(CaseKind::InjectionGoal), 3);
        assert_eq!(plan.cases[0].id, "banking/user_task_0/none/none");
        let again = Plan::resolve(&path, &inventory(), &Filters::default()).unwrap();
        assert_eq!(plan.hash, again.hash);
    }

    #[test]
    fn names_and_numbers_are_refused_at_their_line_before_anything_runs() {
        for (field, bad, message) in [
            ("name = \"mini\"", "name = \"../../../x\"", "name: \"../../../x\" starts with '.'"),
            ("name = \"mini\"", "name = \"\"", "name: a name cannot be empty"),
            ("name = \"mini\"", "name = \"a/b\"", "holds '/'"),
            ("attacks = [", "case_timeout_s = nan\nattacks = [", "case_timeout_s = NaN is not a number of seconds"),
            ("attacks = [", "case_timeout_s = inf\nattacks = [", "case_timeout_s = inf"),
            ("attacks = [", "case_timeout_s = -5.0\nattacks = [", "case_timeout_s = -5"),
            ("attacks = [", "jobs = 100000000000\nattacks = [", "jobs = 100000000000 is not in [1, 4096]"),
            ("attacks = [", "jobs = 0\nattacks = [", "jobs = 0 is not in [1, 4096]"),
            ("attacks = [", "jobs = 1e11\nattacks = [", "invalid type: floating point"),
        ] {
            let (_dir, path) = write(&PLAN.replacen(field, bad, 1));
            let err = Profile::load(&path).err().unwrap().to_string();
            assert!(err.contains("p.toml:") && err.contains(message), "{bad}: {err}");
            let line = err.split(':').nth(1).and_then(|n| n.parse::<usize>().ok()).unwrap();
            let first_line = bad.split('\n').next().unwrap();
            assert_eq!(PLAN.replacen(field, bad, 1).lines().nth(line - 1), Some(first_line), "{err}");
        }
    }

    #[test]
    fn a_threshold_out_of_range_is_refused_at_its_line() {
        let text = format!("{PLAN}[rules.R2]\nasr_max = 0.05\n[rules.R4]\nmargin = 0.05\nalpha = 0.7\n");
        let (_dir, path) = write(&text);
        let err = Profile::load(&path).err().unwrap().to_string();
        let line = text.lines().count();
        assert!(err.contains(&format!("p.toml:{line}:1: rules.R4.alpha = 0.7: must lie in (0, 0.5)")), "{err}");
    }

    #[test]
    fn filters_narrow_and_change_the_hash() {
        let (_dir, path) = write(PLAN);
        let all = Plan::resolve(&path, &inventory(), &Filters::default()).unwrap();
        let filters =
            Filters { suites: vec!["banking".into()], attacks: vec!["tool_knowledge".into()], ..Default::default() };
        let some = Plan::resolve(&path, &inventory(), &filters).unwrap();
        assert!(some.cases.iter().all(|c| c.suite == "banking" && c.attack.as_deref() == Some("tool_knowledge")));
        assert_eq!(some.cases.len(), 4);
        assert_ne!(all.hash, some.hash);
    }

    #[test]
    fn per_run_wording_names_families_marks_held_out_ones_and_hashes_no_seed() {
        let text = PLAN.replace(
            "attacks = [\"important_instructions\", \"tool_knowledge\"]",
            "wording = \"per_run\"\nheld_out = [\"roleplay\"]\nattacks = [\"important_instructions\", \"roleplay\"]",
        );
        let (_dir, path) = write(&text);
        let plan = Plan::resolve(&path, &inventory(), &Filters::default()).unwrap();
        assert_eq!(plan.held_out, ["roleplay"]);
        assert!(
            plan.cases.iter().any(|c| c.id == "banking/user_task_0/fresh_roleplay/injection_task_1"),
            "{:?}",
            plan.cases
        );
        // The draw depends on the seed; the case list and its hash do not.
        let (one, two) = (family::wordings(&plan.cases, 1), family::wordings(&plan.cases, 2));
        assert_eq!(one.len(), plan.count(CaseKind::Attacked));
        assert_ne!(one, two);
        let again = Plan::resolve(&path, &inventory(), &Filters::default()).unwrap();
        assert_eq!(again.hash, plan.hash);
        // Fixed wording of the same families is another case list.
        let (_dir, fixed) = write(&text.replace("wording = \"per_run\"\n", ""));
        let fixed = Plan::resolve(&fixed, &inventory(), &Filters::default()).unwrap();
        assert!(fixed.cases.iter().any(|c| c.attack.as_deref() == Some("payload_roleplay")));
        assert_ne!(fixed.hash, plan.hash);

        for (bad, message) in [
            ("held_out = [\"roleplay\"]", "held_out = [\"urgency\"]"),
            ("held_out = [\"roleplay\"]", "held_out = [\"rolepaly\"]"),
            ("\"roleplay\"]\n[[suites]]", "\"direct\"]\n[[suites]]"),
        ]
        .map(|(from, to)| (text.replacen(from, to, 1), to))
        {
            let (_dir, path) = write(&bad);
            let err = Plan::resolve(&path, &inventory(), &Filters::default()).unwrap_err().to_string();
            let line = bad.lines().position(|l| l.contains(message.lines().next().unwrap())).unwrap() + 1;
            assert!(err.contains(&format!("p.toml:{line}:")), "{err}");
            assert!(
                err.contains("attacks no case")
                    || err.contains("unknown family")
                    || err.contains("unknown attack family"),
                "{err}"
            );
        }
    }

    #[test]
    fn unknown_names_point_at_the_line_and_list_valid_names() {
        let (_dir, path) = write(&PLAN.replace("\"user_task_1\"", "\"user_task_9\""));
        let err = Plan::resolve(&path, &inventory(), &Filters::default()).unwrap_err().to_string();
        assert!(err.contains("p.toml:7:"), "{err}");
        assert!(
            err.contains("unknown user task \"user_task_9\"") && err.contains("valid: user_task_0, user_task_1"),
            "{err}"
        );

        let (_dir, path) = write(&PLAN.replace("name = \"slack\"", "name = \"slak\""));
        let err = Plan::resolve(&path, &inventory(), &Filters::default()).unwrap_err().to_string();
        assert!(err.contains(":10:") && err.contains("valid: banking, slack"), "{err}");

        let (_dir, path) = write(PLAN);
        let filters = Filters { attacks: vec!["nope".into()], ..Default::default() };
        let err = Plan::resolve(&path, &inventory(), &filters).unwrap_err().to_string();
        assert!(err.contains("unknown attack \"nope\"") && err.contains("important_instructions"), "{err}");
    }
}

#[cfg(test)]
mod fuzz;
