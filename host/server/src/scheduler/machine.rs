//! The scheduler's state machine: every admission, queueing, refusal,
//! load, eviction, drain and idle unload is decided here, from events
//! (a request arrives, a load finished, a request is done, time passed, a
//! memory reading) to decisions. No clock, no I/O, no async: the driver
//! feeds it and carries out what it decides, and the tests script it.

use std::collections::{HashMap, VecDeque};
use std::fmt;

use super::guard::{bytes, ceiling, Guard, Reading};

/// Milliseconds on the driver's clock (since the scheduler started).
pub type Millis = u64;

/// One request's place in the scheduler, from arrival to done.
pub type Ticket = u64;

/// The host-wide limits (`hangar serve`'s flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Requests served at once, over every model (`None`: no limit).
    pub max_concurrent: Option<usize>,
    /// Requests that may wait; one more is refused with 429.
    pub max_queue: usize,
    /// How long a request may wait before it is refused with 429.
    pub queue_timeout: Millis,
    /// Models loaded at once (`None`: no limit).
    pub max_loaded: Option<usize>,
    /// The memory guard's level.
    pub guard: Guard,
    /// The most the models may hold, in bytes.
    pub memory_limit: Option<u64>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_concurrent: None,
            max_queue: 256,
            queue_timeout: 60_000,
            max_loaded: None,
            guard: Guard::Off,
            memory_limit: None,
        }
    }
}

/// One model's residency and admission settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Loaded at start, never evicted nor unloaded when idle.
    pub pin: bool,
    /// Unloaded after this long without requests.
    pub ttl: Option<Millis>,
    /// Requests served at once for this model.
    pub max_concurrent: Option<usize>,
    /// How long an unload waits for in-flight requests before stopping
    /// the engine under them.
    pub drain: Millis,
    /// What the model is expected to hold once loaded (bytes).
    pub need: u64,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A request for `model` arrived.
    Request {
        /// Its ticket (unique).
        ticket: Ticket,
        /// The model.
        model: String,
        /// The model's policy now.
        policy: Policy,
    },
    /// A request ended: an admitted one finished, or a queued client left.
    Release(Ticket),
    /// An operator (or a pin at start) asked for `model` to be loaded.
    Load {
        /// The model.
        model: String,
        /// Its policy.
        policy: Policy,
    },
    /// An operator asked for `model` to be unloaded.
    Unload(String),
    /// The model's load succeeded.
    Loaded(String),
    /// The model's load failed (or was cancelled).
    LoadFailed(String),
    /// The model's engine was stopped, as decided.
    Stopped(String),
    /// The model's engine went away on its own (crash).
    Ended(String),
    /// What the model's engine holds now, measured (bytes).
    Held(String, u64),
    /// A reading of the machine's memory.
    Memory(Reading),
    /// Time passed: queue timeouts, idle unloads, drain deadlines.
    Tick,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Serve the request now (its model is loaded or loading).
    Admit(Ticket),
    /// The request waits in the queue.
    Queue(Ticket),
    /// Refuse the request.
    Reject(Ticket, Refusal),
    /// Start loading the model.
    Load(String),
    /// Refuse an operator's load.
    RefuseLoad(String, Refusal),
    /// Stop the model's engine (its in-flight requests, if any, fail).
    Stop(String, Why),
    /// The model drains: new requests wait, in-flight ones finish until
    /// the deadline.
    Drain(String, Millis),
    /// Cancel the model's load.
    CancelLoad(String),
    /// An unload named a model that is neither loaded nor loading.
    NotLoaded(String),
}

