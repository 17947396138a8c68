//! The engine's chat answer, as the routes that translate it read it
//! (`/v1/messages`, `/v1/responses`): the OpenAI chunks the proxy gives
//! become [`Piece`]s (text, reasoning, tool calls and their arguments) in
//! the order they came, with why the answer stopped and its usage; a whole
//! answer is [`gather`]ed, a streamed one is written by the route's
//! [`Events`] as each engine event arrives.
//!
//! Stop sequences are matched here, not by the engine (see
//! `messages.rs` for why): text that could begin one is held back.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::header;
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use super::sse::{self, SseFramer};
use super::{ApiError, App};

/// Why generation stopped (named in Anthropic's words by `as_str`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StopReason {
    EndTurn,
    MaxTokens,
    StopSequence,
    ToolUse,
}

impl StopReason {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::MaxTokens => "max_tokens",
            StopReason::StopSequence => "stop_sequence",
            StopReason::ToolUse => "tool_use",
        }
    }
}

/// One answer's translation from OpenAI chunks: the text to pass on (held
/// back while it could be the start of a stop sequence), the reasoning
/// and tool calls, why it stopped, and its usage.
#[derive(Debug, Default)]
pub(super) struct Translator {
    stops: Vec<String>,
    /// Text received but not yet passed on.
    held: String,
    stop_reason: Option<StopReason>,
    pub(super) stop_sequence: Option<String>,
    pub(super) input_tokens: Option<u64>,
    pub(super) output_tokens: Option<u64>,
    /// Text events received, the token count when the engine sends none.
    events: u64,
    /// Tool calls begun.
    calls: usize,
    /// Whether the answer is complete (`[DONE]`, or a stop sequence).
    pub(super) done: bool,
}

/// A piece of the answer, in the order it came.
#[derive(Debug, PartialEq)]
pub(super) enum Piece {
    Text(String),
    Thinking(String),
    /// A tool call begins.
    ToolUse {
        id: String,
        name: String,
    },
    /// The next fragment of the open tool call's input (JSON text).
    Input(String),
}

/// What one OpenAI event meant.
pub(super) enum Step {
    /// Pieces to pass on (possibly none).
    Pieces(Vec<Piece>),
    /// The engine's error, to end the answer with.
    Error(ApiError),
}

impl Translator {
    pub(super) fn new(stops: Vec<String>) -> Translator {
        Translator {
            stops,
            ..Translator::default()
        }
    }

    /// Takes one server-sent event of the engine's stream.
    pub(super) fn event(&mut self, event: &[u8]) -> Step {
        if sse::is_done(event) {
            self.done = true;
            return Step::Pieces(self.flush());
        }
        let data: Vec<&[u8]> = event
            .split(|&b| b == b'\n')
            .filter_map(|line| line.trim_ascii().strip_prefix(b"data:"))
            .collect();
        let data = data.concat();
        if data.trim_ascii().is_empty() {
            return Step::Pieces(vec![]); // a comment or keep-alive
        }
        match serde_json::from_slice::<Value>(&data) {
            Ok(chunk) => self.chunk(&chunk),
            Err(e) => Step::Error(ApiError::engine(format!(
                "the engine sent an event that is not JSON ({e}): {}",
                String::from_utf8_lossy(&data)
                    .chars()
                    .take(200)
                    .collect::<String>()
            ))),
        }
    }

    /// The held text, passed on (the answer ended, or a tool call began).
    pub(super) fn flush(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        match held.is_empty() {
            true => vec![],
            false => vec![Piece::Text(held)],
        }
    }

