//! Sessions: one running engine per loaded model, behind one map.
//!
//! A model loads on first use. Only one load per model runs at a time;
//! requests that arrive while it loads wait for that same load and share
//! its outcome. When an engine exits unexpectedly, or its readiness route
//! reports failure, or it stops answering (hung), its session is removed at
//! once (so its routes go with it), an event is recorded, every in-flight
//! request is told why, and the next request loads the model again. When
//! the chosen engine fails to load a model, the next compatible one is
//! tried (fallback).

mod plan;
mod session;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::{BoxFuture, FutureExt, Shared};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use hangar_engine::models::Model;
use hangar_engine::registry::{Engine, PluginEntry, Registry};

use crate::metrics::Metrics;
use crate::settings::SettingsStore;
use crate::supervisor::client::Connections;
use crate::supervisor::health::{Monitor, State};
pub(crate) use crate::supervisor::STOP_GRACE;
use crate::supervisor::{free_port, launch, Launch};
use plan::{plan, Dirs, How};
pub(crate) use session::{Backend, InFlight, RankInfo, Served, Session};

/// Why a model could not be loaded. Cloned to every request that waited.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum LoadError {
    /// No plugin can serve the model's format here.
    #[error("no engine can serve model '{model}' ({format}): {reason}; run `hangar resolve {path}` for the full trace")]
    NoEngine {
        /// The model id.
        model: String,
        /// Its format.
        format: String,
        /// Folder, for the hint.
        path: String,
        /// Resolution's reason and rejections.
        reason: String,
    },
    /// The plugin refused to plan the launch (bad settings, missing files).
    #[error("plugin '{plugin}' cannot serve model '{model}': {reason}")]
    Plan {
        /// The plugin.
        plugin: String,
        /// The model id.
        model: String,
        /// The plugin's message.
        reason: String,
    },
    /// The engine did not start or become ready.
    #[error("engine '{plugin}' failed to start model '{model}': {reason}")]
    Start {
        /// The plugin.
        plugin: String,
        /// The model id.
        model: String,
        /// What happened, with the engine's last output.
        reason: String,
    },
    /// Every compatible engine was tried, and each failed (fallback).
    #[error("no engine could load model '{model}': {}", .failures.join("; then "))]
    AllFailed {
        /// The model id.
        model: String,
        /// Each engine's failure, in the order tried.
        failures: Vec<String>,
    },
    /// An unload arrived while the model was loading.
    #[error(
        "the load of model '{model}' was cancelled by an unload; send the request again to load it"
    )]
    Cancelled {
        /// The model id.
        model: String,
    },
    /// The host is shutting down and starts nothing new.
    #[error("the host is shutting down; model '{model}' was not started")]
    ShuttingDown {
        /// The model id.
        model: String,
    },
    /// Something on the host side (files, ports) failed.
    #[error("cannot start model '{model}': {reason}")]
    Host {
        /// The model id.
        model: String,
        /// What failed.
        reason: String,
    },
}

/// Something that happened to a session.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Event {
    /// Seconds since the epoch.
    pub at: u64,
    /// `loaded`, `load_failed`, `fallback`, `unloaded` (on request, idle
    /// past its TTL, or evicted: the message says which), `crashed`,
    /// `failed`, `hung`.
    pub kind: &'static str,
    /// Model id.
    pub model: String,
    /// Session id, when there was one.
    pub session: Option<String>,
    /// Details.
    pub message: String,
}

pub(crate) type LoadFuture = Shared<BoxFuture<'static, Result<Arc<Session>, LoadError>>>;

enum Slot {
    /// A load in flight, and the token that cancels it (an unload sent
    /// while the model loads, or shutdown: a child of `closing`).
    Loading(LoadFuture, CancellationToken),
    Ready(Arc<Session>),
    /// The last load failed (or was cancelled): kept so that a request the
    /// scheduler admitted for that load hears its error, even when the
    /// load failed before the request looked, instead of starting another
    /// one. The scheduler's next load decision replaces it.
    Failed(LoadError),
}

/// What [`Sessions::begin`] found: the model ready, or a load to await.
pub(crate) enum Begun {
    Ready,
    Loading(LoadFuture),
}

/// What [`Sessions::detach`] took: a session to stop (and the event's
/// message), or a cancelled load to wait for.
pub(crate) enum Detached {
    Session(Arc<Session>, String),
    Load(LoadFuture),
}