/// Why an engine is stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// An operator's unload (after the drain, if any).
    Unload,
    /// The drain's grace period ran out with requests still in flight.
    DrainTimeout,
    /// Idle past its TTL (in ms).
    Ttl(Millis),
    /// Least recently used, evicted to make room for this model.
    Evicted(String),
    /// Evicted because the machine ran short of memory.
    Pressure,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::Unload => f.write_str("unloaded on request"),
            Why::DrainTimeout => f.write_str(
                "unloaded on request; requests still running after the drain period were cut off",
            ),
            Why::Ttl(ms) => write!(f, "unloaded after {} s idle (ttl_seconds)", ms / 1000),
            Why::Evicted(by) => write!(f, "evicted (least recently used) to make room for '{by}'"),
            Why::Pressure => {
                f.write_str("evicted (least recently used): the machine is short of memory")
            }
        }
    }
}

/// Why a request or load is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The queue is full (429).
    QueueFull {
        /// Its length.
        max: usize,
        /// Seconds after which to try again.
        retry_after: u64,
    },
    /// The request waited its whole timeout (429).
    QueueTimeout {
        /// How long it waited (ms).
        waited: Millis,
        /// Seconds after which to try again.
        retry_after: u64,
    },
    /// The model does not fit even with every unpinned model evicted (503).
    Memory {
        /// The model.
        model: String,
        /// What it needs.
        need: u64,
        /// What is free under the ceiling now.
        free: u64,
        /// The ceiling.
        ceiling: u64,
        /// Pinned models (never evicted).
        pinned: Vec<String>,
    },
    /// `--max-loaded-models` is reached by pinned models alone (503).
    TooManyModels {
        /// The limit.
        max: usize,
        /// Pinned models.
        pinned: Vec<String>,
    },
    /// Every loaded model is busy, so none can be evicted now (503; an
    /// operator's load, which does not wait).
    Busy {
        /// The model.
        model: String,
    },
    /// The machine is short of memory: no new requests until it is not
    /// (503).
    Pressure {
        /// Memory available now.
        available: u64,
        /// What the guard keeps free.
        reserve: u64,
    },
}

impl Refusal {
    /// Whether the client should retry later (429) rather than the host
    /// being unable (503).
    pub fn is_rate_limit(&self) -> bool {
        matches!(
            self,
            Refusal::QueueFull { .. } | Refusal::QueueTimeout { .. }
        )
    }

    /// Seconds after which a retry may succeed.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Refusal::QueueFull { retry_after, .. } | Refusal::QueueTimeout { retry_after, .. } => {
                Some(*retry_after)
            }
            Refusal::Pressure { .. } | Refusal::Busy { .. } => Some(5),
            Refusal::Memory { .. } | Refusal::TooManyModels { .. } => None,
        }
    }
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::QueueFull { max, retry_after } => write!(
                f,
                "the host is at its concurrency limit and its queue of {max} is full; retry after {retry_after} s"
            ),
            Refusal::QueueTimeout { waited, retry_after } => write!(
                f,
                "the request waited {:.1} s in the queue (--queue-timeout) without a free slot; retry after {retry_after} s",
                *waited as f64 / 1000.0
            ),
            Refusal::Memory { model, need, free, ceiling, pinned } => write!(
                f,
                "model '{model}' needs {} but only {} is free under the memory ceiling of {} even after evicting every unpinned idle model; pinned: {}. Unpin or unload a model, or raise --memory-limit / lower --memory-guard",
                bytes(*need), bytes(*free), bytes(*ceiling), list(pinned)
            ),
            Refusal::TooManyModels { max, pinned } => write!(
                f,
                "--max-loaded-models {max} is taken by pinned models ({}); unpin one or raise the limit",
                list(pinned)
            ),
            Refusal::Busy { model } => write!(
                f,
                "no room to load model '{model}' now: the loaded models that could make room are busy or loading; retry shortly"
            ),
            Refusal::Pressure { available, reserve } => write!(
                f,
                "the machine is short of memory ({} available, the memory guard keeps {}): new requests are refused until it recovers",
                bytes(*available), bytes(*reserve)
            ),
        }
    }
}

