//! `POST /v1/messages`: Anthropic's Messages API, translated by the host to
//! the OpenAI chat request every engine already serves.
//!
//! A request is validated here field by field (Anthropic's rules: a
//! required `max_tokens`, `temperature` in 0..=1, text blocks only), turned
//! into an OpenAI chat request, and sent through [`super::openai::proxy`],
//! the one path every engine request takes (validation, gating, scheduler
//! admission, health waits, metrics). The engine is always asked for a
//! stream with usage; its chunks become Anthropic's events
//! (`message_start`, `content_block_start`, `content_block_delta`,
//! `content_block_stop`, `message_delta`, `message_stop`) or, for a request
//! without `stream`, are gathered into one message.
//!
//! `stop_sequences` are matched by the host, not the engine: OpenAI engines
//! strip a matched stop string and report only `stop`, which cannot tell a
//! stop sequence from the end of the turn. The host holds back text that
//! could begin a stop sequence, and on a match ends the message with
//! `stop_reason: "stop_sequence"` and hangs up on the engine, which stops
//! generating. The engine's usage never arrives then: `output_tokens`
//! counts the engine's text events up to the match (one per token for the
//! engines here), as the metrics do for streams without usage, and
//! `input_tokens` is the engine's count when it sent one, else 0.
//!
//! Every error is in Anthropic's shape,
//! `{"type": "error", "error": {"type", "message"}}`, with the status the
//! OpenAI routes would give.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use super::sse::{self, SseFramer};
use super::{validate, ApiError, App};

/// The route, as the metrics label it.
const ROUTE: &str = "/v1/messages";

/// The fields of a request this host serves; any other is refused by name.
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "metadata",
];

/// `POST /v1/messages`.
#[utoipa::path(post, path = "/v1/messages", tag = "anthropic",
    request_body(content = super::schema::MessagesRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The message, whole or streamed", content((super::schema::Message = "application/json"), (super::schema::SseEvent = "text/event-stream"))),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::AnthropicError),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::AnthropicError)
    ))]
pub(super) async fn messages(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let ask = body.map_err(ApiError::from).and_then(|b| translate(&b));
    let (request, ask) = match ask {
        Ok((request, ask)) => (Ok(request), Some(ask)),
        Err(e) => (Err(e), None),
    };
    let answer = super::openai::proxy(app, ROUTE, "/v1/chat/completions", request).await;
    match (answer, ask) {
        (Ok(response), Some(ask)) => answer_with(response, ask).await,
        (Err(e), _) => error_response(&e),
        (Ok(response), None) => response, // unreachable: no request, no answer
    }
}

/// What the translation keeps for the answer.
#[derive(Debug)]
pub(super) struct Ask {
    /// The client's model id.
    model: String,
    stream: bool,
    stops: Vec<String>,
}

