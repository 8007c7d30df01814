//! A training's progress as its trainer reported it, read back from
//! `trainer-events.jsonl` in its folder: the step reached of how many, the loss after
//! it, and the ETA that `train` and `log` print for it (the trainer's [`StepClock`] over
//! the steps of the current attempt) — what `status`, `status --watch` and `serve` show
//! of a training job. The job names its folder (`Job::training_dir`, recorded as its
//! training starts), so nothing here works the training's id out again.
//!
//! Not the trainer (`trainer`, which writes the file), nor a finished training's
//! manifest (`output`).

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::trainer::{Event, StepClock, span};
use pruefstand_core::queue::{Job, State};

/// At most this much of the events file's end is read (a line a step: a long training's
/// file is far smaller); each step's line names the steps, so the tail tells enough.
const MAX_READ_BYTES: u64 = 1 << 20;

/// Where a training stands.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Phase {
    /// No event yet: the model server starts and the trainer checks its rows.
    Starting,
    /// The rows matched the server's `/tokenize`; the trainer loads the model.
    Checked,
    /// The trainer said how many steps it trains (steps may have ended since).
    Training,
    /// The trainer's `done`: the adapter is written.
    Done,
    /// The trainer refused its input before the first step.
    Refused,
}

/// How far a training has come, from its events across attempts.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub(crate) struct Progress {
    pub(crate) phase: Phase,
    /// The last step reported (a resumed attempt starts at the step it resumed after).
    pub(crate) step: u64,
    /// The steps asked; none before the trainer said.
    pub(crate) steps: Option<u64>,
    /// The loss after `step`: none before a step, or when it was not finite or is not
    /// known (a checkpoint made without its step's line).
    pub(crate) loss: Option<f64>,
    /// The ETA of the steps left as the last step gave it: the median of the current
    /// attempt's last steps' seconds times the steps left; none before its first step.
    pub(crate) eta_s: Option<f64>,
    /// The rows the trainer checked (its last attempt's `checked`).
    pub(crate) rows: Option<u64>,
    /// How many times the trainer started training (`start` events).
    pub(crate) attempts: u32,
    /// The checkpoint's step the last attempt resumed after; 0 when it began afresh.
    pub(crate) resumed_from: Option<u64>,
    /// Why the trainer refused its input.
    pub(crate) refused: Option<String>,
    /// The step's line was read and its loss was null: not finite (said, not hidden).
    #[serde(skip)]
    loss_not_finite: bool,
}