/// Every session of the host.
pub(crate) struct Sessions {
    registry: Arc<Registry>,
    settings: Arc<SettingsStore>,
    keeper: PathBuf,
    state_dir: PathBuf,
    client: reqwest::Client,
    slots: Mutex<HashMap<String, Slot>>,
    events: Mutex<VecDeque<Event>>,
    /// Each event as it is recorded, for `GET /api/events/stream`.
    event_feed: tokio::sync::broadcast::Sender<Event>,
    /// The host's metrics (`GET /metrics`).
    metrics: Arc<Metrics>,
    /// Models whose last session hung or failed, until they load again.
    troubled: Mutex<HashMap<String, (State, String)>>,
    next_id: AtomicU64,
    /// Cancelled when shutdown begins: no new loads, loads in flight stop.
    closing: CancellationToken,
    /// Which plugin serves each format, kept until the settings change.
    resolved: crate::resolved::Resolved,
    /// In-process plugins' `concurrent_generates`, by plugin id.
    at_once: Mutex<HashMap<String, usize>>,
}

/// How many events are kept.
const EVENTS: usize = 500;

impl Sessions {
    /// A session map whose engines run under `keeper` (the `hangar` binary)
    /// with work folders under `state_dir`.
    pub(crate) fn new(
        registry: Arc<Registry>,
        settings: Arc<SettingsStore>,
        keeper: PathBuf,
        state_dir: PathBuf,
        client: reqwest::Client,
    ) -> Arc<Sessions> {
        Arc::new(Sessions {
            registry,
            settings,
            keeper,
            state_dir,
            client,
            slots: Mutex::new(HashMap::new()),
            events: Mutex::new(VecDeque::new()),
            event_feed: tokio::sync::broadcast::channel(EVENTS).0,
            metrics: Arc::new(Metrics::new()),
            troubled: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            closing: CancellationToken::new(),
            resolved: Default::default(),
            at_once: Mutex::new(HashMap::new()),
        })
    }

    /// The registry.
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The stored settings.
    pub(crate) fn settings(&self) -> &Arc<SettingsStore> {
        &self.settings
    }

    /// The plugin and engine that serve `model` under the current
    /// settings, if any (resolved once per format, needs and settings
    /// write).
    pub(crate) async fn serving(&self, model: &Model) -> Option<(&PluginEntry, &Engine)> {
        self.resolved
            .serving(&self.registry, &self.settings, &model.format, model.needs())
            .await
    }

    /// The host's metrics.
    pub(crate) fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The HTTP client used to reach engines.
    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// The session serving `model`, for a request the scheduler admitted:
    /// the ready session, or the outcome of its load in flight, even when
    /// that load has already failed; `None` when there is neither (the
    /// session ended, or was unloaded, after the admission), for the
    /// scheduler to decide again. It starts no load: only the scheduler
    /// does, so that every engine is counted against the memory guard.
    pub(crate) async fn join(&self, model: &Model) -> Result<Option<Arc<Session>>, LoadError> {
        let load = {
            let slots = self.slots.lock().expect("slots lock");
            if self.closing.is_cancelled() {
                return Err(LoadError::ShuttingDown {
                    model: model.id.clone(),
                });
            }
            match slots.get(&model.id) {
                Some(Slot::Ready(s)) if !s.ended.is_cancelled() => return Ok(Some(s.clone())),
                Some(Slot::Loading(load, _)) => load.clone(),
                Some(Slot::Failed(e)) => return Err(e.clone()),
                Some(Slot::Ready(_)) | None => return Ok(None),
            }
        };
        load.await.map(Some)
    }

    /// Whether a live session or a load serves `model`.
    pub(crate) fn live(&self, model: &str) -> bool {
        let slots = self.slots.lock().expect("slots lock");
        match slots.get(model) {
            Some(Slot::Ready(s)) => !s.ended.is_cancelled(),
            Some(Slot::Loading(..)) => true,
            Some(Slot::Failed(_)) | None => false,
        }
    }

