//! What the simulator counts and how it reports it: request admission with a batch
//! capacity (`Gate`, whose waiting/running counts are the queue gauges) and
//! Prometheus text under vLLM's metric names (`vllm:num_requests_running`, …), so the bench's telemetry
//! reads the simulator and a real vLLM alike. Not for latency arithmetic or HTTP.
//!
//! As in vLLM, every series carries `model_name` = the base served name, also for
//! requests to an adapter (vLLM labels by engine, not by LoRA).

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use pruefstand_core::util;
use tokio::sync::{Semaphore, SemaphorePermit};

/// At most `capacity` requests are served at once; the rest wait in FIFO order.
pub struct Gate {
    slots: Semaphore,
    waiting: AtomicUsize,
    running: AtomicUsize,
}

/// A served request's slot; frees it when dropped.
pub struct Pass<'a> {
    _permit: SemaphorePermit<'a>,
    gate: &'a Gate,
}

/// Un-counts a waiter even if its request is dropped while queued (client gone).
struct Waiting<'a>(&'a Gate);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.gate.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Gate {
    /// A capacity of 0 would block forever; it means 1. One beyond tokio's limit
    /// (`usize::MAX >> 3`) panics it; that many slots mean "no queue" anyway.
    pub fn new(capacity: usize) -> Gate {
        let slots = Semaphore::new(capacity.clamp(1, Semaphore::MAX_PERMITS));
        Gate { slots, waiting: AtomicUsize::new(0), running: AtomicUsize::new(0) }
    }

    pub(crate) async fn enter(&self) -> Pass<'_> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let waiting = Waiting(self);
        let permit = self.slots.acquire().await.expect("the gate's semaphore is never closed");
        self.running.fetch_add(1, Ordering::SeqCst);
        drop(waiting);
        Pass { _permit: permit, gate: self }
    }

    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    pub fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }
}

/// vLLM's buckets for end-to-end latency and time to first token (seconds).
const E2E_BUCKETS: &[f64] =
    &[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0];
const TTFT_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];

struct Histogram {
    bounds: &'static [f64],
    /// Per bucket, not cumulative; one more than `bounds` for +Inf.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0 }
    }

    fn observe(&mut self, x: f64) {
        let i = self.bounds.iter().position(|&b| x <= b).unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += x;
    }

    fn write(&self, out: &mut String, name: &str, help: &str, label: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count;
            let le = self.bounds.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\",{label}}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_sum{{{label}}} {}\n{name}_count{{{label}}} {cumulative}", self.sum);
    }
}

/// Blocks the simulated server keeps cached: about as many prompt tokens as a 1 GiB KV
/// cache of a small model holds.
const PREFIX_CACHE_BLOCKS: usize = 16_384;

/// The cached prefix blocks, oldest evicted first.
#[derive(Default)]
struct PrefixCache {
    cached: std::collections::HashSet<u64>,
    order: std::collections::VecDeque<u64>,
}

impl PrefixCache {
    /// How many leading blocks were cached; then caches every block.
    fn take(&mut self, blocks: &[u64]) -> usize {
        let hits = blocks.iter().take_while(|b| self.cached.contains(b)).count();
        for &block in &blocks[hits..] {
            if self.cached.insert(block) {
                self.order.push_back(block);
            }
        }
        while self.order.len() > PREFIX_CACHE_BLOCKS {
            if let Some(old) = self.order.pop_front() {
                self.cached.remove(&old);
            }
        }
        hits
    }
}

struct Counts {
    prompt_tokens: u64,
    prefix_cache_queries: u64,
    prefix_cache_hits: u64,
    prefix_cache: PrefixCache,
    generation_tokens: u64,
    success: u64,
    /// Streams whose client went away before the end (vLLM then aborts the request).
    aborted: u64,
    e2e: Histogram,
    ttft: Histogram,
}

pub(crate) struct Metrics {
    counts: Mutex<Counts>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            counts: Mutex::new(Counts {
                prompt_tokens: 0,
                prefix_cache_queries: 0,
                prefix_cache_hits: 0,
                prefix_cache: PrefixCache::default(),
                generation_tokens: 0,
                success: 0,
                aborted: 0,
                e2e: Histogram::new(E2E_BUCKETS),
                ttft: Histogram::new(TTFT_BUCKETS),
            }),
        }
    }
}

impl Metrics {
    pub fn record(&self, prompt_tokens: u64, completion_tokens: u64, e2e_s: f64, ttft_s: f64) {
        let mut c = util::lock(&self.counts);
        c.prompt_tokens += prompt_tokens;
        c.generation_tokens += completion_tokens;
        c.success += 1;
        c.e2e.observe(e2e_s);
        c.ttft.observe(ttft_s);
    }

    /// A stream the client left before its end.
    pub fn abort(&self) {
        util::lock(&self.counts).aborted += 1;
    }

    /// A prompt's lookup in the prefix cache (its leading blocks already cached are
    /// hits), then its blocks cached: vLLM's `prefix_cache_queries`/`_hits` in tokens.
    pub(crate) fn look_up_prefix(&self, prompt_tokens: u64, blocks: &[u64]) {
        let mut c = util::lock(&self.counts);
        let cached = c.prefix_cache.take(blocks) as u64;
        c.prefix_cache_queries += prompt_tokens;
        c.prefix_cache_hits += (cached * super::openai::PREFIX_BLOCK_CHARS as u64 / 4).min(prompt_tokens);
    }

