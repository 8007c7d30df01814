//! Slurm through its command-line tools, argv only: `sbatch` submits a job array,
//! `squeue` says which of its tasks are still pending or running, `scancel` ends it,
//! `sinfo` and `scontrol` answer `check`. The argv builders and the parsers of what the
//! tools print are pure functions, tested here; running the tools is [`Slurm`]'s.
//!
//! Not here: which shards exist, when to requeue, merging (`cluster`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use pruefstand_core::settings::cluster::ClusterConfig;
use pruefstand_core::util;

/// A submitted job array (`sbatch --parsable` prints its id).
pub(super) type ArrayId = u64;

/// Where an array task stands, as `squeue` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TaskState {
    /// Waiting for a node (or being set up on one).
    Pending,
    /// On a node (running, completing, suspended).
    Running,
}

/// The batch script every array task runs: fixed text, the pruefstand binary and the
/// bench root as single-quoted words, the job id and shard count as numbers; the task
/// index comes from Slurm's own `SLURM_ARRAY_TASK_ID`. No spec content reaches it. With
/// `reference` (the reference's run directory, quoted too) the tasks run the job's
/// reference into it.
pub(super) fn batch_script(
    binary: &Path,
    root: &Path,
    job: u64,
    shards: usize,
    reference: Option<&Path>,
) -> anyhow::Result<String> {
    let reference = match reference {
        Some(dir) => format!(" --reference {}", quote(dir)?),
        None => String::new(),
    };
    Ok(format!(
        "#!/bin/sh\n# pruefstand: one shard of job {job} (written by the daemon; do not edit)\nexec {} --root {} shard \
         {job} \"${{SLURM_ARRAY_TASK_ID}}/{shards}\"{reference}\n",
        quote(binary)?,
        quote(root)?
    ))
}

/// A path as one single-quoted shell word. A quote or a control character in it is
/// refused rather than escaped: no bench root needs one.
fn quote(path: &Path) -> anyhow::Result<String> {
    let text = path.to_str().with_context(|| format!("{}: not UTF-8", path.display()))?;
    if text.chars().any(|c| c == '\'' || c.is_control()) {
        bail!("{text:?}: a path with a quote or a control character cannot be handed to a Slurm batch script");
    }
    Ok(format!("'{text}'"))
}

/// `sbatch`'s arguments for the tasks `indices` of a job's array: parsable output, the
/// partition, the job's comment (how a restarted daemon finds the array), each task's output (`output`, a Slurm file-name pattern: next to the
/// shards), the configured extras, the script.
pub(super) fn sbatch_argv(
    config: &ClusterConfig,
    job: u64,
    indices: &str,
    comment: &str,
    output: &Path,
    script: &Path,
) -> Vec<String> {
    let mut argv = vec![
        "--parsable".to_string(),
        format!("--array={indices}"),
        format!("--job-name=pruefstand-{job}"),
        format!("--comment={comment}"),
        format!("--output={}", output.display()),
    ];
    if let Some(partition) = &config.partition {
        argv.push(format!("--partition={partition}"));
    }
    argv.extend(config.sbatch_args.iter().cloned());
    argv.push(script.display().to_string());
    argv
}

/// The array's task ids as sbatch's `--array` spells them: `0-7`, or `3` for one.
pub(super) fn array_spec(indices: &[usize]) -> String {
    match indices {
        [one] => one.to_string(),
        [first, .., last] if indices.windows(2).all(|w| w[1] == w[0] + 1) => format!("{first}-{last}"),
        _ => indices.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
    }
}

/// `sbatch --parsable` prints `id` or `id;cluster`.
fn parse_sbatch(stdout: &str) -> anyhow::Result<ArrayId> {
    let first = stdout.trim().split(';').next().unwrap_or_default();
    first.parse().with_context(|| format!("sbatch printed {:?}, not a job id", stdout.trim()))
}

/// `squeue -h -r -o %F|%K|%T` lines: the state of each task of the arrays in `arrays`,
/// by (array, task index). Tasks of other jobs and states that mean ended are left out.
fn parse_squeue(stdout: &str, arrays: &[ArrayId]) -> BTreeMap<(ArrayId, usize), TaskState> {
    let mut tasks = BTreeMap::new();
    for line in stdout.lines() {
        let mut fields = line.trim().split('|');
        let (Some(array), Some(index), Some(state)) = (fields.next(), fields.next(), fields.next()) else { continue };
        let (Ok(array), Ok(index)) = (array.parse::<ArrayId>(), index.parse::<usize>()) else { continue };
        if !arrays.contains(&array) {
            continue;
        }
        let state = match state {
            "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESIZING" => TaskState::Pending,
            "RUNNING" | "COMPLETING" | "SUSPENDED" | "STOPPED" | "SIGNALING" | "STAGE_OUT" => TaskState::Running,
            _ => continue,
        };
        tasks.insert((array, index), state);
    }
    tasks
}