    /// The model's session if it is ready, else its load, started now if
    /// none runs, over a failed one too (without waiting: the scheduler
    /// starts loads under its lock, so that a load it decided cannot begin
    /// after an unload it decided later).
    pub(crate) fn begin(self: &Arc<Self>, model: &Model) -> Result<Begun, LoadError> {
        let mut slots = self.slots.lock().expect("slots lock");
        if self.closing.is_cancelled() {
            return Err(LoadError::ShuttingDown {
                model: model.id.clone(),
            });
        }
        Ok(match slots.get(&model.id) {
            Some(Slot::Ready(s)) if !s.ended.is_cancelled() => Begun::Ready,
            Some(Slot::Loading(load, _)) => Begun::Loading(load.clone()),
            _ => {
                // The load runs as its own task: a client that gives up
                // waiting does not cancel it for the others.
                let this = self.clone();
                let cancel = self.closing.child_token();
                let task = tokio::spawn(this.load(model.clone(), cancel.clone()));
                let load: LoadFuture = async move {
                    task.await.unwrap_or_else(|e| {
                        Err(LoadError::Host {
                            model: String::new(),
                            reason: format!("the load task failed: {e}"),
                        })
                    })
                }
                .boxed()
                .shared();
                slots.insert(model.id.clone(), Slot::Loading(load.clone(), cancel));
                Begun::Loading(load)
            }
        })
    }

    /// Ids of models loading now.
    pub(crate) fn loading(&self) -> Vec<String> {
        let slots = self.slots.lock().expect("slots lock");
        let mut ids: Vec<String> = slots
            .iter()
            .filter(|(_, s)| matches!(s, Slot::Loading(..)))
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// Every ready session.
    pub(crate) fn list(&self) -> Vec<Arc<Session>> {
        let slots = self.slots.lock().expect("slots lock");
        let mut sessions: Vec<Arc<Session>> = slots
            .values()
            .filter_map(|s| match s {
                Slot::Ready(s) => Some(s.clone()),
                Slot::Loading(..) | Slot::Failed(_) => None,
            })
            .collect();
        sessions.sort_by(|a, b| a.model.id.cmp(&b.model.id));
        sessions
    }

    /// The ready session with this session id.
    pub(crate) fn by_id(&self, id: &str) -> Option<Arc<Session>> {
        self.list().into_iter().find(|s| s.id == id)
    }

    /// The ready session of this model.
    pub(crate) fn of_model(&self, model: &str) -> Option<Arc<Session>> {
        self.list().into_iter().find(|s| s.model.id == model)
    }

    /// The first half of an unload (of a model's session, or of its load:
    /// the engine being started is stopped, and the requests waiting for it
    /// are told why), which never waits; `None` when the model was neither
    /// loaded nor loading. `why` is the event's message (`unloaded on
    /// request`, `idle for 600 s`). The session leaves the map and ends (its
    /// requests are told `why`), or the load is cancelled;
    /// [`Sessions::finish`] then stops what was detached.
    pub(crate) fn detach(&self, model: &str, why: &str) -> Option<Detached> {
        let mut slots = self.slots.lock().expect("slots lock");
        match slots.get(model) {
            Some(Slot::Ready(_)) => match slots.remove(model) {
                Some(Slot::Ready(session)) => {
                    session.end(format!("model '{model}' was {why}"));
                    Some(Detached::Session(session, why.to_string()))
                }
                _ => unreachable!("checked above"),
            },
            Some(Slot::Loading(load, cancel)) => {
                cancel.cancel();
                Some(Detached::Load(load.clone()))
            }
            Some(Slot::Failed(_)) | None => None,
        }
    }

    /// The second half of an unload: stops the detached session's engine
    /// and records `unloaded`, or waits for a cancelled load to stop the
    /// engine it was starting.
    pub(crate) async fn finish(&self, detached: Detached) {
        match detached {
            // The slot stays the load until it ends, so that a request arriving
            // now waits for the cancelled load to finish stopping its engine
            // rather than starting a second one.
            Detached::Load(load) => {
                let _ = load.await;
            }
            Detached::Session(session, why) => {
                session.stop(STOP_GRACE).await;
                self.record("unloaded", &session.model.id, Some(&session.id), why);
            }
        }
    }

    /// How many requests the engine that would serve `model` takes at
    /// once, where it says: an in-process engine's `concurrent_generates`
    /// (1 when it declares none). `None` for engine processes, which queue
    /// for themselves.
    pub(crate) async fn at_once(&self, model: &Model) -> Option<usize> {
        let (entry, engine) = self.serving(model).await?;
        if !entry.manifest.in_process {
            return None;
        }
        let mut known = self.at_once.lock().expect("at_once lock");
        let n = known.entry(entry.manifest.id.clone()).or_insert_with(|| {
            let declared = engine
                .plugin
                .describe()
                .ok()
                .and_then(|d| d.concurrent_generates);
            declared.unwrap_or(1).max(1) as usize
        });
        Some(*n)
    }

    /// Cancelled when shutdown begins (live streams end on it).
    pub(crate) fn closing(&self) -> CancellationToken {
        self.closing.clone()
    }

    /// Stops every session (host shutdown): refuses new loads, stops the
    /// loads in flight, then stops every engine.
    pub(crate) async fn shutdown(&self) {
        self.closing.cancel();
        let loads: Vec<LoadFuture> = {
            let slots = self.slots.lock().expect("slots lock");
            slots
                .values()
                .filter_map(|s| match s {
                    Slot::Loading(load, _) => Some(load.clone()),
                    Slot::Ready(_) | Slot::Failed(_) => None,
                })
                .collect()
        };
        // Each load sees `closing`, stops its half-started engine and ends.
        futures_util::future::join_all(loads).await;
        let sessions: Vec<Arc<Session>> = {
            let mut slots = self.slots.lock().expect("slots lock");
            slots
                .drain()
                .filter_map(|(_, s)| match s {
                    Slot::Ready(s) => Some(s),
                    Slot::Loading(..) | Slot::Failed(_) => None,
                })
                .collect()
        };
        let stops = sessions.iter().map(|s| {
            s.end("the host is shutting down".into());
            s.stop(STOP_GRACE)
        });
        futures_util::future::join_all(stops).await;
    }

    /// Recorded events, oldest first.
    pub(crate) fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .expect("events lock")
            .iter()
            .cloned()
            .collect()
    }

