//! `GET /metrics`: the host's counters, histograms and gauges in the
//! Prometheus (OpenMetrics) text format, through `prometheus-client`.
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `hangar_requests_total` | model, route, status | OpenAI and Anthropic (`/v1/messages`) requests answered |
//! | `hangar_tokens_total` | model, kind (`prompt`, `completion`) | tokens, from the engine's usage (else counted stream events) |
//! | `hangar_time_to_first_token_seconds` | model | from a streamed request's arrival to its first token |
//! | `hangar_inter_token_seconds` | model | between a stream's tokens |
//! | `hangar_speculative_tokens_total` | model, kind (`proposed`, `accepted`) | tokens speculative decoding proposed and the model kept, from the engine's usage |
//! | `hangar_speculative_verifications_total` | model | verifying passes of speculative decoding (each several tokens for one weight read) |
//! | `hangar_speculative_time_saved_seconds` | model | time speculative decoding saved, as the engine estimates it per answer (a gauge: negative where it cost time) |
//! | `hangar_session_events_total` | model, kind | every event `/api/events` records: `loaded`, `load_failed`, `fallback`, `unloaded`, `crashed`, `failed`, `hung`, and any the scheduler adds (`evicted`, …): loads, failures and hangs by cause |
//! | `hangar_model_state` | model, state | 1 for each model's state now (loading, ready, busy, hung, failed) |
//! | `hangar_requests_in_flight` | model | requests running now |
//! | `hangar_session_resident_bytes` | model, session | resident memory of the engine's process tree (Linux) |
//! | `hangar_queued_requests` | model | requests waiting in the scheduler's queue |
//! | `hangar_memory_used_bytes` | | what loaded models count for (the larger of estimate and measure) |
//! | `hangar_memory_ceiling_bytes` | | the most models may hold now (absent without a guard or limit) |
//! | `hangar_memory_pressure` | guard | 1 while the memory guard refuses new requests |
//!
//! Counters and histograms are updated as things happen; gauges are set at
//! scrape time from a [`Gauges`] snapshot of the sessions and the
//! scheduler, so that an ended session leaves no stale series. The
//! scheduler's decisions (evictions, TTL unloads) arrive as events.

use std::sync::Arc;
use std::time::Instant;

use memchr::memmem;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use serde_json::Value;
use std::sync::atomic::AtomicU64;

use crate::supervisor::health::State;

type Labels = Vec<(&'static str, String)>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// Every metric of the host.
pub(crate) struct Metrics {
    registry: Registry,
    requests: Family<Labels, Counter>,
    tokens: Family<Labels, Counter>,
    speculative_tokens: Family<Labels, Counter>,
    speculative_verifications: Family<Labels, Counter>,
    speculative_time_saved: Family<Labels, Gauge<f64, AtomicU64>>,
    first_token: Histograms,
    inter_token: Histograms,
    events: Family<Labels, Counter>,
    state: Family<Labels, Gauge>,
    in_flight: Family<Labels, Gauge>,
    resident: Family<Labels, Gauge>,
    queued: Family<Labels, Gauge>,
    memory_used: Gauge,
    memory_ceiling: Family<Labels, Gauge>,
    memory_pressure: Family<Labels, Gauge>,
}

/// What the gauges show now, read by the caller from the sessions and the
/// scheduler (this module sees neither, so that imports run one way).
#[derive(Debug, Default)]
pub(crate) struct Gauges {
    /// Each model's state.
    pub states: Vec<(String, State)>,
    /// Each live session.
    pub sessions: Vec<SessionGauges>,
    /// Requests waiting, by model.
    pub queued: Vec<(String, usize)>,
    /// What loaded models count for, in bytes.
    pub memory_used: u64,
    /// The most models may hold now, in bytes (`None`: no ceiling).
    pub memory_ceiling: Option<u64>,
    /// The memory guard's level (`off`, `safe`, …).
    pub guard: String,
    /// Whether the guard refuses new requests now.
    pub pressure: bool,
}

/// One live session's gauges.
#[derive(Debug)]
pub(crate) struct SessionGauges {
    /// Model id.
    pub model: String,
    /// Session id.
    pub session: String,
    /// Requests running now.
    pub in_flight: usize,
    /// Resident memory of its engine, where it can be read.
    pub resident_bytes: Option<u64>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// 5 ms to about 82 s: a token from a fast engine to a long prefill.
fn first_token_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// 1 ms to about 4 s between tokens.
fn inter_token_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 13))
}

