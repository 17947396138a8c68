//! Sessions: one running engine per loaded model, behind one map.
//!
//! A model loads on first use. Only one load per model runs at a time;
//! requests that arrive while it loads wait for that same load and share
//! its outcome. When an engine exits unexpectedly its session is removed at
//! once (so its routes go with it), every in-flight request is told why, an
//! event is recorded, and the next request loads the model again.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::{BoxFuture, FutureExt, Shared};
use hangar_plugin_api::wire::{Description, LaunchPlan, LoadRequest};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use hangar_engine::loader::native::InProcessEngine;
use hangar_engine::loader::wasm::WasmPlugin;
use hangar_engine::models::Model;
use hangar_engine::registry::{probe::find_program, Engine, PluginEntry, Registry};

use crate::settings::{SettingMap, SettingsStore};
use crate::supervisor::{free_port, EngineProcess, Spawn};

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
}

/// How long an engine gets between TERM and KILL.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(5);

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
    end_reason: OnceLock<String>,
    in_flight: AtomicUsize,
    served: AtomicU64,
    work_dir: PathBuf,
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

    fn end(&self, reason: String) {
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

    /// Counts a request in flight until the guard drops.
    pub(crate) fn begin_request(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.served.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
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
            started_at: self.started_at,
            in_flight: self.in_flight.load(Ordering::SeqCst),
            requests_served: self.served.load(Ordering::Relaxed),
            notes: self.notes.clone(),
        }
    }
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

/// Keeps a session's in-flight count up while a request runs.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Session>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
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
    /// Seconds since the epoch.
    pub started_at: u64,
    /// Requests running now.
    pub in_flight: usize,
    /// Requests served so far.
    pub requests_served: u64,
    /// Plan notes.
    pub notes: Vec<String>,
}

/// Something that happened to a session.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Event {
    /// Seconds since the epoch.
    pub at: u64,
    /// `loaded`, `load_failed`, `unloaded`, `crashed`.
    pub kind: &'static str,
    /// Model id.
    pub model: String,
    /// Session id, when there was one.
    pub session: Option<String>,
    /// Details.
    pub message: String,
}

type LoadFuture = Shared<BoxFuture<'static, Result<Arc<Session>, LoadError>>>;

enum Slot {
    Loading(LoadFuture),
    Ready(Arc<Session>),
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
    next_id: AtomicU64,
    /// Cancelled when shutdown begins: no new loads, loads in flight stop.
    closing: CancellationToken,
    /// Which plugin serves each format, kept until the settings change.
    resolved: crate::resolved::Resolved,
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
            next_id: AtomicU64::new(1),
            closing: CancellationToken::new(),
            resolved: Default::default(),
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

    /// The plugin and engine that serve `format` under the current
    /// settings, if any (resolved once per format and settings write).
    pub(crate) async fn serving(&self, format: &str) -> Option<(&PluginEntry, &Engine)> {
        self.resolved
            .serving(&self.registry, &self.settings, format)
            .await
    }

    /// The HTTP client used to reach engines.
    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// The session serving `model`, loading it first if needed.
    pub(crate) async fn ensure(self: &Arc<Self>, model: &Model) -> Result<Arc<Session>, LoadError> {
        let load = {
            let mut slots = self.slots.lock().expect("slots lock");
            if self.closing.is_cancelled() {
                return Err(LoadError::ShuttingDown {
                    model: model.id.clone(),
                });
            }
            match slots.get(&model.id) {
                Some(Slot::Ready(s)) if !s.ended.is_cancelled() => return Ok(s.clone()),
                Some(Slot::Loading(load)) => load.clone(),
                _ => {
                    // The load runs as its own task: a client that gives up
                    // waiting does not cancel it for the others.
                    let this = self.clone();
                    let task = tokio::spawn(this.load(model.clone()));
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
                    slots.insert(model.id.clone(), Slot::Loading(load.clone()));
                    load
                }
            }
        };
        load.await
    }