/// Validates an Anthropic request and translates it to an OpenAI chat
/// request (always streamed, with usage).
pub(super) fn translate(body: &[u8]) -> Result<(Map<String, Value>, Ask), ApiError> {
    let request: Map<String, Value> = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("the request body is not a JSON object: {e}"), None)
    })?;
    if let Some(name) = request.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad_request(
            format!(
                "'{name}' is not supported by this host (it serves text: {})",
                FIELDS.join(", ")
            ),
            None,
        ));
    }
    let model = match request.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => {
            return Err(ApiError::bad_request(
                "'model' is required: a string naming one of the models GET /v1/models lists",
                Some("model"),
            ))
        }
    };
    let max_tokens =
        validate::count(request.get("max_tokens"), "max_tokens")?.ok_or_else(|| {
            ApiError::bad_request(
                "'max_tokens' is required: the most tokens to generate, a whole number from 1",
                Some("max_tokens"),
            )
        })?;
    let stream = match request.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(ApiError::bad_request(
                format!("'stream' must be true or false, not {other}"),
                Some("stream"),
            ))
        }
    };
    let stops = stop_sequences(request.get("stop_sequences"))?;
    let mut chat = Vec::new();
    if let Some(system) = request.get("system").filter(|v| !v.is_null()) {
        chat.push(json!({ "role": "system", "content": text_of(system, "system")? }));
    }
    let turns = match request.get("messages") {
        Some(Value::Array(turns)) if !turns.is_empty() => turns,
        Some(Value::Array(_)) | None | Some(Value::Null) => {
            return Err(ApiError::bad_request(
                "'messages' is required: a non-empty list of {\"role\", \"content\"} turns",
                Some("messages"),
            ))
        }
        Some(other) => {
            return Err(ApiError::bad_request(
                format!("'messages' must be a list of turns, not {other}"),
                Some("messages"),
            ))
        }
    };
    for (i, turn) in turns.iter().enumerate() {
        let bad = |what: String| ApiError::bad_request(what, Some("messages"));
        let Value::Object(turn) = turn else {
            return Err(bad(format!(
                "'messages[{i}]' must be an object with 'role' and 'content', not {turn}"
            )));
        };
        let role = match turn.get("role") {
            Some(Value::String(r)) if r == "user" || r == "assistant" => r,
            None => return Err(bad(format!("'messages[{i}].role' is missing"))),
            Some(other) => {
                return Err(bad(format!(
                    "'messages[{i}].role' must be \"user\" or \"assistant\" (the system prompt is the top-level 'system'), not {other}"
                )))
            }
        };
        let content = match turn.get("content") {
            Some(content) => text_of(content, &format!("messages[{i}].content"))?,
            None => return Err(bad(format!("'messages[{i}].content' is missing"))),
        };
        chat.push(json!({ "role": role, "content": content }));
    }
    if let Some(metadata) = request.get("metadata").filter(|v| !v.is_null()) {
        match metadata.get("user_id") {
            _ if !metadata.is_object() => {
                return Err(ApiError::bad_request(
                    format!(
                    "'metadata' must be an object such as {{\"user_id\": \"...\"}}, not {metadata}"
                ),
                    Some("metadata"),
                ))
            }
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(other) => {
                return Err(ApiError::bad_request(
                    format!("'metadata.user_id' must be a string, not {other}"),
                    Some("metadata"),
                ))
            }
        }
    }
    let mut openai = Map::new();
    openai.insert("model".into(), json!(model));
    openai.insert("messages".into(), Value::Array(chat));
    openai.insert("max_tokens".into(), json!(max_tokens));
    // Anthropic's temperature runs from 0 to 1 (OpenAI's to 2): same scale,
    // narrower range, so a value passes unchanged.
    if let Some(t) = validate::within(request.get("temperature"), "temperature", 0.0, 1.0)? {
        openai.insert("temperature".into(), json!(t));
    }
    if let Some(p) = validate::number(request.get("top_p"), "top_p")? {
        openai.insert("top_p".into(), json!(p));
    }
    if let Some(k) = validate::count(request.get("top_k"), "top_k")? {
        openai.insert("top_k".into(), json!(k));
    }
    openai.insert("stream".into(), json!(true));
    openai.insert("stream_options".into(), json!({ "include_usage": true }));
    Ok((
        openai,
        Ask {
            model,
            stream,
            stops,
        },
    ))
}

/// `stop_sequences`: a list of non-empty strings.
fn stop_sequences(value: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let bad = |what: String| Err(ApiError::bad_request(what, Some("stop_sequences")));
    match value {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::Array(items)) => {
            let mut stops = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) if !s.is_empty() => stops.push(s.clone()),
                    _ => {
                        return bad(format!(
                            "'stop_sequences[{i}]' must be a non-empty string, not {item}"
                        ))
                    }
                }
            }
            Ok(stops)
        }
        Some(other) => bad(format!(
            "'stop_sequences' must be a list of strings, not {other}"
        )),
    }
}

