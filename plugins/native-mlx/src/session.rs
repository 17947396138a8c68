//! A loaded model with its prompt cache: requests in, streamed tokens out.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mlx_rs::transforms::{async_eval, eval};
use mlx_rs::{with_stream, Array, Dtype};

use crate::cache::KvCache;
use crate::chat::{ChatMessage, ChatOptions, ChatTemplate, ImageData};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::ffi::SendStream;
use crate::images::{NoVision, PromptInput, Vision};
use crate::indexing::IndexOnStream;
use crate::model::{LoadOptions, Model};
use crate::sampling::{Sampler, SamplingParams};
use crate::speculate::{SpecUsage, Speculation};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::turn::mlx_turn;

/// Prompt tokens processed per forward pass (mlx-lm's `prefill_step_size`):
/// bounds the memory of attention scores for long prompts.
const PREFILL_STEP: usize = 2048;

/// What to generate from.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Plain text, encoded with the tokenizer's special tokens (a BOS, say).
    Text(String),
    /// Token ids, used as given.
    Tokens(Vec<u32>),
    /// A conversation, rendered with the model's chat template.
    Chat {
        /// The messages so far.
        messages: Vec<ChatMessage>,
        /// Generation prompt, tools and extra template variables.
        options: ChatOptions,
    },
}

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// How to pick tokens.
    pub sampling: SamplingParams,
    /// Strings that end the generation; they are not part of the output.
    pub stop: Vec<String>,
    /// Keep going past end-of-sequence tokens (benchmarks, parity tests).
    pub ignore_eos: bool,
    /// A grammar the answer must follow, in llguidance's Lark syntax (JSON
    /// schemas inside as `%json { … }`): each token is drawn from those the
    /// grammar allows next, and the answer ends where the grammar does.
    /// Served by the [`Batcher`](crate::Batcher); a lone `Session` refuses it.
    pub grammar: Option<String>,
    /// Tokens proposed for the target to verify several at a pass (see
    /// `speculate`). Served by the [`Batcher`](crate::Batcher) while the
    /// request decodes alone; a lone `Session` decodes one token per pass.
    pub speculation: Speculation,
}

impl GenerateRequest {
    /// A greedy request for up to `max_tokens` tokens.
    pub fn new(prompt: Prompt, max_tokens: usize) -> Self {
        Self {
            prompt,
            max_tokens,
            sampling: SamplingParams::greedy(),
            stop: Vec::new(),
            ignore_eos: false,
            grammar: None,
            speculation: Speculation::default(),
        }
    }
}

/// What the token callback sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenEvent<'a> {
    /// The generated token; `None` for the last event of a generation, which
    /// releases text held back (an unfinished character, or the start of
    /// what might have become a stop string).
    pub token: Option<u32>,
    /// Text that became final with this event; often empty (a character
    /// still missing bytes), never half a character.
    pub text: &'a str,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` was reached.
    Length,
    /// The callback asked to stop (a client went away).
    Cancelled,
}

/// Token counts of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Of those, how many came from the cache of the previous request.
    pub cached_prompt_tokens: usize,
    /// Tokens generated (an end-of-sequence token is not counted).
    pub completion_tokens: usize,
}

/// Where the time of one request went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Timings {
    /// From the call to the first generated token: tokenizing, prefill and one step.
    pub time_to_first_token: Duration,
    /// From the first generated token to the end.
    pub decode: Duration,
    /// Of the decoding steps: building their graphs (the model's ops).
    pub graph_build: Duration,
    /// Of the decoding steps: submitting them (`async_eval`, which encodes
    /// the graph for the device, and waits when MLX has too much in flight).
    pub submit: Duration,
    /// Of the decoding steps: waiting for MLX to deliver each token.
    pub eval_wait: Duration,
    /// Detokenizing, stop-string matching and the callback.
    pub detokenize: Duration,
}

/// The result of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The generated text (without a stop string).
    pub text: String,
    /// The generated ids (without an end-of-sequence token).
    pub token_ids: Vec<u32>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
    /// Timings.
    pub timings: Timings,
    /// What speculative decoding proposed and kept.
    pub speculation: SpecUsage,
}

/// One token of a continuation, as [`Session::score`] scores it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenScore {
    /// The continuation's token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely token in its place (the first of equals).
    pub top: u32,
    /// That token's log-probability.
    pub top_logprob: f32,
}