/// Where a model is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    /// Not loaded.
    Absent,
    /// Loading.
    Loading,
    /// Loaded and serving.
    Ready,
    /// Unloading: waiting for in-flight requests until the deadline.
    Draining(Millis),
    /// Its engine is being stopped.
    Stopping,
}

impl Residency {
    /// Counted against `--max-loaded-models` and the memory ceiling.
    fn resident(self) -> bool {
        matches!(
            self,
            Residency::Loading | Residency::Ready | Residency::Draining(_)
        )
    }

    /// Lower-case name, as `/api/sessions` shows it.
    pub fn name(self) -> &'static str {
        match self {
            Residency::Absent => "absent",
            Residency::Loading => "loading",
            Residency::Ready => "ready",
            Residency::Draining(_) => "draining",
            Residency::Stopping => "stopping",
        }
    }
}

/// What the scheduler knows of one model.
#[derive(Debug, Clone)]
pub struct ModelState {
    /// The model's policy, as of its last request or load.
    pub policy: Policy,
    /// Where it is in its life.
    pub residency: Residency,
    /// Requests admitted and not yet released.
    pub in_flight: usize,
    /// Requests waiting for it.
    pub queued: usize,
    /// When its last request ended or began.
    pub last_used: Millis,
    /// What its engine holds, as last measured.
    pub held: Option<u64>,
    /// Requests admitted after waiting, and their total wait.
    pub waited: (u64, Millis),
}

impl ModelState {
    fn new(policy: Policy, now: Millis) -> ModelState {
        ModelState {
            policy,
            residency: Residency::Absent,
            in_flight: 0,
            queued: 0,
            last_used: now,
            held: None,
            waited: (0, 0),
        }
    }

    /// What the model counts for under the ceiling: the larger of its
    /// estimate and its measure (an engine grows its cache as it serves).
    pub fn footprint(&self) -> u64 {
        self.held.unwrap_or(0).max(self.policy.need)
    }
}

#[derive(Debug)]
struct TicketState {
    model: String,
    admitted: bool,
    since: Millis,
}

/// What an admission check found.
enum Room {
    /// Admit now, after stopping these models.
    Now(Vec<String>),
    /// Not now; maybe once a slot frees or a busy model goes idle.
    Wait,
    /// Never, as things are.
    Never(Refusal),
}

/// The scheduler: limits, models, tickets and the FIFO queue.
#[derive(Debug)]
pub struct Scheduler {
    limits: Limits,
    models: HashMap<String, ModelState>,
    tickets: HashMap<Ticket, TicketState>,
    queue: VecDeque<Ticket>,
    in_flight: usize,
    reading: Option<Reading>,
    pressure: Option<Refusal>,
    now: Millis,
}

impl Scheduler {
    /// A scheduler with these limits and nothing loaded.
    pub fn new(limits: Limits) -> Scheduler {
        Scheduler {
            limits,
            models: HashMap::new(),
            tickets: HashMap::new(),
            queue: VecDeque::new(),
            in_flight: 0,
            reading: None,
            pressure: None,
            now: 0,
        }
    }

    /// The limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Every model the scheduler has seen.
    pub fn models(&self) -> impl Iterator<Item = (&String, &ModelState)> {
        self.models.iter()
    }

    /// One model's state.
    pub fn model(&self, id: &str) -> Option<&ModelState> {
        self.models.get(id)
    }

    /// Requests admitted host-wide and not yet released.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Requests waiting host-wide.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// How long the oldest waiter for `model` (or any, for `None`) has
    /// waited.
    pub fn oldest_wait(&self, model: Option<&str>) -> Option<Millis> {
        self.queue
            .iter()
            .filter_map(|t| self.tickets.get(t))
            .find(|t| model.is_none_or(|m| t.model == m))
            .map(|t| self.now.saturating_sub(t.since))
    }

    /// The latest memory reading.
    pub fn reading(&self) -> Option<Reading> {
        self.reading
    }

    /// The refusal new requests get while the machine is short of memory.
    pub fn pressure(&self) -> Option<&Refusal> {
        self.pressure.as_ref()
    }

