//! How many cases the gym keeps in flight. By default the model server decides: its
//! own queue gauges on `/metrics` (`vllm:num_requests_running`, `…_waiting`) say
//! whether it has room, and the target grows while it does and shrinks when requests
//! queue; where there is no `/metrics` (an `external` server), the time per model call
//! steers it instead (additive increase, multiplicative decrease). `[run]
//! max_in_flight` caps it to protect memory; `--jobs N` holds it at N.
//!
//! Also here: what a run observed, stored per served model under the bench root
//! (`state/capacity/`), so the next run of that model starts near where the last one
//! settled. Not here: running cases (`gym`) or recording the run (`run`). The decision
//! rules are pure functions; the one task that applies them, on the runtime, is
//! [`Observer`]: it reads `/metrics` with reqwest and writes commands to the gym's stdin.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use pruefstand_core::record::{ConcurrencyFacts, ConcurrencyMode};
use pruefstand_core::util;

/// How the gym's in-flight count is chosen.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Concurrency {
    /// `--jobs N` (and `pruefstand gym`, which has no server to ask).
    Fixed(usize),
    Auto {
        start: usize,
        ceiling: usize,
    },
}

impl Concurrency {
    /// The in-flight count the gym begins with.
    pub(crate) fn start(&self) -> usize {
        match self {
            Concurrency::Fixed(n) => *n,
            Concurrency::Auto { start, .. } => *start,
        }
    }

    /// The most cases in flight at once.
    pub(crate) fn ceiling(&self) -> usize {
        match self {
            Concurrency::Fixed(n) => *n,
            Concurrency::Auto { ceiling, .. } => *ceiling,
        }
    }
}

/// One reading of the server's queue gauges (summed over its models), and of its
/// prefix-cache counters where it exports them.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
struct ServerLoad {
    pub(crate) running: f64,
    pub(crate) waiting: f64,
    /// Cumulative prompt tokens looked up in, and found in, the prefix cache.
    pub(crate) prefix_cache: Option<(f64, f64)>,
}

/// The two gauges from Prometheus text; None when the server exports neither (not vLLM).
/// A counter may carry Prometheus' `_total` suffix or not.
fn parse_metrics(text: &str) -> Option<ServerLoad> {
    let mut load = ServerLoad::default();
    let mut seen = false;
    let (mut queries, mut hits) = (None::<f64>, None::<f64>);
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let name = series.split('{').next().unwrap_or_default();
        let Ok(value) = value.trim().parse::<f64>() else { continue };
        match name.strip_suffix("_total").unwrap_or(name) {
            "vllm:num_requests_running" => load.running += value,
            "vllm:num_requests_waiting" => load.waiting += value,
            "vllm:prefix_cache_queries" => *queries.get_or_insert(0.0) += value,
            "vllm:prefix_cache_hits" => *hits.get_or_insert(0.0) += value,
            _ => continue,
        }
        seen |= name.starts_with("vllm:num_requests_");
    }
    load.prefix_cache = queries.zip(hits);
    seen.then_some(load)
}

/// The `/metrics` address of an OpenAI-style base URL (`http://host:port/v1`). Plain
/// http only: a TLS endpoint is someone else's server, steered by latency.
pub(crate) fn metrics_url(base_url: &str) -> Option<String> {
    let rest = base_url.strip_prefix("http://")?;
    let authority = rest.split(['/', '?']).next().filter(|a| !a.is_empty())?;
    // vLLM's /metrics takes no credentials: none to carry into the observer's errors.
    let host = authority.rsplit('@').next()?;
    Some(format!("http://{host}/metrics"))
}

/// `/metrics` as text; a status other than 200 is an error naming it.
async fn http_get(http: &reqwest::Client, url: &str) -> anyhow::Result<String> {
    let response = http.get(url).header("accept", "text/plain").send().await?;
    let status = response.status();
    if !status.is_success() {
        anyhow::bail!("{url} answered {status}");
    }
    Ok(response.text().await?)
}

