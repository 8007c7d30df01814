//! A real Slurm cluster of three nodes for the tests: `scripts/slurm-up` starts a
//! controller `ctl` and nodes `n1 n2 n3` in containers on an internal Docker network
//! (or reuses the cluster that answers), once per test process; this machine submits
//! as a login node. Benches of clustered tests live under the folder every node mounts
//! at the same path, as does the binary's folder. A cluster that cannot start fails the
//! test, loudly.
//!
//! Tests that need the whole cluster (the shards spread over every node, a node
//! killed) hold [`whole_cluster`]; the others share it ([`shared_cluster`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{BIN, Bench, repo};

/// The folder the nodes mount at the same path: clustered benches are made in it.
pub const SHARED: &str = "/var/tmp/pruefstand-cluster";
/// The cluster's nodes (container names and Slurm node names).
pub const NODES: [&str; 3] = ["n1", "n2", "n3"];

static CLUSTER: RwLock<()> = RwLock::new(());

/// The cluster to this test alone: no other test's tasks take a node's GPU meanwhile.
pub fn whole_cluster() -> RwLockWriteGuard<'static, ()> {
    CLUSTER.write().unwrap_or_else(|e| e.into_inner())
}

/// The cluster shared with other tests that share it.
pub fn shared_cluster() -> RwLockReadGuard<'static, ()> {
    CLUSTER.read().unwrap_or_else(|e| e.into_inner())
}

/// `docker ARGS…`, which must succeed; its stdout.
pub fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().expect("docker runs");
    assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The cluster's `slurm.conf` (what `SLURM_CONF` must name).
pub fn slurm_conf() -> &'static Path {
    static CONF: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    CONF.get_or_init(|| {
        let bin_dir = Path::new(BIN).parent().expect("the binary's folder");
        let out = Command::new(repo().join("scripts/slurm-up"))
            .arg("--bin-dir")
            .arg(bin_dir)
            .output()
            .expect("scripts/slurm-up runs");
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
        let bench = Bench::new_in(Path::new(SHARED));
        let config = std::fs::read_to_string(bench.path().join("pruefstand.toml")).unwrap();
        // One GPU per task, one per node: three shards run on three nodes at once.
        let cluster = format!(
            "\n[cluster]\nkind = \"slurm\"\npartition = \"main\"\nshards = {shards}\nsbatch_args = [\"--gres=gpu:1\"]\n"
        );
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

    /// A running job's `cluster.json`, once the daemon has recorded its array.
    pub fn wait_array(&self, id: u64) -> (PathBuf, serde_json::Value) {
        let mut found = None;
        super::wait_until(&format!("job {id}'s array"), 300, || {
            let job = self.job(id);
            // cluster.json is written before sbatch (the comment), then with the array.
            let submitted = |d: &PathBuf| {
                std::fs::read_to_string(d.join("cluster.json"))
                    .ok()
                    .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                    .is_some_and(|s| s["submissions"].as_array().is_some_and(|a| !a.is_empty()))
            };
            found = job["run_dir"].as_str().map(PathBuf::from).filter(submitted);
            found.is_some()
        });
        let dir = found.unwrap();
        let state = super::json(&dir.join("cluster.json"));
        (dir, state)
    }
}