    pub(crate) fn record(
        &self,
        kind: &'static str,
        model: &str,
        session: Option<&str>,
        message: String,
    ) {
        match kind {
            "crashed" | "load_failed" | "failed" | "hung" => {
                tracing::warn!(model, kind, "{message}")
            }
            _ => tracing::info!(model, kind, "{message}"),
        }
        // Every event kind is counted by model, the scheduler's too.
        self.metrics.event(model, kind);
        let mut events = self.events.lock().expect("events lock");
        if events.len() == EVENTS {
            events.pop_front();
        }
        let event = Event {
            at: now(),
            kind,
            model: model.to_string(),
            session: session.map(str::to_string),
            message,
        };
        // Sent under the lock, so a subscriber's snapshot and feed meet
        // without a gap or a repeat; no subscriber is no error.
        let _ = self.event_feed.send(event.clone());
        events.push_back(event);
    }

    /// Records each of an engine's notes as an `engine_note` event.
    fn record_engine_notes(&self, model: &str, notes: &[String]) {
        for note in notes {
            self.record("engine_note", model, None, note.clone());
        }
    }

    /// The recorded events and every later one as it happens.
    pub(crate) fn subscribe_events(&self) -> (Vec<Event>, tokio::sync::broadcast::Receiver<Event>) {
        let events = self.events.lock().expect("events lock");
        (
            events.iter().cloned().collect(),
            self.event_feed.subscribe(),
        )
    }

    async fn load(
        self: Arc<Self>,
        model: Model,
        cancel: CancellationToken,
    ) -> Result<Arc<Session>, LoadError> {
        let mut result = self.start_with_fallback(&model, &cancel).await;
        if let (Ok(session), true) = (&result, cancel.is_cancelled()) {
            session.end(format!("the load of model '{}' was cancelled", model.id));
            session.stop(STOP_GRACE).await;
            result = Err(self.cancelled(&model.id));
        } else if let Err(LoadError::Cancelled { .. }) = &result {
            result = Err(self.cancelled(&model.id));
        }
        let mut slots = self.slots.lock().expect("slots lock");
        match &result {
            Ok(session) => {
                slots.insert(model.id.clone(), Slot::Ready(session.clone()));
                drop(slots);
                self.troubled
                    .lock()
                    .expect("troubled lock")
                    .remove(&model.id);
                self.record(
                    "loaded",
                    &model.id,
                    Some(&session.id),
                    format!("served by {} ({:?})", session.plugin, session.backend),
                );
            }
            Err(e) => {
                slots.insert(model.id.clone(), Slot::Failed(e.clone()));
                drop(slots);
                self.record("load_failed", &model.id, None, e.to_string());
            }
        }
        result
    }