    /// What loaded models hold, by the larger of estimate and measure.
    pub fn used(&self) -> u64 {
        self.models
            .values()
            .filter(|m| m.residency.resident())
            .map(ModelState::footprint)
            .sum()
    }

    /// The most the models may hold now (`None`: no ceiling).
    pub fn ceiling(&self) -> Option<u64> {
        let held: u64 = self
            .models
            .values()
            .filter(|m| m.residency.resident())
            .map(|m| m.held.unwrap_or(0))
            .sum();
        ceiling(
            self.limits.guard,
            self.limits.memory_limit,
            self.reading,
            held,
        )
    }

    /// When the next timer is due: a queue timeout, an idle unload or a
    /// drain deadline. The driver ticks then.
    pub fn next_wake(&self) -> Option<Millis> {
        let queue = self
            .queue
            .front()
            .and_then(|t| self.tickets.get(t))
            .map(|t| t.since + self.limits.queue_timeout);
        let models = self.models.values().filter_map(|m| match m.residency {
            Residency::Draining(until) => Some(until),
            Residency::Ready if m.in_flight == 0 && m.queued == 0 && !m.policy.pin => {
                m.policy.ttl.map(|ttl| m.last_used + ttl)
            }
            _ => None,
        });
        queue.into_iter().chain(models).min()
    }

    /// Takes in `event` at time `now`; appends what to do to `out`.
    pub fn step(&mut self, now: Millis, event: Event, out: &mut Vec<Decision>) {
        self.now = self.now.max(now);
        match event {
            Event::Request {
                ticket,
                model,
                policy,
            } => self.request(ticket, model, policy, out),
            Event::Release(ticket) => self.release(ticket, out),
            Event::Load { model, policy } => self.load(model, policy, out),
            Event::Unload(model) => self.unload(model, out),
            Event::Loaded(model) => {
                if let Some(m) = self.models.get_mut(&model) {
                    if m.residency == Residency::Loading {
                        m.residency = Residency::Ready;
                        m.last_used = self.now;
                    }
                }
            }
            Event::LoadFailed(model) | Event::Ended(model) => {
                if let Some(m) = self.models.get_mut(&model) {
                    if m.residency != Residency::Absent {
                        m.residency = Residency::Absent;
                        m.held = None;
                    }
                }
                self.pump(out);
            }
            Event::Stopped(model) => {
                if let Some(m) = self.models.get_mut(&model) {
                    if m.residency == Residency::Stopping {
                        m.residency = Residency::Absent;
                        m.held = None;
                    }
                }
                self.pump(out);
            }
            Event::Held(model, bytes) => {
                if let Some(m) = self.models.get_mut(&model) {
                    if m.residency.resident() {
                        m.held = Some(bytes);
                    }
                }
            }
            Event::Memory(reading) => self.memory(reading, out),
            Event::Tick => self.tick(out),
        }
    }

    fn request(&mut self, ticket: Ticket, model: String, policy: Policy, out: &mut Vec<Decision>) {
        let now = self.now;
        self.models
            .entry(model.clone())
            .and_modify(|m| m.policy = policy.clone())
            .or_insert_with(|| ModelState::new(policy, now));
        if let Some(refusal) = &self.pressure {
            out.push(Decision::Reject(ticket, refusal.clone()));
            return;
        }
        match self.room(&model, true) {
            Room::Now(evict) => {
                self.tickets.insert(
                    ticket,
                    TicketState {
                        model: model.clone(),
                        admitted: false,
                        since: now,
                    },
                );
                self.admit(ticket, evict, out);
            }
            Room::Never(refusal) => out.push(Decision::Reject(ticket, refusal)),
            Room::Wait if self.queue.len() >= self.limits.max_queue => out.push(Decision::Reject(
                ticket,
                Refusal::QueueFull {
                    max: self.limits.max_queue,
                    retry_after: self.retry_after(),
                },
            )),
            Room::Wait => {
                self.tickets.insert(
                    ticket,
                    TicketState {
                        model: model.clone(),
                        admitted: false,
                        since: now,
                    },
                );
                self.queue.push_back(ticket);
                if let Some(m) = self.models.get_mut(&model) {
                    m.queued += 1;
                }
                out.push(Decision::Queue(ticket));
            }
        }
    }

