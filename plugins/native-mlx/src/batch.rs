//! Continuous batching: one engine thread serves many requests at once.
//!
//! Callers hand requests to the engine thread and receive their tokens
//! through a channel. Between decoding steps the thread admits new
//! requests and drops finished ones; each step runs every decoding
//! sequence's next token and chunks of waiting prompts, within a token
//! budget, as one packed forward pass (see `Model::packed_forward`): the
//! projections and the MLP see all tokens at once. Every sequence's keys
//! and values live in the shared paged pool (`KvPool`), from its first
//! prompt chunk on: one write per layer stores every new position of a
//! step, decoding sequences of similar length attend in one kernel, and
//! prompt chunks of the same offset and length attend as one batch (with
//! the paged attention kernel a first chunk's tokens attend as decoding
//! rows instead, see [`BatchOptions::first_chunks_as_rows`]). Prompt
//! chunks start at multiples of [`BLOCK`] whatever
//! else runs, and decoding attention reads padded lengths that depend on
//! the sequence alone, so a request computes the same shapes alone or
//! batched, cold or from the prefix cache, and greedy tokens do not depend
//! on its company.
//!
//! As in `Session`, step n+1 is built and queued before token n is read,
//! so graph building overlaps evaluation. A request under a grammar (see
//! `constraint`) needs token n read before its draw n+1 is masked: a step
//! with such a request queues its forward pass, reads token n, then
//! queues the draws, so the device computes the pass while the host
//! reads, advances the grammars and builds the masks.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mlx_rs::ops::indexing::{argmax_axis, take_axis};
use mlx_rs::ops::{concatenate, select};
use mlx_rs::transforms::async_eval;
use mlx_rs::{with_stream, Array, Dtype};

use crate::cache::KvCache;
use crate::constraint::{Constraint, Grammars, Unpack};
use crate::disk::DiskTier;
use crate::draft::Drafter;
use crate::error::{Error, Result};
use crate::images::{prepare_pixels, ImageDigest};
use crate::indexing::IndexOnStream;
use crate::model::{window, Chunks, Decode, Group, Packed, PagedRead, WindowRead};
use crate::pool::{KvPool, Pages, RowIndex};
use crate::prefix::{block_hashes, PrefixCache, BLOCK};
use crate::sampling::Sampler;
use crate::session::{ids, StopMatcher};
use crate::specprefill::{self, SpecPrefill};
use crate::speculate::{verify_greedy, verify_sampled, Costs, Proposer};
use crate::tokenizer::StreamDecoder;
use crate::turn::mlx_turn;
use crate::{Completion, FinishReason, GenerateRequest, Session, Timings, TokenEvent, Usage};

/// How the engine thread schedules.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchOptions {
    /// Most requests generating at once; more wait in line.
    pub max_sequences: usize,
    /// Tokens one step may compute: every decoding sequence's one token,
    /// then prompt chunks of up to [`BLOCK`] tokens while they fit (a step
    /// with nothing else takes one chunk anyway). Chunks at the same offset
    /// attend as one batch, so a larger budget costs few more kernels: at
    /// 1024 eight 128-token prompts start in one step, as mlx-lm prefills
    /// eight at once.
    pub step_tokens: usize,
    /// Bytes of keys and values the prefix cache keeps in memory (0 turns
    /// the whole prefix cache off).
    pub prefix_cache_bytes: usize,
    /// The folder of the prefix cache's disk tier (a subfolder per model);
    /// `None` keeps the cache in memory only.
    pub prefix_cache_dir: Option<std::path::PathBuf>,
    /// Bytes of block files the disk tier keeps.
    pub prefix_cache_disk_bytes: u64,
    /// Long prompts prefilled in part, scored by the drafter (see
    /// `specprefill`); `None`, the default, or without a drafter: whole.
    pub spec_prefill: Option<SpecPrefill>,
    /// Decoding rows attend in groups of one padded length (a multiple of
    /// the pool's bucket), each group with its own gather, mask and
    /// attention in every layer. Rows of a shorter length join the group
    /// of the next longer one where the positions they then read beyond
    /// their own (rows times the difference) are at most this many. On a
    /// GPU a group costs some 25 ops a layer to encode, a few microseconds
    /// each (about 3 ms a step at 7B), and a padded position a few
    /// nanoseconds, so rows whose lengths differ by a bucket or a few
    /// attend together. `None`: [`MERGE_PADDING_GPU`] on a GPU; 0 on the
    /// CPU, where a step is bound by its arithmetic and a row computes the
    /// same shapes batched as alone.
    pub merge_padding: Option<usize>,
    /// On a GPU, decoding rows attend with Hangar's paged attention kernel
    /// (`src/paged.rs`), one kernel a layer reading the pool through each
    /// row's page table, instead of a gather, a mask and MLX's masked
    /// attention ops per group; layers with sliding windows or attention
    /// sinks, and head sizes the kernel does not take, keep the groups.
    /// `None`: on a GPU (an H200 at 7B, 64 streams: 7.8 ms a step against
    /// 13.5). The CPU has no such kernel.
    pub paged_attention: Option<bool>,
    /// The tokens of first prompt chunks attend as decoding rows, each to
    /// its sequence's positions up to its own, in the same kernel as the
    /// step's decoding rows, in models without sliding windows or
    /// attention sinks; else each chunk length attends as a batch of its
    /// own. `None`: where `paged_attention` is on and its kernel takes
    /// every layer's heads (64 or 128 wide). With the kernel a step
    /// of 32 new prompts is one attention a layer whatever their lengths,
    /// where as chunks each new length is a new shape for MLX's CUDA
    /// attention, which built a graph for each (0.1-0.5 s).
    pub first_chunks_as_rows: Option<bool>,
}

/// [`BatchOptions::merge_padding`] on a GPU: under the padded reads that
/// cost about one group's ops at 7B (some 50 000 row positions, at 2 KB of
/// keys and values a layer each, read twice), with room to spare.
pub const MERGE_PADDING_GPU: usize = 32_768;

impl Default for BatchOptions {
    fn default() -> Self {
        Self {
            max_sequences: 64,
            step_tokens: 1024,
            prefix_cache_bytes: 1 << 30,
            prefix_cache_dir: None,
            prefix_cache_disk_bytes: 8 << 30,
            spec_prefill: None,
            merge_padding: None,
            paged_attention: None,
            first_chunks_as_rows: None,
        }
    }
}

/// What the engine's steps have computed so far, and how long they took:
/// where a batched run's time goes (`native-mlx-bench --concurrent`).
///
/// A step's time is the interval between reading the tokens of the step
/// before it and reading its own: with step n+1 queued before step n is
/// read, that is the device's time for the step once the device is busy.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepStats {
    /// The most sequences (decoding rows and prompt chunks) of one step.
    pub peak_batch: usize,
    /// Steps that only decode, their decoding rows in all, and their time.
    pub decode_steps: u64,
    pub decode_rows: u64,
    pub decode_time: Duration,
    /// Steps that also prefill prompt chunks: their count, decoding rows,
    /// prompt tokens and time.
    pub mixed_steps: u64,
    pub mixed_rows: u64,
    pub mixed_prompt_tokens: u64,
    pub mixed_time: Duration,
    /// Masks computed for rows under a grammar, and the host's time for
    /// them and for advancing the grammars by each token taken.
    pub masks: u64,
    pub grammar_time: Duration,
    /// Speculative steps (one verifying pass of a sequence decoding alone),
    /// the tokens they proposed, kept and produced, and their time.
    pub spec_steps: u64,
    pub spec_proposed: u64,
    pub spec_accepted: u64,
    pub spec_tokens: u64,
    pub spec_time: Duration,
    /// Where the speculative steps' time went: proposing, building the
    /// verifying pass's graph, waiting for MLX to compute it (submission
    /// included), and the rest (reading the step before, verifying on the
    /// host, truncating the cache, taking the tokens).
    pub spec_propose_time: Duration,
    pub spec_build_time: Duration,
    pub spec_wait_time: Duration,
    /// Requests admitted; the engine thread's time starting them (the
    /// prompt's template and tokens, the prefix cache, images), their time
    /// from arrival to admission, and from arrival to their first token
    /// (sums): through a server, what of a client's time to first token
    /// the engine accounts for.
    pub requests: u64,
    pub admit_time: Duration,
    pub queue_time: Duration,
    pub first_token_time: Duration,
    /// Steps built with decoding rows read from the pool, and the
    /// attention groups of those rows in all (see
    /// [`BatchOptions::merge_padding`]).
    pub pool_decode_steps: u64,
    pub decode_groups: u64,
    /// Prompt chunks computed as chunks and the groups they attended in,
    /// and first chunks whose tokens attended as decoding rows (see
    /// [`BatchOptions::first_chunks_as_rows`]).
    pub prompt_chunks: u64,
    pub chunk_groups: u64,
    pub chunks_as_rows: u64,
}