    /// Takes one OpenAI chunk (or a whole `chat.completion`, or a
    /// completion's, whose text is the choice's `text`).
    pub(super) fn chunk(&mut self, chunk: &Value) -> Step {
        if let Some(error) = chunk.get("error") {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| error.to_string(), str::to_string);
            return Step::Error(ApiError::engine(message));
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.input_tokens = usage.get("prompt_tokens").and_then(Value::as_u64);
            self.output_tokens = usage.get("completion_tokens").and_then(Value::as_u64);
        }
        let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) else {
            return Step::Pieces(vec![]);
        };
        let mut pieces = Vec::new();
        // A stream's delta, a whole answer's message, or a completion's
        // choice.
        let delta = ["delta", "message"]
            .iter()
            .find_map(|k| choice.get(*k))
            .unwrap_or(choice);
        if let Some(thinking) = delta.get("reasoning_content").and_then(Value::as_str) {
            if !thinking.is_empty() {
                pieces.push(Piece::Thinking(thinking.to_string()));
            }
        }
        let text = delta.get("content").or_else(|| delta.get("text"));
        match text.and_then(Value::as_str) {
            Some(text) if !text.is_empty() && !self.done => {
                self.events += 1;
                let passed = self.pass(text);
                if !passed.is_empty() {
                    pieces.push(Piece::Text(passed));
                }
            }
            _ => {}
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let function = call.get("function");
            let name = function.and_then(|f| f.get("name")).and_then(Value::as_str);
            if let Some(name) = name {
                pieces.extend(self.flush());
                let id = match call.get("id").and_then(Value::as_str) {
                    Some(id) => id.to_string(),
                    None => format!("toolu_{}", super::inprocess::unique()),
                };
                self.calls += 1;
                pieces.push(Piece::ToolUse {
                    id,
                    name: name.to_string(),
                });
            }
            match function.and_then(|f| f.get("arguments")) {
                Some(Value::String(args)) if !args.is_empty() => {
                    pieces.push(Piece::Input(args.clone()))
                }
                // Some engines send a whole call's arguments as an object.
                Some(args @ Value::Object(_)) => pieces.push(Piece::Input(args.to_string())),
                _ => {}
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            if self.stop_reason != Some(StopReason::StopSequence) {
                self.stop_reason = Some(match reason {
                    "length" => StopReason::MaxTokens,
                    _ if self.calls > 0 => StopReason::ToolUse,
                    _ => StopReason::EndTurn,
                });
            }
        }
        Step::Pieces(pieces)
    }
    /// Adds `text` and returns what can be passed on: all of it but a tail
    /// that could begin a stop sequence, or what comes before a stop
    /// sequence (which ends the answer).
    fn pass(&mut self, text: &str) -> String {
        self.held.push_str(text);
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, stop)) = hit {
            self.stop_sequence = Some(stop.clone());
            self.stop_reason = Some(StopReason::StopSequence);
            self.done = true;
            let mut out = std::mem::take(&mut self.held);
            out.truncate(at);
            return out;
        }
        // The longest tail of `held` that is a proper prefix of a stop
        // sequence stays; every earlier match would have been found above.
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let rest = self.held.split_off(keep);
        std::mem::replace(&mut self.held, rest)
    }

    /// Why the answer ended (the end of the turn until told otherwise).
    pub(super) fn reason(&self) -> StopReason {
        self.stop_reason.unwrap_or(StopReason::EndTurn)
    }

    pub(super) fn stop_reason(&self) -> &'static str {
        self.reason().as_str()
    }

    /// The tokens of the prompt and of the answer.
    pub(super) fn tokens(&self) -> (u64, u64) {
        let output = match self.stop_reason {
            // Cut by the host: the engine's count of the whole generation
            // never came.
            Some(StopReason::StopSequence) => self.events,
            _ => self.output_tokens.unwrap_or(self.events),
        };
        (self.input_tokens.unwrap_or(0), output)
    }

    /// `{"input_tokens", "output_tokens"}`.
    pub(super) fn usage(&self) -> Value {
        let (input, output) = self.tokens();
        json!({ "input_tokens": input, "output_tokens": output })
    }
}

/// What a route writes for the engine's events of one streamed answer.
pub(super) trait Events: Send + 'static {
    /// The events one engine event makes; `true` once the answer is over.
    fn event(&mut self, event: &[u8], out: &mut String) -> bool;
    /// The closing events of a stream that ended without `[DONE]`.
    fn end(&mut self, out: &mut String);
    /// The event that ends a failed stream.
    fn error(&mut self, e: &ApiError, out: &mut String);
}

/// One streamed answer, from the proxy's OpenAI events to the client.
struct Stream<E> {
    body: std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, axum::Error>> + Send>>,
    framer: SseFramer,
    ends: Vec<usize>,
    events: E,
    finished: bool,
}