    /// Why a cancelled load ended: shutdown, or an unload.
    fn cancelled(&self, model: &str) -> LoadError {
        if self.closing.is_cancelled() {
            LoadError::ShuttingDown {
                model: model.to_string(),
            }
        } else {
            LoadError::Cancelled {
                model: model.to_string(),
            }
        }
    }

    /// Starts the model on the engine resolution picks; when that engine
    /// fails to load it (its plugin refuses, or the engine does not start)
    /// and `[serving] fallback` is on, tries the next compatible engine in
    /// resolution order, recording each failure as a `fallback` event and
    /// on the session that finally serves.
    async fn start_with_fallback(
        self: &Arc<Self>,
        model: &Model,
        cancel: &CancellationToken,
    ) -> Result<Arc<Session>, LoadError> {
        let mut tried: Vec<String> = Vec::new();
        let mut failures: Vec<String> = Vec::new();
        loop {
            let result = self
                .clone()
                .start(model.clone(), cancel, &tried, &failures)
                .await;
            let error = match result {
                Err(e @ (LoadError::Plan { .. } | LoadError::Start { .. })) => e,
                other => return other,
            };
            let (LoadError::Plan { plugin, .. } | LoadError::Start { plugin, .. }) = &error else {
                unreachable!("matched above")
            };
            tried.push(plugin.clone());
            if !self.settings.get().serving.fallback || cancel.is_cancelled() {
                return Err(error);
            }
            let next = {
                let (registry, skip) = (self.registry.clone(), tried.clone());
                let (format, needs, defaults) = (
                    model.format.clone(),
                    model.needs(),
                    self.settings.get().default_engines,
                );
                tokio::task::spawn_blocking(move || {
                    registry
                        .serving_except(&format, &needs, &defaults, &skip)
                        .map(|(entry, _)| entry.manifest.id.clone())
                        .ok()
                })
                .await
                .ok()
                .flatten()
            };
            let reason = error.to_string();
            let Some(next) = next else {
                if failures.is_empty() {
                    return Err(error);
                }
                failures.push(reason);
                return Err(LoadError::AllFailed {
                    model: model.id.clone(),
                    failures,
                });
            };
            self.record(
                "fallback",
                &model.id,
                None,
                format!("{reason}; trying the next compatible engine, '{next}'"),
            );
            failures.push(reason);
        }
    }

