//! Training an adapter from the bench's exports (`pruefstand train`, docs/training.md):
//! the refusals before any step (`checks`), the trainer (`scripts/pruefstand_train`,
//! TRL with a PEFT LoRA) run in a container of the base version's model image while the
//! base version's model server answers its `/tokenize` check (`trainer`), and what a
//! finished training leaves (`output`): the adapter beside its training manifest and
//! the new version's spec. A training's folder is durable
//! (`reports/<new>/training/<id>/`), so the same command after a `kill -9` resumes from
//! the last checkpoint, and after a finished training reuses its adapter.
//!
//! Not here: judging the new version (`pruefstand train` then runs it as `pruefstand
//! run` does), the command line (`cmd::train`).

pub(crate) mod checks;
pub(crate) mod online;
pub(crate) mod output;
pub(crate) mod progress;
pub(crate) mod request;
pub(crate) mod trainer;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};

use crate::container::{self, ServerSetup};
use crate::model;
use pruefstand_core::plan::Profile;
use pruefstand_core::root::Root;
use pruefstand_core::spec::{ServedFileKind, Version};
use pruefstand_core::util;
use pruefstand_report::export::Format;
use request::{Hyper, TrainerRequest, TrainingDir};

/// What `pruefstand train` is asked.
pub(crate) struct Ask {
    pub(crate) base: Version,
    pub(crate) exports: Vec<PathBuf>,
    /// None: the exports' format.
    pub(crate) kind: Option<Format>,
    pub(crate) hyper: Hyper,
    pub(crate) seed: u64,
    /// The new version's name; none: `<base>-<kind>-<id>`.
    pub(crate) name: Option<String>,
    /// The plan the new version is judged on (its held-out families are guarded).
    pub(crate) plan: String,
}

/// What a queued training job trains (`Job::training`, written by `start-training`):
/// an [`Ask`] without the base version and the plan, which the job's snapshot holds.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
pub(crate) struct Order {
    pub(crate) exports: Vec<PathBuf>,
    pub(crate) kind: Option<Format>,
    pub(crate) hyper: Hyper,
    pub(crate) seed: u64,
    pub(crate) name: Option<String>,
    /// A chained training (`start-night`): its rows are this job's run (and that run's
    /// reference run) exported as `kind` when the training starts; `exports` is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rows_of: Option<u64>,
}

impl Order {
    /// The ask of a job: its snapshot's version and plan.
    pub(crate) fn ask(self, base: Version, plan: String) -> Ask {
        let Order { exports, kind, hyper, seed, name, .. } = self;
        Ask { base, exports, kind, hyper, seed, name, plan }
    }
}

/// A training done (now or before).
pub(crate) struct Trained {
    pub(crate) version: String,
    pub(crate) spec: PathBuf,
    pub(crate) dir: TrainingDir,
    pub(crate) manifest: output::TrainingManifest,
    /// The adapter was there already, from an earlier run of the same command.
    pub(crate) reused: bool,
}

/// The training's id: a hash of what is asked (the base, the kind, the exports' bytes,
/// the knobs, the seed), so the same order finds its folder and checkpoints again.
pub(crate) fn id_of(base: &Version, checked: &checks::Checked, hyper: &Hyper, seed: u64) -> String {
    let shas: Vec<String> = checked.exports.iter().map(|e| e.sha256.clone()).collect();
    request::training_id(&base.hash, checked.kind, &shas, hyper, seed)
}

