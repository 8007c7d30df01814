//! How long the cases left will take, from the rate cases finished at lately: one
//! estimator for the console's progress line and the daemon's status, so both say the
//! same. Not a promise: a run that stops early ends before it, and a server that slows
//! down moves it.
//!
//! Why the recent rate and not the run's average: a run's first minutes are slower than
//! the rest (the server warms its prefix cache, steering opens the cases in flight step by
//! step) and a resumed or reused run starts fast; an average over the whole run carries
//! that start to the end. The window is a few waves of the cases in flight wide, so it
//! never measures one wave's finishing together as a rate.

use std::collections::VecDeque;
use std::time::Instant;

/// The fewest finished cases an ETA is worked out from (one slow or fast case alone
/// would swing it).
const MIN_CASES: usize = 3;
/// The window holds at least this many finished cases, and at least two waves of what
/// is in flight.
const MIN_WINDOW: usize = 10;
/// Finish times kept: the widest window in use (two waves at the largest in-flight
/// ceiling a bench runs, 256) with room to spare.
const KEPT: usize = 1024;

/// The finish times of this run's cases (resumed ones are not counted: they took no
/// time now).
#[derive(Debug, Clone)]
pub struct Eta {
    started: Instant,
    finished: VecDeque<Instant>,
    count: usize,
    /// Cases in flight before the first finished: the first wave, which starts and
    /// finishes together, so its rate alone is none.
    first_wave: usize,
    in_flight: usize,
}

impl Eta {
    pub fn new(now: Instant) -> Eta {
        Eta { started: now, finished: VecDeque::new(), count: 0, first_wave: 0, in_flight: 0 }
    }

    /// `finished`: cases finished this time so far (a count; each new one is taken as
    /// finished at `now`); `in_flight`: cases running now.
    pub fn observe(&mut self, finished: usize, in_flight: usize, now: Instant) {
        if self.count == 0 {
            self.first_wave = self.first_wave.max(in_flight);
        }
        for _ in self.count..finished {
            if self.finished.len() == KEPT {
                self.finished.pop_front();
            }
            self.finished.push_back(now);
        }
        self.count = self.count.max(finished);
        self.in_flight = in_flight;
    }

    /// Seconds until `remaining` more cases are done; `None` while there is no rate to
    /// trust yet. Within the first wave (cases that started together) the rate is its
    /// median case's time, once half the wave is in; after it, the recent rate.
    pub fn remaining_s(&self, remaining: usize, now: Instant) -> Option<f64> {
        if remaining == 0 {
            return Some(0.0);
        }
        if self.count < MIN_CASES {
            return None;
        }
        if self.count <= self.first_wave.max(1) {
            return self.first_wave_rate(remaining);
        }
        // The window's cases finished since the one before it (or since the start).
        let kept = self.finished.len();
        let wanted = (2 * self.in_flight.max(1)).max(MIN_WINDOW);
        let (window, since) = if wanted < kept {
            (wanted, self.finished[kept - wanted - 1])
        } else if self.count == kept {
            (kept, self.started)
        } else {
            (kept - 1, self.finished[0])
        };
        let elapsed = now.duration_since(since).as_secs_f64().max(1e-6);
        Some(remaining as f64 * elapsed / window as f64)
    }
}

impl Eta {
    /// Within the first wave: once half of it has finished, its median case took as
    /// long as the half-way case's finish, and the cases in flight finish at about
    /// `first_wave` per median time (Little's law). Before that, `None`: the quickest
    /// cases alone would promise too early an end.
    fn first_wave_rate(&self, remaining: usize) -> Option<f64> {
        let half = self.first_wave / 2;
        let median = self.finished.get(half.checked_sub(1)?)?.duration_since(self.started).as_secs_f64();
        (self.count >= half && self.count == self.finished.len())
            .then(|| remaining as f64 * median / self.first_wave as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(t0: Instant, s: f64) -> Instant {
        t0 + Duration::from_secs_f64(s)
    }

    #[test]
    fn a_first_wave_finishing_together_gives_its_median_time_once_half_is_in() {
        let t0 = Instant::now();
        let mut eta = Eta::new(t0);
        eta.observe(0, 8, t0);
        for n in 1..=3 {
            eta.observe(n, 8, at(t0, 10.0));
            assert_eq!(eta.remaining_s(100, at(t0, 10.0)), None, "{n} of a first wave of 8 finished");
        }
        eta.observe(4, 8, at(t0, 10.0));
        // Half the wave in after 10 s: 8 cases per 10 s.
        assert_eq!(eta.remaining_s(100, at(t0, 10.0)), Some(125.0));
        eta.observe(9, 8, at(t0, 11.0));
        assert!(eta.remaining_s(100, at(t0, 11.0)).is_some());
        assert_eq!(eta.remaining_s(0, at(t0, 11.0)), Some(0.0), "nothing left: done, whatever the rate");

        let mut one = Eta::new(t0);
        one.observe(2, 1, at(t0, 4.0));
        assert_eq!(one.remaining_s(10, at(t0, 4.0)), None, "not from one or two cases");
        one.observe(3, 1, at(t0, 6.0));
        assert_eq!(one.remaining_s(14, at(t0, 6.0)), Some(28.0), "0.5 case/s from the start");
    }

    #[test]
    fn the_estimate_follows_the_recent_rate_not_the_run_average() {
        // One case in flight: 10 cases at 10 s each, then 30 at 1 s each.
        let t0 = Instant::now();
        let mut eta = Eta::new(t0);
        let mut t = 0.0;
        for n in 1..=40 {
            t += if n <= 10 { 10.0 } else { 1.0 };
            eta.observe(n, 1, at(t0, t));
        }
        let left = eta.remaining_s(60, at(t0, t)).unwrap();
        // The run's average (130 s for 40) would say 195 s; the last 10 say 60.
        assert!((left - 60.0).abs() < 1e-6, "{left}");
    }

    #[test]
    fn a_stall_lengthens_the_estimate_while_it_lasts() {
        let t0 = Instant::now();
        let mut eta = Eta::new(t0);
        for n in 1..=20 {
            eta.observe(n, 2, at(t0, n as f64));
        }
        let steady = eta.remaining_s(10, at(t0, 20.0)).unwrap();
        let stalled = eta.remaining_s(10, at(t0, 50.0)).unwrap();
        assert!(stalled > steady * 2.0, "{steady} then {stalled}");
    }

    #[test]
    fn the_window_is_two_waves_of_what_is_in_flight_wide() {
        // 100 in flight: 300 cases at 1 per 0.1 s, then 10 very fast ones. A window of
        // ten cases would read 100 case/s; two waves (200 cases) read ~10.
        let t0 = Instant::now();
        let mut eta = Eta::new(t0);
        let mut t = 0.0;
        for n in 1..=310 {
            t += if n <= 300 { 0.1 } else { 0.001 };
            eta.observe(n, 100, at(t0, t));
        }
        let left = eta.remaining_s(100, at(t0, t)).unwrap();
        assert!((9.0..11.0).contains(&left), "{left}");
    }
}