    /// Seconds a refused client should wait: the queue timeout, by which
    /// every waiter now has been served or refused.
    fn retry_after(&self) -> u64 {
        self.limits.queue_timeout.div_ceil(1000).max(1)
    }

    /// Admits a known ticket: stops `evict`, loads its model if absent.
    fn admit(&mut self, ticket: Ticket, evict: Vec<String>, out: &mut Vec<Decision>) {
        let Some(t) = self.tickets.get_mut(&ticket) else {
            return;
        };
        t.admitted = true;
        let waited = self.now.saturating_sub(t.since);
        let model = t.model.clone();
        for victim in evict {
            self.stop(&victim, Why::Evicted(model.clone()), out);
        }
        self.in_flight += 1;
        let m = self
            .models
            .get_mut(&model)
            .expect("a ticket's model is known");
        m.in_flight += 1;
        m.last_used = self.now;
        if waited > 0 {
            m.waited.0 += 1;
            m.waited.1 += waited;
        }
        out.push(Decision::Admit(ticket));
        if m.residency == Residency::Absent {
            m.residency = Residency::Loading;
            out.push(Decision::Load(model));
        }
    }

    fn release(&mut self, ticket: Ticket, out: &mut Vec<Decision>) {
        let Some(t) = self.tickets.remove(&ticket) else {
            return;
        };
        let now = self.now;
        let Some(m) = self.models.get_mut(&t.model) else {
            return;
        };
        if !t.admitted {
            // A client that left the queue.
            self.queue.retain(|q| *q != ticket);
            m.queued -= 1;
            return;
        }
        self.in_flight -= 1;
        m.in_flight -= 1;
        m.last_used = now;
        if m.in_flight == 0 && matches!(m.residency, Residency::Draining(_)) {
            self.stop(&t.model, Why::Unload, out);
        }
        self.pump(out);
    }

    /// Admits every waiter that can go now, in arrival order.
    fn pump(&mut self, out: &mut Vec<Decision>) {
        if self.queue.is_empty() {
            return;
        }
        let mut i = 0;
        while i < self.queue.len() {
            if self.host_full() {
                // Nobody can go before a slot frees; waiters that never
                // could are refused when the next pump reaches them.
                return;
            }
            let ticket = self.queue[i];
            let room = self.room(&self.tickets[&ticket].model, true);
            if let Room::Wait = room {
                i += 1;
                continue;
            }
            // Now or never: either way the waiter leaves the queue.
            self.queue.remove(i);
            let model = self.tickets[&ticket].model.clone();
            if let Some(m) = self.models.get_mut(&model) {
                m.queued -= 1;
            }
            match room {
                Room::Now(evict) => self.admit(ticket, evict, out),
                Room::Never(refusal) => {
                    self.tickets.remove(&ticket);
                    out.push(Decision::Reject(ticket, refusal));
                }
                Room::Wait => unreachable!("skipped above"),
            }
        }
    }

    fn load(&mut self, model: String, policy: Policy, out: &mut Vec<Decision>) {
        let now = self.now;
        self.models
            .entry(model.clone())
            .and_modify(|m| m.policy = policy.clone())
            .or_insert_with(|| ModelState::new(policy, now));
        match self.models[&model].residency {
            Residency::Loading | Residency::Ready => return,
            Residency::Draining(_) | Residency::Stopping => {
                out.push(Decision::RefuseLoad(model.clone(), Refusal::Busy { model }));
                return;
            }
            Residency::Absent => {}
        }
        match self.room(&model, false) {
            Room::Now(evict) => {
                for victim in evict {
                    self.stop(&victim, Why::Evicted(model.clone()), out);
                }
                let m = self.models.get_mut(&model).expect("inserted above");
                m.residency = Residency::Loading;
                m.last_used = now;
                out.push(Decision::Load(model));
            }
            Room::Wait => out.push(Decision::RefuseLoad(model.clone(), Refusal::Busy { model })),
            Room::Never(refusal) => out.push(Decision::RefuseLoad(model, refusal)),
        }
    }