/// A chained training's rows: job `job`'s run and its reference run, exported as
/// `kind` into the trained version's folder (`reports/<name>/exports/job-<job>.<kind>.jsonl`,
/// its manifest beside it) — written when the training starts, since the run did not
/// exist when the chain was queued. The same run exports the same bytes, so a resumed
/// training finds its checkpoints again. No row is an error naming why each case gave
/// none.
pub(crate) fn export_rows_of(root: &Root, job: u64, kind: Format, name: &str) -> anyhow::Result<PathBuf> {
    let queue = pruefstand_core::queue::Queue::open(root)?;
    let source = queue.load(job)?;
    let run_dir = source.run_dir.with_context(|| format!("job {job} has no run folder"))?;
    let run = pruefstand_store::RunDir::open(&run_dir).with_context(|| format!("job {job}'s run"))?;
    let meta = run.read_run_meta()?;
    let mut runs = vec![run];
    // run.json names its reference relative to the run (or absolute: `join` keeps that).
    if let Some(reference) = meta.reference_run_dir {
        let dir = run_dir.join(reference);
        runs.push(pruefstand_store::RunDir::open(&dir).with_context(|| format!("job {job}'s reference run"))?);
    }
    let out = root.reports().join(name).join("exports").join(format!("job-{job}.{}.jsonl", kind.as_str()));
    if let Some(folder) = out.parent() {
        std::fs::create_dir_all(folder).with_context(|| format!("creating {}", folder.display()))?;
    }
    let manifest = pruefstand_report::export::write(kind, &runs, &out)?;
    if manifest.rows == 0 {
        let why: Vec<String> = manifest.skipped.iter().map(|(why, n)| format!("{why}: {n}")).collect();
        bail!("job {job}'s run gave no {} row ({}); nothing to train on", kind.as_str(), why.join("; "));
    }
    tracing::info!(
        "rows of job {job}: {} {} row(s) from {} run(s) → {}",
        manifest.rows,
        kind.as_str(),
        runs.len(),
        out.display()
    );
    Ok(out)
}

/// The trained version's name when none is given: `<base>-<kind>-<id, 8 digits>`.
pub(crate) fn default_name(base: &Version, kind: Format, id: &str) -> String {
    format!("{}-{}-{}", base.name, kind.as_str(), &id[..8])
}

