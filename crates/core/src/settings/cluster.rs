//! `[cluster]` of `pruefstand.toml`: where the daemon runs a job — on this machine
//! (`local`, the default) or as a Slurm job array of shards (`slurm`). Types and their
//! validation only; submitting, following and merging are `cluster`'s.

use serde::{Deserialize, Deserializer};

/// Who runs a queued job's cases.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ClusterKind {
    /// The daemon runs the job itself, on this machine.
    #[default]
    Local,
    /// The daemon submits one Slurm job array; each task runs one shard of the plan.
    Slurm,
}

/// `[cluster]`.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    #[serde(default)]
    pub kind: ClusterKind,
    /// The Slurm partition (`--partition`); absent: the cluster's default partition.
    #[serde(default, deserialize_with = "partition_name")]
    pub partition: Option<String>,
    /// Array tasks a plan is cut into (at most one per user task is useful).
    #[serde(default = "default_shards", deserialize_with = "shard_count")]
    pub shards: usize,
    /// More `sbatch` arguments, passed as they are (e.g. `--gres=gpu:1`). The ones
    /// pruefstand sets itself are refused.
    #[serde(default, deserialize_with = "extra_sbatch_args")]
    pub sbatch_args: Vec<String>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig { kind: ClusterKind::Local, partition: None, shards: default_shards(), sbatch_args: Vec::new() }
    }
}

impl ClusterConfig {
    pub fn is_slurm(&self) -> bool {
        self.kind == ClusterKind::Slurm
    }
}

/// The most array tasks of one job.
pub(crate) const MAX_SHARDS: usize = 1000;

fn default_shards() -> usize {
    4
}

fn shard_count<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    crate::input::bounded_count(d, "shards", (1, MAX_SHARDS))
}

fn partition_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let name = String::deserialize(d)?;
    check_partition(&name).map_err(serde::de::Error::custom)?;
    Ok(Some(name))
}

/// A partition name as Slurm spells them: letters, digits, `_`, `-`, `.`.
fn check_partition(name: &str) -> Result<(), String> {
    let fine = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if fine { Ok(()) } else { Err(format!("partition = {name:?}: letters, digits, '_', '-', '.' only")) }
}

fn extra_sbatch_args<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let args = Vec::<String>::deserialize(d)?;
    for arg in &args {
        check_sbatch_arg(arg).map_err(serde::de::Error::custom)?;
    }
    Ok(args)
}

/// Options pruefstand sets on every submission: one given again would change what the
/// array is (its tasks, its output, what its script is) behind the daemon's back.
const RESERVED: &[&str] = &[
    "--array",
    "-a",
    "--parsable",
    "--wrap",
    "--output",
    "-o",
    "--error",
    "-e",
    "--partition",
    "-p",
    "--job-name",
    "-J",
    "--comment",
    "--export",
    "--wait",
    "-W",
    "--chdir",
    "-D",
];

fn check_sbatch_arg(arg: &str) -> Result<(), String> {
    if arg.chars().any(char::is_control) {
        return Err(format!("sbatch_args: {arg:?} holds a control character"));
    }
    if !arg.starts_with('-') {
        return Err(format!("sbatch_args: {arg:?} is not an option (write --name=value as one element)"));
    }
    let name = arg.split_once('=').map_or(arg, |(name, _)| name);
    // Short options may carry their value glued on (`-pgpu`); sbatch takes any
    // unambiguous prefix of a long option (`--arr=` is `--array=`), so a prefix counts.
    let reserved = RESERVED.iter().any(|r| {
        name == *r
            || (r.len() == 2 && !arg.starts_with("--") && arg.starts_with(r))
            || (r.starts_with("--") && name.starts_with("--") && name.len() > 2 && r.starts_with(name))
    });
    if reserved {
        return Err(format!("sbatch_args: {arg:?} is set by pruefstand itself (partition: use `partition`)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ClusterConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn local_is_the_default_and_slurm_reads_its_fields() {
        assert_eq!(parse("").unwrap().kind, ClusterKind::Local);
        let c = parse(
            "kind = \"slurm\"\npartition = \"gpu\"\nshards = 8\nsbatch_args = [\"--gres=gpu:1\", \"--time=04:00:00\"]",
        )
        .unwrap();
        assert!(c.is_slurm());
        assert_eq!((c.partition.as_deref(), c.shards, c.sbatch_args.len()), (Some("gpu"), 8, 2));
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        assert!(parse("shards = 0").unwrap_err().contains("shards = 0 is not in [1, 1000]"));
        assert!(parse("kind = \"kubernetes\"").unwrap_err().contains("unknown variant"));
        assert!(parse("partition = \"gpu; rm\"").unwrap_err().contains("partition"));
        // Abbreviations too: sbatch expands an unambiguous prefix of a long option.
        for arg in [
            "--array=0-3",
            "-a",
            "--output=/x",
            "-pgpu",
            "--wrap",
            "--export=ALL",
            "--wra=x",
            "--arr=0-9",
            "--expo=ALL",
            "--outp=/x",
            "--chd=/",
            "--wai",
        ] {
            let err = parse(&format!("sbatch_args = [{arg:?}]")).unwrap_err();
            assert!(err.contains("set by pruefstand itself"), "{arg}: {err}");
        }
        assert!(parse("sbatch_args = [\"gpu:1\"]").unwrap_err().contains("not an option"));
        assert!(parse("sbatch_args = [\"--time=1\\n\"]").unwrap_err().contains("control character"));
        // A long option that only starts like a short reserved one is fine.
        assert!(parse("sbatch_args = [\"--exclusive\", \"--account=lab\"]").is_ok());
    }
}