// --- the decisions ------------------------------------------------------------------

/// Queue the server may hold without it counting as "requests queue": a few waiting
/// requests keep it saturated between one case's calls and the next.
fn tolerated_waiting(running: f64) -> f64 {
    (running / 8.0).max(2.0)
}

/// Mean waiting requests below which the server has room.
const ROOM: f64 = 1.0;

/// Growth while nothing has queued yet (×2, as TCP's slow start), and after (+1/16, at
/// least 1).
fn grow(target: usize, slow_start: bool) -> usize {
    if slow_start { target * 2 } else { target + (target / 16).max(1) }
}

/// The next target from the server's gauges (mean over the last second). Grows while
/// nothing waits and the gym uses what it may; shrinks in proportion when more waits
/// than tolerated — but only once an earlier decrease has taken effect (`in_flight`
/// down to the target: running cases are never cut, they finish first).
/// Returns the new target and whether the slow start goes on.
fn step_by_load(target: usize, ceiling: usize, slow_start: bool, load: ServerLoad, in_flight: usize) -> (usize, bool) {
    let tolerated = tolerated_waiting(load.running);
    let next = if load.waiting > tolerated {
        if in_flight > target {
            return (target, false);
        }
        let occupied = load.running + load.waiting;
        let scaled = (target as f64 * (load.running + tolerated) / occupied).floor() as usize;
        return (scaled.max(target / 2).clamp(1, ceiling), false);
    } else if load.waiting < ROOM && in_flight + 1 >= target {
        grow(target, slow_start)
    } else {
        target
    };
    (next.clamp(1, ceiling), slow_start && load.waiting < ROOM)
}

/// The next target from the time per model call of recently finished cases, against the
/// fastest seen (the server unloaded): grow while within 1.5×, shrink by a quarter past 2×.
fn step_by_latency(
    target: usize,
    ceiling: usize,
    slow_start: bool,
    per_call_s: f64,
    baseline_s: f64,
    in_flight: usize,
) -> (usize, bool) {
    if per_call_s > 2.0 * baseline_s {
        if in_flight > target {
            return (target, false);
        }
        return ((target * 3 / 4).clamp(1, ceiling), false);
    }
    if per_call_s <= 1.5 * baseline_s && in_flight + 1 >= target {
        return (grow(target, slow_start).clamp(1, ceiling), slow_start);
    }
    (target, slow_start)
}

/// Where the run settled: the median target over the second half of the decisions
/// taken while cases were still waiting to start (the drain at the end says nothing).
pub(crate) fn settled(history: &[usize]) -> Option<usize> {
    let mut tail: Vec<usize> = history[history.len() / 2..].to_vec();
    tail.sort_unstable();
    tail.get(tail.len() / 2).copied()
}

// --- the observer -------------------------------------------------------------------

/// What the gym's event loop tells the observer.
#[derive(Default, Debug)]
pub(crate) struct Live {
    in_flight: usize,
    peak_in_flight: usize,
    /// Cases not started yet.
    pub(crate) to_start: usize,
    /// Seconds per model call of cases finished since the observer last looked.
    pub(crate) per_call_s: Vec<f64>,
    pub(crate) finished: bool,
}

impl Live {
    pub(crate) fn set_in_flight(&mut self, n: usize) {
        self.in_flight = n;
        self.peak_in_flight = self.peak_in_flight.max(n);
    }
}

/// The task that reads the server's gauges every quarter second, decides every half
/// second, and sends `{"command":"concurrency","target":N}` to the gym.
pub(crate) struct Observer {
    live: Arc<Mutex<Live>>,
    task: tokio::task::JoinHandle<ConcurrencyFacts>,
}

/// The event side of an [`Observer`]: what the gym's events tell it (the steering sink
/// holds one), apart from the task that the pass ends with [`Observer::finish`].
#[derive(Clone)]
pub(crate) struct Feed(Arc<Mutex<Live>>);