impl Metrics {
    /// Every metric, registered and at zero.
    pub(crate) fn new() -> Metrics {
        let mut registry = Registry::with_prefix("hangar");
        let metrics = Metrics {
            requests: Family::default(),
            tokens: Family::default(),
            speculative_tokens: Family::default(),
            speculative_verifications: Family::default(),
            speculative_time_saved: Family::default(),
            first_token: Family::new_with_constructor(first_token_histogram),
            inter_token: Family::new_with_constructor(inter_token_histogram),
            events: Family::default(),
            state: Family::default(),
            in_flight: Family::default(),
            resident: Family::default(),
            queued: Family::default(),
            memory_used: Gauge::default(),
            memory_ceiling: Family::default(),
            memory_pressure: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "requests",
            "OpenAI requests answered, by model, route and status",
            metrics.requests.clone(),
        );
        registry.register(
            "tokens",
            "Tokens processed, by model and kind (prompt, completion)",
            metrics.tokens.clone(),
        );
        registry.register(
            "speculative_tokens",
            "Tokens speculative decoding proposed and the model kept, by model and kind (proposed, accepted)",
            metrics.speculative_tokens.clone(),
        );
        registry.register(
            "speculative_verifications",
            "Verifying passes of speculative decoding, by model",
            metrics.speculative_verifications.clone(),
        );
        registry.register(
            "speculative_time_saved_seconds",
            "Time speculative decoding saved, by model, as its engine estimates it (tokens at a plain step's time less the speculative steps' time; negative where it cost time)",
            metrics.speculative_time_saved.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "Time from a streamed request's arrival to its first token",
            metrics.first_token.clone(),
        );
        registry.register(
            "inter_token_seconds",
            "Time between a stream's tokens",
            metrics.inter_token.clone(),
        );
        registry.register(
            "session_events",
            "Session events by model and kind (loaded, load_failed, fallback, crashed, failed, hung, unloaded, ...)",
            metrics.events.clone(),
        );
        registry.register(
            "model_state",
            "1 for each model's state now (loading, ready, busy, hung, failed)",
            metrics.state.clone(),
        );
        registry.register(
            "requests_in_flight",
            "Requests running now, by model",
            metrics.in_flight.clone(),
        );
        registry.register(
            "session_resident_bytes",
            "Resident memory of a session's engine process tree",
            metrics.resident.clone(),
        );
        registry.register(
            "queued_requests",
            "Requests waiting in the scheduler's queue, by model",
            metrics.queued.clone(),
        );
        registry.register(
            "memory_used_bytes",
            "What loaded models count for (the larger of estimate and measure)",
            metrics.memory_used.clone(),
        );
        registry.register(
            "memory_ceiling_bytes",
            "The most loaded models may hold now (memory guard or limit)",
            metrics.memory_ceiling.clone(),
        );
        registry.register(
            "memory_pressure",
            "1 while the memory guard refuses new requests",
            metrics.memory_pressure.clone(),
        );
        Metrics {
            registry,
            ..metrics
        }
    }

    /// Counts one answered request.
    pub(crate) fn request(&self, model: &str, route: &str, status: u16) {
        let labels = vec![
            ("model", model.to_string()),
            ("route", route.to_string()),
            ("status", status.to_string()),
        ];
        self.requests.get_or_create(&labels).inc();
    }

    /// Counts the tokens of an OpenAI `usage` object.
    pub(crate) fn usage(&self, model: &str, usage: &Value) {
        for (kind, field) in [
            ("prompt", "prompt_tokens"),
            ("completion", "completion_tokens"),
        ] {
            if let Some(n) = usage.get(field).and_then(Value::as_u64) {
                self.tokens(model, kind, n);
            }
        }
        let Some(spec) = usage.get("speculation") else {
            return;
        };
        let count = |field: &str| spec.get(field).and_then(Value::as_u64).unwrap_or(0);
        let model = model.to_string();
        for (kind, field) in [
            ("proposed", "proposed_tokens"),
            ("accepted", "accepted_tokens"),
        ] {
            let labels = vec![("model", model.clone()), ("kind", kind.to_string())];
            self.speculative_tokens
                .get_or_create(&labels)
                .inc_by(count(field));
        }
        if let Some(ms) = spec.get("time_saved_ms").and_then(Value::as_i64) {
            self.speculative_time_saved
                .get_or_create(&vec![("model", model.clone())])
                .inc_by(ms as f64 / 1e3);
        }
        self.speculative_verifications
            .get_or_create(&vec![("model", model)])
            .inc_by(count("verifications"));
    }