impl<E: Events> Stream<E> {
    /// The next events for the client; `None` once the message is over
    /// (dropping the engine's stream, which stops it after a stop sequence).
    async fn next(&mut self) -> Option<Bytes> {
        let mut out = String::new();
        while !self.finished && out.is_empty() {
            match self.body.next().await {
                Some(Ok(chunk)) => {
                    let run = self.framer.push(chunk, &mut self.ends);
                    let mut start = 0;
                    for &end in &self.ends {
                        if self.events.event(&run[start..end], &mut out) {
                            self.finished = true;
                            break;
                        }
                        start = end;
                    }
                }
                Some(Err(e)) => {
                    self.events.error(
                        &ApiError::engine(format!("the stream broke: {e}")),
                        &mut out,
                    );
                    self.finished = true;
                }
                // The proxy ends a failed stream with an error event; one
                // that ends without `[DONE]` still gets its closing events.
                None => {
                    self.events.end(&mut out);
                    self.finished = true;
                }
            }
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }
}

/// What a translation keeps for its answer says how the client's request
/// named its images, so that a refused image is named as sent.
pub(super) trait NamesImages {
    fn image_names(&self) -> super::images::ImageNames;
}

/// Sends a route's `translated` chat request through
/// [`super::openai::proxy`] (which counts it under `route`) and makes the
/// route's answer of the engine's with `answer`, given what the
/// translation kept; a refusal, the translation's or the proxy's, is
/// written by `refusal` in the route's error shape.
pub(super) async fn through_proxy<A: NamesImages, F>(
    app: Arc<App>,
    route: &'static str,
    translated: Result<(Map<String, Value>, A), ApiError>,
    answer: impl FnOnce(Response, A) -> F,
    refusal: fn(&ApiError) -> Response,
) -> Response
where
    F: Future<Output = Response>,
{
    let (request, ask) = match translated {
        Ok((request, ask)) => (Ok(request), Some(ask)),
        Err(e) => (Err(e), None),
    };
    let names = ask.as_ref().map(A::image_names).unwrap_or_default();
    let proxied = super::openai::proxy(app, route, "/v1/chat/completions", request, names).await;
    match (proxied, ask) {
        (Ok(response), Some(ask)) => {
            // The model the answer comes from, for a client that stalls.
            let of = response
                .extensions()
                .get::<super::stall::AnswerOf>()
                .cloned();
            let mut translated = answer(response, ask).await;
            if let Some(of) = of {
                translated.extensions_mut().insert(of);
            }
            translated
        }
        (Err(e), _) => refusal(&e),
        (Ok(response), None) => response, // unreachable: no request, no answer
    }
}

/// Whether the proxy's answer is a stream of server-sent events.
fn is_sse(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Reads the proxy's whole answer (an error passed on, a whole
/// `chat.completion`, or a stream read to its end), handing each run of
/// pieces to `take`; the engine's error, with its status, as an `Err`.
pub(super) async fn gather(
    response: Response,
    translator: &mut Translator,
    mut take: impl FnMut(Vec<Piece>),
) -> Result<(), ApiError> {
    let status = response.status();
    if !status.is_success() || !is_sse(&response) {
        // An engine error passed on, or an engine that answered whole.
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .map_err(|e| ApiError::engine(format!("the answer broke: {e}")))?;
        let value = serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null);
        if !status.is_success() {
            let message = value
                .pointer("/error/message")
                .and_then(Value::as_str)
                .map_or_else(
                    || String::from_utf8_lossy(&bytes).into_owned(),
                    str::to_string,
                );
            let mut e = ApiError::engine(message);
            e.status = status;
            return Err(e);
        }
        match translator.chunk(&value) {
            Step::Pieces(pieces) => take(pieces),
            Step::Error(e) => return Err(e),
        }
        take(translator.flush());
        return Ok(());
    }
    let mut body = response.into_body().into_data_stream();
    let mut framer = SseFramer::default();
    let mut ends = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| ApiError::engine(format!("the stream broke: {e}")))?;
        let run = framer.push(chunk, &mut ends);
        let mut start = 0;
        for &end in &ends {
            match translator.event(&run[start..end]) {
                Step::Pieces(pieces) => take(pieces),
                Step::Error(e) => return Err(e),
            }
            start = end;
            if translator.done {
                return Ok(());
            }
        }
    }
    take(translator.flush());
    Ok(())
}

/// Whether the proxy's answer can be streamed as it comes: a successful
/// stream (anything else is [`gather`]ed).
pub(super) fn streams(response: &Response) -> bool {
    response.status().is_success() && is_sse(response)
}

/// The client's stream of `events` over the proxy's streamed `response`.
pub(super) fn stream(response: Response, events: impl Events) -> Response {
    let state = Stream {
        body: Box::pin(response.into_body().into_data_stream()),
        framer: SseFramer::default(),
        ends: Vec::new(),
        events,
        finished: false,
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        let next = s.next().await?;
        Some((Ok::<_, Infallible>(next), s))
    });
    sse::response(stream)
}