impl Feed {
    pub(crate) fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Where the observer's commands go: the gym's stdin (None: observe only, as with
/// `--jobs`).
pub(crate) type Commands = Option<Box<dyn AsyncWrite + Send + Unpin>>;

const TICK: Duration = Duration::from_millis(250);
const TICKS_PER_DECISION: usize = 2;
/// Cases per latency decision (fewer make it noise).
const LATENCY_WINDOW: usize = 4;

impl Observer {
    /// Starts the task on the current runtime.
    pub(crate) fn spawn(
        concurrency: &Concurrency,
        metrics: Option<String>,
        commands: Commands,
        to_start: usize,
    ) -> Observer {
        let live = Arc::new(Mutex::new(Live { to_start, ..Live::default() }));
        let state = State::new(concurrency, metrics, commands);
        let shared = live.clone();
        let task = tokio::spawn(async move { state.run(&shared).await });
        Observer { live, task }
    }

    pub(crate) fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        util::lock(&self.live)
    }

    /// Its event side, for the gym's steering sink.
    pub(crate) fn feed(&self) -> Feed {
        Feed(self.live.clone())
    }

    /// Ends the task; what it saw.
    pub(crate) async fn finish(self) -> ConcurrencyFacts {
        let peak = {
            let mut live = self.live();
            live.finished = true;
            live.peak_in_flight
        };
        let mut facts = self.task.await.unwrap_or_default();
        facts.peak_in_flight = peak;
        facts
    }
}

struct State {
    auto: bool,
    metrics: Option<String>,
    http: reqwest::Client,
    commands: Commands,
    facts: ConcurrencyFacts,
    target: usize,
    slow_start: bool,
    samples: Vec<ServerLoad>,
    metrics_failures: u32,
    baseline_s: Option<f64>,
    latencies: VecDeque<f64>,
    history: Vec<usize>,
    /// The prefix-cache counters at the first and the latest reading.
    prefix_cache: Option<((f64, f64), (f64, f64))>,
}

impl State {
    fn new(concurrency: &Concurrency, metrics: Option<String>, commands: Commands) -> State {
        let auto = matches!(concurrency, Concurrency::Auto { .. });
        let mode = match (auto, &metrics) {
            (false, _) => ConcurrencyMode::Fixed,
            (true, Some(_)) => ConcurrencyMode::ServerGauges,
            (true, None) => ConcurrencyMode::Latency,
        };
        let facts = ConcurrencyFacts {
            mode,
            start: concurrency.start(),
            settled: concurrency.start(),
            max_in_flight: concurrency.ceiling(),
            ..ConcurrencyFacts::default()
        };
        // A local page: a reading that takes longer than this is a failed one.
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap_or_default();
        State {
            auto,
            metrics,
            http,
            commands,
            facts,
            target: concurrency.start(),
            slow_start: true,
            samples: Vec::new(),
            metrics_failures: 0,
            baseline_s: None,
            latencies: VecDeque::new(),
            history: Vec::new(),
            prefix_cache: None,
        }
    }

    async fn run(mut self, live: &Mutex<Live>) -> ConcurrencyFacts {
        let mut ticks = 0usize;
        let mut clock = tokio::time::interval(TICK);
        clock.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            clock.tick().await;
            let (in_flight, to_start, finished, per_call) = {
                let mut live = util::lock(live);
                self.facts.peak_in_flight = live.peak_in_flight;
                (live.in_flight, live.to_start, live.finished, std::mem::take(&mut live.per_call_s))
            };
            if finished {
                break;
            }
            self.latencies.extend(per_call);
            self.sample().await;
            ticks += 1;
            if self.auto && ticks.is_multiple_of(TICKS_PER_DECISION) && to_start > 0 {
                self.decide(in_flight).await;
                self.history.push(self.target);
            }
        }
        if self.auto {
            self.facts.settled = settled(&self.history).unwrap_or(self.target);
        }
        self.facts.prefix_cache = self.prefix_cache.map(|((q0, h0), (q1, h1))| pruefstand_core::record::PrefixCache {
            queries: (q1 - q0).max(0.0).round() as u64,
            hits: (h1 - h0).max(0.0).round() as u64,
        });
        self.facts
    }