    /// Starts the model on the first engine resolution picks outside
    /// `skip`; `earlier` are the failures of engines tried before it.
    async fn start(
        self: Arc<Self>,
        model: Model,
        cancel: &CancellationToken,
        skip: &[String],
        earlier: &[String],
    ) -> Result<Arc<Session>, LoadError> {
        let registry = self.registry.clone();
        let id = format!("s{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        // Unique across hosts that share a state dir; removed when the
        // session ends.
        let work_dir = self
            .state_dir
            .join("sessions")
            .join(format!("{}-{id}", std::process::id()));
        let host_err = |reason: String| LoadError::Host {
            model: model.id.clone(),
            reason,
        };
        std::fs::create_dir_all(&work_dir)
            .map_err(|e| host_err(format!("cannot create {}: {e}", work_dir.display())))?;
        let port = free_port().map_err(|e| host_err(format!("no free loopback port: {e}")))?;
        let (m, wd, keeper) = (model.clone(), work_dir.clone(), self.keeper.clone());
        let settings = self.settings.clone();
        let skip = skip.to_vec();
        let state = self.state_dir.clone();
        let planned = tokio::task::spawn_blocking(move || {
            let dirs = Dirs {
                work: &wd,
                state: &state,
            };
            plan(&registry, &settings, &keeper, &m, port, dirs, &skip)
        })
        .await
        .map_err(|e| host_err(format!("planning failed: {e}")))?;
        let planned = match planned {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&work_dir);
                return Err(e);
            }
        };
        let session = |backend: Backend, notes: Vec<String>| Session {
            id: id.clone(),
            model: model.clone(),
            plugin: planned.plugin.clone(),
            engine_version: planned.engine_version.clone(),
            accelerator: planned.accelerator.clone(),
            backend,
            // Why earlier engines were passed over comes first.
            notes: earlier
                .iter()
                .map(|f| format!("fell back: {f}"))
                .chain(notes)
                .collect(),
            started_at: now(),
            ended: CancellationToken::new(),
            monitor: None,
            ranks: Vec::new(),
            end_reason: OnceLock::new(),
            in_flight: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            work_dir: work_dir.clone(),
        };
        let (plan, program, mapper, worker) = match planned.how {
            How::InProcess { served, mut notes } => {
                let engine_notes = served.engine_notes();
                self.record_engine_notes(&model.id, &engine_notes);
                notes.extend(engine_notes);
                return Ok(Arc::new(session(Backend::InProcess(served), notes)));
            }
            How::Launch {
                plan,
                program,
                mapper,
                worker,
            } => (plan, program, mapper, worker),
        };
        let start_err = |reason: String| LoadError::Start {
            plugin: planned.plugin.clone(),
            model: model.id.clone(),
            reason,
        };
        let started = launch(
            &self.keeper,
            &self.client,
            &plan,
            program,
            &work_dir,
            port,
            cancel,
        )
        .await;
        let (process, base_url) = match started {
            Ok(started) => started,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&work_dir);
                return Err(match e {
                    Launch::Plan(reason) => LoadError::Plan {
                        plugin: planned.plugin.clone(),
                        model: model.id.clone(),
                        reason,
                    },
                    Launch::Host(reason) => host_err(reason),
                    Launch::Start(reason) => start_err(reason),
                    Launch::Cancelled => LoadError::Cancelled {
                        model: model.id.clone(),
                    },
                });
            }
        };
        let ranks = match find_ranks(&plan, &process).await {
            Ok(ranks) => ranks,
            Err(reason) => {
                process.stop(STOP_GRACE).await;
                let _ = std::fs::remove_dir_all(&work_dir);
                return Err(start_err(reason));
            }
        };
        // The engine is polled and checked while it serves.
        let monitor = Arc::new(Monitor::new(
            base_url.clone(),
            plan.readiness.clone(),
            self.client.clone(),
            self.settings.get().serving,
        ));
        let connections = match Connections::new(&base_url, self.settings.get().serving.connect()) {
            Ok(connections) => connections,
            Err(e) => {
                process.stop(STOP_GRACE).await;
                let _ = std::fs::remove_dir_all(&work_dir);
                return Err(host_err(e.to_string()));
            }
        };
        let mut notes = plan.notes.clone();
        if worker {
            let engine_notes = worker_notes(&self.client, &base_url).await;
            self.record_engine_notes(&model.id, &engine_notes);
            notes.extend(engine_notes);
        }
        let backend = Backend::Process {
            process,
            base_url,
            connections,
            upstream_model: plan.upstream_model.clone(),
            mapper,
        };
        let mut session = session(backend, notes);
        session.monitor = Some(monitor);
        session.ranks = ranks;
        let session = Arc::new(session);
        tokio::spawn(self.clone().watch(session.clone()));
        tokio::spawn(self.clone().poll(session.clone()));
        Ok(session)
    }

    /// Waits for the session's engine (or, distributed, any of its local
    /// ranks) to exit; an exit nobody asked for is a crash: the session
    /// goes at once, its requests are told why, and retiring it stops
    /// every rank with the launcher's process group.
    async fn watch(self: Arc<Self>, session: Arc<Session>) {
        let Some(process) = session.process() else {
            return;
        };
        let reason = tokio::select! {
            exit = process.exited() => {
                let tail = process.log.tail(5).join(" | ");
                // A launcher that saw a rank die stops the others and
                // exits itself, often before the host sees the rank go.
                let what = match session.ranks.len() {
                    0 => String::new(),
                    n => format!(" (the launcher of its {n} ranks)"),
                };
                format!(
                    "engine '{}' serving model '{}'{what} exited unexpectedly ({exit}); the next request loads it again. Last output: {tail}",
                    session.plugin, session.model.id
                )
            }
            dead = ranks_died(&session.ranks) => {
                let tail = process.log.tail(5).join(" | ");
                let dead: Vec<String> = dead
                    .iter()
                    .map(|r| format!("rank {} on peer '{}' (pid {})", r.rank, r.peer, r.pid.unwrap_or_default()))
                    .collect();
                format!(
                    "{} of engine '{}' serving model '{}' died; every rank was stopped and the next request starts the group again. Last output: {tail}",
                    dead.join(" and "), session.plugin, session.model.id
                )
            }
            _ = session.ended.cancelled() => return,
        };
        if session.ended.is_cancelled() {
            return;
        }
        self.retire(session, "crashed", reason).await;
    }

    /// Polls a live session's readiness route; a failed status ends it.
    async fn poll(self: Arc<Self>, session: Arc<Session>) {
        let Some(monitor) = session.monitor.clone() else {
            return;
        };
        let Some(why) = monitor.poll_until_failed(session.ended.cancelled()).await else {
            return;
        };
        monitor.set_final(State::Failed);
        let reason = format!(
            "engine '{}' serving model '{}' failed: {why}; its requests were ended and the next request starts it afresh",
            session.plugin, session.model.id
        );
        self.retire(session, "failed", reason).await;
    }

    /// Ends a session nobody asked to end (`crashed`, `failed`, `hung`):
    /// its slot goes at once (so the next request loads the model afresh),
    /// the event is recorded, its requests are told `reason`, and its
    /// process group is killed.
    pub(crate) async fn retire(
        self: Arc<Self>,
        session: Arc<Session>,
        kind: &'static str,
        reason: String,
    ) {
        {
            let mut slots = self.slots.lock().expect("slots lock");
            if matches!(slots.get(&session.model.id), Some(Slot::Ready(s)) if Arc::ptr_eq(s, &session))
            {
                slots.remove(&session.model.id);
            }
        }
        // The first to end a session says why. The event is recorded as the
        // session goes and before its requests are told, so that whoever
        // sees it gone or reads the reason also finds the event; reaping
        // what the engine left in its group comes after.
        if session.ended.is_cancelled() || session.end_reason.set(reason.clone()).is_err() {
            return;
        }
        let state = match kind {
            "hung" => Some(State::Hung),
            "failed" => Some(State::Failed),
            _ => None,
        };
        if let Some(state) = state {
            let mut troubled = self.troubled.lock().expect("troubled lock");
            troubled.insert(session.model.id.clone(), (state, reason.clone()));
        }
        self.record(kind, &session.model.id, Some(&session.id), reason);
        session.ended.cancel();
        if let Some(process) = session.process() {
            // A hung or failed engine gets no grace; a crashed one's
            // leftovers are reaped.
            process.stop(Duration::from_millis(200)).await;
        }
    }

    /// Every model the host knows the state of, with its state and, when
    /// it hung or failed, why: loading, ready, busy (requests in flight),
    /// hung or failed (until the next load).
    pub(crate) fn states(&self) -> Vec<(String, State, Option<String>)> {
        let mut out: Vec<(String, State, Option<String>)> = {
            let troubled = self.troubled.lock().expect("troubled lock");
            troubled
                .iter()
                .map(|(id, (state, why))| (id.clone(), *state, Some(why.clone())))
                .collect()
        };
        let live = self
            .loading()
            .into_iter()
            .map(|id| (id, State::Loading, None))
            .chain(
                self.list()
                    .into_iter()
                    .map(|s| (s.model.id.clone(), s.state(), None)),
            );
        for entry in live {
            out.retain(|(id, ..)| id != &entry.0);
            out.push(entry);
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// How long the host looks for a distributed engine's local ranks once
/// rank 0 answered: by then every rank has joined the group, so they
/// exist; the margin covers a slow `/proc` walk.
const FIND_RANKS: Duration = Duration::from_secs(5);

/// The ranks a plan describes, each local one with its pid. The group is
/// ready only when every local rank is found running (on Linux; elsewhere
/// pids are unknown and the launcher alone watches its ranks).
async fn find_ranks(
    plan: &hangar_plugin_api::wire::LaunchPlan,
    process: &crate::supervisor::EngineProcess,
) -> Result<Vec<RankInfo>, String> {
    use crate::supervisor::ranks;
    let deadline = std::time::Instant::now() + FIND_RANKS;
    let mut found = Vec::new();
    for rank in &plan.ranks {
        let marker = rank.env_marker.as_deref().filter(|_| rank.local);
        let mut pid = None;
        if let Some(marker) = marker.filter(|_| cfg!(target_os = "linux")) {
            loop {
                let group = process.group();
                let marker = marker.to_string();
                pid = tokio::task::spawn_blocking(move || ranks::find(group, &marker))
                    .await
                    .ok()
                    .flatten();
                if pid.is_some() || std::time::Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if pid.is_none() {
                return Err(format!(
                    "rank {} on peer '{}' ({marker}) was not found running among the launcher's processes after rank 0 became ready; last output:\n{}",
                    rank.rank,
                    rank.peer,
                    process.log.tail(20).join("\n")
                ));
            }
        }
        found.push(RankInfo {
            rank: rank.rank,
            peer: rank.peer.clone(),
            local: rank.local,
            pid,
        });
    }
    Ok(found)
}

/// Resolves with the local ranks found dead (every one gone at that look:
/// a launcher that saw one die may have stopped the others already); never,
/// when no rank has a known pid.
async fn ranks_died(ranks: &[RankInfo]) -> Vec<RankInfo> {
    let watched: Vec<&RankInfo> = ranks.iter().filter(|r| r.pid.is_some()).collect();
    if watched.is_empty() {
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let dead: Vec<RankInfo> = watched
            .iter()
            .filter(|r| !crate::supervisor::ranks::alive(r.pid.expect("filtered")))
            .map(|r| (*r).clone())
            .collect();
        if !dead.is_empty() {
            return dead;
        }
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The notes of the in-process engine a `hangar worker` at `base_url`
/// hosts, from its `/health` (none when it does not answer with them).
async fn worker_notes(client: &reqwest::Client, base_url: &str) -> Vec<String> {
    let health = client
        .get(format!("{base_url}/health"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    let Ok(body) = health.and_then(|r| r.error_for_status()) else {
        return Vec::new();
    };
    body.json::<serde_json::Value>()
        .await
        .ok()
        .and_then(|mut v| serde_json::from_value(v["notes"].take()).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangar_engine::models::{ModelKind, ModelSource};

    /// Sessions over a registry with no plugins, so every load fails at
    /// once (no plugin serves the model's format).
    fn sessions(root: &std::path::Path) -> Arc<Sessions> {
        let registry = Registry::scan(
            &[root.join("plugins")],
            &[],
            hangar_engine::config::Config::default(),
            hangar_engine::platform::detect(),
        );
        Sessions::new(
            Arc::new(registry),
            Arc::new(SettingsStore::open(None).unwrap()),
            root.join("hangar"),
            root.join("state"),
            reqwest::Client::new(),
        )
    }

    fn failures(sessions: &Sessions) -> usize {
        let events = sessions.events();
        events.iter().filter(|e| e.kind == "load_failed").count()
    }

    #[tokio::test]
    async fn a_request_for_a_load_that_failed_hears_its_error_and_starts_no_other() {
        let root = tempfile::tempdir().unwrap();
        let sessions = sessions(root.path());
        let path = root.path().join("m.gguf");
        std::fs::write(&path, b"GGUF").unwrap();
        let model = Model {
            id: "m".into(),
            path,
            format: "gguf".into(),
            source: ModelSource::Folder,
            size_bytes: 4,
            files: vec!["m.gguf".into()],
            rule: "test".into(),
            kind: ModelKind::Chat,
            model_type: None,
            vision: false,
        };
        // A request joins only what the scheduler began: nothing yet.
        assert!(sessions.join(&model).await.unwrap().is_none());
        assert!(sessions.loading().is_empty() && !sessions.live("m"));
        assert_eq!(failures(&sessions), 0);
        // The scheduler decides the load; it fails before the request it
        // was decided for looks (as a guest that traps at once does).
        let Ok(Begun::Loading(load)) = sessions.begin(&model) else {
            panic!("a load begins");
        };
        let failed = load.await.expect_err("no plugin serves gguf here");
        assert_eq!(failures(&sessions), 1);
        // That request hears the load's error; it starts no second load.
        let heard = sessions.join(&model).await.expect_err("the load failed");
        assert_eq!(heard.to_string(), failed.to_string());
        assert_eq!(failures(&sessions), 1);
        assert!(sessions.list().is_empty() && sessions.loading().is_empty());
        assert!(sessions.detach("m", "unloaded on request").is_none());
        // The scheduler's next decision tries again.
        let Ok(Begun::Loading(again)) = sessions.begin(&model) else {
            panic!("a new load begins over a failed one");
        };
        again.await.expect_err("still no plugin");
        assert_eq!(failures(&sessions), 2);
    }
}