impl Progress {
    /// The progress the event lines tell; lines that are no event (a newer trainer's, or
    /// a line cut off by a kill) are passed over.
    pub(crate) fn of_events(text: &str) -> Progress {
        let mut progress = Progress {
            phase: Phase::Starting,
            step: 0,
            steps: None,
            loss: None,
            eta_s: None,
            rows: None,
            attempts: 0,
            resumed_from: None,
            refused: None,
            loss_not_finite: false,
        };
        // The loss of every step seen: a resumed attempt's step is one an earlier
        // attempt reported.
        let mut losses: BTreeMap<u64, Option<f64>> = BTreeMap::new();
        let mut clock = StepClock::default();
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<Event>(line.trim()) else { continue };
            match event {
                Event::Checked { rows, .. } => {
                    progress.rows = Some(rows);
                    if progress.phase == Phase::Starting {
                        progress.phase = Phase::Checked;
                    }
                }
                Event::Start { steps, resumed_from } => {
                    // A new attempt: its ETA is its own steps' (as `log` prints it).
                    clock = StepClock::default();
                    progress.phase = Phase::Training;
                    progress.attempts += 1;
                    progress.steps = Some(steps);
                    progress.step = resumed_from;
                    progress.resumed_from = Some(resumed_from);
                    progress.eta_s = None;
                    losses.retain(|step, _| *step <= resumed_from);
                }
                Event::Step { step, steps, loss, seconds } => {
                    if let Some(seconds) = seconds {
                        clock.observe(seconds);
                    }
                    progress.phase = Phase::Training;
                    progress.step = step;
                    progress.steps = Some(steps);
                    progress.eta_s = clock.remaining_s(steps.saturating_sub(step));
                    losses.insert(step, loss);
                }
                Event::Done { losses: all, .. } => {
                    progress.phase = Phase::Done;
                    progress.step = all.len() as u64;
                    progress.steps = Some(all.len() as u64);
                    progress.eta_s = None;
                    losses = all.into_iter().enumerate().map(|(i, loss)| (i as u64 + 1, loss)).collect();
                }
                Event::Refused { reason } => {
                    progress.phase = Phase::Refused;
                    progress.refused = Some(reason);
                }
            }
        }
        let loss = losses.get(&progress.step);
        progress.loss = loss.copied().flatten();
        progress.loss_not_finite = matches!(loss, Some(None));
        progress
    }

    /// The progress in a training's events file: none yet (no file) is [`Phase::Starting`].
    /// Only a regular file is read, and of a large one its last [`MAX_READ_BYTES`].
    pub(crate) fn read(events: &Path) -> anyhow::Result<Progress> {
        let (mut file, size) = match pruefstand_core::files::open_regular(events) {
            Ok(opened) => opened,
            Err(_) if !events.exists() => return Ok(Progress::of_events("")),
            Err(e) => return Err(e),
        };
        let from = size.saturating_sub(MAX_READ_BYTES);
        file.seek(SeekFrom::Start(from))?;
        let mut bytes = Vec::new();
        file.take(MAX_READ_BYTES).read_to_end(&mut bytes)?;
        let text = String::from_utf8_lossy(&bytes);
        // Read from inside the file: its first line is cut.
        let text = if from > 0 { text.split_once('\n').map_or("", |(_, rest)| rest) } else { &text };
        Ok(Progress::of_events(text))
    }

    /// In words: `step 3/8, loss 0.6123, ETA 2 min 05 s`, `done, step 8/8, loss 0.5961`.
    pub(crate) fn line(&self) -> String {
        let of = |step: u64| self.steps.map_or_else(|| step.to_string(), |steps| format!("{step}/{steps}"));
        let loss = match (self.loss, self.loss_not_finite) {
            (Some(loss), _) => format!(", loss {loss:.4}"),
            (None, true) => ", loss not finite".into(),
            (None, false) => String::new(),
        };
        match self.phase {
            Phase::Starting => "starting: its rows are checked against the model server".into(),
            Phase::Checked => {
                let rows = self.rows.map_or_else(String::new, |rows| format!("{rows} row(s) "));
                format!("{rows}checked, the trainer starts")
            }
            Phase::Training => {
                let eta = self.eta_s.map_or_else(String::new, |s| format!(", ETA {}", span(s)));
                let resumed = match self.resumed_from {
                    Some(k) if k > 0 && k == self.step => format!(" (resumed after step {k})"),
                    _ => String::new(),
                };
                format!("step {}{loss}{eta}{resumed}", of(self.step))
            }
            Phase::Done => format!("done, step {}{loss}", of(self.step)),
            Phase::Refused => {
                format!("refused: {}", pruefstand_core::util::cut(self.refused.as_deref().unwrap_or(""), 200))
            }
        }
    }
}

/// A training job's progress, as `status` and `serve` show it.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub(crate) struct JobTraining {
    pub(crate) job: u64,
    /// The job's state (a training job stays `running` while it judges what it made).
    pub(crate) state: State,
    /// The version the training makes.
    pub(crate) version: String,
    /// Its training folder.
    pub(crate) dir: PathBuf,
    #[serde(flatten)]
    pub(crate) progress: Progress,
}

impl JobTraining {
    /// The progress of `job`'s training; none for a job that recorded no training folder
    /// (not a training job, or its training not started). An events file that cannot be
    /// read is said, and shows as none. `daemon`: whether a daemon runs (without one, a
    /// job left `running` reaches no ETA).
    pub(crate) fn of(job: &Job, daemon: bool) -> Option<JobTraining> {
        let dir = job.training_dir.clone()?;
        let progress = match Progress::read(&dir.join(super::request::EVENTS)) {
            Ok(progress) => progress,
            Err(e) => {
                tracing::warn!("job {}: its training's progress: {e:#}", job.id);
                return None;
            }
        };
        let version = job
            .training
            .as_ref()
            .and_then(|order| order.get("name")?.as_str().map(str::to_string))
            .or_else(|| Some(dir.parent()?.parent()?.file_name()?.to_string_lossy().into_owned()))
            .unwrap_or_default();
        let mut progress = progress;
        if job.state != State::Running || !daemon {
            // Nothing runs to reach it.
            progress.eta_s = None;
        }
        Some(JobTraining { job: job.id, state: job.state, version, dir, progress })
    }

