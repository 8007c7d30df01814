//! The sinks every gym pass has: the events log (`events.jsonl`), the run directory's
//! records (`cases.jsonl`, the environment check), the console's progress, the
//! caller's progress handle (the daemon's status) and the concurrency steering. Each
//! takes the typed events on its own; none knows the others. Early stop, the one sink
//! that may end a pass, is the run's (`run::early`). The driver calls them on the
//! blocking pool: the records sink fsyncs every case.

use std::sync::Arc;

use super::events::{Ask, GymEvent, Seen, Sink};
use super::{Control, Counts, Frame};
use crate::concurrency::Feed;
use crate::console;
use pruefstand_core::case::CaseRecord;
use pruefstand_store::{CasesWriter, RunDir};

/// Appends every line the gym printed to `events.jsonl`, as printed (lines that are no
/// event too): the pass's raw account, for reading after the fact.
pub(super) struct EventsLog(std::fs::File);

impl EventsLog {
    pub(crate) fn open(run_dir: &RunDir) -> anyhow::Result<EventsLog> {
        Ok(EventsLog(run_dir.open_events_log()?))
    }
}

impl Sink for EventsLog {
    fn line(&mut self, line: &str) -> anyhow::Result<()> {
        std::io::Write::write_all(&mut self.0, format!("{line}\n").as_bytes())?;
        Ok(())
    }

    fn on(&mut self, _: &GymEvent, _: &Seen) -> anyhow::Result<Ask> {
        Ok(Ask::Continue)
    }
}

/// Appends each finished case to `cases.jsonl` the moment it arrives (fsync'd), and
/// keeps the gym's environment check.
pub(super) struct Records {
    run_dir: RunDir,
    writer: CasesWriter,
}

impl Records {
    pub(crate) fn open(run_dir: &RunDir) -> anyhow::Result<Records> {
        Ok(Records { run_dir: run_dir.clone(), writer: run_dir.open_cases_for_append()? })
    }
}

impl Sink for Records {
    fn on(&mut self, event: &GymEvent, _: &Seen) -> anyhow::Result<Ask> {
        match event {
            GymEvent::Case { record } => self.writer.append(record)?,
            GymEvent::EnvironmentCheck { checks } => self.run_dir.write_environment_checks(checks)?,
            _ => {}
        }
        Ok(Ask::Continue)
    }
}

/// The console's progress: a bar on a terminal, else a line every tenth of the plan.
pub(crate) struct Progress(console::Progress);

impl Progress {
    /// `continuing`: a later pass of a run (a campaign's round), its start said at debug.
    pub(crate) fn new(total: usize, continuing: bool) -> Progress {
        let progress = console::Progress::new(total);
        Progress(if continuing { progress.continuing() } else { progress })
    }
}

impl Sink for Progress {
    fn on(&mut self, event: &GymEvent, seen: &Seen) -> anyhow::Result<Ask> {
        match event {
            GymEvent::Start { total, to_run, jobs, processes } => {
                self.0.start(*total, *to_run, *jobs, processes.unwrap_or(*jobs))
            }
            GymEvent::CaseStart { case_id } => {
                tracing::debug!("case {case_id} started");
                self.0.case_started(seen.in_flight);
            }
            GymEvent::Case { record } => {
                self.0.in_flight(seen.in_flight);
                self.0.case_done(record.is_error());
            }
            _ => {}
        }
        Ok(Ask::Continue)
    }
}

/// The caller's progress handle (the daemon's status and ETA): cases done of planned,
/// within the pass's frame when it has one.
pub(crate) struct Report {
    control: Arc<Control>,
    frame: Frame,
}

impl Report {
    pub(crate) fn new(control: Arc<Control>, run_dir: &RunDir, frame: Option<Frame>) -> Report {
        let frame = frame.unwrap_or(Frame { run_dir: run_dir.path().to_path_buf(), done_before: 0, total: 0 });
        Report { control, frame }
    }
}

impl Sink for Report {
    fn on(&mut self, event: &GymEvent, seen: &Seen) -> anyhow::Result<Ask> {
        if matches!(event, GymEvent::Start { .. } | GymEvent::Case { .. }) {
            let done = self.frame.done_before + seen.done;
            let total = self.frame.total.max(done).max(seen.total);
            self.control.report(&self.frame.run_dir, Counts { done, total, in_flight: seen.in_flight });
        }
        Ok(Ask::Continue)
    }
}

/// Feeds the concurrency observer (a task on the runtime that reads the server's
/// gauges and sends the gym its target) what only the events show: cases in flight,
/// cases left to start, time per model call. The driver ends the observer after the
/// pass.
pub(super) struct Steering(Feed);

impl Steering {
    pub(crate) fn new(feed: Feed) -> Steering {
        Steering(feed)
    }
}

impl Sink for Steering {
    fn on(&mut self, event: &GymEvent, seen: &Seen) -> anyhow::Result<Ask> {
        let mut live = self.0.live();
        match event {
            GymEvent::Start { to_run, .. } => live.to_start = *to_run,
            GymEvent::CaseStart { .. } => {
                live.set_in_flight(seen.in_flight);
                live.to_start = live.to_start.saturating_sub(1);
            }
            GymEvent::Case { record } => {
                live.set_in_flight(seen.in_flight);
                if let Some(per_call) = per_call_s(record) {
                    live.per_call_s.push(per_call);
                }
            }
            _ => {}
        }
        Ok(Ask::Continue)
    }
}

/// Seconds per model call of a scored case (what the latency rule steers by).
fn per_call_s(record: &CaseRecord) -> Option<f64> {
    let calls = record.llm_calls.filter(|&n| n > 0)?;
    (!record.is_error()).then(|| record.duration_s / calls as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_campaign_reports_its_cases_as_part_of_the_whole_run() {
        let seen_counts = Arc::new(std::sync::Mutex::new(Vec::new()));
        let into = seen_counts.clone();
        let control = Arc::new(Control::with_progress(move |_, counts| into.lock().unwrap().push(counts)));
        let dir = tempfile::tempdir().unwrap();
        let run_dir = RunDir::new(dir.path());
        // The campaign after 141 plan cases, 831 at most in all: the daemon's status and
        // ETA count plan and campaign as one run.
        let frame = Frame { run_dir: dir.path().into(), done_before: 141, total: 831 };
        let mut report = Report::new(control, &run_dir, Some(frame));
        let start = GymEvent::Start { total: 240, to_run: 30, jobs: 8, processes: None };
        report.on(&start, &Seen { in_flight: 8, done: 210, total: 240 }).unwrap();
        let counts = seen_counts.lock().unwrap()[0];
        assert_eq!((counts.done, counts.total, counts.in_flight), (351, 831, 8));
    }
}