    /// Ids of models loading now.
    pub(crate) fn loading(&self) -> Vec<String> {
        let slots = self.slots.lock().expect("slots lock");
        let mut ids: Vec<String> = slots
            .iter()
            .filter(|(_, s)| matches!(s, Slot::Loading(_)))
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
                Slot::Loading(_) => None,
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

    /// Stops a model's session. Returns false when none was running.
    pub(crate) async fn unload(&self, model: &str) -> bool {
        let session = {
            let mut slots = self.slots.lock().expect("slots lock");
            match slots.get(model) {
                Some(Slot::Ready(_)) => match slots.remove(model) {
                    Some(Slot::Ready(s)) => s,
                    _ => unreachable!("checked above"),
                },
                _ => return false,
            }
        };
        session.end(format!("model '{model}' was unloaded"));
        session.stop(STOP_GRACE).await;
        self.record(
            "unloaded",
            model,
            Some(&session.id),
            "unloaded on request".into(),
        );
        true
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
                    Slot::Loading(load) => Some(load.clone()),
                    Slot::Ready(_) => None,
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
                    Slot::Loading(_) => None,
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

    fn record(&self, kind: &'static str, model: &str, session: Option<&str>, message: String) {
        match kind {
            "crashed" | "load_failed" => tracing::warn!(model, kind, "{message}"),
            _ => tracing::info!(model, kind, "{message}"),
        }
        let mut events = self.events.lock().expect("events lock");
        if events.len() == EVENTS {
            events.pop_front();
        }
        events.push_back(Event {
            at: now(),
            kind,
            model: model.to_string(),
            session: session.map(str::to_string),
            message,
        });
    }

    async fn load(self: Arc<Self>, model: Model) -> Result<Arc<Session>, LoadError> {
        let mut result = self.clone().start(model.clone()).await;
        if let (Ok(session), true) = (&result, self.closing.is_cancelled()) {
            session.end("the host is shutting down".into());
            session.stop(STOP_GRACE).await;
            result = Err(LoadError::ShuttingDown {
                model: model.id.clone(),
            });
        }
        let mut slots = self.slots.lock().expect("slots lock");
        match &result {
            Ok(session) => {
                slots.insert(model.id.clone(), Slot::Ready(session.clone()));
                drop(slots);
                self.record(
                    "loaded",
                    &model.id,
                    Some(&session.id),
                    format!("served by {} ({:?})", session.plugin, session.backend),
                );
            }
            Err(e) => {
                slots.remove(&model.id);
                drop(slots);
                self.record("load_failed", &model.id, None, e.to_string());
            }
        }
        result
    }

    async fn start(self: Arc<Self>, model: Model) -> Result<Arc<Session>, LoadError> {
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
        let planned =
            tokio::task::spawn_blocking(move || plan(&registry, &settings, &keeper, &m, port, &wd))
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
            notes,
            started_at: now(),
            ended: CancellationToken::new(),
            end_reason: OnceLock::new(),
            in_flight: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            work_dir: work_dir.clone(),
        };
        let (plan, program, mapper) = match planned.how {
            How::InProcess { served, notes } => {
                return Ok(Arc::new(session(Backend::InProcess(served), notes)))
            }
            How::Launch {
                plan,
                program,
                mapper,
            } => (plan, program, mapper),
        };
        let start_err = |reason: String| LoadError::Start {
            plugin: planned.plugin.clone(),
            model: model.id.clone(),
            reason,
        };
        let started = self.launch(&plan, program, &work_dir, port).await;
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
                    Launch::ShuttingDown => LoadError::ShuttingDown {
                        model: model.id.clone(),
                    },
                });
            }
        };
        let backend = Backend::Process {
            process,
            base_url,
            upstream_model: plan.upstream_model.clone(),
            mapper,
        };
        let session = Arc::new(session(backend, plan.notes.clone()));
        tokio::spawn(self.clone().watch(session.clone()));
        Ok(session)
    }

    /// Writes the plan's files, starts its process and waits until it is
    /// ready; a process that does not become ready is stopped.
    async fn launch(
        &self,
        plan: &LaunchPlan,
        program: PathBuf,
        work_dir: &Path,
        port: u16,
    ) -> Result<(EngineProcess, String), Launch> {
        for (name, contents) in &plan.files {
            let relative = Path::new(name);
            let safe = relative
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !safe {
                return Err(Launch::Plan(format!(
                    "the launch plan's file '{name}' is not a plain relative path"
                )));
            }
            let path = work_dir.join(relative);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| Launch::Host(format!("cannot create {}: {e}", dir.display())))?;
            }
            std::fs::write(&path, contents)
                .map_err(|e| Launch::Host(format!("cannot write {}: {e}", path.display())))?;
        }
        let spawn = Spawn {
            program,
            args: plan.args.clone(),
            env: plan.env.clone(),
            cwd: plan
                .cwd
                .clone()
                .map(PathBuf::from)
                .unwrap_or(work_dir.to_path_buf()),
        };
        let process =
            EngineProcess::start(&self.keeper, &spawn).map_err(|e| Launch::Start(e.to_string()))?;
        let base_url = format!("http://127.0.0.1:{port}");
        let timeout = Duration::from_millis(plan.start_timeout_ms);
        let ready = tokio::select! {
            r = process.wait_ready(&self.client, &base_url, &plan.readiness, timeout) => {
                r.map_err(|e| Launch::Start(e.to_string()))
            }
            _ = self.closing.cancelled() => Err(Launch::ShuttingDown),
        };
        match ready {
            Ok(()) => Ok((process, base_url)),
            Err(e) => {
                process.stop(STOP_GRACE).await;
                Err(e)
            }
        }
    }

    /// Waits for the session's engine to exit; an exit nobody asked for is
    /// a crash: the session goes at once and its requests are told why.
    async fn watch(self: Arc<Self>, session: Arc<Session>) {
        let Some(process) = session.process() else {
            return;
        };
        let exit = tokio::select! {
            exit = process.exited() => exit,
            _ = session.ended.cancelled() => return,
        };
        if session.ended.is_cancelled() {
            return;
        }
        let tail = process.log.tail(5).join(" | ");
        let reason = format!(
            "engine '{}' serving model '{}' exited unexpectedly ({exit}); the next request loads it again. Last output: {tail}",
            session.plugin, session.model.id
        );
        {
            let mut slots = self.slots.lock().expect("slots lock");
            if matches!(slots.get(&session.model.id), Some(Slot::Ready(s)) if Arc::ptr_eq(s, &session))
            {
                slots.remove(&session.model.id);
            }
        }
        session.end(reason.clone());
        // Recorded as the session goes, so that whoever sees it gone also
        // sees why; reaping what the engine left in its group comes after.
        self.record("crashed", &session.model.id, Some(&session.id), reason);
        process.stop(Duration::from_millis(200)).await;
    }
}