    /// The training of the jobs to show: the running training job's, else the newest
    /// that recorded a training folder.
    pub(crate) fn shown(jobs: &[Job], daemon: bool) -> Option<JobTraining> {
        let trained = || jobs.iter().rev().filter(|job| job.training_dir.is_some());
        let job = trained().find(|job| job.state == State::Running).or_else(|| trained().next())?;
        JobTraining::of(job, daemon)
    }

    /// Whether the training itself still runs (not yet done, nor refused, and its job
    /// still running).
    pub(crate) fn in_progress(&self) -> bool {
        self.state == State::Running && !matches!(self.progress.phase, Phase::Done | Phase::Refused)
    }

    /// `training smol-sft (job 5): step 3/8, loss 0.6123, ETA 2 min 05 s`; of a job
    /// no longer running, its state: `training smol-sft (job 5, done): done, step 8/8, …`.
    pub(crate) fn line(&self) -> String {
        let state = match self.state {
            State::Running => String::new(),
            state => format!(", {}", state.as_str()),
        };
        let version = pruefstand_core::util::cut(&self.version, 40);
        format!("training {version} (job {}{state}): {}", self.job, self.progress.line())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(step: u64, loss: &str, seconds: &str) -> String {
        format!(r#"{{"event":"step","step":{step},"steps":8,"loss":{loss},"seconds":{seconds}}}"#)
    }

    #[test]
    fn no_step_yet_is_said_as_such() {
        let none = Progress::of_events("");
        assert_eq!((none.phase, none.step, none.steps, none.loss, none.eta_s), (Phase::Starting, 0, None, None, None));
        assert_eq!(none.line(), "starting: its rows are checked against the model server");
        let checked = Progress::of_events(r#"{"event":"checked","rows":13,"tokens":18420}"#);
        assert_eq!((checked.phase, checked.rows), (Phase::Checked, Some(13)));
        assert_eq!(checked.line(), "13 row(s) checked, the trainer starts");
        let started = Progress::of_events(
            "{\"event\":\"checked\",\"rows\":13,\"tokens\":18420}\n{\"event\":\"start\",\"steps\":8,\"resumed_from\":0}\n",
        );
        assert_eq!((started.phase, started.step, started.steps, started.attempts), (Phase::Training, 0, Some(8), 1));
        assert_eq!(started.line(), "step 0/8", "no loss nor ETA before the first step");
    }

    #[test]
    fn the_last_step_gives_the_loss_and_the_median_of_the_last_steps_the_eta() {
        let text = [
            r#"{"event":"checked","rows":13,"tokens":18420}"#.to_string(),
            r#"{"event":"start","steps":8,"resumed_from":0}"#.into(),
            step(1, "0.6931", "20.0"),
            step(2, "0.6802", "90.0"),
            step(3, "0.6123", "22.0"),
        ]
        .join("\n");
        let p = Progress::of_events(&text);
        assert_eq!((p.phase, p.step, p.steps, p.loss), (Phase::Training, 3, Some(8), Some(0.6123)));
        // The trainer's own clock: the median of 20, 90, 22 is 22, times 5 steps left.
        let mut clock = StepClock::default();
        [20.0, 90.0, 22.0].into_iter().for_each(|s| clock.observe(s));
        assert_eq!(p.eta_s, clock.remaining_s(5));
        assert_eq!(p.eta_s, Some(110.0));
        assert_eq!(p.line(), "step 3/8, loss 0.6123, ETA 1 min 50 s");
        // A line cut off by a kill, and a line of another kind, are passed over.
        let cut = format!("{text}\n{{\"event\":\"progress\",\"x\":1}}\n{{\"event\":\"step\",\"step\":4,\"ste");
        assert_eq!(Progress::of_events(&cut), p);
    }

    #[test]
    fn a_null_loss_is_said_not_finite_and_a_step_without_seconds_keeps_the_eta_of_those_with() {
        let text = [
            r#"{"event":"start","steps":8,"resumed_from":0}"#.to_string(),
            step(1, "0.69", "30.0"),
            step(2, "null", "null"),
        ]
        .join("\n");
        let p = Progress::of_events(&text);
        assert_eq!((p.step, p.loss, p.eta_s), (2, None, Some(6.0 * 30.0)));
        assert_eq!(p.line(), "step 2/8, loss not finite, ETA 3 min 00 s");
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!((json["loss"].is_null(), json["step"].as_u64()), (true, Some(2)), "{json}");
    }

    #[test]
    fn a_resumed_attempt_carries_on_from_its_checkpoint_with_a_clock_of_its_own() {
        let text = [
            r#"{"event":"checked","rows":13,"tokens":18420}"#.to_string(),
            r#"{"event":"start","steps":8,"resumed_from":0}"#.into(),
            step(1, "0.6931", "20.0"),
            step(2, "0.6802", "21.0"),
            step(3, "0.6654", "22.0"),
            // Killed here; step 3's checkpoint had no marker, so it resumes after 2.
            r#"{"event":"checked","rows":13,"tokens":18420}"#.into(),
        ]
        .join("\n");
        let between = Progress::of_events(&text);
        assert_eq!((between.phase, between.step), (Phase::Training, 3), "checked again: still where it stood");
        let resumed = format!("{text}\n{}", r#"{"event":"start","steps":8,"resumed_from":2}"#);
        let p = Progress::of_events(&resumed);
        assert_eq!((p.step, p.loss, p.eta_s, p.attempts, p.resumed_from), (2, Some(0.6802), None, 2, Some(2)));
        assert_eq!(p.line(), "step 2/8, loss 0.6802 (resumed after step 2)");
        let p = Progress::of_events(&format!("{resumed}\n{}", step(3, "0.6654", "40.0")));
        assert_eq!((p.step, p.loss, p.eta_s), (3, Some(0.6654), Some(5.0 * 40.0)), "the new attempt's steps only");
        assert_eq!(p.line(), "step 3/8, loss 0.6654, ETA 3 min 20 s");
        // A checkpoint whose step's line was lost (killed between the two): the loss is
        // not known, which is not "not finite".
        let p = Progress::of_events(&format!("{resumed}\n{}", r#"{"event":"start","steps":8,"resumed_from":5}"#));
        assert_eq!((p.step, p.loss), (5, None));
        assert_eq!(p.line(), "step 5/8 (resumed after step 5)");
    }

    #[test]
    fn done_gives_the_last_step_and_loss_and_refused_its_reason() {
        let text = [
            r#"{"event":"start","steps":2,"resumed_from":0}"#.to_string(),
            r#"{"event":"step","step":1,"steps":2,"loss":0.69,"seconds":5.0}"#.into(),
            r#"{"event":"step","step":2,"steps":2,"loss":0.61,"seconds":5.0}"#.into(),
            r#"{"event":"done","adapter":"/work/out/adapter","sha256":{},"losses":[0.69,0.5961],"rows_used":3}"#.into(),
        ]
        .join("\n");
        let p = Progress::of_events(&text);
        assert_eq!((p.phase, p.step, p.steps, p.loss, p.eta_s), (Phase::Done, 2, Some(2), Some(0.5961), None));
        assert_eq!(p.line(), "done, step 2/2, loss 0.5961");
        let refused = Progress::of_events(r#"{"event":"refused","reason":"row a.jsonl:2: token 5 differs"}"#);
        assert_eq!(refused.line(), "refused: row a.jsonl:2: token 5 differs");
    }

    #[test]
    fn the_file_is_read_from_its_folder_and_a_missing_one_is_a_training_starting() {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("trainer-events.jsonl");
        assert_eq!(Progress::read(&events).unwrap().phase, Phase::Starting);
        let lines = format!("{}\n{}\n", r#"{"event":"start","steps":8,"resumed_from":0}"#, step(1, "0.5", "2.0"));
        std::fs::write(&events, &lines).unwrap();
        assert_eq!(Progress::read(&events).unwrap(), Progress::of_events(&lines));
        // A long file: only its end is read, its first (cut) line passed over.
        let long: String = (1..=20_003).map(|k| format!("{}\n", step(k % 8 + 1, "0.5", "2.0"))).collect();
        assert!(long.len() as u64 > MAX_READ_BYTES);
        std::fs::write(&events, &long).unwrap();
        let p = Progress::read(&events).unwrap();
        assert_eq!((p.step, p.steps, p.loss), (4, Some(8), Some(0.5)));
        std::fs::remove_file(&events).unwrap();
        std::fs::create_dir(&events).unwrap();
        let err = Progress::read(&events).unwrap_err().to_string();
        assert!(err.contains("trainer-events.jsonl") && err.contains("a folder"), "{err}");
    }
}