/// The text of a string or of a list of text blocks (`system`, a turn's
/// `content`), blocks joined by newlines.
fn text_of(value: &Value, name: &str) -> Result<String, ApiError> {
    let param = if name == "system" {
        "system"
    } else {
        "messages"
    };
    let bad = |what: String| Err(ApiError::bad_request(what, Some(param)));
    let blocks = match value {
        Value::String(s) => return Ok(s.clone()),
        Value::Array(blocks) if !blocks.is_empty() => blocks,
        Value::Array(_) => return bad(format!("'{name}' must not be an empty list of blocks")),
        other => {
            return bad(format!(
                "'{name}' must be a string or a list of text blocks, not {other}"
            ))
        }
    };
    let mut texts = Vec::with_capacity(blocks.len());
    for (j, block) in blocks.iter().enumerate() {
        match (block.get("type"), block.get("text")) {
            (Some(Value::String(t)), Some(Value::String(text))) if t == "text" => {
                texts.push(text.as_str())
            }
            (Some(Value::String(t)), _) if t == "text" => {
                return bad(format!(
                    "'{name}[{j}].text' must be a string, not {}",
                    block.get("text").unwrap_or(&Value::Null)
                ))
            }
            (Some(Value::String(t)), _) => {
                return bad(format!(
                    "'{name}[{j}]' is a '{t}' block; this host serves text blocks only ({{\"type\": \"text\", \"text\": \"...\"}})"
                ))
            }
            _ => {
                return bad(format!(
                    "'{name}[{j}]' must be a block object such as {{\"type\": \"text\", \"text\": \"...\"}}, not {block}"
                ))
            }
        }
    }
    Ok(texts.join("\n"))
}

/// Why generation stopped, in Anthropic's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    EndTurn,
    MaxTokens,
    StopSequence,
}

impl StopReason {
    fn as_str(self) -> &'static str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::MaxTokens => "max_tokens",
            StopReason::StopSequence => "stop_sequence",
        }
    }
}

/// One answer's translation from OpenAI chunks: the text to pass on (held
/// back while it could be the start of a stop sequence), why it stopped,
/// and its usage.
#[derive(Debug, Default)]
pub(super) struct Translator {
    stops: Vec<String>,
    /// Text received but not yet passed on.
    held: String,
    stop_reason: Option<StopReason>,
    stop_sequence: Option<String>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    /// Text events received, the token count when the engine sends none.
    events: u64,
    /// Whether the answer is complete (`[DONE]`, or a stop sequence).
    done: bool,
}

/// What one OpenAI event meant.
enum Step {
    /// Text to pass on (possibly empty).
    Text(String),
    /// The engine's error, to end the answer with.
    Error(ApiError),
}

impl Translator {
    fn new(stops: Vec<String>) -> Translator {
        Translator {
            stops,
            ..Translator::default()
        }
    }

    /// Takes one server-sent event of the engine's stream.
    fn event(&mut self, event: &[u8]) -> Step {
        if sse::is_done(event) {
            self.done = true;
            return Step::Text(std::mem::take(&mut self.held));
        }
        let data: Vec<&[u8]> = event
            .split(|&b| b == b'\n')
            .filter_map(|line| line.trim_ascii().strip_prefix(b"data:"))
            .collect();
        let data = data.concat();
        if data.trim_ascii().is_empty() {
            return Step::Text(String::new()); // a comment or keep-alive
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

    /// Takes one OpenAI chunk (or a whole `chat.completion`).
    fn chunk(&mut self, chunk: &Value) -> Step {
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
            return Step::Text(String::new());
        };
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.stop_reason = Some(match reason {
                "length" => StopReason::MaxTokens,
                _ => StopReason::EndTurn,
            });
        }
        // A stream's delta, or a whole answer's message.
        let text = ["delta", "message"]
            .iter()
            .find_map(|k| choice.get(*k)?.get("content")?.as_str());
        match text {
            Some(text) if !text.is_empty() => {
                self.events += 1;
                Step::Text(self.pass(text))
            }
            _ => Step::Text(String::new()),
        }
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

    fn stop_reason(&self) -> &'static str {
        self.stop_reason.unwrap_or(StopReason::EndTurn).as_str()
    }

    fn usage(&self) -> Value {
        json!({
            "input_tokens": self.input_tokens.unwrap_or(0),
            "output_tokens": match self.stop_reason {
                // Cut by the host: the engine's count of the whole
                // generation never came.
                Some(StopReason::StopSequence) => self.events,
                _ => self.output_tokens.unwrap_or(self.events),
            },
        })
    }
}

