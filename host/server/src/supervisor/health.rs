//! Health that knows: what state each engine is in while it serves, and
//! the checks that tell a busy engine from a hung one.
//!
//! While a session lives its engine's readiness route (the launch plan's
//! [`Readiness`]) is polled; an answer in the plan's `failed_statuses`
//! (mlx_lm.server's 503 once its generation thread died) marks the session
//! failed, unless the engine is still streaming tokens: a readiness route
//! can answer 503 under load (every slot taken, in llama-server's and
//! older mlxcel's words; the plan lists such statuses in `busy_statuses`),
//! and an engine with clients receiving tokens from it is busy, whatever
//! its route says, never failed. It is judged again once its streams end
//! or go silent. Requests wait on an engine under three timeouts (connect, first
//! byte, silence between bytes of a stream); when one passes while the
//! engine process lives, the engine is asked on its readiness route: an
//! answer, whatever its status, means it is **busy** (keep waiting, and say
//! so in `/health` and `/api/sessions`); no answer within the check timeout
//! means it is **hung**, and the caller kills it.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hangar_plugin_api::wire::Readiness;
use serde::{Deserialize, Serialize};

/// The serving settings (`[serving]` in `settings.toml`): timeouts, the
/// readiness poll, and engine fallback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ServingSettings {
    /// When the chosen engine fails to load a model, try the next
    /// compatible one in resolution order.
    pub fallback: bool,
    /// How long connecting to an engine may take, in milliseconds.
    pub connect_timeout_ms: u64,
    /// How long an engine may take to start its answer before it is
    /// checked, in milliseconds (long prompts take a while to prefill).
    pub first_byte_timeout_ms: u64,
    /// How long a stream may stay silent before the engine is checked, in
    /// milliseconds.
    pub stream_idle_timeout_ms: u64,
    /// How often a live session's readiness route is polled, in
    /// milliseconds.
    pub health_poll_ms: u64,
    /// How long the engine has to answer a check before it counts as hung,
    /// in milliseconds.
    pub check_timeout_ms: u64,
    /// How long a client may accept no bytes of an answer it is being
    /// sent (its socket full), or send none of a request body it started,
    /// before its connection is cut and its slot freed, in milliseconds.
    pub client_stall_timeout_ms: u64,
    /// A second port whose root is Ollama's API, as `hangar serve
    /// --ollama-port` (which wins); read when the host starts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ollama_port: Option<u16>,
}

impl Default for ServingSettings {
    fn default() -> Self {
        ServingSettings {
            fallback: true,
            connect_timeout_ms: 5_000,
            first_byte_timeout_ms: 120_000,
            stream_idle_timeout_ms: 60_000,
            health_poll_ms: 2_000,
            check_timeout_ms: 5_000,
            client_stall_timeout_ms: 30_000,
            ollama_port: None,
        }
    }
}

impl ServingSettings {
    /// Every problem with the values: each duration must be positive.
    pub(crate) fn problems(&self) -> Vec<String> {
        [
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("first_byte_timeout_ms", self.first_byte_timeout_ms),
            ("stream_idle_timeout_ms", self.stream_idle_timeout_ms),
            ("health_poll_ms", self.health_poll_ms),
            ("check_timeout_ms", self.check_timeout_ms),
            ("client_stall_timeout_ms", self.client_stall_timeout_ms),
        ]
        .into_iter()
        .filter(|(_, v)| *v == 0 || *v > i64::MAX as u64)
        .map(|(name, v)| {
            format!("serving.{name} must be a positive number of milliseconds, not {v}")
        })
        .collect()
    }

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// The connect timeout.
    pub(crate) fn connect(&self) -> Duration {
        Self::ms(self.connect_timeout_ms)
    }

    /// The first-byte timeout.
    pub(crate) fn first_byte(&self) -> Duration {
        Self::ms(self.first_byte_timeout_ms)
    }

    /// The stream silence timeout.
    pub(crate) fn stream_idle(&self) -> Duration {
        Self::ms(self.stream_idle_timeout_ms)
    }

    /// The poll interval.
    pub(crate) fn poll(&self) -> Duration {
        Self::ms(self.health_poll_ms)
    }

    /// The check timeout.
    pub(crate) fn check(&self) -> Duration {
        Self::ms(self.check_timeout_ms)
    }