/// One token of a sampled continuation, as [`Session::score_draws`] scores it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrawScore {
    /// The continuation's token.
    pub token: u32,
    /// The token the seeded draw takes in its place.
    pub choice: u32,
    /// How far the draw fell outside `token`'s share of the sampled
    /// distribution (after the filters and the temperature), as a fraction
    /// of the whole: 0 when `token` is the choice.
    pub miss: f32,
}

impl TokenScore {
    /// How much less likely `token` is than the greedy choice, in nats
    /// (0 when it is that choice).
    pub fn gap(&self) -> f32 {
        self.top_logprob - self.logprob
    }
}

/// A model, its tokenizer and chat template, and the cache of the last
/// conversation, so that a follow-up request only computes what is new.
///
/// One session serves one request at a time (`&mut self`); it is `Send`, so
/// a host can own it on a worker thread.
pub struct Session {
    /// Every graph of this session is built on this stream (see
    /// [`SendStream`] for why not the thread's default).
    pub(crate) stream: SendStream,
    pub(crate) dir: PathBuf,
    pub(crate) model: Model,
    pub(crate) tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
    /// The vision tower and how prompts place images, or why the model
    /// reads none.
    pub(crate) vision: std::result::Result<Vision, NoVision>,
    cache: Vec<KvCache>,
    /// The tokens whose keys and values `cache` holds, in order.
    cached: Vec<u32>,
}

