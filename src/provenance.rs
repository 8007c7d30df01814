//! `provenance.json` in every run directory: what exactly ran, so a result can be
//! reproduced or doubted — the image (id, digests) and the exact container command (API
//! key redacted), driver/CUDA/GPU (NVML), Jetson power mode and L4T release, model and
//! adapter files, agentdojo version, plan hash, and our own version and revision.
//!
//! Collecting never fails a run: anything unavailable is recorded as absent, with why.
//! Not the judgement's input (that is `run.json`); R1 reads the image digest from there.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::container::ServerSetup;
use crate::container::pool::Container;
use pruefstand_core::record::Provenance;
use pruefstand_core::spec::ServedFileKind;
use pruefstand_core::util;
use pruefstand_store::RunDir;

/// Files up to this size are hashed (sha256); larger ones (weights) are recorded by
/// size and mtime only — hashing tens of GB per run would cost minutes.
const HASH_LIMIT: u64 = 64 << 20;
/// At most this many files per folder are listed.
const MAX_FILES: usize = 2000;

/// Owned, so that collecting (git, NVML, hashing the model's files) can run on the
/// blocking pool.
pub(crate) struct Inputs {
    pub(crate) server: ServerSetup,
    pub(crate) plan_name: String,
    pub(crate) plan_hash: String,
    pub(crate) benchmark_version: String,
    pub(crate) agentdojo_version: String,
    pub(crate) container: Option<Container>,
    /// The model and adapter folders the server read (spec paths, or generated ones).
    pub(crate) model_dir: Option<PathBuf>,
    pub(crate) adapter_dir: Option<PathBuf>,
    /// The bench's identity key ([`pruefstand_core::root::Root::identity_key`]).
    pub(crate) identity_key: Vec<u8>,
}

pub(crate) fn write(run: &RunDir, inputs: &Inputs) -> anyhow::Result<()> {
    run.write(&collect(inputs))
}

pub(crate) fn collect(i: &Inputs) -> Provenance {
    let server = &i.server;
    let container = i.container.as_ref().map(|c| {
        json!({
            "id": c.id, "name": c.name,
            "command": c.command,
            "env": ["VLLM_API_KEY=<redacted>"],
            "published": format!("127.0.0.1:{}", c.host_port),
            // The base model and every adapter loaded so far (a warm server's too).
            "served": c.served,
            "gpu": server.model.gpu,
            // The context the server was given: a case that outgrows it is scored as a
            // context overflow, so the figure belongs with the results.
            "max_model_len": crate::container::vllm_option(&c.command, "--max-model-len").and_then(|v| v.parse::<u64>().ok()),
        })
    });
    let mut files = json!({
        "method": format!("sha256 for files up to {} MiB; larger files by size and mtime only", HASH_LIMIT >> 20),
        "model": i.model_dir.as_deref().map(fingerprint),
        "adapter": i.adapter_dir.as_deref().map(fingerprint),
    });
    for kind in ServedFileKind::ALL {
        files[kind.field()] = Value::Null;
    }
    // What the server was set up with; read now only where there is no server, each
    // file on its own (one that cannot be read keeps its path, its sha256 absent).
    match &i.container {
        Some(c) => {
            for file in c.served_files() {
                files[file.kind.field()] = json!({"path": file.host, "sha256": file.sha256});
            }
        }
        None => {
            for (kind, host) in &server.served_files {
                let sha256 = std::fs::read(host).ok().map(|bytes| util::sha256_hex(&bytes));
                files[kind.field()] = json!({"path": host, "sha256": sha256});
            }
        }
    }
    Provenance {
        collected_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        pruefstand: ours(),
        version: json!({"name": server.name, "spec_hash": server.spec_hash, "backend": server.model.backend.get_ref()}),
        // The spec hash sees the URL redacted: a keyed hash tells two credentials apart
        // without revealing either (an unkeyed one falls to a dictionary offline).
        model_url: server.model.url.as_ref().map(|u| {
            json!({"shown": u, "hmac_sha256": u.keyed_identity(&i.identity_key), "key": ".pruefstand/identity.key"})
        }),
        plan: json!({"name": i.plan_name, "hash": i.plan_hash, "benchmark_version": i.benchmark_version}),
        agentdojo_version: i.agentdojo_version.clone(),
        image: i
            .container
            .as_ref()
            .map(|c| json!({"name": c.image.name, "id": c.image.id, "repo_digests": c.image.repo_digests})),
        server_version: i.container.as_ref().and_then(|c| c.server_version.clone()),
        container,
        gpu: nvml(),
        jetson: jetson(),
        files,
        shards: None,
    }
}

/// Our version, and the git revision read at run time from the checkout the binary was
/// built from (`CARGO_MANIFEST_DIR`); null with the reason when that is not a checkout.
fn ours() -> Value {
    let source = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").arg("-C").arg(source).args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let revision = git(&["rev-parse", "HEAD"]);
    let dirty =
        revision.as_ref().and_then(|_| git(&["status", "--porcelain", "--untracked-files=no"])).map(|s| !s.is_empty());
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "git_revision": revision,
        "git_dirty": dirty,
        "git_source": format!("`git rev-parse HEAD` at run time in {source} (the build's source folder)"),
    })
}

