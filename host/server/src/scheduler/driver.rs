//! The driver: the one impure part of the scheduler. It turns API calls
//! and the passing of time into [`Event`]s for the [`Scheduler`], and
//! carries out its [`Decision`]s on the sessions: wakes queued requests,
//! starts loads, drains and stops engines, cancels loads. A background
//! task ticks the timers, reads the machine's memory and each engine's
//! resident memory, and notices engines that went away on their own.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{oneshot, Notify};

use hangar_engine::models::Model;

use super::estimate::{draft_estimate, estimate, local_share};
use super::machine::{
    Decision, Event, Limits, Millis, Policy, Refusal, Residency, Scheduler, Ticket,
};
use super::readings;
use crate::sessions::{Begun, Detached, InFlight, LoadError, Session, Sessions};
use crate::settings::residency_of;

/// How often memory is read and engines are looked at.
const SAMPLE: Duration = Duration::from_secs(1);

/// How many times a request is admitted when the session it was admitted
/// for has gone by the time it looks (an engine that died, an unload).
const ADMISSIONS: usize = 3;

/// Why a request or load did not get a session.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdmitError {
    /// The scheduler refused it (429 or 503).
    #[error("{0}")]
    Refused(Refusal),
    /// The model's load failed.
    #[error(transparent)]
    Load(#[from] LoadError),
}

type Reply = oneshot::Sender<Result<(), Refusal>>;

struct Inner {
    machine: Scheduler,
    next_ticket: Ticket,
    /// Queued requests, woken by Admit or Reject.
    waiters: HashMap<Ticket, Reply>,
    /// The models the scheduler has seen, for the loads it starts.
    models: HashMap<String, Model>,
    /// Estimates by model id and context, so that no request reads files.
    /// By model, context length and draft model folder.
    estimates: HashMap<(String, Option<u64>, Option<String>), u64>,
    /// Pinned models at start, and how their load went.
    pinned: Vec<(String, Result<bool, String>)>,
    /// Idle unload times a client asked for (Ollama's `keep_alive`), by
    /// model: `None` keeps the model loaded. They win over `ttl_seconds`.
    keep_alive: HashMap<String, Option<Millis>>,
    decisions: Vec<Decision>,
}

/// What an unload did, answered at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unloaded {
    /// The model's engine is being stopped (it had no requests in flight).
    Stopped,
    /// The model drains: its requests in flight may finish within `within`
    /// (ms); then they are cut off with an error and its engine stops.
    Draining {
        /// Requests in flight.
        requests: usize,
        /// Until the drain's deadline (ms).
        within: Millis,
    },
    /// The model was loading; its load was cancelled.
    LoadCancelled,
    /// The model was neither loaded nor loading.
    NotLoaded,
}

/// The scheduler, driven.
pub(crate) struct Driver {
    sessions: Arc<Sessions>,
    inner: Mutex<Inner>,
    origin: Instant,
    wake: Notify,
}

/// A request's place: released (leaving the queue, or freeing its slot)
/// when dropped.
struct Permit {
    driver: Arc<Driver>,
    ticket: Ticket,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.driver.step(Event::Release(self.ticket));
    }
}

/// What `/api/sessions` shows of the scheduler.
#[derive(Debug, Serialize)]
pub(crate) struct SchedulerView {
    /// Requests running now, host-wide.
    pub in_flight: usize,
    /// Requests waiting now, host-wide.
    pub queued: usize,
    /// How long the oldest waiter has waited (ms).
    pub oldest_wait_ms: Option<Millis>,
    /// `--max-concurrent-requests`.
    pub max_concurrent_requests: Option<usize>,
    /// `--max-queued-requests`.
    pub max_queued_requests: usize,
    /// `--max-loaded-models`.
    pub max_loaded_models: Option<usize>,
    /// The memory guard.
    pub memory: MemoryView,
    /// Per model.
    pub models: Vec<ModelView>,
}

/// The memory guard's state.
#[derive(Debug, Serialize)]
pub(crate) struct MemoryView {
    /// `off`, `safe`, `balanced` or `aggressive`.
    pub guard: String,
    /// `--memory-limit`.
    pub limit_bytes: Option<u64>,
    /// The most models may hold now.
    pub ceiling_bytes: Option<u64>,
    /// What loaded models count for (the larger of estimate and measure).
    pub used_bytes: u64,
    /// The machine's memory, as last read.
    pub total_bytes: Option<u64>,
    /// Available, as last read.
    pub available_bytes: Option<u64>,
    /// Free GPU memory, as last read.
    pub device_free_bytes: Option<u64>,
    /// Why new requests are refused, when the machine is short.
    pub pressure: Option<String>,
}

