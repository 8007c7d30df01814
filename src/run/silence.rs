//! A model server that stopped answering: a sink on the gym's events that counts the
//! cases, in the order they finish, whose agent could not connect to the server even
//! after its retries (`CaseRecord::could_not_connect`). [`CONSECUTIVE`] of them in a row
//! and the server is taken for gone: the sink asks the gym to drain (no new case starts;
//! the ones in flight finish) and says so through [`Silence`]. What follows is the
//! executor's: an external server's run ends invalid, naming the server and the case;
//! a container is restarted on the same path as a container that died (`container::pool`).
//! A case that connected — whatever its outcome — resets the count.

use std::sync::{Arc, Mutex};

use crate::gym::{Ask, GymEvent, Seen, Sink};
use pruefstand_core::util;

/// Cases in a row that could not connect before the server is taken for gone. Each has
/// already retried with backoff (about 7 s), so three is well past a hiccup, and few
/// enough that a night is not burnt on a dead server.
const CONSECUTIVE: usize = 3;

/// Where a silence was noticed: the case id whose record made it [`CONSECUTIVE`] in a
/// row; shared between the sink and whoever acts on it.
#[derive(Clone, Default)]
pub(super) struct Silence(Arc<Mutex<Option<String>>>);

impl Silence {
    /// The case at which the server was taken for gone, once it was.
    pub(super) fn noticed_at(&self) -> Option<String> {
        util::lock(&self.0).clone()
    }

    fn notice(&self, case_id: &str) {
        *util::lock(&self.0) = Some(case_id.to_string());
    }

    /// The sink of one gym pass; `on_silence` runs once, when it notices (a container
    /// is told here that its server stopped answering).
    pub(crate) fn sink(&self, on_silence: Box<dyn FnMut() + Send>) -> Box<dyn Sink> {
        Box::new(Watch { silence: self.clone(), in_a_row: 0, on_silence: Some(on_silence) })
    }

    /// The failure an external server's run records: what R1 names.
    pub(crate) fn message(url: &str, case_id: &str) -> String {
        format!(
            "the model server at {url} stopped answering at case {case_id} ({CONSECUTIVE} cases in a row could not \
             connect after their retries); no new case was started"
        )
    }
}

struct Watch {
    silence: Silence,
    in_a_row: usize,
    on_silence: Option<Box<dyn FnMut() + Send>>,
}

impl Sink for Watch {
    fn on(&mut self, event: &GymEvent, _seen: &Seen) -> anyhow::Result<Ask> {
        let GymEvent::Case { record } = event else { return Ok(Ask::Continue) };
        if !record.could_not_connect() {
            self.in_a_row = 0;
            return Ok(Ask::Continue);
        }
        self.in_a_row += 1;
        if self.in_a_row < CONSECUTIVE {
            return Ok(Ask::Continue);
        }
        if let Some(mut on_silence) = self.on_silence.take() {
            tracing::warn!(
                "the model server stopped answering: {CONSECUTIVE} cases in a row could not connect (the last {})",
                record.case_id
            );
            self.silence.notice(&record.case_id);
            on_silence();
        }
        Ok(Ask::Drain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pruefstand_core::case::{Case, CaseRecord};

    fn case(id: &str, error: Option<&str>) -> GymEvent {
        let mut record = CaseRecord::of(&Case::clean("s", id), Some(true), None);
        record.case_id = id.to_string();
        record.error = error.map(str::to_string);
        GymEvent::Case { record: Box::new(record) }
    }

    const REFUSED: &str = "agent error: model server: cannot connect: error sending request for url \
                           (http://127.0.0.1:9/v1/chat/completions): tcp connect error: Connection refused \
                           (gave up after 4 attempts)";

    #[test]
    fn three_unreachable_cases_in_a_row_drain_the_gym_once_and_name_the_last() {
        let silence = Silence::default();
        let calls = Arc::new(Mutex::new(0));
        let counted = calls.clone();
        let mut sink = silence.sink(Box::new(move || *util::lock(&counted) += 1));
        let seen = Seen::new(10);
        let asks: Vec<Ask> =
            ["a", "b", "c", "d"].iter().map(|id| sink.on(&case(id, Some(REFUSED)), &seen).unwrap()).collect();
        assert_eq!(asks, [Ask::Continue, Ask::Continue, Ask::Drain, Ask::Drain]);
        assert_eq!(silence.noticed_at().as_deref(), Some("c"));
        assert_eq!(*util::lock(&calls), 1, "told once");
    }

    #[test]
    fn a_case_that_connected_resets_the_count_whatever_its_outcome() {
        let silence = Silence::default();
        let mut sink = silence.sink(Box::new(|| {}));
        let seen = Seen::new(10);
        let events = [
            case("a", Some(REFUSED)),
            case("b", Some(REFUSED)),
            case("c", Some("agent error: model server: HTTP 500: boom (gave up after 4 attempts)")),
            case("d", Some(REFUSED)),
            case("e", None),
            case("f", Some(REFUSED)),
            case("g", Some(REFUSED)),
        ];
        for event in &events {
            assert_eq!(sink.on(event, &seen).unwrap(), Ask::Continue);
        }
        assert_eq!(silence.noticed_at(), None);
    }
}