/// For benchmarks through a server (scripts/serving_bench.py): with
/// `NATIVE_MLX_STATS_FILE` set, each time the engine goes idle it writes
/// its step statistics there as one JSON object (times in milliseconds),
/// so that a run's steps can be told apart from the server around them.
fn write_stats(stats: &Mutex<StepStats>) {
    static FILE: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
    let Some(path) = FILE.get_or_init(|| std::env::var_os("NATIVE_MLX_STATS_FILE").map(Into::into))
    else {
        return;
    };
    let s = *stats.lock().unwrap_or_else(|e| e.into_inner());
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let json = serde_json::json!({
        "peak_batch": s.peak_batch,
        "decode_steps": s.decode_steps, "decode_rows": s.decode_rows, "decode_ms": ms(s.decode_time),
        "mixed_steps": s.mixed_steps, "mixed_rows": s.mixed_rows,
        "mixed_prompt_tokens": s.mixed_prompt_tokens, "mixed_ms": ms(s.mixed_time),
        "spec_steps": s.spec_steps, "spec_tokens": s.spec_tokens, "spec_ms": ms(s.spec_time),
        "requests": s.requests, "admit_ms": ms(s.admit_time), "queue_ms": ms(s.queue_time),
        "first_token_ms": ms(s.first_token_time),
        "pool_decode_steps": s.pool_decode_steps, "decode_groups": s.decode_groups,
        "prompt_chunks": s.prompt_chunks, "chunk_groups": s.chunk_groups,
        "chunks_as_rows": s.chunks_as_rows,
    });
    // Written whole, then renamed: a reader never sees half of it.
    let partial = path.with_extension("partial");
    if std::fs::write(&partial, json.to_string()).is_ok() {
        let _ = std::fs::rename(&partial, path);
    }
}

impl StepStats {
    /// Counts a step of `rows` decoding rows and `prompt_tokens` prompt
    /// tokens that took `time`.
    fn record(&mut self, rows: usize, prompt_tokens: usize, time: Duration) {
        if prompt_tokens == 0 {
            self.decode_steps += 1;
            self.decode_rows += rows as u64;
            self.decode_time += time;
        } else {
            self.mixed_steps += 1;
            self.mixed_rows += rows as u64;
            self.mixed_prompt_tokens += prompt_tokens as u64;
            self.mixed_time += time;
        }
    }
}

enum Event {
    Token { token: Option<u32>, text: String },
    Done(Result<Completion>),
}

struct Job {
    request: GenerateRequest,
    /// Its images' pixels by digest, prepared by the caller's thread.
    pixels: Vec<(ImageDigest, Vec<f32>)>,
    events: mpsc::Sender<Event>,
    cancel: Arc<AtomicBool>,
    received: Instant,
}

/// A session served by its own thread, many requests at a time.
pub struct Batcher {
    jobs: Option<mpsc::Sender<Job>>,
    /// The side of the images the model's vision tower reads, if it has one.
    image_size: Option<u32>,
    stats: Arc<Mutex<StepStats>>,
    thread: Option<JoinHandle<()>>,
}

impl Batcher {
    /// Moves `session` to a new engine thread.
    pub fn start(session: Session, options: BatchOptions) -> Self {
        Self::start_with_drafter(session, options, None)
    }

    /// Moves `session` to a new engine thread, with a draft model for the
    /// requests that speculate with one (`Speculation::draft_model`).
    pub fn start_with_drafter(
        session: Session,
        options: BatchOptions,
        drafter: Option<Drafter>,
    ) -> Self {
        let (jobs, inbox) = mpsc::channel();
        let image_size = session.vision.as_ref().ok().map(|v| v.image_size());
        let stats = Arc::new(Mutex::new(StepStats::default()));
        let engine_stats = stats.clone();
        let thread = std::thread::Builder::new()
            .name("native-mlx-engine".into())
            .spawn(move || {
                let stream = session.stream.0.clone();
                with_stream(&stream, || {
                    Engine::new(session, drafter, options, inbox, engine_stats).run()
                });
            })
            .expect("the OS starts a thread");
        Self {
            jobs: Some(jobs),
            image_size,
            stats,
            thread: Some(thread),
        }
    }

    /// The most sequences one step has computed together so far (how much
    /// batching happened).
    pub fn peak_batch(&self) -> usize {
        self.step_stats().peak_batch
    }