fn nvml() -> Value {
    let nvml = match nvml_wrapper::Nvml::init() {
        Ok(n) => n,
        Err(e) => return json!({"available": false, "reason": format!("NVML: {e}")}),
    };
    let cuda = nvml.sys_cuda_driver_version().ok().map(|v| {
        format!("{}.{}", nvml_wrapper::cuda_driver_version_major(v), nvml_wrapper::cuda_driver_version_minor(v))
    });
    let count = nvml.device_count().unwrap_or(0);
    let names: Vec<Value> =
        (0..count).map(|i| nvml.device_by_index(i).and_then(|d| d.name()).map_or(Value::Null, Value::from)).collect();
    json!({
        "available": true,
        "driver_version": nvml.sys_driver_version().ok(),
        "cuda_driver_version": cuda,
        "gpus": names,
    })
}

fn jetson() -> Value {
    let read = |p: &str| {
        std::fs::read_to_string(p).ok().map(|s| s.trim_matches(|c: char| c.is_whitespace() || c == '\0').to_string())
    };
    let nvpmodel = Command::new("nvpmodel")
        .arg("-q")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    json!({
        "nvpmodel_q": nvpmodel,
        "nv_tegra_release": read("/etc/nv_tegra_release"),
        "device_model": read("/proc/device-tree/model"),
    })
}

/// Every file under `dir` (sorted): size, mtime, and sha256 when small enough.
fn fingerprint(dir: &Path) -> Value {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(_) => files.push(p),
                Err(_) => {}
            }
        }
    }
    files.sort();
    let truncated = files.len() > MAX_FILES;
    let listed: Vec<Value> = files
        .iter()
        .take(MAX_FILES)
        .map(|p| {
            let meta = std::fs::metadata(p).ok();
            let size = meta.as_ref().map(|m| m.len());
            let mtime = meta
                .as_ref()
                .and_then(|m| m.modified().ok())
                .map(|t| chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339());
            let sha256 =
                size.filter(|s| *s <= HASH_LIMIT).and_then(|_| std::fs::read(p).ok()).map(|b| util::sha256_hex(&b));
            json!({"path": p.strip_prefix(dir).unwrap_or(p), "size": size, "mtime": mtime, "sha256": sha256})
        })
        .collect();
    json!({"path": dir, "exists": dir.is_dir(), "files": listed, "truncated": truncated})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_server_each_served_file_is_read_on_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let spec = dir.path().join("v.toml");
        let text = "[model]\nbackend = \"docker\"\nimage = \"img:1\"\nserved_name = \"base\"\npath = \"/srv/models/m\"\n\
                    chat_template = \"tools.jinja\"\ntool_parser_plugin = \"parser.py\"\n";
        std::fs::write(&spec, text).unwrap();
        std::fs::write(dir.path().join("tools.jinja"), "{{ messages }}").unwrap();
        std::fs::write(dir.path().join("parser.py"), "# parser").unwrap();
        let version = pruefstand_core::spec::Version::load(dir.path(), spec.to_str().unwrap()).unwrap();
        // Gone since the spec was checked: its path stays on record, its hash is absent.
        std::fs::remove_file(dir.path().join("parser.py")).unwrap();
        let inputs = Inputs {
            server: ServerSetup::of(&version),
            plan_name: "p".into(),
            plan_hash: "h".into(),
            benchmark_version: "b".into(),
            agentdojo_version: "a".into(),
            container: None,
            model_dir: None,
            adapter_dir: None,
            identity_key: b"k".to_vec(),
        };
        let files = &collect(&inputs).files;
        assert_eq!(files["chat_template"]["sha256"], util::sha256_hex(b"{{ messages }}"), "{files}");
        assert_eq!(files["tool_parser_plugin"]["path"], dir.path().join("parser.py").to_str().unwrap(), "{files}");
        assert!(files["tool_parser_plugin"]["sha256"].is_null(), "{files}");

        // The typed provenance writes the bytes the `json!` value it replaced wrote: the
        // same keys in the same order, null where a part is absent.
        let typed = collect(&inputs);
        let old = json!({
            "collected_at": typed.collected_at,
            "pruefstand": typed.pruefstand,
            "version": typed.version,
            "model_url": typed.model_url,
            "plan": typed.plan,
            "agentdojo_version": typed.agentdojo_version,
            "image": typed.image,
            "server_version": typed.server_version,
            "container": typed.container,
            "gpu": typed.gpu,
            "jetson": typed.jetson,
            "files": typed.files,
        });
        let run = RunDir::new(dir.path());
        run.write(&typed).unwrap();
        let written = std::fs::read(run.test_file(pruefstand_store::RunFile::Provenance)).unwrap();
        let old_path = dir.path().join("old.json");
        util::write_json_atomic(&old_path, &old).unwrap();
        assert_eq!(String::from_utf8(written).unwrap(), std::fs::read_to_string(&old_path).unwrap());
        assert_eq!(run.read::<Provenance>().unwrap().unwrap(), typed, "read back as written");
    }
}