    async fn sample(&mut self) {
        let Some(url) = &self.metrics else { return };
        match http_get(&self.http, url).await.map(|text| parse_metrics(&text)) {
            Ok(Some(load)) => {
                self.metrics_failures = 0;
                let peak = |old: Option<u64>, v: f64| Some(old.unwrap_or(0).max(v.round() as u64));
                self.facts.peak_running = peak(self.facts.peak_running, load.running);
                self.facts.peak_waiting = peak(self.facts.peak_waiting, load.waiting);
                let busy = self.facts.busy.unwrap_or_default();
                let reading = pruefstand_core::record::Busy { readings: 1, busy: u64::from(load.running >= 1.0) };
                self.facts.busy = Some(busy.plus(reading));
                if let Some(counters) = load.prefix_cache {
                    let first = self.prefix_cache.map_or(counters, |(first, _)| first);
                    self.prefix_cache = Some((first, counters));
                }
                self.samples.push(load);
            }
            result => {
                self.metrics_failures += 1;
                // Never readable, or gone for good: steer by latency from here on.
                if self.metrics_failures >= 8 || self.facts.peak_running.is_none() && self.metrics_failures >= 3 {
                    let why = match result {
                        Err(err) => format!("{err:#}"),
                        Ok(_) => "no vllm:num_requests_* gauges".into(),
                    };
                    tracing::info!("{url}: {why}; the number of cases in flight follows the time per model call");
                    self.metrics = None;
                    if self.auto {
                        self.facts.mode = ConcurrencyMode::Latency;
                    }
                }
            }
        }
    }

    async fn decide(&mut self, in_flight: usize) {
        let ceiling = self.facts.max_in_flight;
        let (next, slow_start) = if self.metrics.is_some() {
            if self.samples.is_empty() {
                return;
            }
            let n = self.samples.len() as f64;
            let mean = ServerLoad {
                running: self.samples.iter().map(|s| s.running).sum::<f64>() / n,
                waiting: self.samples.iter().map(|s| s.waiting).sum::<f64>() / n,
                prefix_cache: None,
            };
            self.samples.clear();
            step_by_load(self.target, ceiling, self.slow_start, mean, in_flight)
        } else {
            if self.latencies.len() < LATENCY_WINDOW {
                return;
            }
            let mean = self.latencies.iter().sum::<f64>() / self.latencies.len() as f64;
            self.latencies.clear();
            let baseline = *self.baseline_s.get_or_insert(mean);
            self.baseline_s = Some(baseline.min(mean));
            step_by_latency(self.target, ceiling, self.slow_start, mean, baseline.min(mean), in_flight)
        };
        self.slow_start = slow_start;
        if next != self.target {
            tracing::debug!("cases in flight: {} → {next}", self.target);
            self.target = next;
            self.send(next).await;
        }
    }

    async fn send(&mut self, target: usize) {
        let Some(commands) = &mut self.commands else { return };
        let mut line = serde_json::json!({ "command": "concurrency", "target": target }).to_string();
        line.push('\n');
        let sent = async {
            commands.write_all(line.as_bytes()).await?;
            commands.flush().await
        };
        if sent.await.is_err() {
            self.commands = None; // the gym has ended
        }
    }
}

// --- per-model memory ---------------------------------------------------------------

