//! One session: a served model, how its requests reach the engine, its
//! in-flight count, and what `GET /api/sessions` shows of it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use hangar_engine::loader::native::InProcessEngine;
use hangar_engine::loader::wasm::WasmPlugin;
use hangar_engine::models::Model;
use hangar_plugin_api::wire::Description;

use crate::settings::SettingMap;
use crate::supervisor::client::Connections;
use crate::supervisor::health::{Monitor, State};
use crate::supervisor::EngineProcess;

/// An in-process engine serving one model, with the model's settings as
/// request defaults.
pub(crate) struct Served {
    /// The engine.
    pub engine: Arc<InProcessEngine>,
    /// The model id clients use.
    pub model_id: String,
    /// The model's effective settings (`max_tokens`, `temperature`, …).
    pub defaults: SettingMap,
    /// Admits as many `generate` calls at once as the plugin's description
    /// declares (`concurrent_generates`, 1 when it declares none); the
    /// rest wait here.
    pub gate: Arc<tokio::sync::Semaphore>,
}

impl Served {
    /// `engine`, loaded by a plugin that described itself as `description`.
    pub(crate) fn new(
        engine: InProcessEngine,
        description: Option<&Description>,
        model_id: String,
        defaults: SettingMap,
    ) -> Self {
        let at_once = description
            .and_then(|d| d.concurrent_generates)
            .unwrap_or(1)
            .max(1);
        Self {
            engine: Arc::new(engine),
            model_id,
            defaults,
            gate: Arc::new(tokio::sync::Semaphore::new(at_once as usize)),
        }
    }

    /// What the engine decided at load that an operator should know
    /// (plugin-api 1.6; none from older engines, or from a list that does
    /// not parse).
    pub(crate) fn engine_notes(&self) -> Vec<String> {
        serde_json::from_str(self.engine.notes().as_str()).unwrap_or_default()
    }
}

/// A served model: its engine process and everything the API needs to
/// reach it.
#[derive(Debug)]
pub(crate) struct Session {
    /// Session id (`s1`, `s2`, …), unique for the host's lifetime.
    pub id: String,
    /// The model.
    pub model: Model,
    /// The serving plugin.
    pub plugin: String,
    /// The engine version the probe read.
    pub engine_version: Option<String>,
    /// The accelerator chosen.
    pub accelerator: String,
    /// How requests reach the engine.
    pub backend: Backend,
    /// Notes from the plan (settings ignored, fallbacks).
    pub notes: Vec<String>,
    /// Seconds since the epoch when it became ready.
    pub started_at: u64,
    /// Cancelled when the session ends (crash, unload, shutdown).
    pub ended: CancellationToken,
    /// How the engine is checked and what it is doing (engine processes
    /// only).
    pub monitor: Option<Arc<Monitor>>,
    /// The ranks of a distributed engine (empty: one process).
    pub ranks: Vec<RankInfo>,
    pub(super) end_reason: OnceLock<String>,
    pub(super) in_flight: AtomicUsize,
    pub(super) served: AtomicU64,
    pub(super) work_dir: PathBuf,
}

impl Drop for Session {
    fn drop(&mut self) {
        // The session's scratch folder goes with it.
        let _ = std::fs::remove_dir_all(&self.work_dir);
    }
}

impl Session {
    /// Why the session ended, once it has.
    pub(crate) fn end_reason(&self) -> Option<&str> {
        self.end_reason.get().map(String::as_str)
    }

    pub(super) fn end(&self, reason: String) {
        let _ = self.end_reason.set(reason);
        self.ended.cancel();
    }

    /// The engine process, unless the engine runs inside the host.
    pub(crate) fn process(&self) -> Option<&EngineProcess> {
        match &self.backend {
            Backend::Process { process, .. } => Some(process),
            Backend::InProcess(_) => None,
        }
    }

    /// Stops the engine: its process tree, or (in-process) lets the engine
    /// go once its last request is done.
    pub(crate) async fn stop(&self, grace: Duration) {
        if let Some(process) = self.process() {
            process.stop(grace).await;
        }
    }