    /// The engine's step statistics so far.
    pub fn step_stats(&self) -> StepStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `request` with whatever else is running, calling `on_token` on
    /// this thread as tokens arrive; `ControlFlow::Break` cancels it.
    pub fn generate(
        &self,
        request: GenerateRequest,
        mut on_token: impl FnMut(TokenEvent<'_>) -> ControlFlow<()>,
    ) -> Result<Completion> {
        let pixels = match self.image_size {
            Some(size) => prepare_pixels(&request.prompt, size)?,
            None => Vec::new(),
        };
        let (events, inbox) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let job = Job {
            request,
            pixels,
            events,
            cancel: cancel.clone(),
            received: Instant::now(),
        };
        let gone = || Error::EngineStopped("its thread ended".into());
        self.jobs
            .as_ref()
            .ok_or_else(gone)?
            .send(job)
            .map_err(|_| gone())?;
        // What the caller saw: when it cancels, the engine may have run a
        // token or two further, which the answer does not count.
        let (mut tokens, mut text_seen) = (0, String::new());
        for event in inbox {
            match event {
                Event::Token { token, text } => {
                    if cancel.load(Ordering::Relaxed) {
                        continue;
                    }
                    tokens += usize::from(token.is_some());
                    text_seen.push_str(&text);
                    if on_token(TokenEvent { token, text: &text }).is_break() {
                        cancel.store(true, Ordering::Relaxed);
                    }
                }
                Event::Done(Ok(mut done)) if cancel.load(Ordering::Relaxed) => {
                    if done.finish_reason == FinishReason::Cancelled
                        || done.token_ids.len() > tokens
                    {
                        done.finish_reason = FinishReason::Cancelled;
                        done.token_ids.truncate(tokens);
                        done.usage.completion_tokens = done.token_ids.len();
                        done.text = text_seen;
                    }
                    return Ok(done);
                }
                Event::Done(result) => return result,
            }
        }
        Err(gone())
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        // The thread ends once its inbox is closed and its requests are done.
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One request on the engine thread.
struct Seq {
    job: Job,
    prompt: Vec<u32>,
    /// What the prefix cache keys the prompt's blocks by, where it has
    /// images (see `PromptInput::cache_keys`); else the prompt itself.
    keys: Option<Vec<u32>>,
    /// Hashes of the prompt's whole blocks (all but its last token).
    hashes: Vec<u64>,
    /// The soft tokens of its images not prefilled yet: `(start, rows)`,
    /// rows `(len, hidden)` for prompt positions `start..start + len`.
    images: Vec<(usize, Array)>,
    /// Its keys and values in the pool.
    pages: Pages,
    /// Instead, while it decodes alone: its keys and values in a cache of
    /// its own, as a `Session` decodes (see `Engine::build_lone`).
    alone: Option<Vec<KvCache>>,
    /// Prompt tokens in the pool.
    filled: usize,
    /// Prompt positions SpecPrefill left out: `prompt` holds the others,
    /// and each decoded token sits this far past its cache position.
    skipped: usize,
    /// The RoPE position of each token of `prompt`, when some were left out.
    positions: Option<Vec<i32>>,
    cached_prompt_tokens: usize,
    sampler: Sampler,
    /// The grammar its answer follows, if the request has one.
    constraint: Option<Constraint>,
    /// What proposes its tokens, if it speculates.
    proposer: Option<Proposer>,
    /// Its last token was read on the host (a speculative step) and is
    /// not in its cache yet: the next step feeds it.
    unfed: bool,
    /// Why it ended early, to answer with (its grammar failed).
    error: Option<Error>,
    stops: StopMatcher,
    decoder: StreamDecoder,
    text: String,
    token_ids: Vec<u32>,
    /// Where the last sampled token, not yet fed back, is in the tokens of
    /// the step in flight (see `InFlight`).
    pending: Option<i32>,
    /// Tokens sampled so far, read or not.
    sampled: usize,
    first_token_at: Option<Instant>,
    finished: Option<FinishReason>,
}

impl Seq {
    /// What the prefix cache keys its blocks by.
    fn cache_keys(&self) -> &[u32] {
        self.keys.as_deref().unwrap_or(&self.prompt)
    }

    /// The prompt is in the cache but its last token, which the first
    /// decoding step feeds.
    fn prefilled(&self) -> bool {
        self.filled + 1 >= self.prompt.len()
    }

    /// Its grammar, while its next token counts.
    fn live_constraint(&mut self) -> Option<&mut Constraint> {
        self.constraint.as_mut().filter(|_| self.finished.is_none())
    }

    /// Ends it with `error` as its answer.
    fn fail(&mut self, error: Error) {
        self.error = Some(error);
        self.finished = Some(FinishReason::Stop);
    }
}

/// A step whose forward pass is queued and whose draws wait for the
/// tokens of the step before (a row of it is under a grammar).
struct Deferred {
    logits: Array,
    decoding: Vec<usize>,
    prompt_tokens: usize,
}

/// A queued step's sampled tokens: one `(1, n)` array, so that the next
/// step feeds them back with one op and reads them with one wait, however
/// many sequences decode.
struct InFlight {
    tokens: Array,
    /// Prompt tokens the step also computed.
    prompt_tokens: usize,
    /// The identity of the sequence of each row (indices into `active`
    /// are not stable across a step).
    tags: Vec<usize>,
    /// When it was submitted.
    started: Instant,
}

struct Engine {
    session: Session,
    drafter: Option<Drafter>,
    options: BatchOptions,
    inbox: mpsc::Receiver<Job>,
    waiting: VecDeque<Job>,
    active: Vec<Seq>,
    pool: KvPool,
    prefix: PrefixCache,
    /// The step queued last, whose tokens are read after the next is built.
    in_flight: Option<InFlight>,
    /// The step built last, when its draws wait for `in_flight`'s tokens.
    deferred: Option<Deferred>,
    grammars: Grammars,
    /// Expands masks for logits of the width it was made for.
    unpack: Option<Unpack>,
    /// Identities of `active`, parallel to it.
    tags: Vec<usize>,
    next_id: usize,
    open: bool,
    stats: Arc<Mutex<StepStats>>,
    /// When the tokens of the last step were read, and whether it was a
    /// plain step of one sequence.
    last_read: Option<(Instant, bool)>,
    /// When the first step of prompt chunks alone since then was
    /// submitted, and their prompt tokens: such a step yields no tokens to
    /// read, so its time and tokens count in the next step that does.
    chunks_since: Option<(Instant, usize)>,
    /// Grammar work not yet counted in `stats`: masks and time.
    grammar_work: (u64, Duration),
    /// How long a plain decoding step of one sequence takes (a moving
    /// average: what a speculative pass's tokens would have cost), and
    /// each size of verifying pass.
    costs: Costs,
}

impl Engine {
    fn new(
        session: Session,
        drafter: Option<Drafter>,
        options: BatchOptions,
        inbox: mpsc::Receiver<Job>,
        stats: Arc<Mutex<StepStats>>,
    ) -> Self {
        let mut options = options;
        let gpu = mlx_rs::Device::try_default()
            .and_then(|d| d.get_type())
            .is_ok_and(|t| matches!(t, mlx_rs::DeviceType::Gpu));
        if options.merge_padding.is_none() {
            options.merge_padding = Some(if gpu { MERGE_PADDING_GPU } else { 0 });
        }
        // The paged attention kernel is CUDA's.
        options.paged_attention = Some(options.paged_attention.unwrap_or(gpu) && gpu);
        // Asked for, prompt rows need layers that read every position
        // (elsewhere the groups compute them); by default they go where
        // the kernel serves every layer.
        let model = &session.model;
        options.first_chunks_as_rows = Some(match options.first_chunks_as_rows {
            Some(on) => on && model.reads_every_position(),
            None => options.paged_attention == Some(true) && model.pages_everywhere(),
        });
        let disk = options
            .prefix_cache_dir
            .as_ref()
            .and_then(|root| DiskTier::open(root, &session.dir, options.prefix_cache_disk_bytes));
        let prefix = PrefixCache::new(options.prefix_cache_bytes, disk);
        Self {
            session,
            drafter,
            options,
            inbox,
            waiting: VecDeque::new(),
            active: Vec::new(),
            pool: KvPool::new(),
            prefix,
            in_flight: None,
            deferred: None,
            grammars: Grammars::default(),
            unpack: None,
            tags: Vec::new(),
            next_id: 0,
            open: true,
            stats,
            last_read: None,
            chunks_since: None,
            grammar_work: (0, Duration::ZERO),
            costs: Costs::default(),
        }
    }

    fn run(&mut self) {
        loop {
            self.receive();
            if !self.open
                && self.waiting.is_empty()
                && self.active.is_empty()
                && self.in_flight.is_none()
            {
                return;
            }
            // The step's turn ends before waiting for the next jobs.
            let _turn = mlx_turn();
            self.admit();
            if let Err(e) = self.iterate() {
                // A failed step leaves every cache in it in doubt: fail the
                // requests that were running, keep serving new ones.
                let message = e.to_string();
                for seq in self.active.drain(..) {
                    let _ = seq
                        .job
                        .events
                        .send(Event::Done(Err(Error::EngineStopped(message.clone()))));
                }
                self.tags.clear();
                self.in_flight = None;
                self.deferred = None;
                self.pool.clear();
            }
            // Idle: the pool's memory goes back to the device (MLX would
            // keep it for reuse: on an H100 another 7B engine's next burst
            // ran out of memory beside it), and the wait for the next
            // request is no step's time.
            if self.active.is_empty() && self.in_flight.is_none() {
                write_stats(&self.stats);
                self.last_read = None;
                self.chunks_since = None;
                if !self.pool.is_empty() {
                    self.pool.clear();
                    crate::ffi::release_cached_buffers();
                }
            }
        }
    }

    /// Takes new jobs: waits for one when there is nothing to do.
    fn receive(&mut self) {
        if !self.open {
            return;
        }
        if self.waiting.is_empty() && self.active.is_empty() && self.in_flight.is_none() {
            match self.inbox.recv() {
                Ok(job) => self.waiting.push_back(job),
                Err(_) => {
                    self.open = false;
                    return;
                }
            }
        }
        loop {
            match self.inbox.try_recv() {
                Ok(job) => self.waiting.push_back(job),
                Err(mpsc::TryRecvError::Empty) => return,
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.open = false;
                    return;
                }
            }
        }
    }

    /// Starts waiting jobs while there is room.
    fn admit(&mut self) {
        while self.active.len() < self.options.max_sequences.max(1) {
            let Some(mut job) = self.waiting.pop_front() else {
                return;
            };
            if job.cancel.load(Ordering::Relaxed) {
                continue;
            }
            // The pixels are done with once the tower has run.
            let pixels = std::mem::take(&mut job.pixels);
            let began = Instant::now();
            match self.start(&job.request, &pixels) {
                Ok(started) => {
                    {
                        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
                        stats.requests += 1;
                        stats.admit_time += began.elapsed();
                        stats.queue_time += began - job.received;
                    }
                    let Started {
                        prompt,
                        keys,
                        hashes,
                        images,
                        pages,
                        filled,
                        sampler,
                        constraint,
                    } = started;
                    // An image's soft tokens are no ids a drafter can score.
                    let (prompt, hashes, skipped, positions) = match keys {
                        None => self.spec_prefill(prompt, hashes, filled),
                        Some(_) => (prompt, hashes, 0, None),
                    };
                    let stops = StopMatcher::new(&job.request.stop);
                    let mut spec = job.request.speculation.clone();
                    // Without a drafter that fits, a draft model proposes
                    // nothing; nor does a model without an MTP layer.
                    spec.draft_model &= self.drafter.is_some();
                    spec.mtp &= self.session.model.mtp_layers() > 0;
                    let proposer = spec.is_on().then(|| Proposer::new(spec));
                    self.active.push(Seq {
                        job,
                        prompt,
                        keys,
                        hashes,
                        images,
                        pages,
                        alone: None,
                        filled,
                        skipped,
                        positions,
                        cached_prompt_tokens: filled,
                        sampler,
                        constraint,
                        proposer,
                        unfed: false,
                        error: None,
                        stops,
                        decoder: StreamDecoder::new(),
                        text: String::new(),
                        token_ids: Vec::new(),
                        pending: None,
                        sampled: 0,
                        first_token_at: None,
                        finished: None,
                    });
                    self.tags.push(self.next_id);
                    self.next_id += 1;
                    // The next read's time includes starting it: no plain
                    // step's.
                    if let Some((_, plain)) = &mut self.last_read {
                        *plain = false;
                    }
                }
                Err(e) => {
                    let _ = job.events.send(Event::Done(Err(e)));
                }
            }
        }
    }

    /// The prompt to prefill, its block hashes, the positions left out and
    /// the RoPE positions of the rest: `prompt` whole, unless SpecPrefill is
    /// on, a drafter scores, and enough of it is not cached yet (`filled`
    /// positions are). Only the blocks before the first gap stay cacheable.
    /// A scorer that fails leaves the prompt whole.
    #[allow(clippy::type_complexity)]
    fn spec_prefill(
        &self,
        prompt: Vec<u32>,
        hashes: Vec<u64>,
        filled: usize,
    ) -> (Vec<u32>, Vec<u64>, usize, Option<Vec<i32>>) {
        let (Some(options), Some(drafter)) = (&self.options.spec_prefill, &self.drafter) else {
            return (prompt, hashes, 0, None);
        };
        // Sliding windows count cache rows, which a prompt with gaps no
        // longer lines up with positions: such models prefill whole.
        if self.session.model.config().sliding_window.is_some() {
            return (prompt, hashes, 0, None);
        }
        if prompt.len().saturating_sub(filled) < options.min_tokens.max(1) {
            return (prompt, hashes, 0, None);
        }
        let Ok(scores) = drafter.importance(&prompt, options.lookahead) else {
            return (prompt, hashes, 0, None);
        };
        let kept = specprefill::select(&scores, filled, options.keep);
        if kept.len() == prompt.len() {
            return (prompt, hashes, 0, None);
        }
        let gap = kept
            .iter()
            .enumerate()
            .find(|&(i, &p)| i != p)
            .map_or(kept.len(), |(i, _)| i);
        let hashes = hashes[..(gap / BLOCK).min(hashes.len())].to_vec();
        let skipped = prompt.len() - kept.len();
        let tokens = kept.iter().map(|&p| prompt[p]).collect();
        let positions = kept.iter().map(|&p| p as i32).collect();
        (tokens, hashes, skipped, Some(positions))
    }

    /// Checks a request, puts its cached prefix in the pool and computes
    /// the soft tokens of the images past it.
    fn start(
        &mut self,
        request: &GenerateRequest,
        pixels: &[(ImageDigest, Vec<f32>)],
    ) -> Result<Started> {
        if request.max_tokens == 0 {
            return Err(Error::InvalidRequest(
                "max_tokens must be at least 1".into(),
            ));
        }
        let input = self.session.prompt_input(&request.prompt)?;
        let keys = input.cache_keys();
        let prompt = input.tokens;
        if prompt.is_empty() {
            return Err(Error::InvalidRequest("the prompt has no tokens".into()));
        }
        // The first decoding step feeds the last token by its id.
        if input
            .images
            .last()
            .is_some_and(|i| i.start + i.len >= prompt.len())
        {
            return Err(Error::InvalidRequest(
                "the prompt ends with an image; the template should close it".into(),
            ));
        }
        let sampler = Sampler::new(request.sampling.clone())?;
        let constraint = match &request.grammar {
            Some(lark) => Some(self.grammars.compile(&self.session.tokenizer, lark)?),
            None => None,
        };
        // The last prompt token is fed by the first decoding step, so only
        // blocks before it are cached or restored.
        let all_keys = keys.as_deref().unwrap_or(&prompt);
        let body = &all_keys[..prompt.len() - 1];
        let hashes = block_hashes(body);
        let mut pages = Pages::default();
        let filled = match self.prefix.restore(body, &hashes)? {
            Some((filled, cache)) => {
                if let Err(e) = self.pool.adopt(&mut pages, &cache) {
                    self.pool.release(pages);
                    return Err(e);
                }
                filled
            }
            None => 0,
        };
        // Images wholly in the cached prefix need no tower.
        let mut images = Vec::new();
        for (index, image) in input.images.iter().enumerate() {
            if image.start + image.len <= filled {
                continue;
            }
            let vision = self
                .session
                .vision
                .as_mut()
                .expect("images expanded by the vision");
            let prepared = pixels
                .iter()
                .find(|(digest, _)| *digest == image.digest)
                .map(|(_, p)| p.as_slice());
            match vision.soft_tokens(image, index, prepared) {
                Ok(rows) => images.push((image.start, rows)),
                Err(e) => {
                    self.pool.release(pages);
                    return Err(e);
                }
            }
        }
        Ok(Started {
            prompt,
            keys,
            hashes,
            images,
            pages,
            filled,
            sampler,
            constraint,
        })
    }

    /// One step: build and queue the next forward pass, then read the
    /// tokens of the previous one.
    fn iterate(&mut self) -> Result<()> {
        // Cancelled requests leave before the step is built.
        for seq in &mut self.active {
            if seq.finished.is_none() && seq.job.cancel.load(Ordering::Relaxed) {
                seq.finished = Some(FinishReason::Cancelled);
            }
        }
        self.retire();
        if self.speculating() {
            return self.speculate();
        }
        // Blocks of the step in flight, which is read below.
        let computed = self.prefix.take_unsaved();
        let queued = self.build()?;
        if let Some(previous) = std::mem::replace(&mut self.in_flight, queued) {
            self.read(previous)?;
            self.look_for_proposals();
        }
        // The grammars have taken those tokens: the waiting draws can be masked.
        if let Some(step) = self.deferred.take() {
            let step = self.sample(&step.logits, &step.decoding, step.prompt_tokens)?;
            async_eval([&step.tokens])?;
            self.in_flight = Some(step);
        }
        // That step is done: its new prefix blocks can be written.
        self.prefix.persist(computed)?;
        self.retire();
        Ok(())
    }

    /// Reads the tokens of the queued step `previous` and takes them.
    fn read(&mut self, previous: InFlight) -> Result<()> {
        {
            previous.tokens.eval()?;
            let now = Instant::now();
            // A step's time runs from the last read, or from its own
            // submission where that came later (the first step after a
            // pause). A plain step of one sequence read right after another
            // times a plain step (a prompt chunk's read waits for no token,
            // so the step after it pays for the chunk too).
            let plain = previous.tags.len() == 1 && previous.prompt_tokens == 0;
            let (submitted, chunk_tokens) = match self.chunks_since.take() {
                Some((chunks, tokens)) => (chunks.min(previous.started), tokens),
                None => (previous.started, 0),
            };
            let (before, after_plain) = match self.last_read.replace((now, plain)) {
                Some((read, after_plain)) if read >= submitted => (read, after_plain),
                _ => (submitted, false),
            };
            if plain && after_plain {
                let took = (now - before).as_secs_f64();
                let plain = self.costs.plain.map_or(took, |p| 0.9 * p + 0.1 * took);
                self.costs.plain = Some(plain);
            }
            let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            let prompt_tokens = previous.prompt_tokens + chunk_tokens;
            stats.record(previous.tags.len(), prompt_tokens, now - before);
            let (masks, time) = std::mem::take(&mut self.grammar_work);
            stats.masks += masks;
            stats.grammar_time += time;
            drop(stats);
            let ids: Vec<u32> = previous.tokens.as_slice::<u32>().to_vec();
            for (tag, id) in previous.tags.into_iter().zip(ids) {
                if let Some(at) = self.tags.iter().position(|&t| t == tag) {
                    self.accept(at, id)?;
                }
            }
        }
        Ok(())
    }

    /// A lone sequence whose proposer found nothing to propose (or rests)
    /// looks again after the tokens it has now: it speculates from the next
    /// step on if there is something.
    fn look_for_proposals(&mut self) {
        let [seq] = self.active.as_mut_slice() else {
            return;
        };
        let Some(proposer) = seq.proposer.as_mut().filter(|p| p.quiet) else {
            return;
        };
        proposer.look(&seq.prompt, &seq.token_ids);
    }

    /// Whether the next step is a speculative one: one sequence decodes,
    /// alone (nobody waits), without a grammar, and has something to
    /// propose.
    fn speculating(&self) -> bool {
        let [seq] = self.active.as_slice() else {
            return false;
        };
        self.waiting.is_empty()
            && self.deferred.is_none()
            && seq.finished.is_none()
            && seq.prefilled()
            && seq.constraint.is_none()
            && seq.proposer.as_ref().is_some_and(|p| !p.quiet)
            && seq.skipped == 0
            && seq.sampled < seq.job.request.max_tokens
    }

    /// One speculative step of the lone sequence: reads the step in flight
    /// (speculation needs the tokens so far on the host), proposes, verifies
    /// the proposals in one pass on the sequence's own cache, forgets what
    /// was rejected, and takes the kept tokens and the one after them.
    fn speculate(&mut self) -> Result<()> {
        if let Some(previous) = self.in_flight.take() {
            let computed = self.prefix.take_unsaved();
            self.read(previous)?;
            self.prefix.persist(computed)?;
            self.retire();
            if !self.speculating() {
                return Ok(());
            }
        }
        let began = Instant::now();
        self.go_alone()?;
        let seq = &mut self.active[0];
        let last = match seq.token_ids.last() {
            Some(&id) if seq.sampled > 0 => id,
            _ => seq.prompt[seq.prompt.len() - 1],
        };
        let answer = seq.token_ids.len();
        let context: Vec<u32> = seq.prompt.iter().chain(&seq.token_ids).copied().collect();
        // The kept proposals and the token after them stay within max_tokens.
        let room = seq.job.request.max_tokens - seq.sampled - 1;
        let proposer = seq
            .proposer
            .as_mut()
            .expect("a speculating sequence proposes");
        let proposing = Instant::now();
        let proposal = proposer.propose(
            &context,
            answer,
            room,
            self.drafter.as_ref(),
            Some(&self.session.model),
            Some(&self.costs),
        )?;
        let proposed = proposing.elapsed();
        proposer.proposed_in(proposal.tokens.len(), proposed.as_secs_f64());
        if proposal.tokens.is_empty() {
            // Nothing to verify: the plain path takes the next token until
            // there is something. Its input is on the host: the step that
            // made it is no longer in flight.
            if seq.pending.take().is_some() {
                seq.unfed = true;
            }
            proposer.quiet = true;
            return Ok(());
        }
        seq.pending = None;
        let mut input = Vec::with_capacity(proposal.tokens.len() + 1);
        input.push(last);
        input.extend_from_slice(&proposal.tokens);
        let cache = seq.alone.as_mut().expect("a cache of its own");
        let before = cache.first().map_or(0, KvCache::offset);
        let building = Instant::now();
        let (hidden, logits) = self.session.model.hidden_and_logits(&ids(&input)?, cache)?;
        // Log-probabilities as `Session::step` computes them, row by row.
        let logprobs = logits.subtract(logits.logsumexp_axis(-1, true)?)?;
        let (built, waited);
        let (kept, next) = if seq.sampler.is_greedy() {
            let choices = argmax_axis(&logprobs, -1, None)?.as_dtype(Dtype::Uint32)?;
            built = building.elapsed();
            choices.eval()?;
            waited = building.elapsed() - built;
            let choices = choices.as_slice::<u32>();
            match proposer.spec.accept_all {
                true => (proposal.tokens.len(), choices[proposal.tokens.len()]),
                false => verify_greedy(&proposal.tokens, choices),
            }
        } else {
            let probs = seq.sampler.probabilities(&logprobs)?;
            let draws = seq
                .sampler
                .uniforms(input.len() + 1)?
                .expect("a sampled request draws");
            built = building.elapsed();
            mlx_rs::transforms::eval([&probs, &draws])?;
            waited = building.elapsed() - built;
            let vocab = probs.dim(-1) as usize;
            let probs = probs.as_slice::<f32>();
            let rows: Vec<&[f32]> = probs.chunks(vocab).collect();
            let mut draws = draws.as_slice::<f32>().iter().copied();
            verify_sampled(&proposal.tokens, &rows, || draws.next().unwrap_or(0.0))
        };
        // The cache keeps the input and the kept proposals; the token
        // after them is fed by the next step.
        let keep = before + 1 + kept as i32;
        for layer in cache.iter_mut() {
            layer.truncate(keep);
        }
        proposer.record(&proposal, kept);
        if let Some(mtp) = proposer.mtp() {
            // The model's hidden states of the input and the kept
            // proposals: the MTP layer reads them next time.
            mtp.push(before as usize, hidden.at((.., ..kept as i32 + 1, ..))?);
        }
        let produced: Vec<u32> = proposal.tokens[..kept]
            .iter()
            .copied()
            .chain([next])
            .collect();
        seq.sampled += produced.len();
        seq.unfed = true;
        for id in produced.iter().copied() {
            self.accept(0, id)?;
            if self.active[0].finished.is_some() {
                break;
            }
        }
        let took = began.elapsed();
        self.costs
            .verified(input.len(), (took - proposed).as_secs_f64());
        if let (Some(plain), Some(proposer)) = (self.costs.plain, &mut self.active[0].proposer) {
            let saved = produced.len() as f64 * plain - took.as_secs_f64();
            let usage = &mut proposer.usage;
            usage.time_saved = Some(usage.time_saved.unwrap_or(0.0) + saved);
        }
        {
            let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            stats.spec_steps += 1;
            stats.spec_proposed += proposal.tokens.len() as u64;
            stats.spec_accepted += kept as u64;
            stats.spec_tokens += produced.len() as u64;
            stats.spec_time += began.elapsed();
            stats.spec_propose_time += proposed;
            stats.spec_build_time += built;
            stats.spec_wait_time += waited;
        }
        self.last_read = None;
        self.retire();
        Ok(())
    }

    /// Builds and queues one packed forward pass; returns its sampled tokens.
    fn build(&mut self) -> Result<Option<InFlight>> {
        // A cache of its own counts positions from 0 up: not for a prompt
        // prefilled in part.
        let lone =
            self.active.len() == 1 && self.active[0].prefilled() && self.active[0].skipped == 0;
        if !lone {
            // Company came: a sequence that decoded alone moves to the pool.
            for seq in &mut self.active {
                if let Some(cache) = seq.alone.take() {
                    self.pool.adopt(&mut seq.pages, &cache)?;
                }
            }
        }
        let mut budget = self.options.step_tokens;
        // The pages this step's sequences take next, and those prompts
        // still being prefilled will take in the pool, asked for at once.
        let pages: i32 = self
            .active
            .iter()
            .filter(|seq| seq.finished.is_none())
            .map(|seq| {
                let len = if seq.prefilled() {
                    seq.pages.len() + 1
                } else {
                    seq.prompt.len() as i32
                };
                (Pages::needed(len) - seq.pages.held()).max(0)
            })
            .sum();
        if !lone {
            self.pool.make_room(pages);
        }
        // Decoding sequences first, one token each, grouped by the padded
        // length their attention reads. A token is a row of the step in
        // flight, or a prompt's last token (the first step of a sequence).
        let mut decoding: Vec<(i32, usize, Input)> = Vec::new();
        let mut firsts: Vec<u32> = Vec::new();
        for (at, seq) in self.active.iter_mut().enumerate() {
            if seq.finished.is_some()
                || !seq.prefilled()
                || seq.sampled >= seq.job.request.max_tokens
            {
                continue;
            }
            let input = match seq.pending.take() {
                Some(row) => Input::Row(row),
                None if seq.sampled == 0 => {
                    firsts.push(seq.prompt[seq.prompt.len() - 1]);
                    Input::First(firsts.len() as i32 - 1)
                }
                // A speculative step read it.
                None if seq.unfed => {
                    seq.unfed = false;
                    firsts.push(*seq.token_ids.last().expect("a token was taken"));
                    Input::First(firsts.len() as i32 - 1)
                }
                // Its token is still in flight.
                None => continue,
            };
            if lone {
                return self.build_lone(input, &firsts);
            }
            let len = seq.pages.len() + 1;
            self.pool.reserve(&mut seq.pages, len);
            decoding.push((Pages::padded(len), at, input));
        }
        decoding.sort_by_key(|&(padded, _, _)| padded);
        budget = budget.saturating_sub(decoding.len());
        // Then prompt chunks, in arrival order, one per sequence, ending at
        // the next block boundary (or the prompt's last token but one).
        let mut prefilling: Vec<(usize, usize)> = Vec::new();
        for (at, seq) in self.active.iter().enumerate() {
            if seq.finished.is_some() || seq.prefilled() {
                continue;
            }
            let end = ((seq.filled / BLOCK + 1) * BLOCK).min(seq.prompt.len() - 1);
            let len = end - seq.filled;
            if len > budget && !(decoding.is_empty() && prefilling.is_empty()) {
                break;
            }
            prefilling.push((at, end));
            budget = budget.saturating_sub(len);
        }
        if decoding.is_empty() && prefilling.is_empty() {
            return Ok(None);
        }
        // Chunks of the same offset and length side by side: they attend
        // as one batch. First chunks (without positions of their own) come
        // first: with the paged attention kernel their tokens attend as
        // decoding rows, one kernel a layer whatever their lengths, where
        // as chunks each length is an attention shape of its own (MLX's
        // CUDA attention built a graph for each new one, 0.1-0.5 s).
        prefilling.sort_by_key(|&(at, end)| {
            let seq = &self.active[at];
            (seq.filled, seq.positions.is_some(), end - seq.filled)
        });
        let as_rows = if self.options.first_chunks_as_rows == Some(true) {
            prefilling
                .iter()
                .take_while(|&&(at, _)| {
                    let seq = &self.active[at];
                    seq.filled == 0 && seq.positions.is_none()
                })
                .count()
        } else {
            0
        };
        {
            let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            stats.peak_batch = stats.peak_batch.max(decoding.len() + prefilling.len());
        }
        let mut rows = Vec::new();
        let decode = self.decode_batch(&decoding, &prefilling[..as_rows], &mut rows)?;
        let chunks = self.chunk_groups(&prefilling[as_rows..], &mut rows)?;
        let mut parts: Vec<Array> = Vec::new();
        if !decoding.is_empty() {
            parts.push(self.decoding_input(&decoding, &firsts)?);
        }
        let mut prompt_tokens = 0;
        let mut soft_tokens = Vec::new();
        // Decoding rows come first in the step's input.
        let mut offset = decoding.len();
        for &(at, end) in &prefilling {
            let seq = &self.active[at];
            let start = seq.filled;
            parts.push(ids(&seq.prompt[start..end])?);
            for (image, rows) in &seq.images {
                let (from, to) = (start.max(*image), end.min(image + rows.dim(0) as usize));
                if from < to {
                    let own = rows.at(((from - image) as i32..(to - image) as i32, ..))?;
                    soft_tokens.push(((offset + from - start) as i32, own));
                }
            }
            offset += end - start;
            prompt_tokens += end - start;
        }
        let input = if parts.len() == 1 {
            parts.pop().expect("one part")
        } else {
            concatenate(&parts, 1)?
        };
        let n = rows.len() as i32;
        let mut step = Packed {
            pool: &mut self.pool,
            rows: RowIndex::new(Array::from_slice(&rows, &[1, n, 1])),
            decode,
            chunks,
            soft_tokens,
        };
        let (logits, hidden) = self.session.model.packed_forward(&input, &mut step)?;
        drop(step);
        if let (Some(logits), true) = (&logits, prefilling.is_empty()) {
            report_graph(logits, decoding.len())?;
        }
        // The hidden states of sequences that propose with the MTP layer:
        // the decoding rows first, then each prompt chunk, as in `input`.
        let mut to_eval: Vec<Array> = Vec::new();
        if self
            .active
            .iter()
            .any(|seq| seq.proposer.as_ref().is_some_and(|p| p.spec.mtp))
        {
            let mut row = 0;
            for &(_, at, _) in &decoding {
                let position = self.active[at].pages.len() as usize - 1;
                let rows = hidden.at((.., row..row + 1, ..))?;
                to_eval.extend(self.mtp_hidden(at, position, rows)?);
                row += 1;
            }
            for &(at, end) in &prefilling {
                let filled = self.active[at].filled;
                let len = (end - filled) as i32;
                let rows = hidden.at((.., row..row + len, ..))?;
                to_eval.extend(self.mtp_hidden(at, filled, rows)?);
                row += len;
            }
        }

        let mut queued = None;
        if let Some(logits) = logits {
            let decoding: Vec<usize> = decoding.iter().map(|&(_, at, _)| at).collect();
            if self.constrained(&decoding) {
                to_eval.push(logits.clone());
                self.deferred = Some(Deferred {
                    logits,
                    decoding,
                    prompt_tokens,
                });
            } else {
                let step = self.sample(&logits, &decoding, prompt_tokens)?;
                to_eval.push(step.tokens.clone());
                queued = Some(step);
            }
        }
        // A step of prompt chunks alone yields no tokens: its writes are
        // what is evaluated.
        to_eval.extend(self.pool.arrays().cloned());
        if queued.is_none() && self.deferred.is_none() {
            self.chunks_since
                .get_or_insert_with(|| (Instant::now(), 0))
                .1 += prompt_tokens;
        }
        for (at, end) in prefilling {
            let seq = &mut self.active[at];
            let start = seq.filled;
            seq.filled = end;
            // Prefilled images' soft tokens are done with.
            seq.images
                .retain(|(image, rows)| image + rows.dim(0) as usize > end);
            // A whole block computed as one chunk goes to the prefix cache.
            let index = (end / BLOCK).wrapping_sub(1);
            if let (true, Some(&hash)) = (
                end - start == BLOCK && end % BLOCK == 0,
                seq.hashes.get(index),
            ) {
                if self.prefix.enabled() && !self.prefix.contains(hash) {
                    let rows: Vec<i32> = (start..end).map(|p| seq.pages.row(p as i32)).collect();
                    let layers = self.pool.copy_rows(&rows)?;
                    let keys = seq.cache_keys();
                    to_eval.extend(self.prefix.insert(hash, index, keys, layers)?);
                }
            }
        }
        async_eval(to_eval.iter())?;
        Ok(queued)
    }

    /// Samples the next token of each sequence of `decoding` (indices into
    /// `active`) from its row of `logits` (`(1, rows, vocab)`): the step to
    /// queue, whose tokens are one `(1, rows)` array.
    fn sample(
        &mut self,
        logits: &Array,
        decoding: &[usize],
        prompt_tokens: usize,
    ) -> Result<InFlight> {
        // Rows under a grammar: their masks as bit words, expanded and
        // applied on the device for all of them at once.
        let width = logits.dim(-1) as usize;
        if self.unpack.as_ref().is_none_or(|u| u.width() != width) {
            self.unpack = Some(Unpack::new(width));
        }
        let unpack = self.unpack.as_ref().expect("made above");
        let (mut masked, mut words) = (Vec::new(), Vec::new());
        for (row, &at) in decoding.iter().enumerate() {
            let seq = &mut self.active[at];
            let Some(constraint) = seq.live_constraint() else {
                continue;
            };
            let begun = Instant::now();
            let allowed = constraint.allowed_words(unpack.words(), &mut words);
            self.grammar_work.0 += 1;
            self.grammar_work.1 += begun.elapsed();
            match allowed {
                Ok(()) => masked.push(row),
                // Its answer ends with the error; the row's draw is not read.
                Err(e) => seq.fail(e),
            }
        }
        let masked_logits = match masked.is_empty() {
            true => None,
            false => {
                let rows: Vec<i32> = masked.iter().map(|&r| r as i32).collect();
                let rows = Array::from_slice(&rows, &[rows.len() as i32]);
                let picked = take_axis(logits, &rows, 1)?;
                let allowed = unpack.masks(&words, masked.len())?.expand_dims(0)?;
                let never = Array::from_f32(f32::NEG_INFINITY);
                let masked_logits = select(&allowed, &picked, &never)?;
                let greedy = argmax_axis(&masked_logits, -1, None)?;
                Some((masked_logits, greedy))
            }
        };
        // Greedy rows share three ops: the log-sum-exp of each row (as
        // `Session::step` computes it for one) and the argmax.
        let shared = |seq: &Seq| {
            seq.sampler.is_greedy() && (seq.constraint.is_none() || seq.finished.is_some())
        };
        let all_greedy = decoding.iter().all(|&at| shared(&self.active[at]));
        let greedy = if all_greedy || decoding.iter().any(|&at| shared(&self.active[at])) {
            let logprobs = logits.subtract(logits.logsumexp_axis(-1, true)?)?;
            Some(argmax_axis(&logprobs, -1, None)?)
        } else {
            None
        };
        let mut rows = Vec::new();
        for (row, &at) in decoding.iter().enumerate() {
            let seq = &mut self.active[at];
            if !all_greedy {
                let under_grammar = masked.iter().position(|&r| r == row);
                rows.push(match (&greedy, under_grammar, &masked_logits) {
                    (_, Some(j), Some((_, tokens))) if seq.sampler.is_greedy() => {
                        tokens.at((.., j as i32))?
                    }
                    (_, Some(j), Some((logits, _))) => {
                        let logits = logits.at((.., j as i32, ..))?;
                        let logprobs = logits.subtract(logits.logsumexp(true)?)?;
                        seq.sampler.sample(&logprobs)?.as_dtype(Dtype::Uint32)?
                    }
                    (Some(tokens), _, _) if shared(seq) => tokens.at((.., row as i32))?,
                    _ => {
                        let logits = logits.at((.., row as i32, ..))?;
                        // As `Session::step`: a log-sum-exp over the `(1, vocab)` row.
                        let logprobs = logits.subtract(logits.logsumexp(true)?)?;
                        seq.sampler.sample(&logprobs)?.as_dtype(Dtype::Uint32)?
                    }
                });
            }
            seq.pending = Some(row as i32);
            seq.sampled += 1;
        }
        let tokens = match greedy {
            Some(tokens) if all_greedy => tokens,
            _ => concatenate(&rows, 0)?.reshape(&[1, -1])?,
        };
        Ok(InFlight {
            tokens,
            prompt_tokens,
            tags: decoding.iter().map(|&at| self.tags[at]).collect(),
            started: Instant::now(),
        })
    }

    /// The step of a sequence that decodes alone, from `input` (as in
    /// `decoding_input`; `firsts` holds its first token): on a cache of its
    /// own, as a `Session` decodes, which costs fewer ops than the pool's
    /// padded, masked reads. Its keys and values leave the pool at its
    /// first step alone and return to it when company comes (`build`). On
    /// the CPU both paths give the same tokens (the tests check a request
    /// alone against batched, and against a `Session`).
    fn build_lone(&mut self, input: Input, firsts: &[u32]) -> Result<Option<InFlight>> {
        let input = self.decoding_input(&[(0, 0, input)], firsts)?;
        self.go_alone()?;
        let seq = &mut self.active[0];
        let cache = seq.alone.as_mut().expect("a cache of its own");
        let position = cache.first().map_or(0, KvCache::offset) as usize;
        let (hidden, logits) = self.session.model.hidden_and_logits(&input, cache)?;
        let mut to_eval = self.mtp_hidden(0, position, hidden)?;
        if self.constrained(&[0]) {
            to_eval.push(logits.clone());
            async_eval(&to_eval)?;
            self.deferred = Some(Deferred {
                logits,
                decoding: vec![0],
                prompt_tokens: 0,
            });
            return Ok(None);
        }
        let step = self.sample(&logits, &[0], 0)?;
        to_eval.push(step.tokens.clone());
        async_eval(&to_eval)?;
        Ok(Some(step))
    }

    /// Hands the model's hidden states `hidden` (`(1, n, width)`) of
    /// positions `position..` of sequence `at` to its MTP layer, if it
    /// proposes with one, and feeds the layer what it can take; returns
    /// the arrays to evaluate with the step (lazy).
    fn mtp_hidden(&mut self, at: usize, position: usize, hidden: Array) -> Result<Vec<Array>> {
        let Seq {
            proposer,
            prompt,
            token_ids,
            skipped,
            ..
        } = &mut self.active[at];
        // A prompt prefilled in part has no hidden states of what it left
        // out; such a sequence does not speculate.
        let Some(mtp) = proposer
            .as_mut()
            .and_then(Proposer::mtp)
            .filter(|_| *skipped == 0)
        else {
            return Ok(Vec::new());
        };
        mtp.push(position, hidden);
        let split = prompt.len();
        mtp.catch_up(&self.session.model, split + token_ids.len(), |p| {
            if p < split {
                prompt[p]
            } else {
                token_ids[p - split]
            }
        })
    }

    /// Moves the keys and values of the lone sequence out of the pool, into
    /// a cache of its own (once).
    fn go_alone(&mut self) -> Result<()> {
        let seq = &mut self.active[0];
        if seq.alone.is_none() {
            let len = seq.pages.len();
            let rows: Vec<i32> = (0..len).map(|p| seq.pages.row(p)).collect();
            let mut cache = if len == 0 {
                self.session.model.new_cache()
            } else {
                self.pool
                    .copy_rows(&rows)?
                    .into_iter()
                    .map(|(k, v)| KvCache::from_state(k, v))
                    .collect()
            };
            // Its prompt was prefilled but its last token, as a session's.
            for layer in &mut cache {
                layer.set_prefilled(seq.prompt.len() as i32 - 1);
            }
            self.pool.release(std::mem::take(&mut seq.pages));
            seq.alone = Some(cache);
        }
        Ok(())
    }

    /// Whether a sequence of `decoding` (indices into `active`) draws
    /// under a grammar.
    fn constrained(&self, decoding: &[usize]) -> bool {
        decoding.iter().any(|&at| {
            let seq = &self.active[at];
            seq.constraint.is_some() && seq.finished.is_none()
        })
    }

    /// The `(1, n)` input tokens of the decoding sequences `decoding`, in
    /// order: rows of the step in flight and first tokens `firsts`, in
    /// one op (none when the rows are the step's own, in order).
    fn decoding_input(&self, decoding: &[(i32, usize, Input)], firsts: &[u32]) -> Result<Array> {
        let previous = self.in_flight.as_ref().map(|f| &f.tokens);
        let from_previous = previous.map_or(0, |p| p.dim(1));
        let index: Vec<i32> = decoding
            .iter()
            .map(|(_, _, input)| match *input {
                Input::Row(row) => row,
                Input::First(i) => from_previous + i,
            })
            .collect();
        if firsts.is_empty() && index.iter().copied().eq(0..from_previous) {
            return Ok(previous.expect("rows of the step in flight").clone());
        }
        let source = match previous {
            Some(p) if !firsts.is_empty() => concatenate(&[p.clone(), ids(firsts)?], 1)?,
            Some(p) => p.clone(),
            None => ids(firsts)?,
        };
        let index = Array::from_slice(&index, &[index.len() as i32]);
        Ok(take_axis(&source, &index, 1)?)
    }

    /// The step's decoding rows: those of `decoding` (see `build`), then
    /// each token of the first prompt chunks `prompts` (index into
    /// `active`, end) as a row of its own, at its position, reading its
    /// sequence's positions up to its own (the causal mask). Groups rows
    /// by the padded length they read, fills their positions, appends
    /// their pool rows to `rows`, and gives every row its page table for
    /// the paged attention kernel where that is on and pays.
    fn decode_batch(
        &mut self,
        decoding: &[(i32, usize, Input)],
        prompts: &[(usize, usize)],
        rows: &mut Vec<i32>,
    ) -> Result<Option<Decode>> {
        if decoding.is_empty() && prompts.is_empty() {
            return Ok(None);
        }
        let mut positions = Vec::new();
        let mut groups = Vec::new();
        let heads = self.session.model.config().num_kv_heads;
        // The mask once per key/value head, as the pool's gather lays the
        // rows out.
        let per_head = |mask: &[bool]| -> Vec<bool> {
            (0..heads).flat_map(|_| mask.iter().copied()).collect()
        };
        let window = (self.session.model.config().sliding_window.as_ref()).map(|w| w.size);
        debug_assert!(prompts.is_empty() || window.is_none());
        let lengths: Vec<i32> = decoding.iter().map(|&(padded, _, _)| padded).collect();
        // Each row: its sequence, its prompt position (none for a decoding
        // row: the position after the sequence's last), the length it reads.
        let mut members: Vec<(usize, Option<i32>, i32)> = decoding
            .iter()
            .zip(merged_padding(
                &lengths,
                self.options.merge_padding.unwrap_or(0),
            ))
            .map(|(&(_, at, _), padded)| (at, None, padded))
            .collect();
        for &(at, end) in prompts {
            let seq = &mut self.active[at];
            self.pool.reserve(&mut seq.pages, end as i32);
            KvPool::fill(&mut seq.pages, end as i32);
            members.extend(
                (seq.filled as i32..end as i32).map(|p| (at, Some(p), Pages::padded(p + 1))),
            );
        }
        // Each row's read length, for the paged kernel.
        let mut lens = Vec::with_capacity(members.len());
        let mut members = members.into_iter().peekable();
        while let Some(&(_, _, padded)) = members.peek() {
            let (mut index, mut mask, mut count) = (Vec::new(), Vec::new(), 0);
            // Sliding-window layers read each row's window, in mlx-lm's order.
            let window_padded = window.map_or(0, |w| padded.min(Pages::padded(w)));
            let (mut window_index, mut window_mask) = (Vec::new(), Vec::new());
            while let Some((at, prompt, _)) = members.next_if(|m| m.2 == padded) {
                let seq = &mut self.active[at];
                let pages = &mut seq.pages;
                let pos = match prompt {
                    Some(pos) => {
                        positions.push(pos);
                        pos
                    }
                    None => {
                        let pos = pages.len();
                        KvPool::fill(pages, pos + 1);
                        positions.push(pos + seq.skipped as i32);
                        pos
                    }
                };
                rows.push(pages.row(pos));
                lens.push(pos + 1);
                index.extend((0..padded).map(|p| pages.row(if p <= pos { p } else { 0 })));
                mask.extend((0..padded).map(|p| p <= pos));
                if let Some(w) = window {
                    let base = seq.prompt.len() as i32 - 1;
                    let read = window::decoding_positions(pos + 1, base, w);
                    let len = read.len();
                    window_index.extend(
                        (0..window_padded as usize)
                            .map(|p| pages.row(if p < len { read[p] } else { read[0] })),
                    );
                    window_mask.extend((0..window_padded as usize).map(|p| p < len));
                }
                count += 1;
            }
            groups.push(Group {
                rows: count,
                padded,
                index: RowIndex::new(Array::from_slice(&index, &[1, count * padded, 1])),
                mask: Array::from_slice(&per_head(&mask), &[heads * count, 1, 1, padded]),
                window: window.map(|_| WindowRead {
                    padded: window_padded,
                    index: RowIndex::new(Array::from_slice(
                        &window_index,
                        &[1, count * window_padded, 1],
                    )),
                    mask: Array::from_slice(
                        &per_head(&window_mask),
                        &[heads * count, 1, 1, window_padded],
                    ),
                }),
            });
        }
        {
            let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            stats.pool_decode_steps += 1;
            stats.decode_groups += groups.len() as u64;
            stats.chunks_as_rows += prompts.len() as u64;
        }
        let n = positions.len() as i32;
        let longest = lens.iter().copied().max().unwrap_or(0);
        let paged = (self.options.paged_attention == Some(true)
            && crate::paged::pays(n, heads, longest))
        .then(|| {
            // Each row's pages (padded with page 0), in row order.
            let sequences = decoding.iter().map(|&(_, at, _)| (at, 1));
            let sequences = sequences.chain(
                prompts
                    .iter()
                    .map(|&(at, end)| (at, end - self.active[at].filled)),
            );
            let width = sequences
                .clone()
                .map(|(at, _)| self.active[at].pages.held())
                .max()
                .unwrap_or(1);
            let mut table = Vec::with_capacity(n as usize * width as usize);
            for (at, tokens) in sequences {
                let pages = &self.active[at].pages;
                for _ in 0..tokens {
                    table.extend((0..width).map(|i| pages.page(i)));
                }
            }
            PagedRead {
                table: Array::from_slice(&table, &[n, width]),
                lens: Array::from_slice(&lens, &[n]),
            }
        });
        Ok(Some(Decode {
            positions: Array::from_slice(&positions, &[n]),
            logits: decoding.len() as i32,
            groups,
            paged,
        }))
    }

    /// The chunk groups of prompt chunks `prefilling` (index into `active`,
    /// end), in that order, consecutive chunks of the same offset and
    /// length in one group; reserves and fills their positions and appends
    /// their pool rows to `rows`.
    fn chunk_groups(
        &mut self,
        prefilling: &[(usize, usize)],
        rows: &mut Vec<i32>,
    ) -> Result<Vec<Chunks>> {
        let mut groups: Vec<Chunks> = Vec::new();
        let mut reads: Vec<Vec<i32>> = Vec::new();
        for &(at, end) in prefilling {
            let seq = &mut self.active[at];
            let (offset, len) = (seq.filled as i32, (end - seq.filled) as i32);
            self.pool.reserve(&mut seq.pages, offset + len);
            KvPool::fill(&mut seq.pages, offset + len);
            let pages = &seq.pages;
            rows.extend((offset..offset + len).map(|p| pages.row(p)));
            let positions = seq.positions.as_ref().map(|all| {
                let own = &all[offset as usize..(offset + len) as usize];
                Array::from_slice(own, &[len])
            });
            match groups.last_mut() {
                Some(g)
                    if (g.offset, g.len) == (offset, len)
                        && g.positions.is_none()
                        && positions.is_none() =>
                {
                    g.seqs += 1
                }
                _ => {
                    groups.push(Chunks {
                        seqs: 1,
                        offset,
                        len,
                        index: None,
                        positions,
                    });
                    reads.push(Vec::new());
                }
            }
            if offset > 0 {
                let read = reads.last_mut().expect("a group");
                read.extend((0..offset + len).map(|p| pages.row(p)));
            }
        }
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        stats.prompt_chunks += prefilling.len() as u64;
        stats.chunk_groups += groups.len() as u64;
        drop(stats);
        for (group, read) in groups.iter_mut().zip(reads) {
            if group.offset > 0 {
                group.index = Some(RowIndex::new(Array::from_slice(
                    &read,
                    &[1, read.len() as i32, 1],
                )));
            }
        }
        Ok(groups)
    }

    /// Takes sampled token `id` of sequence `at`: stop checks, text, event.
    fn accept(&mut self, at: usize, id: u32) -> Result<()> {
        let tokenizer = &self.session.tokenizer;
        let seq = &mut self.active[at];
        if seq.finished.is_some() {
            return Ok(());
        }
        if seq.first_token_at.is_none() {
            let now = Instant::now();
            seq.first_token_at = Some(now);
            let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            stats.first_token_time += now - seq.job.received;
        }
        if !seq.job.request.ignore_eos && tokenizer.is_eos(id) {
            seq.finished = Some(FinishReason::Stop);
            return Ok(());
        }
        seq.token_ids.push(id);
        // A grammar that is complete ends the answer after this token.
        let begun = Instant::now();
        let taken = seq.constraint.as_mut().map(|c| c.take(id));
        if taken.is_some() {
            self.grammar_work.1 += begun.elapsed();
        }
        let complete = match taken {
            Some(Err(e)) => {
                seq.fail(e);
                return Ok(());
            }
            Some(Ok(complete)) => complete,
            None => false,
        };
        let piece = seq.decoder.push(tokenizer, id)?;
        let (piece, stopped) = seq.stops.push(&piece);
        seq.text.push_str(&piece);
        let sent = seq.job.events.send(Event::Token {
            token: Some(id),
            text: piece,
        });
        if stopped || complete {
            seq.finished = Some(FinishReason::Stop);
        } else if sent.is_err() || seq.job.cancel.load(Ordering::Relaxed) {
            seq.finished = Some(FinishReason::Cancelled);
        } else if seq.token_ids.len() >= seq.job.request.max_tokens {
            seq.finished = Some(FinishReason::Length);
        }
        Ok(())
    }

    /// Answers and drops finished sequences.
    fn retire(&mut self) {
        let tokenizer = &self.session.tokenizer;
        let mut at = 0;
        while at < self.active.len() {
            let Some(reason) = self.active[at].finished else {
                at += 1;
                continue;
            };
            let mut seq = self.active.remove(at);
            self.tags.remove(at);
            self.pool.release(std::mem::take(&mut seq.pages));
            let result = match seq.error.take() {
                Some(e) => Err(e),
                None => finish(&mut seq, reason, tokenizer),
            };
            let _ = seq.job.events.send(Event::Done(result));
        }
    }
}

/// A request checked and started: what `Engine::start` gives `admit`.
struct Started {
    prompt: Vec<u32>,
    keys: Option<Vec<u32>>,
    hashes: Vec<u64>,
    images: Vec<(usize, Array)>,
    pages: Pages,
    /// Prompt positions restored from the prefix cache.
    filled: usize,
    sampler: Sampler,
    constraint: Option<Constraint>,
}

/// Where a decoding sequence's next input token is.
#[derive(Debug, Clone, Copy)]
enum Input {
    /// This row of the step in flight.
    Row(i32),
    /// This index of the step's first tokens (prompts' last tokens).
    First(i32),
}

/// The last text held back, and the request's completion.
/// With `NATIVE_MLX_GRAPH_OPS` set, prints to stderr the primitives of the
/// first decoding-only step at each batch size (`rows`), by name: what the
/// host builds and submits per step (as `native-mlx-bench --graph-ops` does
/// for a session's step). A diagnostic; nothing happens unset.
fn report_graph(logits: &Array, rows: usize) -> Result<()> {
    static WANTED: OnceLock<bool> = OnceLock::new();
    static SEEN: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    if !*WANTED.get_or_init(|| std::env::var_os("NATIVE_MLX_GRAPH_OPS").is_some()) {
        return Ok(());
    }
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.contains(&rows) {
        return Ok(());
    }
    seen.push(rows);
    let counts = crate::ffi::graph_primitives(&[logits])?;
    let total: usize = counts.values().sum();
    let each = counts
        .iter()
        .map(|(name, n)| format!("{name} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    eprintln!("native-mlx: a decoding step of {rows} rows: {total} primitives ({each})");
    Ok(())
}

fn finish(seq: &mut Seq, reason: FinishReason, tokenizer: &crate::Tokenizer) -> Result<Completion> {
    if reason != FinishReason::Cancelled {
        let (mut tail, stopped) = seq.stops.push(&seq.decoder.finish(tokenizer)?);
        if !stopped {
            tail.push_str(&seq.stops.finish());
        }
        if !tail.is_empty() {
            seq.text.push_str(&tail);
            let _ = seq.job.events.send(Event::Token {
                token: None,
                text: tail,
            });
        }
    }
    let end = Instant::now();
    let first = seq.first_token_at.unwrap_or(end);
    let completion_tokens = seq.token_ids.len();
    Ok(Completion {
        text: std::mem::take(&mut seq.text),
        token_ids: std::mem::take(&mut seq.token_ids),
        finish_reason: reason,
        usage: Usage {
            prompt_tokens: seq.prompt.len() + seq.skipped,
            cached_prompt_tokens: seq.cached_prompt_tokens,
            completion_tokens,
        },
        timings: Timings {
            time_to_first_token: first - seq.job.received,
            decode: end - first,
            ..Timings::default()
        },
        speculation: seq.proposer.as_ref().map(|p| p.usage).unwrap_or_default(),
    })
}

/// The padded length each decoding row reads, from its own (`padded`,
/// ascending, as the step orders its rows): the rows of one length join
/// the group of the next longer length where the positions they then read
/// beyond their own (rows times the difference) are at most `budget`
/// (see [`BatchOptions::merge_padding`]), else they start a group.
fn merged_padding(padded: &[i32], budget: usize) -> Vec<i32> {
    let mut reads = padded.to_vec();
    let mut end = reads.len();
    let mut group = None;
    while end > 0 {
        let own = reads[end - 1];
        let start = reads[..end].partition_point(|&p| p < own);
        match group {
            Some(longer) if (end - start) * (longer - own) as usize <= budget => {
                reads[start..end].fill(longer)
            }
            _ => group = Some(own),
        }
        end = start;
    }
    reads
}

#[cfg(test)]
mod tests {
    use super::merged_padding;

    #[test]
    fn shorter_rows_join_a_longer_group_within_the_budget() {
        assert_eq!(merged_padding(&[128, 128, 256], 0), [128, 128, 256]);
        // Two rows 128 short of 256 read 256 positions more.
        assert_eq!(merged_padding(&[128, 128, 256], 256), [256; 3]);
        assert_eq!(merged_padding(&[128, 128, 256], 255), [128, 128, 256]);
        // A long row keeps its group; the short ones join among themselves.
        assert_eq!(
            merged_padding(&[128, 256, 256, 4096], 1000),
            [256, 256, 256, 4096]
        );
        // Each length is weighed against the group it would join.
        assert_eq!(merged_padding(&[128, 256, 384], 256), [384; 3]);
        assert_eq!(merged_padding(&[128, 256, 384], 200), [128, 384, 384]);
        assert!(merged_padding(&[], 10).is_empty());
    }
}