/// Why a launch failed, before it becomes a [`LoadError`].
enum Launch {
    Plan(String),
    Host(String),
    Start(String),
    ShuttingDown,
}

struct Planned {
    plugin: String,
    engine_version: Option<String>,
    accelerator: String,
    how: How,
}

/// How a model will be served.
enum How {
    /// Run this plan's program (already checked against the manifest).
    Launch {
        plan: Box<LaunchPlan>,
        program: PathBuf,
        /// The WebAssembly plugin that maps the session's requests and
        /// responses, when the plan came from one.
        mapper: Option<WasmPlugin>,
    },
    /// The engine is loaded in the host already.
    InProcess {
        served: Arc<Served>,
        notes: Vec<String>,
    },
}

/// Resolves the model's engine and asks its plugin how to serve it
/// (blocking: plugin calls and probes are synchronous). A plugin that runs
/// inference itself is hosted by `hangar worker` (the `keeper` binary),
/// unless the operator set `isolation = "none"` for it.
fn plan(
    registry: &Registry,
    settings: &SettingsStore,
    keeper: &Path,
    model: &Model,
    port: u16,
    work_dir: &Path,
) -> Result<Planned, LoadError> {
    let stored = settings.get();
    let (entry, engine) = registry
        .serving(&model.format, &stored.default_engines)
        .map_err(|reason| LoadError::NoEngine {
            model: model.id.clone(),
            format: model.format.clone(),
            path: model.path.display().to_string(),
            reason,
        })?;
    let chosen = entry.manifest.id.clone();
    let manifest = &entry.manifest;
    let plan_err = |reason: String| LoadError::Plan {
        plugin: chosen.clone(),
        model: model.id.clone(),
        reason,
    };
    let plugin_settings = registry.config().plugin_settings(&chosen);
    let (effective, mut notes) = crate::settings::effective(&stored, entry, engine, &model.id);
    let effective: SettingMap = effective.into_iter().map(|(k, e)| (k, e.value)).collect();
    let request = LoadRequest {
        model_id: model.id.clone(),
        model_path: model.path.display().to_string(),
        model_files: model.files.clone(),
        format: model.format.clone(),
        accelerator: entry
            .accelerator
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_else(|| "cpu".into()),
        engine: engine.report.clone(),
        capabilities: engine
            .capabilities
            .iter()
            .filter(|(_, s)| s.is_on())
            .map(|(id, _)| id.clone())
            .collect(),
        settings: effective.clone(),
        plugin_settings: plugin_settings.clone(),
        host: "127.0.0.1".into(),
        port,
        work_dir: work_dir.display().to_string(),
    };
    let planned = |how| Planned {
        plugin: chosen.clone(),
        engine_version: engine.version.as_ref().map(ToString::to_string),
        accelerator: request.accelerator.clone(),
        how,
    };
    if manifest.in_process {
        match plugin_settings.get("isolation").and_then(|v| v.as_str()) {
            Some("none") => {
                let description = engine.plugin.describe().ok();
                let engine = engine.plugin.load_in_process(&request).map_err(plan_err)?;
                notes.push("runs inside the host (isolation = \"none\"): a crash in the engine takes the host down".into());
                let served = Arc::new(Served::new(
                    engine,
                    description.as_ref(),
                    model.id.clone(),
                    effective,
                ));
                return Ok(planned(How::InProcess { served, notes }));
            }
            None | Some("worker") => {}
            Some(other) => {
                return Err(plan_err(format!(
                "isolation = \"{other}\" is not a mode; use \"worker\" (the default) or \"none\""
            )))
            }
        }
        let load = serde_json::to_string_pretty(&request).expect("requests serialize");
        let plan = LaunchPlan {
            program: keeper.display().to_string(),
            args: vec![
                "worker".into(),
                "--plugin-dir".into(),
                entry.dir.display().to_string(),
                "--request".into(),
                work_dir.join("load.json").display().to_string(),
            ],
            env: Default::default(),
            cwd: None,
            readiness: hangar_plugin_api::wire::Readiness {
                health_path: "/health".into(),
                ready_status: 200,
                warmup: None,
                failed_statuses: vec![],
            },
            start_timeout_ms: effective
                .get("start_timeout_ms")
                .and_then(|v| v.as_u64())
                .unwrap_or(300_000),
            protocol: Default::default(),
            upstream_model: None,
            notes,
            files: [("load.json".to_string(), load)].into_iter().collect(),
        };
        return Ok(planned(How::Launch {
            plan: Box::new(plan),
            program: keeper.to_path_buf(),
            mapper: None,
        }));
    }
    let mut plan = engine.plugin.plan_launch(&request).map_err(plan_err)?;
    plan.notes.splice(0..0, notes);
    // The host runs only programs the manifest declares: the probe's
    // resolved program, or a declared name found the same way.
    let probed = engine.report.program.as_deref();
    if let Some(why) = hangar_engine::registry::programs::undeclared_program(
        manifest,
        &plugin_settings,
        probed,
        &plan.program,
    ) {
        return Err(plan_err(format!(
            "the host refuses the launch plan: it {why}"
        )));
    }
    let program = if probed == Some(plan.program.as_str()) {
        PathBuf::from(&plan.program)
    } else {
        let configured = plugin_settings.get("program").and_then(|v| v.as_str());
        let configured = (manifest.probe.program.as_deref() == Some(plan.program.as_str()))
            .then_some(configured)
            .flatten();
        find_program(&plan.program, configured, &manifest.probe.search_paths).map_err(
            |searched| {
                plan_err(format!(
                    "program '{}' was not found (looked in {})",
                    plan.program,
                    searched.join(", ")
                ))
            },
        )?
    };
    Ok(planned(How::Launch {
        plan: Box::new(plan),
        program,
        mapper: engine.plugin.wasm().cloned(),
    }))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