/// `squeue -o %F|%k` lines: the array whose comment is `comment`.
fn parse_comments(stdout: &str, comment: &str) -> Option<ArrayId> {
    stdout.lines().find_map(|line| {
        let (array, found) = line.trim().split_once('|')?;
        (found == comment).then(|| array.parse().ok()).flatten()
    })
}

/// `scontrol show … -o` prints one line of `Key=Value` pairs; the value of `key`.
fn scontrol_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
}

/// The Slurm tools, run with a minimal environment (plus `SLURM_CONF` when set): a
/// submitted task inherits sbatch's environment, and the daemon's may hold secrets.
#[derive(Clone, Debug, Default)]
pub(crate) struct Slurm {
    /// Where the tools are (None: `PATH`).
    pub(crate) bin_dir: Option<PathBuf>,
}

impl Slurm {
    fn command(&self, tool: &str) -> Command {
        let program = self.bin_dir.as_ref().map_or_else(|| PathBuf::from(tool), |dir| dir.join(tool));
        let mut command = Command::new(program);
        util::minimal_env(&mut command);
        if let Some(conf) = std::env::var_os("SLURM_CONF") {
            command.env("SLURM_CONF", conf);
        }
        command
    }

    /// Runs `tool args…`; its stdout, or an error with its stderr.
    pub(crate) fn run(&self, tool: &str, args: &[String]) -> anyhow::Result<String> {
        let output =
            self.command(tool).args(args).output().with_context(|| format!("running {tool} (is Slurm installed?)"))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            bail!("{tool} {} failed ({}): {}", args.join(" "), output.status, stderr.trim());
        }
        Ok(stdout)
    }

    /// Submits the array; its id.
    pub(super) fn submit(&self, argv: &[String]) -> anyhow::Result<ArrayId> {
        parse_sbatch(&self.run("sbatch", argv)?)
    }

    /// The pending and running tasks of `arrays` (this user's jobs only).
    pub(crate) fn tasks(&self, arrays: &[ArrayId]) -> anyhow::Result<BTreeMap<(ArrayId, usize), TaskState>> {
        let user = std::env::var("USER")
            .ok()
            .or_else(|| nix::unistd::User::from_uid(nix::unistd::getuid()).ok()?.map(|u| u.name));
        let mut args = vec!["-h".to_string(), "-r".into(), "-o".into(), "%F|%K|%T".into()];
        if let Some(user) = user {
            args.extend(["-u".to_string(), user]);
        }
        Ok(parse_squeue(&self.run("squeue", &args)?, arrays))
    }

    /// The array of this user's jobs named `name` whose comment is `comment` (what
    /// `squeue` still lists: pending or running tasks).
    pub(super) fn find_by_comment(&self, name: &str, comment: &str) -> anyhow::Result<Option<ArrayId>> {
        let args = ["-h".to_string(), "-r".into(), format!("--name={name}"), "-o".into(), "%F|%k".into()];
        Ok(parse_comments(&self.run("squeue", &args)?, comment))
    }

    /// Ends every task of `array`.
    pub(crate) fn cancel(&self, array: ArrayId) -> anyhow::Result<()> {
        self.run("scancel", &[array.to_string()]).map(drop)
    }

    /// What `scontrol` knows of one task (None once Slurm has forgotten it).
    pub(super) fn task_facts(&self, array: ArrayId, index: usize) -> Option<String> {
        let out = self.run("scontrol", &["show".into(), "job".into(), "-o".into(), format!("{array}_{index}")]).ok()?;
        let line = out.lines().next()?;
        let field = |key| scontrol_field(line, key).unwrap_or("?");
        Some(format!("{} {} on {}", field("JobState"), field("Reason"), field("NodeList")))
    }
}

/// One line of `check` about the cluster: what was found, and the fix when it fails.
#[derive(Debug)]
pub(crate) struct Probe {
    pub(crate) ok: bool,
    pub(crate) what: String,
    pub(crate) fix: String,
}