/// One model as the scheduler sees it.
#[derive(Debug, Serialize)]
pub(crate) struct ModelView {
    /// Model id.
    pub model: String,
    /// `absent`, `loading`, `ready`, `draining`, `stopping`.
    pub state: &'static str,
    /// Pinned.
    pub pin: bool,
    /// Running requests.
    pub in_flight: usize,
    /// Waiting requests.
    pub queued: usize,
    /// How long its oldest waiter has waited (ms).
    pub oldest_wait_ms: Option<Millis>,
    /// Mean wait of requests admitted after waiting (ms).
    pub mean_wait_ms: Option<Millis>,
    /// Estimated need (bytes).
    pub need_bytes: u64,
    /// Measured resident memory of its engine (bytes).
    pub held_bytes: Option<u64>,
    /// How long it has been idle (ms): 0 while it serves or is waited for.
    pub idle_ms: Millis,
    /// Its idle TTL (ms): `None` when it stays loaded (pinned, or no
    /// `ttl_seconds`).
    pub ttl_ms: Option<Millis>,
    /// How long until it is unloaded for being idle (ms), as
    /// [`Driver::expires_in`]; `None` when it stays loaded.
    pub ttl_left_ms: Option<Millis>,
}

impl Driver {
    /// A driver over `sessions` with `limits`; its background task starts
    /// with [`Driver::run`].
    pub(crate) fn new(sessions: Arc<Sessions>, limits: Limits) -> Arc<Driver> {
        Arc::new(Driver {
            sessions,
            inner: Mutex::new(Inner {
                machine: Scheduler::new(limits),
                next_ticket: 1,
                waiters: HashMap::new(),
                models: HashMap::new(),
                estimates: HashMap::new(),
                pinned: Vec::new(),
                keep_alive: HashMap::new(),
                decisions: Vec::new(),
            }),
            origin: Instant::now(),
            wake: Notify::new(),
        })
    }

    fn now(&self) -> Millis {
        self.origin.elapsed().as_millis() as Millis
    }