/// Refuses or trains. `stop` ends the trainer early (its checkpoints stay).
pub(crate) async fn train(
    root: &Root,
    ask: Ask,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Trained> {
    train_in(root, ask, stop, None).await
}

/// [`train`] as job `job` of the queue: the job records the training's folder before
/// any step (`Job::training_dir`), so `status` and `serve` find its progress.
pub(crate) async fn train_for_job(
    root: &Root,
    job: u64,
    ask: Ask,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Trained> {
    train_in(root, ask, stop, Some(job)).await
}

/// What a training is, decided before the trainer starts: the checked exports, its
/// id, name and folder (locked), and the base model.
struct Prepared {
    base: Version,
    model_path: PathBuf,
    checked: checks::Checked,
    id: String,
    name: String,
    dir: TrainingDir,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// The refusals, the name and the training's folder: everything before a container.
async fn prepare(root: &Root, ask: &Ask, job: Option<u64>) -> anyhow::Result<Prepared> {
    let base = ask.base.clone();
    let model_path = checks::base_usable(&base)?;
    let (_, plan, _) = Profile::load_named(&root.path, &ask.plan)?;
    let checked = {
        let (base, model_path, exports, kind, plan_name) =
            (base.clone(), model_path.clone(), ask.exports.clone(), ask.kind, ask.plan.clone());
        crate::runtime::blocking(move || checks::check(&base, &model_path, &exports, kind, &plan_name, &plan)).await?
    };
    let id = id_of(&base, &checked, &ask.hyper, ask.seed);
    let name = ask.name.clone().unwrap_or_else(|| default_name(&base, checked.kind, &id));
    pruefstand_core::input::check_name(&name).map_err(|why| anyhow::anyhow!("--name {name:?}: {why}"))?;
    if name == base.name {
        bail!("--name {name}: that is the base version's name; the trained version needs its own");
    }
    let dir = TrainingDir::new(&root.reports(), &name, &id);
    for folder in [dir.checkpoints(), dir.out(), dir.code()] {
        std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
    }
    let lock = lock(root, &dir)?;
    if let Some(job) = job {
        // Only what `status` shows depends on it: a failure is said, not fatal.
        let (root, path) = (root.clone(), std::path::absolute(&dir.path)?);
        let recorded = crate::runtime::blocking(move || {
            pruefstand_core::queue::Queue::open(&root)?.record_training_dir(job, &path).map(drop)
        })
        .await;
        if let Err(e) = recorded {
            tracing::warn!("job {job}: recording its training folder: {e:#}");
        }
    }
    Ok(Prepared { base, model_path, checked, id, name, dir, _lock: lock })
}

/// What the trainer's container ran with, for the manifest.
struct Ran {
    attempt: trainer::Attempt,
    image: container::ImageInfo,
    trainer_sha256: String,
}

/// Starts the base version's model server for the token check, writes the request and
/// runs the trainer once (`check_only`: it stops after the rows matched the server).
async fn run_trainer(
    p: &Prepared,
    ask: &Ask,
    check_only: bool,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Ran> {
    let (base, dir) = (&p.base, &p.dir);
    let trainer_sha256 = crate::runtime::blocking({
        let dir = dir.clone();
        move || write_code(&dir)
    })
    .await?;
    let server = ServerSetup::of(base);
    let docker = container::connect().await?;
    for orphan in container::remove_orphans(&docker).await? {
        tracing::info!("{orphan}");
    }
    let image_name = server.model.image.clone().context("backend \"docker\" needs model.image")?;
    let image = container::ensure_image(&docker, &image_name, server.model.pull)
        .await
        .with_context(|| base.path.display().to_string())?;

    // The server the rows are checked against, as a run starts it.
    tracing::info!("starting {}'s model server for the token check", base.name);
    let pool = container::Pool::new(dir.path.join("server"));
    let context = model::UpContext {
        pool: &pool,
        run_dir: &dir.path,
        job: &format!("train-{}", std::process::id()),
        run_id: &p.id,
        interrupt_clients: Arc::new(|| false),
    };
    let endpoint = match model::up(&server, &dir.path.join("no-truth.json"), &context).await {
        Ok(endpoint) => endpoint,
        Err(e) => {
            let _ = pool.shutdown().await;
            return Err(anyhow::Error::new(e).context(format!("starting {}'s model server", base.name)));
        }
    };
    let api_key = endpoint.api_key.clone();
    let check = trainer::CheckServer { endpoint, pool };
    let trainer_request = TrainerRequest {
        kind: p.checked.kind,
        base_model: request::MODEL.into(),
        base_model_name: base.spec.model.served_name.clone(),
        chat_template: base
            .served_file(ServedFileKind::ChatTemplate)
            .map(|_| ServedFileKind::ChatTemplate.container_path().to_string()),
        rows: (0..p.checked.exports.len()).map(request::export_in_container).collect(),
        tokenize_url: check.tokenize_url(),
        served_model: base.spec.model.served_name.clone(),
        out: request::OUT.into(),
        checkpoints: request::CHECKPOINTS.into(),
        seed: ask.seed,
        hyper: ask.hyper.clone(),
    };
    let written = crate::runtime::blocking({
        let path = dir.request();
        move || util::write_json_atomic(&path, &trainer_request)
    })
    .await;
    if let Err(e) = written {
        let _ = check.stop().await;
        return Err(e);
    }
    let exports: Vec<PathBuf> = p.checked.exports.iter().map(|e| e.path.clone()).collect();
    let launch = trainer::Launch {
        docker: &docker,
        server: &server,
        model_host: &p.model_path,
        dir,
        exports: &exports,
        api_key,
        version: &p.name,
        check_only,
    };
    let attempt = trainer::run(&launch, Some(check), stop).await?;
    if let Some(reason) = &attempt.refused {
        bail!("refused before the first step: the trainer says: {reason}");
    }
    Ok(Ran { attempt, image, trainer_sha256 })
}

/// Rows that rendered, as the base version's server renders them.
pub(crate) struct RowsChecked {
    pub(crate) rows: u64,
    pub(crate) tokens: u64,
    /// The training's folder: its `trainer.log` says what was checked.
    pub(crate) dir: TrainingDir,
}

/// The refusals and the token check of a training, without a step: every row rendered
/// with the served chat template and its tools, and matched token for token against
/// the base version's running server (`/tokenize`). An error names the first row and
/// token that differ. `stop` ends it early (the trainer's container and the server removed).
pub(crate) async fn check_rows(
    root: &Root,
    ask: Ask,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<RowsChecked> {
    let prepared = prepare(root, &ask, None).await?;
    let ran = run_trainer(&prepared, &ask, true, stop).await?;
    let Some((rows, tokens)) = ran.attempt.checked else {
        bail!("the trainer ended without its `checked` line (its log: {})", prepared.dir.log().display());
    };
    Ok(RowsChecked { rows, tokens, dir: prepared.dir })
}

async fn train_in(
    root: &Root,
    ask: Ask,
    stop: impl std::future::Future<Output = ()>,
    job: Option<u64>,
) -> anyhow::Result<Trained> {
    let prepared = prepare(root, &ask, job).await?;
    let Prepared { base, checked, id, name, dir, .. } = &prepared;
    let kind = checked.kind;
    tracing::info!(
        "training {name} from {} ({} {} row(s) in {} export(s)): {}",
        base.name,
        checked.rows(),
        kind.as_str(),
        checked.exports.len(),
        dir.path.display()
    );

    let manifest_path = dir.manifest();
    if let Some(manifest) = crate::runtime::blocking({
        let dir = dir.clone();
        move || output::finished(&dir)
    })
    .await
    {
        tracing::info!("already trained: the adapter in {} (same command, same inputs)", dir.adapter().display());
        let spec = write_spec(root, base, name, &manifest, &manifest_path).await?;
        return Ok(Trained { version: name.clone(), spec, dir: dir.clone(), manifest, reused: true });
    }
    let base_model = crate::runtime::blocking({
        let path = prepared.model_path.clone();
        move || output::base_model(&path)
    })
    .await?;
    let Ran { attempt, image, trainer_sha256 } = run_trainer(&prepared, &ask, false, stop).await?;
    let Some(trainer::Event::Done { sha256, losses, rows_used, .. }) = attempt.done else {
        bail!("the trainer ended without its `done` line (its log: {})", dir.log().display());
    };
    let adapter = crate::runtime::blocking({
        let dir = dir.clone();
        move || output::install_adapter(&dir, &sha256)
    })
    .await?;
    let (step_seconds, attempts) = output::steps_from_events(&dir.events());
    let manifest = output::TrainingManifest {
        version: name.clone(),
        base_version: base.name.clone(),
        base_spec_hash: base.hash.clone(),
        training: id.clone(),
        kind,
        exports: checked.exports.iter().map(output::ExportRef::of).collect(),
        rows: checked.rows(),
        rows_used,
        hyperparameters: ask.hyper.clone(),
        seed: ask.seed,
        base_model,
        image: output::ImageRef { name: image.name.clone(), id: image.id.clone(), digest: image.digest() },
        trainer_sha256,
        steps: losses.len(),
        losses,
        step_seconds,
        attempts,
        wall_s: attempt.wall_s,
        adapter,
        finished_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        written_by: format!("pruefstand {}", env!("CARGO_PKG_VERSION")),
    };
    crate::runtime::blocking({
        let (path, manifest) = (manifest_path.clone(), manifest.clone());
        move || util::write_json_atomic(&path, &manifest)
    })
    .await?;
    let spec = write_spec(root, base, name, &manifest, &manifest_path).await?;
    Ok(Trained { version: name.clone(), spec, dir: dir.clone(), manifest, reused: false })
}

/// [`output::write_spec`] on the blocking pool.
async fn write_spec(
    root: &Root,
    base: &Version,
    name: &str,
    manifest: &output::TrainingManifest,
    manifest_path: &std::path::Path,
) -> anyhow::Result<PathBuf> {
    let (versions, base, name, manifest, manifest_path) =
        (root.versions(), base.clone(), name.to_string(), manifest.clone(), manifest_path.to_path_buf());
    crate::runtime::blocking(move || output::write_spec(&versions, &base, &name, &manifest, &manifest_path)).await
}

/// One `train` at a time in a training's folder: a second (a user's double start) says
/// so instead of writing the same checkpoints.
fn lock(root: &Root, dir: &TrainingDir) -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
    let path = root.lock_file(&format!("train-{}-{}", dir.version, dir.id))?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|_| {
        anyhow::anyhow!("another `pruefstand train` works on {} now ({} is held)", dir.path.display(), path.display())
    })
}

/// Writes the trainer's package as this binary embeds it (the files of
/// `scripts/gym.manifest` under `pruefstand_train/`) into the training's folder, and
/// returns a sha256 over them.
fn write_code(dir: &TrainingDir) -> anyhow::Result<String> {
    let files: Vec<&(&str, &[u8])> =
        pruefstand_gym::pyenv::GYM_FILES.iter().filter(|(path, _)| path.starts_with("pruefstand_train/")).collect();
    if files.is_empty() {
        bail!(
            "this build of pruefstand embeds no trainer (no pruefstand_train/ files in scripts/gym.manifest): \
             `pruefstand train` needs one"
        );
    }
    let mut listing = String::new();
    for (path, bytes) in files {
        let target = dir.code().join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        util::write_atomic(&target, bytes)?;
        listing.push_str(&format!("{path} {}\n", util::sha256_hex(bytes)));
    }
    Ok(util::sha256_hex(listing.as_bytes()))
}