/// The answer to the client from the engine's `response` (which the proxy
/// gave in OpenAI's shapes).
async fn answer_with(response: Response, ask: Ask) -> Response {
    let status = response.status();
    let is_sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut translator = Translator::new(ask.stops.clone());
    let id = format!("msg_{}", super::inprocess::unique());
    if !status.is_success() || !is_sse {
        // An engine error passed on, or an engine that answered whole.
        let bytes = match axum::body::to_bytes(response.into_body(), usize::MAX).await {
            Ok(b) => b,
            Err(e) => return error_response(&ApiError::engine(format!("the answer broke: {e}"))),
        };
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
            return error_response(&e);
        }
        let mut text = match translator.chunk(&value) {
            Step::Text(text) => text,
            Step::Error(e) => return error_response(&e),
        };
        text.push_str(&std::mem::take(&mut translator.held));
        return whole(&id, &ask, &translator, text);
    }
    let body = response.into_body().into_data_stream();
    if !ask.stream {
        let mut text = String::new();
        let mut body = body;
        let mut framer = SseFramer::default();
        let mut ends = Vec::new();
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    return error_response(&ApiError::engine(format!("the stream broke: {e}")))
                }
            };
            let run = framer.push(chunk, &mut ends);
            let mut start = 0;
            for &end in &ends {
                match translator.event(&run[start..end]) {
                    Step::Text(t) => text.push_str(&t),
                    Step::Error(e) => return error_response(&e),
                }
                start = end;
                if translator.done {
                    return whole(&id, &ask, &translator, text);
                }
            }
        }
        text.push_str(&std::mem::take(&mut translator.held));
        return whole(&id, &ask, &translator, text);
    }
    let state = Stream {
        body: Box::pin(body),
        framer: SseFramer::default(),
        ends: Vec::new(),
        events: Events::new(id, ask.model, translator),
        finished: false,
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        let next = s.next().await?;
        Some((Ok::<_, Infallible>(next), s))
    });
    super::sse::response(stream)
}

/// A whole (non-streamed) message.
fn whole(id: &str, ask: &Ask, translator: &Translator, text: String) -> Response {
    Json(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": ask.model,
        "content": [{ "type": "text", "text": text }],
        "stop_reason": translator.stop_reason(),
        "stop_sequence": translator.stop_sequence,
        "usage": translator.usage(),
    }))
    .into_response()
}

/// Anthropic's events for one streamed message, written as server-sent
/// events with `event:` lines.
struct Events {
    id: String,
    model: String,
    translator: Translator,
    started: bool,
}

impl Events {
    fn new(id: String, model: String, translator: Translator) -> Events {
        Events {
            id,
            model,
            translator,
            started: false,
        }
    }

    fn write(out: &mut String, name: &str, data: Value) {
        out.push_str("event: ");
        out.push_str(name);
        out.push_str("\ndata: ");
        out.push_str(&data.to_string());
        out.push_str("\n\n");
    }

    /// `message_start` and the text block's start, once.
    fn start(&mut self, out: &mut String) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        Events::write(
            out,
            "message_start",
            json!({ "type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": { "input_tokens": 0, "output_tokens": 0 },
            }}),
        );
        Events::write(
            out,
            "content_block_start",
            json!({ "type": "content_block_start", "index": 0,
                    "content_block": { "type": "text", "text": "" } }),
        );
    }

    /// The events one engine event makes; `true` once the message is over.
    fn event(&mut self, event: &[u8], out: &mut String) -> bool {
        self.start(out);
        match self.translator.event(event) {
            Step::Text(text) => {
                self.text(&text, out);
                if self.translator.done {
                    self.end(out);
                }
                self.translator.done
            }
            Step::Error(e) => {
                Events::error(&e, out);
                true
            }
        }
    }

    fn text(&self, text: &str, out: &mut String) {
        if !text.is_empty() {
            Events::write(
                out,
                "content_block_delta",
                json!({ "type": "content_block_delta", "index": 0,
                        "delta": { "type": "text_delta", "text": text } }),
            );
        }
    }

    /// The closing events: the block's stop, why and how much, the end.
    fn end(&mut self, out: &mut String) {
        self.start(out);
        let held = std::mem::take(&mut self.translator.held);
        self.text(&held, out);
        Events::write(
            out,
            "content_block_stop",
            json!({ "type": "content_block_stop", "index": 0 }),
        );
        Events::write(
            out,
            "message_delta",
            json!({ "type": "message_delta",
                    "delta": { "stop_reason": self.translator.stop_reason(),
                               "stop_sequence": self.translator.stop_sequence },
                    "usage": self.translator.usage() }),
        );
        Events::write(out, "message_stop", json!({ "type": "message_stop" }));
    }

    fn error(e: &ApiError, out: &mut String) {
        Events::write(out, "error", error_body(e));
    }
}