impl Session {
    /// Loads the model folder `dir` (config, weights, tokenizer, chat
    /// template) with the default [`LoadOptions`].
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_with(dir, &LoadOptions::default())
    }

    /// Loads the model folder `dir` with `options`.
    pub fn load_with(dir: &Path, options: &LoadOptions) -> Result<Self> {
        let config = ModelConfig::load(dir)?;
        let tokenizer = Tokenizer::load(dir, &config.eos_token_ids)?;
        let chat_template = ChatTemplate::load(dir)?;
        let stream = SendStream::new(false)?;
        let (model, vision) = {
            let _turn = mlx_turn();
            with_stream(&stream.0, || -> Result<_> {
                let model = Model::load(dir, config, options)?;
                Ok((model, Vision::load(dir, &tokenizer, options)))
            })?
        };
        let cache = model.new_cache();
        Ok(Self {
            stream,
            dir: dir.to_owned(),
            model,
            tokenizer,
            chat_template,
            vision,
            cache,
            cached: Vec::new(),
        })
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Forgets the cached conversation.
    pub fn clear_cache(&mut self) {
        self.cache = self.model.new_cache();
        self.cached.clear();
    }

    /// The primitives of one decoding step's graph, by name, after a prompt
    /// of `prompt` tokens (`native-mlx-bench --graph-ops`): what the host
    /// builds and submits for every token. Forgets the cached conversation.
    pub fn decode_step_primitives(
        &mut self,
        prompt: &[u32],
    ) -> Result<std::collections::BTreeMap<String, usize>> {
        let stream = self.stream.clone();
        let result = with_stream(&stream.0, || {
            self.clear_cache();
            let (_, last) = self.prefill(prompt)?;
            let first = self.logprobs(&ids(&[last])?)?;
            eval([&first])?;
            let step = self.logprobs(&ids(&[last])?)?;
            let counts = crate::ffi::graph_primitives(&[&step])?;
            eval([&step])?;
            Ok(counts)
        });
        self.clear_cache();
        result
    }

    /// Whether the model reads images (Gemma 3 with its vision tower):
    /// `Err` says why not.
    pub fn reads_images(&self) -> std::result::Result<(), String> {
        self.vision
            .as_ref()
            .map(|_| ())
            .map_err(|no| no.reason.clone())
    }

    /// Why the model reads no images although its folder has a vision
    /// tower (it did not load), for the operator; `None` otherwise.
    pub fn vision_problem(&self) -> Option<String> {
        match &self.vision {
            Err(no) if no.broken => Some(format!("images are refused: {}", no.reason)),
            _ => None,
        }
    }

    /// The input embeddings of `prompt` as the first layer reads them
    /// `(tokens, hidden)`, in float32: image soft tokens in place of their
    /// ids' embeddings, Gemma's scale applied. What the tests compare with
    /// mlx-vlm's merged embeddings.
    #[doc(hidden)]
    pub fn prompt_embeddings(&mut self, prompt: &Prompt) -> Result<Vec<f32>> {
        let input = self.prompt_input(prompt)?;
        let stream = self.stream.clone();
        let _turn = mlx_turn();
        with_stream(&stream.0, || {
            let soft_tokens = self.soft_tokens(&input)?;
            let h = self
                .model
                .embedded_with(&ids(&input.tokens)?, &soft_tokens)?
                .as_dtype(Dtype::Float32)?;
            h.eval()?;
            Ok(h.as_slice::<f32>().to_vec())
        })
    }

    /// Each image's soft tokens, by the index of its first in the prompt.
    fn soft_tokens(&mut self, input: &PromptInput) -> Result<Vec<(i32, Array)>> {
        let mut soft_tokens = Vec::new();
        for (index, image) in input.images.iter().enumerate() {
            let vision = self.vision.as_mut().expect("images expanded by the vision");
            soft_tokens.push((image.start as i32, vision.soft_tokens(image, index, None)?));
        }
        Ok(soft_tokens)
    }

    /// The token ids a prompt stands for (an image's soft tokens included).
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        Ok(self.prompt_input(prompt)?.tokens)
    }

    /// The token ids a prompt stands for, and where its images are.
    pub(crate) fn prompt_input(&self, prompt: &Prompt) -> Result<PromptInput> {
        match prompt {
            Prompt::Text(text) => Ok(PromptInput::text(self.tokenizer.encode(text, true)?)),
            Prompt::Tokens(ids) => Ok(PromptInput::text(ids.clone())),
            Prompt::Chat { messages, options } => {
                let template =
                    self.chat_template
                        .as_ref()
                        .ok_or_else(|| Error::NoChatTemplate {
                            dir: self.dir.clone(),
                        })?;
                let images: Vec<ImageData> = messages
                    .iter()
                    .flat_map(ChatMessage::images)
                    .cloned()
                    .collect();
                let vision = match &self.vision {
                    _ if images.is_empty() => None,
                    Ok(vision) => Some(vision),
                    Err(no) => {
                        return Err(Error::InvalidRequest(format!(
                            "the request has {} image(s), but model {} lacks the vision \
                             capability in native-mlx: {}; send text only",
                            images.len(),
                            self.dir.display(),
                            no.reason
                        )))
                    }
                };
                // As transformers' apply_chat_template: the template writes
                // the special tokens itself.
                let text = template.render(messages, options)?;
                match vision {
                    Some(vision) => vision.expand(&text, images, &self.tokenizer),
                    None => Ok(PromptInput::text(self.tokenizer.encode(&text, false)?)),
                }
            }
        }
    }

    /// Generates for `request`, calling `on_token` as tokens arrive;
    /// `ControlFlow::Break` from it stops the generation (finish reason
    /// [`FinishReason::Cancelled`]).
    ///
    /// The longest common prefix of this prompt and the cached tokens of the
    /// previous request is not computed again.
    pub fn generate(
        &mut self,
        request: &GenerateRequest,
        on_token: impl FnMut(TokenEvent<'_>) -> ControlFlow<()>,
    ) -> Result<Completion> {
        let stream = self.stream.clone();
        let result = with_stream(&stream.0, || self.run(request, on_token));
        if result.is_err() {
            // A failure may leave the cache half-updated.
            self.clear_cache();
        }
        result
    }

    fn run(
        &mut self,
        request: &GenerateRequest,
        mut on_token: impl FnMut(TokenEvent<'_>) -> ControlFlow<()>,
    ) -> Result<Completion> {
        let start = Instant::now();
        if request.max_tokens == 0 {
            return Err(Error::InvalidRequest(
                "max_tokens must be at least 1".into(),
            ));
        }
        if request.grammar.is_some() {
            return Err(Error::InvalidRequest(
                "a grammar is served by the Batcher, not a lone Session".into(),
            ));
        }
        let input = self.prompt_input(&request.prompt)?;
        if !input.images.is_empty() {
            return Err(Error::InvalidRequest(
                "images are served by the Batcher, not a lone Session".into(),
            ));
        }
        let prompt = input.tokens;
        if prompt.is_empty() {
            return Err(Error::InvalidRequest("the prompt has no tokens".into()));
        }
        let turn = mlx_turn();
        let mut sampler = Sampler::new(request.sampling.clone())?;
        let (reuse, last) = self.prefill(&prompt)?;

        // mlx-lm's pipeline: the graph of step n+1 (fed with the still lazy
        // token of step n) is built and queued before waiting for token n,
        // so graph building overlaps evaluation.
        let mut y = self.step(&ids(&[last])?, &mut sampler)?;
        self.cached.push(last);
        async_eval([&y])?;
        drop(turn);

        let mut stops = StopMatcher::new(&request.stop);
        let mut decoder = StreamDecoder::new();
        let mut text = String::new();
        let mut token_ids = Vec::new();
        let mut first_token_at = None;
        let mut timings = Timings::default();
        let finish_reason = loop {
            // Each step takes its own turn, given back before the callback.
            let turn = mlx_turn();
            let building = Instant::now();
            let (next, submitting) = if token_ids.len() + 1 < request.max_tokens {
                let next = self.step(&y.reshape(&[1, 1])?, &mut sampler)?;
                let submitting = Instant::now();
                async_eval([&next])?;
                (Some(next), submitting)
            } else {
                (None, Instant::now())
            };
            let waited = Instant::now();
            let id = y
                .try_item_cast::<u32>()
                .map_err(|e| Error::Mlx(mlx_rs::error::Exception::custom(e.to_string())))?;
            drop(turn);
            let decoded = Instant::now();
            if first_token_at.is_none() {
                first_token_at = Some(decoded);
            } else {
                timings.graph_build += submitting - building;
                timings.submit += waited - submitting;
                timings.eval_wait += decoded - waited;
            }
            if next.is_some() {
                self.cached.push(id);
            }
            if !request.ignore_eos && self.tokenizer.is_eos(id) {
                break FinishReason::Stop;
            }
            token_ids.push(id);
            let piece = decoder.push(&self.tokenizer, id)?;
            let (piece, stopped) = stops.push(&piece);
            text.push_str(&piece);
            let flow = on_token(TokenEvent {
                token: Some(id),
                text: &piece,
            });
            timings.detokenize += decoded.elapsed();
            if stopped {
                break FinishReason::Stop;
            }
            if flow.is_break() {
                break FinishReason::Cancelled;
            }
            match next {
                Some(next) => y = next,
                None => break FinishReason::Length,
            }
        };
        if finish_reason != FinishReason::Cancelled {
            let (mut tail, stopped) = stops.push(&decoder.finish(&self.tokenizer)?);
            if !stopped {
                tail.push_str(&stops.finish());
            }
            if !tail.is_empty() {
                text.push_str(&tail);
                // The generation is over; a Break here has nothing left to stop.
                let _ = on_token(TokenEvent {
                    token: None,
                    text: &tail,
                });
            }
        }
        let end = Instant::now();
        let first = first_token_at.unwrap_or(end);
        timings.time_to_first_token = first - start;
        timings.decode = end - first;
        Ok(Completion {
            text,
            usage: Usage {
                prompt_tokens: prompt.len(),
                cached_prompt_tokens: reuse,
                completion_tokens: token_ids.len(),
            },
            token_ids,
            finish_reason,
            timings,
            speculation: SpecUsage::default(),
        })
    }

    /// Scores `continuation` after `prompt` (non-empty): for each of its
    /// tokens, its log-probability under the model and the model's greedy
    /// choice in its place. Computed as [`Session::generate`] decodes (the
    /// same prefill, then one token per step), so a greedy completion's
    /// tokens are each `top`, with a `gap` of 0; tokens that another path
    /// chose (batched, on other kernels) show by how much they missed.
    pub fn score(&mut self, prompt: &[u32], continuation: &[u32]) -> Result<Vec<TokenScore>> {
        self.each_step(prompt, continuation, token_score)
    }

    /// [`Session::score`] after a prompt that may hold images (a chat
    /// prompt's images as their soft tokens, as the [`crate::Batcher`]
    /// places them): all but its last token in one pass from their
    /// embeddings, then one token per step. Forgets the cached
    /// conversation.
    pub fn score_prompt(
        &mut self,
        prompt: &Prompt,
        continuation: &[u32],
    ) -> Result<Vec<TokenScore>> {
        let input = self.prompt_input(prompt)?;
        if input.images.is_empty() {
            return self.score(&input.tokens, continuation);
        }
        let n = input.tokens.len();
        if input
            .images
            .iter()
            .any(|image| image.start + image.len >= n)
        {
            return Err(Error::InvalidRequest(
                "scoring needs a prompt that ends after its last image".into(),
            ));
        }
        self.clear_cache();
        let stream = self.stream.clone();
        let _turn = mlx_turn();
        let result = with_stream(&stream.0, || {
            let soft_tokens = self.soft_tokens(&input)?;
            let body = self
                .model
                .embedded_with(&ids(&input.tokens[..n - 1])?, &soft_tokens)?;
            self.model.hidden_of(body, &mut self.cache)?;
            eval(self.cache.iter().flat_map(KvCache::state))?;
            for layer in &mut self.cache {
                layer.set_prefilled(n as i32 - 1);
            }
            self.steps_from(input.tokens[n - 1], continuation, token_score)
        });
        // The cache holds images' positions, which `cached` cannot name.
        self.clear_cache();
        result
    }

    /// Scores `continuation` after `prompt` as sampled with `sampling` (a
    /// temperature above 0 and a seed): for each token, the token that
    /// generating with `sampling` draws in its place, and how far that
    /// step's draw fell outside the token's share of the distribution.
    /// Computed as [`Session::generate`] samples, so the completion it
    /// generated scores a miss of 0 at every token; a token that another
    /// path drew (batched, on other kernels) shows by how much it missed.
    pub fn score_draws(
        &mut self,
        prompt: &[u32],
        continuation: &[u32],
        sampling: &SamplingParams,
    ) -> Result<Vec<DrawScore>> {
        if sampling.temperature == 0.0 || sampling.seed.is_none() {
            return Err(Error::InvalidRequest(
                "scoring draws needs a temperature above 0 and a seed".into(),
            ));
        }
        let mut sampler = Sampler::new(sampling.clone())?;
        self.each_step(prompt, continuation, |logprobs, token| {
            let draw = sampler.draw(&logprobs)?.expect("a seeded sampler draws");
            Ok(DrawScore {
                token,
                choice: draw.choice(),
                miss: draw.miss(token).ok_or_else(|| outside(token))?,
            })
        })
    }

    /// Prefills `prompt` (non-empty) as [`Session::generate`] does, then
    /// feeds `continuation` one token per step, giving `score` each step's
    /// lazy log-probabilities `(1, vocab)` and the token that followed.
    fn each_step<T>(
        &mut self,
        prompt: &[u32],
        continuation: &[u32],
        score: impl FnMut(Array, u32) -> Result<T>,
    ) -> Result<Vec<T>> {
        if prompt.is_empty() {
            return Err(Error::InvalidRequest("the prompt has no tokens".into()));
        }
        let stream = self.stream.clone();
        let _turn = mlx_turn();
        let result = with_stream(&stream.0, || {
            let (_, last) = self.prefill(prompt)?;
            self.steps_from(last, continuation, score)
        });
        if result.is_err() {
            self.clear_cache();
        }
        result
    }

    /// Feeds `last`, the prompt's last token, then `continuation` one token
    /// per step, giving `score` each step's log-probabilities and the token
    /// that followed.
    fn steps_from<T>(
        &mut self,
        last: u32,
        continuation: &[u32],
        mut score: impl FnMut(Array, u32) -> Result<T>,
    ) -> Result<Vec<T>> {
        let inputs = std::iter::once(last).chain(continuation.iter().copied());
        let mut scores = Vec::with_capacity(continuation.len());
        for (input, &token) in inputs.zip(continuation) {
            let logprobs = self.logprobs(&ids(&[input])?)?;
            scores.push(score(logprobs, token)?);
            self.cached.push(input);
        }
        Ok(scores)
    }

    /// Fills the cache with `prompt` (non-empty) but its last token,
    /// keeping the longest common prefix with the cached tokens; returns
    /// how many were kept and that last token, whose logits give the first
    /// generated one.
    fn prefill(&mut self, prompt: &[u32]) -> Result<(usize, u32)> {
        let reuse = common_prefix(&self.cached, prompt).min(prompt.len() - 1);
        self.truncate_cache(reuse);
        let (body, last) = prompt[reuse..].split_at(prompt.len() - reuse - 1);
        for chunk in body.chunks(PREFILL_STEP) {
            self.model.hidden(&ids(chunk)?, &mut self.cache)?;
            // Only the caches are wanted: the lazy graph skips the unused
            // final norm and output projection.
            eval(self.cache.iter().flat_map(KvCache::state))?;
            self.cached.extend_from_slice(chunk);
        }
        for layer in &mut self.cache {
            layer.set_prefilled(prompt.len() as i32 - 1);
        }
        Ok((reuse, last[0]))
    }

    /// One decoding step: feeds `ids` (`(1, n)`), returns the sampled next
    /// token as a lazy `(1,)` array.
    fn step(&mut self, ids: &Array, sampler: &mut Sampler) -> Result<Array> {
        sampler.sample(&self.logprobs(ids)?)
    }

    /// Feeds `ids` (`(1, n)`); the log-probabilities `(1, vocab)` of the
    /// token after them. Lazy.
    fn logprobs(&mut self, ids: &Array) -> Result<Array> {
        let logits = self.model.logits(ids, &mut self.cache)?;
        let logits = logits.at((.., -1, ..))?;
        // Log-probabilities as mlx-lm computes them (a log-sum-exp over the
        // whole (1, vocab) array), so that sampling sees identical numbers.
        Ok(logits.subtract(logits.logsumexp(true)?)?)
    }

    fn truncate_cache(&mut self, len: usize) {
        self.cached.truncate(len);
        for layer in &mut self.cache {
            layer.truncate(len as i32);
        }
    }
}

/// `token`'s [`TokenScore`] under lazy log-probabilities `(1, vocab)`.
fn token_score(logprobs: Array, token: u32) -> Result<TokenScore> {
    let logprobs = logprobs.as_dtype(Dtype::Float32)?;
    logprobs.eval()?;
    let logprobs = logprobs.as_slice::<f32>();
    let logprob = *logprobs.get(token as usize).ok_or_else(|| outside(token))?;
    // The first of equal maxima, as `argmax`.
    let (top, top_logprob) =
        logprobs
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (i, &p)| {
                if p > best.1 {
                    (i as u32, p)
                } else {
                    best
                }
            });
    Ok(TokenScore {
        token,
        logprob,
        top,
        top_logprob,
    })
}