    /// The time speculative decoding saved `model` so far, in seconds, by
    /// its engine's estimates; `None` where no engine estimated it.
    pub(crate) fn speculation_time_saved(&self, model: &str) -> Option<f64> {
        self.speculative_time_saved
            .get(&vec![("model", model.to_string())])
            .map(|g| g.get())
    }

    /// What speculative decoding did for `model` so far: verifying passes,
    /// tokens proposed and tokens kept; `None` where it never speculated.
    pub(crate) fn speculation(&self, model: &str) -> Option<(u64, u64, u64)> {
        let tokens = |kind: &str| {
            let labels = vec![("model", model.to_string()), ("kind", kind.to_string())];
            self.speculative_tokens.get(&labels).map(|c| c.get())
        };
        let verifications = self
            .speculative_verifications
            .get(&vec![("model", model.to_string())])
            .map(|c| c.get())?;
        Some((
            verifications,
            tokens("proposed").unwrap_or(0),
            tokens("accepted").unwrap_or(0),
        ))
    }

    fn tokens(&self, model: &str, kind: &str, n: u64) {
        let labels = vec![("model", model.to_string()), ("kind", kind.to_string())];
        self.tokens.get_or_create(&labels).inc_by(n);
    }

    /// Counts a session event.
    pub(crate) fn event(&self, model: &str, kind: &str) {
        let labels = vec![("model", model.to_string()), ("kind", kind.to_string())];
        self.events.get_or_create(&labels).inc();
    }

    /// Watches one stream's events for its token timings and usage.
    pub(crate) fn stream(self: &Arc<Self>, model: &str, started: Instant) -> StreamMetrics {
        StreamMetrics {
            metrics: self.clone(),
            model: model.to_string(),
            last: started,
            first: true,
            inter_token: None,
            counted: 0,
            usage: false,
        }
    }

    /// The text exposition, with the gauges set from `now`.
    pub(crate) fn scrape(&self, now: Gauges) -> String {
        let gauge = |bytes: u64| i64::try_from(bytes).unwrap_or(i64::MAX);
        for family in [
            &self.state,
            &self.in_flight,
            &self.resident,
            &self.queued,
            &self.memory_ceiling,
            &self.memory_pressure,
        ] {
            family.clear();
        }
        for (model, state) in now.states {
            let state = serde_json::to_value(state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            self.state
                .get_or_create(&vec![("model", model), ("state", state)])
                .set(1);
        }
        for session in now.sessions {
            self.in_flight
                .get_or_create(&vec![("model", session.model.clone())])
                .set(session.in_flight as i64);
            if let Some(bytes) = session.resident_bytes {
                self.resident
                    .get_or_create(&vec![
                        ("model", session.model),
                        ("session", session.session),
                    ])
                    .set(gauge(bytes));
            }
        }
        for (model, queued) in now.queued {
            self.queued
                .get_or_create(&vec![("model", model)])
                .set(queued as i64);
        }
        self.memory_used.set(gauge(now.memory_used));
        if let Some(ceiling) = now.memory_ceiling {
            self.memory_ceiling
                .get_or_create(&vec![])
                .set(gauge(ceiling));
        }
        self.memory_pressure
            .get_or_create(&vec![("guard", now.guard)])
            .set(i64::from(now.pressure));
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String does not fail");
        out
    }
}

/// One stream's timings: time to first token, time between tokens, and
/// its tokens (the engine's usage when it sends one, else one token per
/// content event).
pub(crate) struct StreamMetrics {
    metrics: Arc<Metrics>,
    model: String,
    last: Instant,
    first: bool,
    /// The model's inter-token histogram, looked up at the second token
    /// rather than at every one (a lookup allocates its labels and takes
    /// the family's lock).
    inter_token: Option<Histogram>,
    counted: u64,
    usage: bool,
}

impl StreamMetrics {
    /// Sees one server-sent event (its raw bytes, as relayed). Only an
    /// event that mentions `"usage"` is parsed, the last of a stream as a
    /// rule; the others are searched for a non-empty text field, so that
    /// timing a token costs a byte search, not a JSON parse.
    pub(crate) fn event(&mut self, event: &[u8]) {
        if memmem::find(event, b"\"usage\"").is_some() {
            self.read_usage(event);
        }
        if !has_text(event) {
            return;
        }
        let now = Instant::now();
        let since = now.duration_since(self.last).as_secs_f64();
        let labels = || vec![("model", self.model.clone())];
        if std::mem::replace(&mut self.first, false) {
            self.metrics
                .first_token
                .get_or_create(&labels())
                .observe(since);
        } else {
            let inter_token = &self.metrics.inter_token;
            self.inter_token
                .get_or_insert_with(|| inter_token.get_or_create(&labels()).clone())
                .observe(since);
        }
        self.last = now;
        self.counted += 1;
    }