    fn unload(&mut self, model: String, out: &mut Vec<Decision>) {
        let now = self.now;
        let Some(m) = self.models.get_mut(&model) else {
            out.push(Decision::NotLoaded(model));
            return;
        };
        match m.residency {
            Residency::Absent | Residency::Stopping => out.push(Decision::NotLoaded(model)),
            Residency::Loading => {
                m.residency = Residency::Absent;
                out.push(Decision::CancelLoad(model));
                self.pump(out);
            }
            Residency::Ready if m.in_flight == 0 => self.stop(&model, Why::Unload, out),
            Residency::Ready => {
                let until = now + m.policy.drain;
                m.residency = Residency::Draining(until);
                out.push(Decision::Drain(model, until));
            }
            Residency::Draining(_) => {}
        }
    }

    fn stop(&mut self, model: &str, why: Why, out: &mut Vec<Decision>) {
        if let Some(m) = self.models.get_mut(model) {
            m.residency = Residency::Stopping;
            out.push(Decision::Stop(model.to_string(), why));
        }
    }

    fn memory(&mut self, reading: Reading, out: &mut Vec<Decision>) {
        self.reading = Some(reading);
        let others = self.limits.guard.reserves().map(|(_, others)| others);
        let short = match others {
            Some(reserve) if reading.available < reserve => Some((reading.available, reserve)),
            _ => None,
        };
        let over_limit = self
            .limits
            .memory_limit
            .filter(|limit| self.measured() > *limit);
        self.pressure = match (short, over_limit) {
            (Some((available, reserve)), _) => Some(Refusal::Pressure { available, reserve }),
            (None, Some(limit)) => Some(Refusal::Pressure {
                available: 0,
                reserve: self.measured() - limit,
            }),
            (None, None) => None,
        };
        if self.pressure.is_none() {
            self.pump(out);
            return;
        }
        // Make room the way a load would: least recently used idle
        // unpinned models first, until the shortfall is covered.
        let deficit = match (short, over_limit) {
            (Some((available, reserve)), _) => reserve - available,
            (None, Some(limit)) => self.measured() - limit,
            (None, None) => 0,
        };
        let mut freed = 0;
        for victim in self.idle_lru() {
            if freed >= deficit {
                break;
            }
            freed += self.models[&victim].footprint();
            self.stop(&victim, Why::Pressure, out);
        }
    }

    /// What loaded models hold by measure alone.
    fn measured(&self) -> u64 {
        self.models
            .values()
            .filter(|m| m.residency.resident())
            .filter_map(|m| m.held)
            .sum()
    }

    fn tick(&mut self, out: &mut Vec<Decision>) {
        let now = self.now;
        let timeout = self.limits.queue_timeout;
        while let Some(&ticket) = self.queue.front() {
            let t = &self.tickets[&ticket];
            let waited = now.saturating_sub(t.since);
            if waited < timeout {
                break;
            }
            let model = t.model.clone();
            self.queue.pop_front();
            self.tickets.remove(&ticket);
            if let Some(m) = self.models.get_mut(&model) {
                m.queued -= 1;
            }
            let retry_after = self.retry_after();
            out.push(Decision::Reject(
                ticket,
                Refusal::QueueTimeout {
                    waited,
                    retry_after,
                },
            ));
        }
        let mut due: Vec<(String, Why)> = self
            .models
            .iter()
            .filter_map(|(id, m)| match m.residency {
                Residency::Draining(until) if now >= until => Some((id.clone(), Why::DrainTimeout)),
                Residency::Ready if m.in_flight == 0 && m.queued == 0 && !m.policy.pin => m
                    .policy
                    .ttl
                    .filter(|ttl| now >= m.last_used + ttl)
                    .map(|ttl| (id.clone(), Why::Ttl(ttl))),
                _ => None,
            })
            .collect();
        due.sort_by(|a, b| a.0.cmp(&b.0));
        for (model, why) in due {
            self.stop(&model, why, out);
        }
    }