impl Slurm {
    /// `check`'s look at the cluster: the tools, the controller, the partition, and a
    /// tiny job that writes a file under `probe_dir` (on the storage the nodes share).
    /// Stops at the first failure: the later probes need the earlier ones.
    pub(crate) fn check(&self, config: &ClusterConfig, probe_dir: &Path) -> Vec<Probe> {
        let mut probes = Vec::new();
        let mut step = |ok: bool, what: String, fix: &str| {
            probes.push(Probe { ok, what, fix: fix.to_string() });
            ok
        };
        for tool in ["sbatch", "squeue", "scancel"] {
            let found = self.run(tool, &["--version".to_string()]);
            let what = match &found {
                Ok(version) => format!("{tool}: {}", version.trim()),
                Err(err) => format!("{tool}: {err:#}"),
            };
            if !step(found.is_ok(), what, "install Slurm's client tools (Debian: slurm-client) and set SLURM_CONF") {
                return probes;
            }
        }
        let ping = self.run("scontrol", &["ping".to_string()]);
        let up = ping.as_ref().is_ok_and(|out| out.contains("is UP"));
        let what = match &ping {
            Ok(out) => format!("Slurm controller: {}", out.trim()),
            Err(err) => format!("Slurm controller: {err:#}"),
        };
        if !step(up, what, "start slurmctld, or point SLURM_CONF at the cluster's slurm.conf") {
            return probes;
        }
        let partition = config.partition.clone();
        let mut sinfo = vec!["-h".to_string(), "-o".into(), "%P %a %D %t".into()];
        if let Some(p) = &partition {
            sinfo.extend(["-p".to_string(), p.clone()]);
        }
        let listed = self.run("sinfo", &sinfo).unwrap_or_default();
        let shown = partition.as_deref().unwrap_or("the default partition");
        let what = format!("partition {shown}: {}", listed.lines().next().unwrap_or("not found").trim());
        if !step(!listed.trim().is_empty(), what, "name an existing partition in [cluster] partition (see `sinfo`)") {
            return probes;
        }
        let written = self.probe_write(config, probe_dir);
        let what = match &written {
            Ok(node) => format!("a test job on {node} wrote under {}", probe_dir.display()),
            Err(err) => format!("a test job writing under {}: {err:#}", probe_dir.display()),
        };
        step(
            written.is_ok(),
            what,
            "the bench root must be on storage every node mounts at the same path, writable by this user",
        );
        probes
    }

    /// Submits a one-line job (`sbatch --wait`, at most [`PROBE_TIMEOUT`]) that writes
    /// its node's name into a fresh file under `dir`; the node's name.
    fn probe_write(&self, config: &ClusterConfig, dir: &Path) -> anyhow::Result<String> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let nonce = format!("probe-{}-{}", std::process::id(), chrono::Utc::now().timestamp_millis());
        let (script, proof) = (dir.join(format!("{nonce}.sbatch")), dir.join(format!("{nonce}.node")));
        let text = format!(
            "#!/bin/sh
hostname > {}
",
            quote(&proof)?
        );
        util::write_atomic(&script, text.as_bytes())?;
        let mut argv = vec!["--parsable".to_string(), "--wait".into(), format!("--job-name=pruefstand-check")];
        argv.push(format!("--output={}", dir.join(format!("{nonce}.out")).display()));
        if let Some(partition) = &config.partition {
            argv.push(format!("--partition={partition}"));
        }
        argv.extend(config.sbatch_args.iter().cloned());
        argv.push(script.display().to_string());
        let mut child = self
            .command("sbatch")
            .args(&argv)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("running sbatch")?;
        let deadline = std::time::Instant::now() + PROBE_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                bail!("the test job did not end within {} s (a busy partition?)", PROBE_TIMEOUT.as_secs());
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        };
        let node = std::fs::read_to_string(&proof).map(|n| n.trim().to_string());
        for file in [&script, &proof, &dir.join(format!("{nonce}.out"))] {
            let _ = std::fs::remove_file(file);
        }
        match node {
            Ok(node) => Ok(node),
            Err(_) => bail!("the test job ended ({status}) but its file is not there"),
        }
    }
}