    /// The model's policy from its settings, with its estimate; `at_once`
    /// is how many requests its engine serves at once, where it says.
    fn policy(&self, inner: &mut Inner, model: &Model, at_once: Option<usize>) -> Policy {
        let stored = self.sessions.settings().get();
        let residency = residency_of(&stored, &model.id);
        let context = stored
            .models
            .get(&model.id)
            .and_then(|m| m.get(hangar_plugin_api::wire::settings::CONTEXT_LENGTH))
            .or_else(|| {
                stored
                    .defaults
                    .get(hangar_plugin_api::wire::settings::CONTEXT_LENGTH)
            })
            .and_then(serde_json::Value::as_u64);
        // A draft model (speculative decoding) is loaded with the model.
        let draft = stored
            .models
            .get(&model.id)
            .and_then(|m| m.get(hangar_plugin_api::wire::settings::DRAFT_MODEL))
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned);
        let need = *inner
            .estimates
            .entry((model.id.clone(), context, draft.clone()))
            .or_insert_with(|| {
                let drafter = draft.map_or(0, |dir| draft_estimate(Path::new(&dir), context));
                estimate(&model.path, model.size_bytes, context)
                    .total()
                    .saturating_add(drafter)
            });
        let need = local_share(
            need,
            &self.sessions.registry().config().clusters,
            stored.models.get(&model.id),
        );
        inner.models.insert(model.id.clone(), model.clone());
        Policy {
            pin: residency.pin,
            ttl: match inner.keep_alive.get(&model.id) {
                Some(asked) => *asked,
                None => residency.ttl_seconds.map(|s| s.saturating_mul(1000)),
            },
            // An engine that serves N at once gets N: the rest wait in the
            // scheduler's queue, under its timeout, not inside the engine.
            max_concurrent: residency
                .max_concurrent_requests
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
                .into_iter()
                .chain(at_once)
                .min(),
            drain: residency.drain_seconds.saturating_mul(1000),
            need,
        }
    }

    /// Feeds one event and carries out the decisions; returns them.
    fn step(self: &Arc<Self>, event: Event) -> Vec<Decision> {
        let mut inner = self.inner.lock().expect("scheduler lock");
        self.step_locked(&mut inner, event)
    }

    fn step_locked(self: &Arc<Self>, inner: &mut Inner, event: Event) -> Vec<Decision> {
        let now = self.now();
        let tick = event == Event::Tick;
        let mut decisions = std::mem::take(&mut inner.decisions);
        decisions.clear();
        inner.machine.step(now, event, &mut decisions);
        for d in &decisions {
            self.carry_out(inner, d);
        }
        if !tick {
            // The timers may have moved: let the background task look
            // again (not after its own tick, or it would spin).
            self.wake.notify_one();
        }
        let out = decisions.clone();
        inner.decisions = decisions;
        out
    }

    fn carry_out(self: &Arc<Self>, inner: &mut Inner, decision: &Decision) {
        match decision {
            Decision::Admit(ticket) => {
                if let Some(reply) = inner.waiters.remove(ticket) {
                    let _ = reply.send(Ok(()));
                }
            }
            Decision::Reject(ticket, refusal) => {
                if let Some(reply) = inner.waiters.remove(ticket) {
                    let _ = reply.send(Err(refusal.clone()));
                }
            }
            Decision::Load(model) => {
                let Some(model) = inner.models.get(model).cloned() else {
                    return;
                };
                // Begun now, under the scheduler's lock: begun later, the
                // load could start after an unload decided since, and serve
                // a model the scheduler counts as gone.
                let begun = self.sessions.begin(&model);
                let this = self.clone();
                tokio::spawn(async move {
                    let loaded = match begun {
                        Ok(Begun::Ready) => true,
                        Ok(Begun::Loading(load)) => load.await.is_ok(),
                        Err(_) => false,
                    };
                    let event = match loaded {
                        true => Event::Loaded(model.id.clone()),
                        false => Event::LoadFailed(model.id.clone()),
                    };
                    this.step(event);
                });
            }
            Decision::Stop(model, why) => {
                // Detached now, so that whoever sees the decision (an unload
                // answering) finds the session gone and its requests told
                // why; stopping the engine may take its grace period.
                let detached = self.sessions.detach(model, &why.to_string());
                let (this, model) = (self.clone(), model.clone());
                tokio::spawn(async move {
                    if let Some(detached) = detached {
                        this.sessions.finish(detached).await;
                    }
                    this.step(Event::Stopped(model));
                });
            }
            // Only an operator's unload cancels a load, and `unload` carries
            // it out itself, so that it can answer once the load is gone.
            Decision::CancelLoad(_)
            | Decision::Queue(_)
            | Decision::RefuseLoad(..)
            | Decision::Drain(..)
            | Decision::NotLoaded(_) => {}
        }
    }

    /// Admits a request for `model` (waiting in the queue if it must),
    /// then returns its session, loading the model if needed. The
    /// returned guard holds the request's slot until dropped.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        model: &Model,
    ) -> Result<(Arc<Session>, InFlight), AdmitError> {
        let at_once = self.sessions.at_once(model).await;
        let (session, permit) = self
            .decided(model, || self.admission(model, at_once))
            .await?;
        let in_flight = session.begin_request().holding(Box::new(permit));
        Ok((session, in_flight))
    }

    /// The session of `model` once `decide` (an admission, a load
    /// decision) has had the scheduler decide for it, with what `decide`
    /// gave. A session that went away after the decision (its engine died,
    /// an unload) is told to the machine, and the scheduler decides again.
    async fn decided<T, F>(
        self: &Arc<Self>,
        model: &Model,
        mut decide: impl FnMut() -> F,
    ) -> Result<(Arc<Session>, T), AdmitError>
    where
        F: std::future::Future<Output = Result<T, AdmitError>>,
    {
        for _ in 0..ADMISSIONS {
            let decision = decide().await?;
            if let Some(session) = self.sessions.join(model).await? {
                // Known as loaded before the caller hears of it (the load's
                // own task may report it a moment later).
                self.step(Event::Loaded(model.id.clone()));
                return Ok((session, decision));
            }
            // An admission's permit is given back before the next decision.
            drop(decision);
            self.gone(&model.id);
        }
        Err(AdmitError::Load(LoadError::Host {
            model: model.id.clone(),
            reason: format!(
                "its session ended {ADMISSIONS} times between the scheduler's decision and the request's start; send it again"
            ),
        }))
    }

    /// The request's turn: admitted at once, or after waiting in the queue
    /// (dropping the future, as a client that leaves does, takes it out).
    async fn admission(
        self: &Arc<Self>,
        model: &Model,
        at_once: Option<usize>,
    ) -> Result<Permit, AdmitError> {
        let (ticket, outcome) = {
            let mut inner = self.inner.lock().expect("scheduler lock");
            let ticket = inner.next_ticket;
            inner.next_ticket += 1;
            let policy = self.policy(&mut inner, model, at_once);
            let decisions = self.step_locked(
                &mut inner,
                Event::Request {
                    ticket,
                    model: model.id.clone(),
                    policy,
                },
            );
            let mut outcome = Ok(None);
            for d in decisions {
                match d {
                    Decision::Reject(t, refusal) if t == ticket => outcome = Err(refusal),
                    Decision::Queue(t) if t == ticket => {
                        let (tx, rx) = oneshot::channel();
                        inner.waiters.insert(ticket, tx);
                        outcome = Ok(Some(rx));
                    }
                    _ => {}
                }
            }
            (ticket, outcome)
        };
        // Made outside the lock: dropping it takes the lock.
        let permit = Permit {
            driver: self.clone(),
            ticket,
        };
        let queued = outcome.map_err(AdmitError::Refused)?;
        if let Some(rx) = queued {
            match rx.await {
                Ok(Ok(())) => {}
                Ok(Err(refusal)) => return Err(AdmitError::Refused(refusal)),
                Err(_) => {
                    return Err(AdmitError::Load(LoadError::ShuttingDown {
                        model: model.id.clone(),
                    }))
                }
            }
        }
        Ok(permit)
    }

    /// Loads `model` on an operator's request (or a pin), evicting what
    /// must go; refused when it cannot fit.
    pub(crate) async fn load(self: &Arc<Self>, model: &Model) -> Result<Arc<Session>, AdmitError> {
        let at_once = self.sessions.at_once(model).await;
        let (session, ()) = self
            .decided(model, || self.decide_load(model, at_once))
            .await?;
        Ok(session)
    }

    /// The scheduler's load decision for `model`, or its refusal.
    async fn decide_load(
        self: &Arc<Self>,
        model: &Model,
        at_once: Option<usize>,
    ) -> Result<(), AdmitError> {
        // A model whose engine is being stopped (an unload answers before
        // its engine is gone) loads once it is: the stop takes at most the
        // engine's grace period.
        let stopped_by = Instant::now() + crate::sessions::STOP_GRACE + SAMPLE;
        loop {
            let (decisions, stopping) = {
                let mut inner = self.inner.lock().expect("scheduler lock");
                let policy = self.policy(&mut inner, model, at_once);
                let stopping = inner.machine.model(&model.id).map(|m| m.residency)
                    == Some(Residency::Stopping);
                let event = Event::Load {
                    model: model.id.clone(),
                    policy,
                };
                (self.step_locked(&mut inner, event), stopping)
            };
            let refused = decisions.into_iter().find_map(|d| match d {
                Decision::RefuseLoad(m, refusal) if m == model.id => Some(refusal),
                _ => None,
            });
            match refused {
                None => return Ok(()),
                Some(_) if stopping && Instant::now() < stopped_by => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Some(refusal) => return Err(AdmitError::Refused(refusal)),
            }
        }
    }

    /// Tells the machine that `model`, which it counts as ready, has no
    /// session any more (its engine died, or it was unloaded outside the
    /// scheduler), found by a request that was admitted for it or by the
    /// background task; the machine's next decision loads it again.
    fn gone(self: &Arc<Self>, model: &str) {
        let mut inner = self.inner.lock().expect("scheduler lock");
        self.gone_locked(&mut inner, model);
    }

    fn gone_locked(self: &Arc<Self>, inner: &mut Inner, model: &str) {
        let ready = inner.machine.model(model).map(|m| m.residency) == Some(Residency::Ready);
        // Loads begin under this lock, so a load cannot start between the
        // look and the event.
        if ready && !self.sessions.live(model) {
            self.step_locked(inner, Event::Ended(model.to_string()));
        }
    }

    /// Unloads `model`, answering at once with what it did: cancelled its
    /// load, stopped it (its engine goes in the background), or began to
    /// drain its in-flight requests, which are cut off with an error at the
    /// drain's deadline (`drain_seconds`).
    pub(crate) fn unload(self: &Arc<Self>, model: &str) -> Unloaded {
        let mut inner = self.inner.lock().expect("scheduler lock");
        let before = inner.machine.model(model).map(|m| m.residency);
        if before == Some(Residency::Stopping) {
            // Stopping already (an eviction, a drain that ended).
            return Unloaded::Stopped;
        }
        let decisions = self.step_locked(&mut inner, Event::Unload(model.to_string()));
        for d in &decisions {
            match d {
                Decision::Stop(m, _) if m == model => return Unloaded::Stopped,
                Decision::CancelLoad(m) if m == model => {
                    if let Some(detached) = self.sessions.detach(model, "load cancelled") {
                        let sessions = self.sessions.clone();
                        tokio::spawn(async move { sessions.finish(detached).await });
                    }
                    return Unloaded::LoadCancelled;
                }
                Decision::NotLoaded(m) if m == model => {
                    // Not the scheduler's (a load it did not start): the
                    // sessions may still have it.
                    return match self.sessions.detach(model, "unloaded on request") {
                        Some(detached) => {
                            let outcome = match detached {
                                Detached::Load(_) => Unloaded::LoadCancelled,
                                Detached::Session(..) => Unloaded::Stopped,
                            };
                            let sessions = self.sessions.clone();
                            tokio::spawn(async move { sessions.finish(detached).await });
                            outcome
                        }
                        None => Unloaded::NotLoaded,
                    };
                }
                _ => {}
            }
        }
        // Draining: newly, or since an earlier unload.
        let now = self.now();
        match inner.machine.model(model) {
            Some(m) => match m.residency {
                Residency::Draining(until) => Unloaded::Draining {
                    requests: m.in_flight,
                    within: until.saturating_sub(now),
                },
                _ => Unloaded::Stopped,
            },
            None => Unloaded::NotLoaded,
        }
    }

    /// Sets how long `model` stays loaded once idle, for its next requests
    /// on: `Some(None)` keeps it loaded, `Some(Some(ms))` unloads it after
    /// `ms` idle, `None` goes back to its settings' `ttl_seconds`. A client's
    /// `keep_alive` (Ollama's API) is one; it counts from the next request.
    pub(crate) fn keep_alive(&self, model: &str, ttl: Option<Option<Millis>>) {
        let mut inner = self.inner.lock().expect("scheduler lock");
        match ttl {
            Some(ttl) => inner.keep_alive.insert(model.to_string(), ttl),
            None => inner.keep_alive.remove(model),
        };
    }

    /// How long until `model` is unloaded for being idle (ms): from now
    /// when it is idle, its whole TTL while it serves; `None` when it stays.
    pub(crate) fn expires_in(&self, model: &str) -> Option<Millis> {
        let inner = self.inner.lock().expect("scheduler lock");
        let m = inner.machine.model(model)?;
        let ttl = m.policy.ttl.filter(|_| !m.policy.pin)?;
        match m.in_flight == 0 && m.queued == 0 {
            true => Some((m.last_used + ttl).saturating_sub(self.now())),
            false => Some(ttl),
        }
    }

    /// Loads every pinned model among `models` (in the background), so
    /// that `/health` reports `healthy` once they are all ready.
    pub(crate) fn load_pinned(self: &Arc<Self>, models: &[Model]) {
        let stored = self.sessions.settings().get();
        let pinned: Vec<Model> = models
            .iter()
            .filter(|m| residency_of(&stored, &m.id).pin)
            .cloned()
            .collect();
        {
            let mut inner = self.inner.lock().expect("scheduler lock");
            inner.pinned = pinned.iter().map(|m| (m.id.clone(), Ok(false))).collect();
        }
        for model in pinned {
            let this = self.clone();
            tokio::spawn(async move {
                let outcome = match this.load(&model).await {
                    Ok(_) => Ok(true),
                    Err(e) => {
                        if let AdmitError::Refused(r) = &e {
                            this.sessions
                                .record("load_failed", &model.id, None, r.to_string());
                        }
                        Err(e.to_string())
                    }
                };
                let mut inner = this.inner.lock().expect("scheduler lock");
                if let Some(p) = inner.pinned.iter_mut().find(|(id, _)| *id == model.id) {
                    p.1 = outcome;
                }
            });
        }
    }

    /// The pinned models and their state: `ready`, `loading`, or why their
    /// load failed. `/health` is `healthy` only when all are ready.
    pub(crate) fn pinned(&self) -> Vec<(String, String)> {
        let inner = self.inner.lock().expect("scheduler lock");
        inner
            .pinned
            .iter()
            .map(|(id, outcome)| {
                let ready = self.sessions.of_model(id).is_some();
                let state = match outcome {
                    _ if ready => "ready".to_string(),
                    Err(e) => format!("failed: {e}"),
                    Ok(_) => "loading".to_string(),
                };
                (id.clone(), state)
            })
            .collect()
    }

    /// The limits the scheduler was started with.
    pub(crate) fn limits(&self) -> Limits {
        self.inner
            .lock()
            .expect("scheduler lock")
            .machine
            .limits()
            .clone()
    }

    /// The scheduler's state for `/api/sessions`.
    pub(crate) fn view(&self) -> SchedulerView {
        let inner = self.inner.lock().expect("scheduler lock");
        let m = &inner.machine;
        let limits = m.limits();
        let reading = m.reading();
        let now = self.now();
        let mut models: Vec<ModelView> = m
            .models()
            .map(|(id, s)| {
                let idle = s.in_flight == 0 && s.queued == 0;
                let ttl = s.policy.ttl.filter(|_| !s.policy.pin);
                ModelView {
                    model: id.clone(),
                    state: s.residency.name(),
                    pin: s.policy.pin,
                    in_flight: s.in_flight,
                    queued: s.queued,
                    oldest_wait_ms: m.oldest_wait(Some(id)),
                    mean_wait_ms: (s.waited.0 > 0).then(|| s.waited.1 / s.waited.0),
                    need_bytes: s.policy.need,
                    held_bytes: s.held,
                    idle_ms: if idle {
                        now.saturating_sub(s.last_used)
                    } else {
                        0
                    },
                    ttl_ms: ttl,
                    ttl_left_ms: ttl.map(|ttl| match idle {
                        true => (s.last_used + ttl).saturating_sub(now),
                        false => ttl,
                    }),
                }
            })
            .collect();
        models.sort_by(|a, b| a.model.cmp(&b.model));
        SchedulerView {
            in_flight: m.in_flight(),
            queued: m.queued(),
            oldest_wait_ms: m.oldest_wait(None),
            max_concurrent_requests: limits.max_concurrent,
            max_queued_requests: limits.max_queue,
            max_loaded_models: limits.max_loaded,
            memory: MemoryView {
                guard: limits.guard.to_string(),
                limit_bytes: limits.memory_limit,
                ceiling_bytes: m.ceiling(),
                used_bytes: m.used(),
                total_bytes: reading.map(|r| r.total),
                available_bytes: reading.map(|r| r.available),
                device_free_bytes: reading.and_then(|r| r.device_free),
                pressure: m.pressure().map(ToString::to_string),
            },
            models,
        }
    }

    /// The background task: ticks timers when they are due, and every
    /// [`SAMPLE`] reads memory and notices engines that went away.
    pub(crate) async fn run(self: Arc<Self>) {
        let mut next_sample = Instant::now();
        loop {
            if Instant::now() >= next_sample {
                self.sample().await;
                next_sample = Instant::now() + SAMPLE;
            }
            let due = {
                let inner = self.inner.lock().expect("scheduler lock");
                inner.machine.next_wake()
            };
            let until_sample = next_sample.saturating_duration_since(Instant::now());
            let sleep = match due {
                Some(at) => Duration::from_millis(at.saturating_sub(self.now())).min(until_sample),
                None => until_sample,
            };
            tokio::select! {
                _ = tokio::time::sleep(sleep) => {}
                _ = self.wake.notified() => {}
            }
            self.step(Event::Tick);
        }
    }

    async fn sample(self: &Arc<Self>) {
        let sessions = self.sessions.list();
        let gpu = sessions.iter().any(|s| s.accelerator.starts_with("cuda"));
        let measured = tokio::task::spawn_blocking(move || {
            let held: Vec<(String, u64)> = sessions
                .iter()
                .filter_map(|s| Some((s.model.id.clone(), s.process()?.resident_bytes()?)))
                .collect();
            (readings::machine(gpu), held)
        })
        .await;
        let Ok((reading, held)) = measured else {
            return;
        };
        let mut inner = self.inner.lock().expect("scheduler lock");
        // Ready models whose session is gone went away on their own.
        let ids: Vec<String> = inner.machine.models().map(|(id, _)| id.clone()).collect();
        for id in ids {
            self.gone_locked(&mut inner, &id);
        }
        for (id, bytes) in held {
            self.step_locked(&mut inner, Event::Held(id, bytes));
        }
        if let Some(reading) = reading {
            self.step_locked(&mut inner, Event::Memory(reading));
        }
    }
}