/// A `(1, n)` array of token ids.
pub(crate) fn ids(tokens: &[u32]) -> Result<Array> {
    Ok(Array::from_slice(tokens, &[1, tokens.len() as i32]))
}

/// The error for a scored token that the vocabulary does not hold.
fn outside(token: u32) -> Error {
    Error::InvalidRequest(format!("token {token} is outside the vocabulary"))
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Holds back generated text that could still turn into a stop string.
pub(crate) struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    pub(crate) fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Adds `piece`; returns the text that is now safe to emit, and whether a
    /// stop string was completed (the text then ends right before it).
    pub(crate) fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s)).min() {
            let out = self.held[..at].to_owned();
            self.held.clear();
            return (out, true);
        }
        // The longest tail of `held` that begins some stop string stays.
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let out = self.held[..keep_from].to_owned();
        self.held.replace_range(..keep_from, "");
        (out, false)
    }

    /// Releases what is held: the generation ended without a stop string.
    pub(crate) fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = Vec::new();
        for piece in pieces {
            let (text, stopped) = m.push(piece);
            out.push(text);
            if stopped {
                return (out, true);
            }
        }
        out.push(m.finish());
        (out, false)
    }

    #[test]
    fn stop_string_across_pieces_is_cut() {
        assert_eq!(
            run(&["</s>"], &["Hello <", "/", "s> more"]),
            (vec!["Hello ".into(), "".into(), "".into()], true)
        );
    }

    #[test]
    fn held_text_is_released_when_it_cannot_match() {
        assert_eq!(
            run(&["STOP"], &["a S", "T", "x", "y"]),
            (
                vec!["a ".into(), "".into(), "STx".into(), "y".into(), "".into()],
                false
            )
        );
    }

    #[test]
    fn earliest_stop_wins_and_multibyte_is_safe() {
        assert_eq!(
            run(&["é!", "b"], &["aé", "!b"]),
            (vec!["a".into(), "".into()], true)
        );
    }

    #[test]
    fn common_prefix_counts_equal_leading_ids() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
    }
}