    /// What the engine is doing: hung or failed once judged so; busy while
    /// requests run (or wait past a timeout on an engine that answers);
    /// else ready.
    pub(crate) fn state(&self) -> State {
        let seen = self.monitor.as_ref().map_or(State::Ready, |m| m.state());
        match seen {
            State::Ready if self.in_flight.load(Ordering::SeqCst) > 0 => State::Busy,
            other => other,
        }
    }

    /// Counts a request in flight until the guard drops.
    pub(crate) fn begin_request(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.served.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone(), None)
    }

    /// A serializable view.
    pub(crate) fn info(&self) -> SessionInfo {
        SessionInfo {
            id: self.id.clone(),
            model: self.model.id.clone(),
            plugin: self.plugin.clone(),
            engine_version: self.engine_version.clone(),
            accelerator: self.accelerator.clone(),
            endpoint: match &self.backend {
                Backend::Process { base_url, .. } => base_url.clone(),
                Backend::InProcess(_) => "in-process".into(),
            },
            pid: self.process().and_then(EngineProcess::engine_pid),
            state: self.state(),
            started_at: self.started_at,
            in_flight: self.in_flight.load(Ordering::SeqCst),
            requests_served: self.served.load(Ordering::Relaxed),
            notes: self.notes.clone(),
            ranks: self.ranks.clone(),
        }
    }
}

/// One rank of a distributed session: where it runs and, on this machine,
/// its pid.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RankInfo {
    /// The rank (0 serves HTTP).
    pub rank: u32,
    /// The cluster peer it runs on.
    pub peer: String,
    /// Whether that peer is this machine.
    pub local: bool,
    /// Its pid on this machine (local ranks, where `/proc` tells).
    pub pid: Option<u32>,
}

/// How a session's requests reach its engine.
pub(crate) enum Backend {
    /// An engine process (a plugin's launch plan, or a `hangar worker`
    /// hosting an in-process engine) behind loopback HTTP.
    Process {
        /// The process.
        process: EngineProcess,
        /// `http://127.0.0.1:PORT`.
        base_url: String,
        /// Connections to `base_url` for proxied requests, kept open
        /// between them.
        connections: Arc<Connections>,
        /// The `model` value the engine expects (`None`: omit the field).
        upstream_model: Option<String>,
        /// The WebAssembly plugin whose `map_request` / `map_response` see
        /// every request and non-streaming response.
        mapper: Option<WasmPlugin>,
    },
    /// An engine inside the host (`isolation = "none"`).
    InProcess(Arc<Served>),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Process { base_url, .. } => write!(f, "Process({base_url})"),
            Backend::InProcess(s) => write!(f, "InProcess({})", s.model_id),
        }
    }
}

/// Keeps a session's in-flight count up while a request runs, and
/// whatever else the request holds until it ends (its scheduler slot).
pub(crate) struct InFlight(Arc<Session>, Option<Box<dyn Send + Sync>>);

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InFlight({})", self.0.id)
    }
}

impl InFlight {
    /// This guard, also holding `guard` until the request ends.
    pub(crate) fn holding(mut self, guard: Box<dyn Send + Sync>) -> InFlight {
        self.1 = Some(guard);
        self
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        // The held guard drops after the count, so that a slot freed by it
        // never admits a request to a session that still counts this one.
        self.1.take();
    }
}

/// What `GET /api/sessions` shows of a session.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SessionInfo {
    /// Session id.
    pub id: String,
    /// Model id.
    pub model: String,
    /// Serving plugin.
    pub plugin: String,
    /// Engine version.
    pub engine_version: Option<String>,
    /// Accelerator.
    pub accelerator: String,
    /// The engine's loopback endpoint.
    pub endpoint: String,
    /// The engine's pid.
    pub pid: Option<u32>,
    /// ready, busy, hung or failed.
    pub state: State,
    /// Seconds since the epoch.
    pub started_at: u64,
    /// Requests running now.
    pub in_flight: usize,
    /// Requests served so far.
    pub requests_served: u64,
    /// Plan notes.
    pub notes: Vec<String>,
    /// Where each rank of a distributed engine runs (absent: one process).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankInfo>,
}