/// How long `check` waits for its test job.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_script_holds_only_quoted_paths_and_numbers() {
        let script = batch_script(Path::new("/opt/pruefstand"), Path::new("/bench root"), 12, 4, None).unwrap();
        assert!(script.starts_with("#!/bin/sh\n"));
        assert!(script.contains("exec '/opt/pruefstand' --root '/bench root' shard 12 \"${SLURM_ARRAY_TASK_ID}/4\"\n"));
        let reference = batch_script(Path::new("/p"), Path::new("/r"), 3, 2, Some(Path::new("/r/ref run"))).unwrap();
        assert!(reference.contains("shard 3 \"${SLURM_ARRAY_TASK_ID}/2\" --reference '/r/ref run'\n"), "{reference}");
        for bad in ["/a'b", "/a\nb"] {
            assert!(batch_script(Path::new(bad), Path::new("/r"), 1, 1, None).is_err(), "{bad:?}");
            assert!(batch_script(Path::new("/p"), Path::new(bad), 1, 1, None).is_err(), "{bad:?}");
            assert!(batch_script(Path::new("/p"), Path::new("/r"), 1, 1, Some(Path::new(bad))).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sbatch_argv_is_parsable_with_the_array_partition_output_and_extras() {
        let config = ClusterConfig {
            partition: Some("gpu".into()),
            sbatch_args: vec!["--gres=gpu:1".into(), "--time=04:00:00".into()],
            ..ClusterConfig::default()
        };
        let run = pruefstand_store::RunDir::new("/r");
        let argv =
            sbatch_argv(&config, 7, "0-3", "pruefstand-7-ab", &run.shard_output_pattern(), &run.shard_script_path());
        assert_eq!(
            argv,
            [
                "--parsable",
                "--array=0-3",
                "--job-name=pruefstand-7",
                "--comment=pruefstand-7-ab",
                "--output=/r/shards/slurm-%A_%a.out",
                "--partition=gpu",
                "--gres=gpu:1",
                "--time=04:00:00",
                "/r/shards/shard.sbatch"
            ]
        );
        let plain = sbatch_argv(&ClusterConfig::default(), 7, "2", "c", Path::new("/o"), Path::new("/s"));
        assert!(!plain.iter().any(|a| a.starts_with("--partition")));
    }

    #[test]
    fn array_specs_are_ranges_where_they_can_be() {
        assert_eq!(array_spec(&[0, 1, 2, 3]), "0-3");
        assert_eq!(array_spec(&[2]), "2");
        assert_eq!(array_spec(&[1, 3]), "1,3");
    }

    #[test]
    fn sbatch_output_is_a_job_id_with_or_without_a_cluster() {
        assert_eq!(parse_sbatch("1234\n").unwrap(), 1234);
        assert_eq!(parse_sbatch("1234;gpucluster\n").unwrap(), 1234);
        assert!(parse_sbatch("sbatch: error: Batch job submission failed").is_err());
    }

    #[test]
    fn squeue_lines_give_our_tasks_pending_or_running() {
        let out = "12|0|RUNNING\n12|1|PENDING\n12|2|COMPLETING\n13|0|RUNNING\n15|3|CONFIGURING\n15|4|CANCELLED\nbad\n\
                   12|N/A|RUNNING\n";
        let tasks = parse_squeue(out, &[12, 15]);
        assert_eq!(
            tasks.into_iter().collect::<Vec<_>>(),
            [
                ((12, 0), TaskState::Running),
                ((12, 1), TaskState::Pending),
                ((12, 2), TaskState::Running),
                ((15, 3), TaskState::Pending)
            ]
        );
    }

    #[test]
    fn an_array_is_found_by_its_comment_only() {
        let out = "12|pruefstand-3-aa\n12|pruefstand-3-aa\n14|pruefstand-3-bb\n15|(null)\n";
        assert_eq!(parse_comments(out, "pruefstand-3-bb"), Some(14));
        assert_eq!(parse_comments(out, "pruefstand-3-cc"), None);
        assert_eq!(parse_comments("", "pruefstand-3-aa"), None);
    }

    #[test]
    fn scontrol_fields_are_read_from_the_one_line_form() {
        let line = "JobId=13 ArrayJobId=12 ArrayTaskId=1 JobState=CANCELLED Reason=None NodeList=vm ExitCode=0:15";
        assert_eq!(scontrol_field(line, "JobState"), Some("CANCELLED"));
        assert_eq!(scontrol_field(line, "NodeList"), Some("vm"));
        assert_eq!(scontrol_field(line, "Job"), None);
        assert_eq!(scontrol_field(line, "Partition"), None);
    }
}