/// One streamed answer, from the proxy's OpenAI events to the client.
struct Stream {
    body: std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, axum::Error>> + Send>>,
    framer: SseFramer,
    ends: Vec<usize>,
    events: Events,
    finished: bool,
}

impl Stream {
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
                    Events::error(
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

/// Anthropic's error type for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

fn error_body(e: &ApiError) -> Value {
    json!({ "type": "error", "error": { "type": error_type(e.status), "message": e.message } })
}

/// An error in Anthropic's shape, with the status (and `retry-after`) the
/// OpenAI routes would give.
pub(super) fn error_response(e: &ApiError) -> Response {
    let mut response = (e.status, Json(error_body(e))).into_response();
    if let Some(secs) = e.retry_after {
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            response.headers_mut().insert("retry-after", v);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use expect_test::{expect, Expect};

    use super::*;

    /// Translates a request and renders the OpenAI request, or the error.
    fn check(request: Value, expect: Expect) {
        let verdict = match translate(request.to_string().as_bytes()) {
            Ok((openai, ask)) => format!(
                "{}\nstream={} stops={:?}",
                Value::Object(openai),
                ask.stream,
                ask.stops
            ),
            Err(e) => format!(
                "{} {} {:?}: {}",
                e.status.as_u16(),
                error_type(e.status),
                e.param,
                e.message
            ),
        };
        expect.assert_eq(&verdict);
    }

    /// Feeds engine chunks (each one event's data) and renders the
    /// Anthropic events, one line each.
    fn check_stream(stops: &[&str], chunks: &[&str], expect: Expect) {
        let translator = Translator::new(stops.iter().map(|s| s.to_string()).collect());
        let mut events = Events::new("msg_1".into(), "m".into(), translator);
        let mut out = String::new();
        for chunk in chunks {
            if events.event(format!("data: {chunk}\n\n").as_bytes(), &mut out) {
                break;
            }
        }
        let lines: Vec<&str> = out
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with("event: "))
            .map(|l| l.trim_start_matches("data: "))
            .collect();
        expect.assert_eq(&lines.join("\n"));
    }

    fn delta(text: &str) -> String {
        json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
            .to_string()
    }

    #[test]
    fn a_request_becomes_a_streamed_chat_request() {
        check(
            json!({"model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
                   "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "yo", "cache_control": {"type": "ephemeral"}}]}],
                   "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stop_sequences": ["\n\n"], "stream": true, "metadata": {"user_id": "u"}}),
            expect![[r#"
                {"max_tokens":8,"messages":[{"content":"Be brief.\nBe kind.","role":"system"},{"content":"hi","role":"user"},{"content":"yo","role":"assistant"}],"model":"m","stream":true,"stream_options":{"include_usage":true},"temperature":0.5,"top_k":40,"top_p":0.9}
                stream=true stops=["\n\n"]"#]],
        );
    }

    #[test]
    fn every_field_is_checked_by_name() {
        let base = || json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
        let with = |k: &str, v: Value| {
            let mut r = base();
            r[k] = v;
            r
        };
        let mut no_max = base();
        no_max.as_object_mut().unwrap().remove("max_tokens");
        check(
            no_max,
            expect![[
                r#"400 invalid_request_error Some("max_tokens"): 'max_tokens' is required: the most tokens to generate, a whole number from 1"#
            ]],
        );
        check(
            with("max_tokens", json!(0)),
            expect![[
                r#"400 invalid_request_error Some("max_tokens"): 'max_tokens' must be a whole number from 1 to 4294967295, not 0"#
            ]],
        );
        check(
            with("max_tokens", json!(2.5)),
            expect![[
                r#"400 invalid_request_error Some("max_tokens"): 'max_tokens' must be a whole number from 1 to 4294967295, not 2.5"#
            ]],
        );
        check(
            with("temperature", json!(1.5)),
            expect![[
                r#"400 invalid_request_error Some("temperature"): 'temperature' must be a number from 0 to 1, not 1.5"#
            ]],
        );
        check(
            with("top_p", json!("x")),
            expect![[
                r#"400 invalid_request_error Some("top_p"): 'top_p' must be a number from 0 to 1, not "x""#
            ]],
        );
        check(
            with("top_k", json!(-1)),
            expect![[
                r#"400 invalid_request_error Some("top_k"): 'top_k' must be a whole number from 0 to 4294967295, not -1"#
            ]],
        );
        check(
            with("stream", json!(1)),
            expect![[
                r#"400 invalid_request_error Some("stream"): 'stream' must be true or false, not 1"#
            ]],
        );
        check(
            with("stop_sequences", json!("x")),
            expect![[
                r#"400 invalid_request_error Some("stop_sequences"): 'stop_sequences' must be a list of strings, not "x""#
            ]],
        );
        check(
            with("stop_sequences", json!(["a", ""])),
            expect![[
                r#"400 invalid_request_error Some("stop_sequences"): 'stop_sequences[1]' must be a non-empty string, not """#
            ]],
        );
        check(
            with("system", json!(5)),
            expect![[
                r#"400 invalid_request_error Some("system"): 'system' must be a string or a list of text blocks, not 5"#
            ]],
        );
        check(
            with("metadata", json!("u")),
            expect![[
                r#"400 invalid_request_error Some("metadata"): 'metadata' must be an object such as {"user_id": "..."}, not "u""#
            ]],
        );
        check(
            with("tools", json!([])),
            expect![[
                r#"400 invalid_request_error None: 'tools' is not supported by this host (it serves text: model, messages, max_tokens, system, stop_sequences, stream, temperature, top_p, top_k, metadata)"#
            ]],
        );
        check(
            with("model", json!("")),
            expect![[
                r#"400 invalid_request_error Some("model"): 'model' is required: a string naming one of the models GET /v1/models lists"#
            ]],
        );
        check(
            with("messages", json!([])),
            expect![[
                r#"400 invalid_request_error Some("messages"): 'messages' is required: a non-empty list of {"role", "content"} turns"#
            ]],
        );
        check(
            with("messages", json!([{"role": "system", "content": "x"}])),
            expect![[
                r#"400 invalid_request_error Some("messages"): 'messages[0].role' must be "user" or "assistant" (the system prompt is the top-level 'system'), not "system""#
            ]],
        );
        check(
            with("messages", json!([{"role": "user"}])),
            expect![[
                r#"400 invalid_request_error Some("messages"): 'messages[0].content' is missing"#
            ]],
        );
        check(
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]),
            ),
            expect![[
                r#"400 invalid_request_error Some("messages"): 'messages[0].content[0]' is a 'image' block; this host serves text blocks only ({"type": "text", "text": "..."})"#
            ]],
        );
        check(
            with(
                "messages",
                json!([{"role": "user", "content": [{"type": "text", "text": 5}]}]),
            ),
            expect![[
                r#"400 invalid_request_error Some("messages"): 'messages[0].content[0].text' must be a string, not 5"#
            ]],
        );
        check(
            with("messages", json!([{"role": "user", "content": []}])),
            expect![[
                r#"400 invalid_request_error Some("messages"): 'messages[0].content' must not be an empty list of blocks"#
            ]],
        );
    }

    #[test]
    fn a_stream_becomes_anthropic_events_in_order() {
        check_stream(
            &[],
            &[
                &delta("Hel"),
                &delta("lo"),
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
                r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#,
                "[DONE]",
            ],
            expect![[r#"
                {"message":{"content":[],"id":"msg_1","model":"m","role":"assistant","stop_reason":null,"stop_sequence":null,"type":"message","usage":{"input_tokens":0,"output_tokens":0}},"type":"message_start"}
                {"content_block":{"text":"","type":"text"},"index":0,"type":"content_block_start"}
                {"delta":{"text":"Hel","type":"text_delta"},"index":0,"type":"content_block_delta"}
                {"delta":{"text":"lo","type":"text_delta"},"index":0,"type":"content_block_delta"}
                {"index":0,"type":"content_block_stop"}
                {"delta":{"stop_reason":"max_tokens","stop_sequence":null},"type":"message_delta","usage":{"input_tokens":5,"output_tokens":2}}
                {"type":"message_stop"}"#]],
        );
    }

    #[test]
    fn a_stop_sequence_split_across_chunks_ends_the_message() {
        // "END" arrives as "E" + "ND": the "E" is held back, never shown.
        check_stream(
            &["END", "xyz"],
            &[
                &delta("ab"),
                &delta("cE"),
                &delta("ND tail"),
                &delta("never"),
            ],
            expect![[r#"
                {"message":{"content":[],"id":"msg_1","model":"m","role":"assistant","stop_reason":null,"stop_sequence":null,"type":"message","usage":{"input_tokens":0,"output_tokens":0}},"type":"message_start"}
                {"content_block":{"text":"","type":"text"},"index":0,"type":"content_block_start"}
                {"delta":{"text":"ab","type":"text_delta"},"index":0,"type":"content_block_delta"}
                {"delta":{"text":"c","type":"text_delta"},"index":0,"type":"content_block_delta"}
                {"index":0,"type":"content_block_stop"}
                {"delta":{"stop_reason":"stop_sequence","stop_sequence":"END"},"type":"message_delta","usage":{"input_tokens":0,"output_tokens":3}}
                {"type":"message_stop"}"#]],
        );
        // A held prefix that turns out not to be one is passed on; the end
        // of the turn flushes what is held.
        check_stream(
            &["END"],
            &[
                &delta("aE"),
                &delta("x"),
                &delta("E"),
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
                "[DONE]",
            ],
            expect![[r#"
                {"message":{"content":[],"id":"msg_1","model":"m","role":"assistant","stop_reason":null,"stop_sequence":null,"type":"message","usage":{"input_tokens":0,"output_tokens":0}},"type":"message_start"}
                {"content_block":{"text":"","type":"text"},"index":0,"type":"content_block_start"}
                {"delta":{"text":"a","type":"text_delta"},"index":0,"type":"content_block_delta"}
                {"delta":{"text":"Ex","type":"text_delta"},"index":0,"type":"content_block_delta"}
                {"delta":{"text":"E","type":"text_delta"},"index":0,"type":"content_block_delta"}
                {"index":0,"type":"content_block_stop"}
                {"delta":{"stop_reason":"end_turn","stop_sequence":null},"type":"message_delta","usage":{"input_tokens":0,"output_tokens":3}}
                {"type":"message_stop"}"#]],
        );
    }

    #[test]
    fn an_engine_error_mid_stream_becomes_an_error_event() {
        check_stream(
            &[],
            &[
                &delta("a"),
                r#"{"error":{"message":"engine 'mlx-lm' exited","type":"engine_error"}}"#,
            ],
            expect![[r#"
                {"message":{"content":[],"id":"msg_1","model":"m","role":"assistant","stop_reason":null,"stop_sequence":null,"type":"message","usage":{"input_tokens":0,"output_tokens":0}},"type":"message_start"}
                {"content_block":{"text":"","type":"text"},"index":0,"type":"content_block_start"}
                {"delta":{"text":"a","type":"text_delta"},"index":0,"type":"content_block_delta"}
                {"error":{"message":"engine 'mlx-lm' exited","type":"api_error"},"type":"error"}"#]],
        );
    }
}