    fn read_usage(&mut self, event: &[u8]) {
        for line in event.split(|&b| b == b'\n') {
            let Some(data) = line.strip_prefix(b"data:") else {
                continue;
            };
            let Ok(value) = serde_json::from_slice::<Value>(data.trim_ascii()) else {
                continue;
            };
            if let Some(usage) = value.get("usage").filter(|u| u.is_object()) {
                self.metrics.usage(&self.model, usage);
                self.usage = true;
            }
        }
    }
}

/// Whether an OpenAI stream event carries text: a `"content"` (chat) or
/// `"text"` (completion) string that is not empty.
fn has_text(event: &[u8]) -> bool {
    [&b"\"content\""[..], &b"\"text\""[..]].iter().any(|key| {
        memmem::find_iter(event, key).any(|at| {
            let rest = event[at + key.len()..].trim_ascii_start();
            let Some(rest) = rest.strip_prefix(b":") else {
                return false;
            };
            let rest = rest.trim_ascii_start();
            rest.first() == Some(&b'"') && rest.get(1).is_some_and(|&b| b != b'"')
        })
    })
}

impl Drop for StreamMetrics {
    fn drop(&mut self) {
        if !self.usage && self.counted > 0 {
            self.metrics.tokens(&self.model, "completion", self.counted);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speculation_counts_and_time_saved_add_up_by_model() {
        let metrics = Metrics::new();
        let usage = |saved: Option<i64>| {
            let mut spec = serde_json::json!({"verifications": 4, "proposed_tokens": 16, "accepted_tokens": 10});
            if let Some(ms) = saved {
                spec["time_saved_ms"] = ms.into();
            }
            serde_json::json!({"prompt_tokens": 3, "completion_tokens": 14, "speculation": spec})
        };
        metrics.usage("tiny", &usage(Some(250)));
        metrics.usage("tiny", &usage(Some(-50)));
        metrics.usage("tiny", &usage(None));
        assert_eq!(metrics.speculation("tiny"), Some((12, 48, 30)));
        assert_eq!(metrics.speculation_time_saved("tiny"), Some(0.2));
        // A model whose engine never estimated has no figure.
        metrics.usage("other", &usage(None));
        assert_eq!(metrics.speculation_time_saved("other"), None);
        let mut out = String::new();
        encode(&mut out, &metrics.registry).unwrap();
        assert!(
            out.contains("hangar_speculative_time_saved_seconds{model=\"tiny\"} 0.2"),
            "{out}"
        );
    }

    #[test]
    fn streams_time_their_tokens_and_fall_back_to_counting_them() {
        let metrics = Arc::new(Metrics::new());
        {
            let mut stream = metrics.stream("tiny", Instant::now());
            stream.event(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n");
            stream.event(b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n");
            stream.event(b"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n");
            stream.event(b"data: [DONE]\n\n");
        }
        {
            let mut stream = metrics.stream("tiny", Instant::now());
            stream.event(b"data: {\"choices\":[{\"text\":\"a\"}]}\n\n");
            stream.event(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":7}}\n\n");
        }
        let mut out = String::new();
        encode(&mut out, &metrics.registry).unwrap();
        let mut lines: Vec<&str> = out
            .lines()
            .filter(|l| {
                l.starts_with("hangar_tokens_total")
                    || l.starts_with("hangar_time_to_first_token_seconds_count")
                    || l.starts_with("hangar_inter_token_seconds_count")
            })
            .collect();
        lines.sort();
        expect_test::expect![[r#"
            hangar_inter_token_seconds_count{model="tiny"} 1
            hangar_time_to_first_token_seconds_count{model="tiny"} 2
            hangar_tokens_total{model="tiny",kind="completion"} 9
            hangar_tokens_total{model="tiny",kind="prompt"} 3"#]]
        .assert_eq(&lines.join("\n"));
    }
}