/// `<root>/state/capacity/<served model>.json`: where the last run of a model settled.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub(crate) struct ObservedCapacity {
    pub(crate) served_model: String,
    pub(crate) settled: usize,
    #[serde(default)]
    pub(crate) peak_running: Option<u64>,
    #[serde(default)]
    pub(crate) peak_waiting: Option<u64>,
    pub(crate) run_id: String,
    pub(crate) updated_at: String,
}

/// The file for a served model: its name made safe (`/` and the like become `_`) plus a
/// short hash of the exact name, so two names never share a file.
fn capacity_file(state_dir: &Path, served_model: &str) -> PathBuf {
    let safe: String =
        served_model.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    let hash = &util::sha256_hex(served_model.as_bytes())[..8];
    state_dir.join("capacity").join(format!("{safe}-{hash}.json"))
}

/// The stored capacity of a model; None when there is none or it cannot be read (a
/// damaged file only costs the head start, so it is a warning).
pub(crate) fn load_capacity(state_dir: &Path, served_model: &str) -> Option<ObservedCapacity> {
    let path = capacity_file(state_dir, served_model);
    let text = std::fs::read_to_string(&path).ok()?;
    match serde_json::from_str::<ObservedCapacity>(&text) {
        Ok(stored) if stored.served_model == served_model && stored.settled >= 1 => Some(stored),
        Ok(_) => None,
        Err(err) => {
            tracing::warn!("{}: {err}; starting from the plan's jobs", path.display());
            None
        }
    }
}