    /// How long a client may stall an answer or a request body.
    pub(crate) fn client_stall(&self) -> Duration {
        Self::ms(self.client_stall_timeout_ms)
    }
}

/// What a model's engine is doing, as `/health` and `/api/sessions` show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum State {
    /// Being started.
    Loading,
    /// Serving, answering its checks.
    Ready,
    /// A request waited past a timeout, and the engine still answers.
    Busy,
    /// The engine stopped answering; it is being killed.
    Hung,
    /// Its readiness route reported failure; it is being restarted.
    Failed,
}

impl State {
    fn from_u8(v: u8) -> State {
        match v {
            1 => State::Busy,
            2 => State::Hung,
            3 => State::Failed,
            _ => State::Ready,
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            State::Loading | State::Ready => 0,
            State::Busy => 1,
            State::Hung => 2,
            State::Failed => 3,
        }
    }
}

/// How one session's engine is checked, and what was last seen.
#[derive(Debug)]
pub(crate) struct Monitor {
    base_url: String,
    readiness: Readiness,
    client: reqwest::Client,
    settings: ServingSettings,
    state: AtomicU8,
    /// Requests now waiting past a timeout on an engine that answers.
    waiting: AtomicUsize,
    /// When the monitor began: token times are kept as milliseconds since.
    epoch: Instant,
    /// Streams from the engine now relayed to clients.
    streams: AtomicUsize,
    /// When the engine last sent a stream chunk, in milliseconds since
    /// `epoch` plus one (0: never).
    last_chunk: AtomicU64,
}

/// Why a wait ended without the awaited thing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hung {
    /// The timeout that passed, for the message.
    pub waited: Duration,
    /// When (`while its answer was awaited`, `in the middle of its answer`).
    pub what: &'static str,
}

/// What the readiness route said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Check {
    /// It answered (any status but a failed or busy one).
    Answered(u16),
    /// It answered with a status the plan calls busy (full, not failed).
    Busy(u16),
    /// It answered with a status the plan calls failed.
    Failed(u16, String),
    /// No answer within the check timeout.
    Silent,
}

impl Monitor {
    /// A monitor of the engine at `base_url`.
    pub(crate) fn new(
        base_url: String,
        readiness: Readiness,
        client: reqwest::Client,
        settings: ServingSettings,
    ) -> Monitor {
        Monitor {
            base_url,
            readiness,
            client,
            settings,
            state: AtomicU8::new(0),
            waiting: AtomicUsize::new(0),
            epoch: Instant::now(),
            streams: AtomicUsize::new(0),
            last_chunk: AtomicU64::new(0),
        }
    }

    /// Counts a streaming request as open from the moment it is sent until
    /// the returned guard drops; call [`Streaming::chunk`] for each chunk
    /// it brings. The sending counts as its first sign of life: an engine
    /// may report itself busy (mlx_lm.server's 503) as soon as it takes the
    /// request, before its first chunk reaches the host.
    pub(crate) fn stream(self: &Arc<Self>) -> Streaming {
        self.streams.fetch_add(1, Ordering::SeqCst);
        let streaming = Streaming(self.clone());
        streaming.chunk();
        streaming
    }

    /// Whether the engine is streaming now: a stream is open and one of
    /// its chunks arrived within the stream-silence timeout (a stream
    /// silent for longer is the request's own timeout's business, which
    /// tells busy from hung).
    fn streaming(&self) -> bool {
        if self.streams.load(Ordering::SeqCst) == 0 {
            return false;
        }
        match self.last_chunk.load(Ordering::SeqCst) {
            0 => false,
            at => {
                let since = self.epoch.elapsed().as_millis() as u64 + 1 - at;
                since <= self.settings.stream_idle_timeout_ms
            }
        }
    }

    /// The serving settings the session started with.
    pub(crate) fn settings(&self) -> &ServingSettings {
        &self.settings
    }

    /// The state now.
    pub(crate) fn state(&self) -> State {
        State::from_u8(self.state.load(Ordering::SeqCst))
    }

    /// Marks the session hung or failed (final: the session is ending).
    pub(crate) fn set_final(&self, state: State) {
        self.state.store(state.as_u8(), Ordering::SeqCst);
    }

