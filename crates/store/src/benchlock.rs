//! The bench lock: one GPU-backed run at a time on a bench root. The daemon holds it
//! while a job whose version (or its reference) runs its model in Docker is running; a
//! plain `pruefstand run` of such a version takes it too, so the two never start a
//! second model server on the same GPU. Simulated and external versions use no GPU of
//! ours and never take it.
//!
//! It is a flock on `.pruefstand/locks/gpu.lock` (beside the reference locks) with the
//! holder written inside, so whoever waits can say for whom. A Docker version with
//! `gpu = "none"` (the simulator's image) uses no GPU either. Not here: the guards'
//! view of foreign GPU users (`guard`), the run directory's own lock (`rundir`).

use crate::{LockError, RunLock};
use pruefstand_core::root::Root;
use pruefstand_core::spec::{Backend, GpuMode, Version};

/// Whether running `version` starts a model server on the GPU: its own or its
/// reference's (made first when missing), the reference found where the version finds
/// it (a queued job's snapshot).
pub fn needs_gpu(version: &Version) -> anyhow::Result<bool> {
    if uses_gpu(version) {
        return Ok(true);
    }
    match version.load_reference() {
        Some(reference) => Ok(uses_gpu(&reference?)),
        None => Ok(false),
    }
}

fn uses_gpu(version: &Version) -> bool {
    let model = &version.spec.model;
    *model.backend.get_ref() == Backend::Docker && model.gpu != GpuMode::None
}

/// Takes the bench lock now as `holder`, or says who holds it.
pub fn try_take(root: &Root, holder: &str) -> Result<RunLock, LockError> {
    RunLock::try_take_as(&root.lock_file("gpu")?, holder)
}

/// Why a waiter waits, in words.
pub fn held_by(holder: &str) -> String {
    format!("the bench lock is held by {}", holder.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_with(versions: &[(&str, &str)]) -> (tempfile::TempDir, Root) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../pruefstand.toml"),
            dir.path().join("pruefstand.toml"),
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("versions")).unwrap();
        for (name, text) in versions {
            std::fs::write(dir.path().join("versions").join(format!("{name}.toml")), text).unwrap();
        }
        let root = Root::find(Some(dir.path().to_path_buf())).unwrap();
        (dir, root)
    }

    #[test]
    fn only_a_docker_model_on_the_gpu_needs_the_lock_its_own_or_its_references() {
        let repo =
            |name: &str| std::fs::read_to_string(format!("{}/../../versions/{name}.toml", env!("CARGO_MANIFEST_DIR")));
        let sim = repo("demo-baseline").unwrap();
        let no_gpu = repo("demo-docker").unwrap().replace("reference = \"demo-baseline\"", "");
        let gpu = no_gpu.replace("gpu = \"none\"", "gpu = \"device-request\"");
        let refers = sim.replace("[model]", "reference = \"gpu\"\n[model]");
        let versions = [("plain", sim.as_str()), ("no-gpu", &no_gpu), ("gpu", &gpu), ("refers", &refers)];
        let (_dir, root) = root_with(&versions);
        let needs = |name: &str| needs_gpu(&Version::load(&root.versions(), name).unwrap()).unwrap();
        assert!(!needs("plain"));
        assert!(!needs("no-gpu"), "the simulator's image runs without a GPU");
        assert!(needs("gpu"));
        assert!(needs("refers"), "its reference runs on the GPU first");
    }

    #[test]
    fn the_second_taker_learns_the_first_ones_name() {
        let (_dir, root) = root_with(&[]);
        let held = try_take(&root, "job 7 (kandidat on voll)").unwrap();
        let Err(LockError::Busy { holder }) = try_take(&root, "someone else") else { panic!("the lock is held") };
        assert!(holder.starts_with("job 7 (kandidat on voll) since "), "{holder}");
        drop(held);
        assert!(try_take(&root, "someone else").is_ok(), "released on drop");
    }
}