pub(crate) fn store_capacity(state_dir: &Path, observed: &ObservedCapacity) -> anyhow::Result<()> {
    let path = capacity_file(state_dir, &observed.served_model);
    std::fs::create_dir_all(path.parent().expect("capacity/ has a parent"))?;
    util::write_json_atomic(&path, observed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(running: f64, waiting: f64) -> ServerLoad {
        ServerLoad { running, waiting, prefix_cache: None }
    }

    #[test]
    fn gauges_are_summed_over_models_and_absent_without_vllm_names() {
        let text = "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n\
                    vllm:num_requests_running{model_name=\"a\"} 3\nvllm:num_requests_running{model_name=\"b\"} 2\n\
                    vllm:num_requests_waiting{model_name=\"a\"} 1.0\nvllm:request_success_total 7\n";
        assert_eq!(parse_metrics(text), Some(load(5.0, 1.0)));
        assert_eq!(parse_metrics("process_cpu_seconds_total 3\n"), None);
        // vLLM's prefix-cache counters, with or without Prometheus' `_total`.
        let cached =
            format!("{text}vllm:prefix_cache_queries_total{{engine=\"0\"}} 1200.0\nvllm:prefix_cache_hits 900\n");
        assert_eq!(parse_metrics(&cached).unwrap().prefix_cache, Some((1200.0, 900.0)));
        assert_eq!(parse_metrics("vllm:prefix_cache_hits 900\n"), None, "counters alone are no gauges");
    }

    #[test]
    fn metrics_live_beside_the_api_on_plain_http_only() {
        assert_eq!(metrics_url("http://127.0.0.1:8000/v1").as_deref(), Some("http://127.0.0.1:8000/metrics"));
        assert_eq!(metrics_url("http://host:9/").as_deref(), Some("http://host:9/metrics"));
        assert_eq!(metrics_url("https://api.example.com/v1"), None);
        assert_eq!(metrics_url("http://u:pw@host:9/v1?t=x").as_deref(), Some("http://host:9/metrics"));
    }

    #[test]
    fn an_idle_server_gets_more_cases_fast_then_slowly() {
        assert_eq!(step_by_load(8, 256, true, load(8.0, 0.0), 8), (16, true));
        assert_eq!(step_by_load(8, 256, true, load(8.0, 0.9), 8), (16, true), "less than one waiting: room");
        assert_eq!(step_by_load(32, 256, false, load(20.0, 0.0), 32), (34, false));
        assert_eq!(step_by_load(250, 256, true, load(20.0, 0.0), 250), (256, true), "the ceiling holds");
    }

    #[test]
    fn no_growth_while_the_gym_does_not_use_what_it_may() {
        assert_eq!(step_by_load(32, 256, true, load(10.0, 0.0), 20), (32, true));
    }

    #[test]
    fn a_queue_shrinks_the_target_in_proportion_once_a_decrease_took_effect() {
        // 32 running, 32 waiting, 4 tolerated: 96 × 36/64 = 54
        assert_eq!(step_by_load(96, 256, true, load(32.0, 32.0), 96), (54, false));
        assert_eq!(step_by_load(54, 256, false, load(32.0, 32.0), 90), (54, false), "cases still draining");
        assert_eq!(step_by_load(96, 256, false, load(2.0, 200.0), 96), (48, false), "at most halved per step");
    }

    #[test]
    fn a_small_queue_is_held() {
        assert_eq!(step_by_load(60, 256, false, load(32.0, 3.0), 60), (60, false));
        assert_eq!(step_by_load(60, 256, true, load(32.0, 1.5), 60), (60, false), "a queue ends the slow start");
    }

    #[test]
    fn latency_grows_near_the_baseline_and_backs_off_past_twice_it() {
        assert_eq!(step_by_latency(8, 64, true, 0.12, 0.1, 8), (16, true));
        assert_eq!(step_by_latency(40, 64, false, 0.25, 0.1, 40), (30, false));
        assert_eq!(step_by_latency(40, 64, false, 0.18, 0.1, 40), (40, false));
        assert_eq!(step_by_latency(30, 64, false, 0.25, 0.1, 40), (30, false), "cases still draining");
    }

    #[test]
    fn settled_is_the_median_of_the_second_half() {
        assert_eq!(settled(&[4, 6, 9, 50, 48, 52]), Some(50));
        assert_eq!(settled(&[]), None);
    }

    #[test]
    fn observed_capacity_round_trips_per_model_in_its_own_file() {
        let dir = tempfile::tempdir().unwrap();
        let observed = ObservedCapacity {
            served_model: "org/model-8b".into(),
            settled: 57,
            peak_running: Some(32),
            peak_waiting: Some(6),
            run_id: "r1".into(),
            updated_at: "2026-01-01T00:00:00Z".into(),
        };
        store_capacity(dir.path(), &observed).unwrap();
        assert_eq!(load_capacity(dir.path(), "org/model-8b"), Some(observed));
        assert_eq!(load_capacity(dir.path(), "org_model-8b"), None, "a look-alike name is another model");
        let file = capacity_file(dir.path(), "org/model-8b");
        assert!(file.starts_with(dir.path().join("capacity")) && file.to_string_lossy().contains("org_model-8b-"));
        std::fs::write(&file, "{not json").unwrap();
        assert_eq!(load_capacity(dir.path(), "org/model-8b"), None);
    }

    #[tokio::test]
    async fn the_observer_reads_a_served_metrics_page_and_steers_the_gym() {
        use std::io::{BufRead, Write};
        use tokio::io::AsyncBufReadExt;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/metrics", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let body = "vllm:num_requests_running 4\nvllm:num_requests_waiting 0\n";
                let _ = write!(&stream, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
            }
        });
        let (reader, writer) = tokio::io::duplex(4096);
        let observer =
            Observer::spawn(&Concurrency::Auto { start: 4, ceiling: 64 }, Some(url), Some(Box::new(writer)), 100);
        observer.live().set_in_flight(4);
        let mut lines = tokio::io::BufReader::new(reader).lines();
        let first = lines.next_line().await.unwrap().unwrap();
        assert_eq!(first, r#"{"command":"concurrency","target":8}"#);
        let facts = observer.finish().await;
        assert_eq!(
            (facts.mode, facts.peak_running, facts.peak_waiting),
            (ConcurrencyMode::ServerGauges, Some(4), Some(0))
        );
        assert_eq!(facts.peak_in_flight, 4);
    }
}