    /// Prometheus text exposition format 0.0.4.
    pub fn render(&self, model_name: &str, gate: &Gate) -> String {
        let label = format!("model_name=\"{}\"", escape_label(model_name));
        let c = util::lock(&self.counts);
        let mut out = String::new();
        let mut scalar = |name: &str, kind: &str, help: &str, labels: &str, value: String| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}");
        };
        scalar(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            &label,
            gate.running().to_string(),
        );
        scalar(
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            &label,
            gate.waiting().to_string(),
        );
        scalar(
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            &label,
            c.prompt_tokens.to_string(),
        );
        scalar(
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            &label,
            c.generation_tokens.to_string(),
        );
        scalar(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            &label,
            c.prefix_cache_queries.to_string(),
        );
        scalar(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            &label,
            c.prefix_cache_hits.to_string(),
        );
        let success_labels = format!("finished_reason=\"stop\",{label}");
        scalar(
            "vllm:request_success_total",
            "counter",
            "Count of successfully processed requests.",
            &success_labels,
            c.success.to_string(),
        );
        let _ = writeln!(out, "vllm:request_success_total{{finished_reason=\"abort\",{label}}} {}", c.aborted);
        c.e2e.write(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            &label,
        );
        c.ttft.write(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &label,
        );
        out
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', r"\\").replace('"', "\\\"").replace('\n', r"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counting only: lets spawned tasks run until `cond` holds (no clocks involved).
    async fn settle(cond: impl Fn() -> bool) {
        for _ in 0..10_000 {
            if cond() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("condition never held");
    }

    #[tokio::test]
    async fn a_capacity_beyond_tokio_limit_means_no_queue() {
        let gate = Gate::new(usize::MAX);
        let _a = gate.enter().await;
        assert_eq!(gate.running.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn gate_queues_beyond_capacity_and_counts() {
        let gate = std::sync::Arc::new(Gate::new(2));
        let a = gate.enter().await;
        let _b = gate.enter().await;
        assert_eq!((gate.running(), gate.waiting()), (2, 0));
        let (g, (tx, rx)) = (gate.clone(), tokio::sync::oneshot::channel::<()>());
        let third = tokio::spawn(async move {
            let _pass = g.enter().await;
            rx.await.ok();
        });
        settle(|| gate.waiting() == 1).await;
        assert_eq!(gate.running(), 2);
        drop(a);
        settle(|| gate.waiting() == 0).await;
        assert_eq!(gate.running(), 2, "the third took the freed slot");
        tx.send(()).unwrap();
        third.await.unwrap();
        assert_eq!(gate.running(), 1);
    }

    #[tokio::test]
    async fn a_dropped_waiter_is_uncounted() {
        let gate = Gate::new(0);
        let _held = gate.enter().await;
        {
            let fut = std::pin::pin!(gate.enter());
            assert!(futures_poll_once(fut).await.is_none());
            assert_eq!(gate.waiting(), 1);
        }
        assert_eq!(gate.waiting(), 0);
    }

    async fn futures_poll_once<F: std::future::Future>(mut fut: std::pin::Pin<&mut F>) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match fut.as_mut().poll(cx) {
                std::task::Poll::Ready(v) => Some(v),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }

    #[test]
    fn a_prompt_sharing_a_cached_beginning_hits_its_blocks_only() {
        let m = Metrics::default();
        let parse = |text: &str| {
            let body = serde_json::json!({"model": "m", "messages": [{"role": "system", "content": text}]});
            crate::openai::parse_request(body.to_string().as_bytes()).unwrap()
        };
        let system = "x".repeat(640);
        let first = parse(&system);
        m.look_up_prefix(first.prompt_tokens, &first.prefix_blocks);
        let longer = parse(&format!("{system}{}", "y".repeat(128)));
        m.look_up_prefix(longer.prompt_tokens, &longer.prefix_blocks);
        let other = parse(&"z".repeat(640));
        m.look_up_prefix(other.prompt_tokens, &other.prefix_blocks);
        let c = util::lock(&m.counts);
        assert_eq!(c.prefix_cache_queries, first.prompt_tokens + longer.prompt_tokens + other.prompt_tokens);
        // The longer prompt found the first one's whole blocks (role and text: 641
        // characters, 10 blocks of 16 tokens); the other prompt found nothing.
        assert_eq!(c.prefix_cache_hits, 160);
    }

    #[test]
    fn renders_vllm_series() {
        let m = Metrics::default();
        m.record(100, 7, 0.4, 0.01);
        m.record(50, 3, 1000.0, 0.002);
        let text = m.render("base\"x", &Gate::new(4));
        assert!(text.contains("vllm:prompt_tokens_total{model_name=\"base\\\"x\"} 150\n"), "{text}");
        assert!(text.contains("vllm:generation_tokens_total{model_name=\"base\\\"x\"} 10\n"));
        assert!(text.contains("vllm:request_success_total{finished_reason=\"stop\",model_name=\"base\\\"x\"} 2\n"));
        assert!(text.contains("vllm:e2e_request_latency_seconds_bucket{le=\"0.5\",model_name=\"base\\\"x\"} 1\n"));
        assert!(text.contains("vllm:e2e_request_latency_seconds_bucket{le=\"+Inf\",model_name=\"base\\\"x\"} 2\n"));
        assert!(text.contains("vllm:e2e_request_latency_seconds_count{model_name=\"base\\\"x\"} 2\n"));
        assert!(text.contains("vllm:num_requests_waiting{model_name=\"base\\\"x\"} 0\n"));
    }
}
