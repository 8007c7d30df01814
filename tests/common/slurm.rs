//! A real one-node Slurm cluster for the tests: `scripts/slurm-up` starts munged,
//! slurmctld and slurmd under /tmp/pruefstand-slurm (or reuses the cluster that
//! already answers there; the daemons' ports are fixed, so one per machine), once per
//! test process. A cluster that cannot start fails the test, loudly.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Bench, repo};

/// The cluster's `slurm.conf` (what `SLURM_CONF` must name).
pub fn slurm_conf() -> &'static Path {
    static CONF: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    CONF.get_or_init(|| {
        let out = Command::new(repo().join("scripts/slurm-up")).output().expect("scripts/slurm-up runs");
        assert!(
            out.status.success(),
            "the Slurm cluster did not start (scripts/slurm-up):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// A Slurm tool's stdout (`squeue`, `scancel`, …), run against the test cluster.
pub fn slurm(tool: &str, args: &[&str]) -> String {
    let out = Command::new(tool).args(args).env("SLURM_CONF", slurm_conf()).output().expect("Slurm tool runs");
    assert!(out.status.success(), "{tool} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The task ids (`<array>_<i>`) of `array` that `squeue` still lists.
pub fn queued_tasks(array: u64) -> Vec<String> {
    slurm("squeue", &["-h", "-r", "-o", "%F|%K"])
        .lines()
        .filter_map(|l| l.split_once('|'))
        .filter(|(a, _)| a.trim() == array.to_string())
        .map(|(a, i)| format!("{}_{}", a.trim(), i.trim()))
        .collect()
}

impl Bench {
    /// A bench whose queue runs on the test cluster in `shards` shards.
    pub fn clustered(shards: usize) -> Bench {
        slurm_conf();
        let bench = Bench::new();
        let config = std::fs::read_to_string(bench.path().join("pruefstand.toml")).unwrap();
        let cluster = format!("\n[cluster]\nkind = \"slurm\"\npartition = \"main\"\nshards = {shards}\n");
        bench.write("pruefstand.toml", &(config + &cluster));
        bench
    }

    /// A daemon that talks to the test cluster.
    pub fn cluster_daemon(&self) -> super::Daemon {
        self.daemon_with(|cmd| {
            cmd.env("SLURM_CONF", slurm_conf());
        })
    }

    /// `pruefstand ARGS…` against the test cluster.
    pub fn run_on_cluster(&self, args: &[&str]) -> super::Run {
        super::Run::from(self.cmd(args).env("SLURM_CONF", slurm_conf()).output().expect("pruefstand runs"))
    }

    /// A running job's `cluster.json`, once the daemon has written it.
    pub fn wait_array(&self, id: u64) -> (PathBuf, serde_json::Value) {
        let mut found = None;
        super::wait_until(&format!("job {id}'s array"), 300, || {
            let job = self.job(id);
            found = job["run_dir"].as_str().map(PathBuf::from).filter(|d| d.join("cluster.json").is_file());
            found.is_some()
        });
        let dir = found.unwrap();
        let state = super::json(&dir.join("cluster.json"));
        (dir, state)
    }
}