    /// Asks the engine's readiness route once.
    pub(crate) async fn check(&self) -> Check {
        let url = format!("{}{}", self.base_url, self.readiness.health_path);
        let answer = self
            .client
            .get(url)
            .timeout(self.settings.check())
            .send()
            .await;
        match answer {
            Ok(r) if self.readiness.busy_statuses.contains(&r.status().as_u16()) => {
                Check::Busy(r.status().as_u16())
            }
            Ok(r)
                if self
                    .readiness
                    .failed_statuses
                    .contains(&r.status().as_u16()) =>
            {
                let status = r.status().as_u16();
                let body = r.text().await.unwrap_or_default();
                Check::Failed(status, body.chars().take(300).collect())
            }
            Ok(r) => Check::Answered(r.status().as_u16()),
            Err(_) => Check::Silent,
        }
    }

    /// Polls the readiness route until it reports failure (returned as a
    /// sentence) or `ended` resolves. Silence here is not judged: a busy
    /// single-threaded engine may not answer polls, and requests' own
    /// timeouts tell busy from hung. A busy status, or a failed one while
    /// the engine streams tokens, shows the session `busy` until the route
    /// answers otherwise.
    pub(crate) async fn poll_until_failed(
        &self,
        ended: impl Future<Output = ()>,
    ) -> Option<String> {
        tokio::pin!(ended);
        let mut busy: Option<BusyGuard<'_>> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.settings.poll()) => {}
                _ = &mut ended => return None,
            }
            let path = &self.readiness.health_path;
            match self.check().await {
                Check::Failed(status, body) if self.streaming() => {
                    if busy.is_none() {
                        tracing::info!(
                            "engine at {} answered {path} with {status} ({body}) while streaming tokens to {} clients: busy, not failed",
                            self.base_url,
                            self.streams.load(Ordering::SeqCst)
                        );
                    }
                    busy.get_or_insert_with(|| BusyGuard::new(self));
                }
                Check::Failed(status, body) => {
                    return Some(format!(
                        "its readiness route {path} answered {status} ({body})"
                    ));
                }
                Check::Busy(_) => {
                    busy.get_or_insert_with(|| BusyGuard::new(self));
                }
                Check::Answered(_) => busy = None,
                Check::Silent => {}
            }
        }
    }

    /// Awaits `future`; each time `period` passes first, checks the engine:
    /// an answer means busy (the wait goes on, and the session shows
    /// `busy` meanwhile), silence means hung.
    pub(crate) async fn watched<F: Future>(
        &self,
        future: F,
        period: Duration,
        what: &'static str,
    ) -> Result<F::Output, Hung> {
        tokio::pin!(future);
        let mut busy = None;
        loop {
            tokio::select! {
                out = &mut future => return Ok(out),
                _ = tokio::time::sleep(period) => {}
            }
            match self.check().await {
                Check::Answered(_) | Check::Busy(_) => {
                    if busy.is_none() {
                        busy = Some(BusyGuard::new(self));
                        tracing::info!(
                            "engine at {} is busy: no {what} after {period:?}, but it answers",
                            self.base_url
                        );
                    }
                }
                // The poller ends a failed session; this request goes with it.
                Check::Failed(..) => continue,
                Check::Silent => {
                    return Err(Hung {
                        waited: period,
                        what,
                    })
                }
            }
        }
    }
}

/// One stream from the engine relayed to a client, counted while it lives
/// (see [`Monitor::stream`]).
#[derive(Debug)]
pub(crate) struct Streaming(Arc<Monitor>);

impl Streaming {
    /// A chunk of the stream arrived from the engine.
    pub(crate) fn chunk(&self) {
        let now = self.0.epoch.elapsed().as_millis() as u64 + 1;
        self.0.last_chunk.fetch_max(now, Ordering::SeqCst);
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Keeps a session `busy` while one request waits on an engine that
/// answers its checks, or while its readiness route says it is full.
struct BusyGuard<'a>(&'a Monitor);

impl<'a> BusyGuard<'a> {
    fn new(monitor: &'a Monitor) -> BusyGuard<'a> {
        monitor.waiting.fetch_add(1, Ordering::SeqCst);
        let _ = monitor.state.compare_exchange(
            State::Ready.as_u8(),
            State::Busy.as_u8(),
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        BusyGuard(monitor)
    }
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        if self.0.waiting.fetch_sub(1, Ordering::SeqCst) == 1 {
            let _ = self.0.state.compare_exchange(
                State::Busy.as_u8(),
                State::Ready.as_u8(),
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
    }
}