    /// Ready, idle, unpinned models, least recently used first.
    fn idle_lru(&self) -> Vec<String> {
        let mut idle: Vec<(&String, &ModelState)> = self
            .models
            .iter()
            .filter(|(_, m)| {
                m.residency == Residency::Ready
                    && m.in_flight == 0
                    && m.queued == 0
                    && !m.policy.pin
            })
            .collect();
        idle.sort_by(|a, b| a.1.last_used.cmp(&b.1.last_used).then(a.0.cmp(b.0)));
        idle.into_iter().map(|(id, _)| id.clone()).collect()
    }

    fn pinned(&self) -> Vec<String> {
        let mut pinned: Vec<String> = self
            .models
            .iter()
            .filter(|(_, m)| m.policy.pin && m.residency.resident())
            .map(|(id, _)| id.clone())
            .collect();
        pinned.sort();
        pinned
    }

    /// Whether every host-wide slot is taken.
    fn host_full(&self) -> bool {
        self.limits
            .max_concurrent
            .is_some_and(|max| self.in_flight >= max)
    }

    /// Whether a request (`slot`: it takes a concurrency slot) or load for
    /// `model` can go now, and what must be evicted for it.
    fn room(&self, model: &str, slot: bool) -> Room {
        let m = &self.models[model];
        if slot {
            let host_full = self.host_full();
            let model_full = m
                .policy
                .max_concurrent
                .is_some_and(|max| m.in_flight >= max);
            if host_full || model_full {
                return Room::Wait;
            }
        }
        match m.residency {
            Residency::Loading | Residency::Ready => return Room::Now(vec![]),
            Residency::Draining(_) | Residency::Stopping => return Room::Wait,
            Residency::Absent => {}
        }
        let need = m.policy.need;
        let ceiling = self.ceiling();
        let mut loaded = self
            .models
            .values()
            .filter(|m| m.residency.resident())
            .count();
        let mut used = self.used();
        let fits = |loaded: usize, used: u64| {
            self.limits.max_loaded.is_none_or(|max| loaded < max)
                && ceiling.is_none_or(|c| used + need <= c)
        };
        let mut evict = Vec::new();
        let mut idle = self.idle_lru().into_iter();
        while !fits(loaded, used) {
            let Some(victim) = idle.next() else { break };
            loaded -= 1;
            used -= self.models[&victim].footprint();
            evict.push(victim);
        }
        if fits(loaded, used) {
            return Room::Now(evict);
        }
        // Would it fit once every unpinned model is gone? Then wait for
        // the busy ones; otherwise it never will.
        let pinned: Vec<&ModelState> = self
            .models
            .iter()
            .filter(|(id, m)| m.policy.pin && m.residency.resident() && id.as_str() != model)
            .map(|(_, m)| m)
            .collect();
        let pinned_used: u64 = pinned.iter().map(|m| m.footprint()).sum();
        if let Some(max) = self.limits.max_loaded {
            if pinned.len() >= max {
                return Room::Never(Refusal::TooManyModels {
                    max,
                    pinned: self.pinned(),
                });
            }
        }
        if let Some(c) = ceiling {
            if pinned_used + need > c {
                return Room::Never(Refusal::Memory {
                    model: model.to_string(),
                    need,
                    free: c.saturating_sub(self.used()),
                    ceiling: c,
                    pinned: self.pinned(),
                });
            }
        }
        Room::Wait
    }
}
