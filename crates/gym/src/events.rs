//! The gym's event stream, typed, and the seam its consumers plug into: each line the
//! gym prints on stdout becomes a [`GymEvent`]; the driver (`gym::run`) keeps the one
//! count everyone needs ([`Seen`]: cases in flight, done, planned) and hands every event
//! to each [`Sink`] in turn. A sink may ask the gym to drain (start no new case, let
//! the ones in flight finish) — early stop does. What the sinks do with the events is
//! theirs (`gym::sinks`, `run::early`); nothing here writes a file or steers anything.
//! The driver hands each sink every line as printed too, before it is an event (the
//! events log keeps them).

use serde::Deserialize;

use pruefstand_core::case::CaseRecord;
use pruefstand_core::record::EnvCheck;

/// One line of the gym's stdout (docs/protocol.md §2).
#[derive(Deserialize, Debug)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum GymEvent {
    Start {
        total: usize,
        to_run: usize,
        jobs: usize,
        processes: Option<usize>,
    },
    Skip {},
    Rerun {
        case_id: String,
        reason: String,
    },
    CaseStart {
        case_id: String,
    },
    Case {
        record: Box<CaseRecord>,
    },
    EnvironmentCheck {
        checks: Vec<EnvCheck>,
    },
    Warning {
        message: String,
    },
    /// `not_started` counts the cases that will not run, `stopped` those of them that
    /// were in flight and were ended (a stop, not a drain).
    Drained {
        not_started: usize,
        #[serde(default)]
        stopped: usize,
    },
    Done,
}

/// What the driver has counted once the event is taken in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Seen {
    /// Cases started and not finished.
    pub in_flight: usize,
    /// Cases with a record: those recorded before this pass and those finished in it.
    pub done: usize,
    /// Cases the pass runs over (the request's).
    pub total: usize,
}

impl Seen {
    pub fn new(total: usize) -> Seen {
        Seen { in_flight: 0, done: 0, total }
    }

    /// Takes an event in; `started` holds the ids of the cases in flight.
    pub fn take(&mut self, event: &GymEvent, started: &mut std::collections::HashSet<String>) {
        match event {
            GymEvent::Start { total, to_run, .. } => {
                self.total = *total;
                self.done = total.saturating_sub(*to_run);
            }
            GymEvent::CaseStart { case_id } => {
                started.insert(case_id.clone());
            }
            GymEvent::Case { record } => {
                started.remove(&record.case_id);
                self.done += 1;
            }
            _ => {}
        }
        self.in_flight = started.len();
    }
}

/// What a sink asks of the gym after an event; of several sinks' asks the last listed
/// here wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ask {
    Continue,
    /// Start no new case; the cases in flight finish (asked of the gym once).
    Drain,
    /// Start no new case and end the cases in flight unrecorded: nothing they could
    /// record would change what was decided (early stop).
    Stop,
}

/// A consumer of the gym's events. An error ends the pass (the gym is killed; every
/// case recorded so far stays recorded).
pub trait Sink: Send {
    /// Each line the gym printed, as printed, before it is read as an event (the
    /// events log keeps them all); most sinks want only the events.
    fn line(&mut self, _line: &str) -> anyhow::Result<()> {
        Ok(())
    }

    fn on(&mut self, event: &GymEvent, seen: &Seen) -> anyhow::Result<Ask>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use pruefstand_core::case::Case;

    #[test]
    fn the_driver_counts_a_resumed_pass_from_what_is_recorded() {
        let mut seen = Seen::new(0);
        let mut started = Default::default();
        seen.take(&GymEvent::Start { total: 10, to_run: 4, jobs: 2, processes: None }, &mut started);
        assert_eq!(seen, Seen { in_flight: 0, done: 6, total: 10 });
        for id in ["a", "b"] {
            seen.take(&GymEvent::CaseStart { case_id: id.into() }, &mut started);
        }
        assert_eq!(seen.in_flight, 2);
        let mut record = CaseRecord::of(&Case::clean("s", "u"), Some(true), None);
        record.case_id = "a".into();
        seen.take(&GymEvent::Case { record: Box::new(record) }, &mut started);
        assert_eq!(seen, Seen { in_flight: 1, done: 7, total: 10 });
    }

    #[test]
    fn events_parse_from_the_gyms_lines() {
        let event: GymEvent = serde_json::from_str(r#"{"event":"drained","not_started":3}"#).unwrap();
        assert!(matches!(event, GymEvent::Drained { not_started: 3, stopped: 0 }));
        assert!(serde_json::from_str::<GymEvent>(r#"{"event":"nonsense"}"#).is_err());
    }
}
