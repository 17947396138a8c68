//! Ollama's answers from the proxy's OpenAI stream: one NDJSON line per
//! piece of text or reasoning, the tool calls whole (Ollama never streams
//! a call's arguments), then a final line with `done: true`, `done_reason`
//! and the counts and durations (nanoseconds); for `"stream": false` the
//! same gathered into one object. An engine's error mid-stream ends the
//! stream with an `{"error": "..."}` line, as Ollama's do.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use super::super::messages::{Piece, Step, Translator};
use super::super::sse::SseFramer;
use super::super::{ApiError, App};
use super::request::{Ask, Kind};
use super::Refusal;

/// One line of an answer: the model, the time, and the text (a chat's
/// `message`, a generate's `response`), `done: false`.
pub(super) fn line(
    kind: Kind,
    model: &str,
    text: &str,
    thinking: Option<&str>,
) -> Map<String, Value> {
    let mut line = Map::new();
    line.insert("model".into(), json!(model));
    line.insert(
        "created_at".into(),
        json!(super::timestamp(SystemTime::now())),
    );
    match kind {
        Kind::Chat => {
            let mut message = json!({ "role": "assistant", "content": text });
            if let Some(thinking) = thinking {
                message["thinking"] = json!(thinking);
            }
            line.insert("message".into(), message);
        }
        Kind::Generate => {
            line.insert("response".into(), json!(text));
            if let Some(thinking) = thinking {
                line.insert("thinking".into(), json!(thinking));
            }
        }
    }
    line.insert("done".into(), json!(false));
    line
}

/// The client's answer from the proxy's `response`; `after` is the model
/// to unload once it is sent (`keep_alive` 0).
pub(super) async fn answer(
    response: Response,
    ask: Ask,
    after: Option<(Arc<App>, String)>,
) -> Response {
    let status = response.status();
    let is_sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let reply = Reply::new(&ask);
    if !status.is_success() || !is_sse {
        // An engine error passed on, or an engine that answered whole.
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await;
        let value = bytes
            .as_ref()
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(b).ok())
            .unwrap_or(Value::Null);
        let mut pump = Pump {
            body: None,
            framer: SseFramer::default(),
            ends: vec![],
            reply,
            after,
        };
        if !status.is_success() {
            let message = value
                .pointer("/error/message")
                .and_then(Value::as_str)
                .map_or_else(
                    || String::from_utf8_lossy(bytes.as_deref().unwrap_or_default()).into_owned(),
                    str::to_string,
                );
            pump.finish();
            return Refusal(ApiError {
                status,
                ..ApiError::engine(message)
            })
            .into_response();
        }
        let mut lines = match pump.reply.translator.chunk(&value) {
            Step::Pieces(pieces) => pump.reply.pieces(pieces),
            Step::Error(e) => vec![error_line(&e)],
        };
        lines.extend(pump.reply.end());
        pump.finish();
        return send(ask.stream, lines);
    }
    let mut pump = Pump {
        body: Some(Box::pin(response.into_body().into_data_stream())),
        framer: SseFramer::default(),
        ends: Vec::new(),
        reply,
        after,
    };
    if !ask.stream {
        let mut lines = Vec::new();
        while let Some(more) = pump.next().await {
            lines.extend(more);
        }
        return send(false, lines);
    }
    let stream = futures_util::stream::unfold(pump, |mut pump| async move {
        let lines = pump.next().await?;
        let mut out = String::new();
        for line in lines {
            out.push_str(&line.to_string());
            out.push('\n');
        }
        Some((Ok::<_, Infallible>(Bytes::from(out)), pump))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Whole lines as the answer: NDJSON, or the last line alone (an error
/// line as an error).
fn send(stream: bool, lines: Vec<Value>) -> Response {
    if stream {
        let mut out = String::new();
        for line in &lines {
            out.push_str(&line.to_string());
            out.push('\n');
        }
        return ([(header::CONTENT_TYPE, "application/x-ndjson")], out).into_response();
    }
    match lines
        .iter()
        .find_map(|l| l.get("error").and_then(Value::as_str))
    {
        Some(error) => Refusal(ApiError::engine(error)).into_response(),
        None => Json(lines.into_iter().last().unwrap_or(Value::Null)).into_response(),
    }
}

fn error_line(e: &ApiError) -> Value {
    json!({ "error": e.message })
}

/// One answer's translation: what is gathered for the final line, and the
/// timings.
struct Reply {
    kind: Kind,
    model: String,
    stream: bool,
    think: bool,
    started: Instant,
    /// When the first token came.
    first: Option<Instant>,
    translator: Translator,
    /// Gathered text and reasoning (for an answer that is not streamed).
    text: String,
    thinking: String,
    /// Tool calls: name, and arguments as JSON text so far.
    calls: Vec<(String, String)>,
}

impl Reply {
    fn new(ask: &Ask) -> Reply {
        Reply {
            kind: ask.kind,
            model: ask.name.clone(),
            stream: ask.stream,
            think: ask.think,
            started: Instant::now(),
            first: None,
            // Ollama's stops go to the engine: none matched here.
            translator: Translator::new(vec![]),
            text: String::new(),
            thinking: String::new(),
            calls: Vec::new(),
        }
    }

    /// The lines `pieces` make (none when the answer is gathered).
    fn pieces(&mut self, pieces: Vec<Piece>) -> Vec<Value> {
        let mut out = Vec::new();
        for piece in pieces {
            self.first.get_or_insert_with(Instant::now);
            match piece {
                Piece::Text(text) if self.stream => {
                    out.push(Value::Object(line(self.kind, &self.model, &text, None)))
                }
                Piece::Text(text) => self.text.push_str(&text),
                Piece::Thinking(_) if !self.think => {}
                Piece::Thinking(thinking) if self.stream => out.push(Value::Object(line(
                    self.kind,
                    &self.model,
                    "",
                    Some(&thinking),
                ))),
                Piece::Thinking(thinking) => self.thinking.push_str(&thinking),
                Piece::ToolUse { name, .. } => self.calls.push((name, String::new())),
                Piece::Input(json) => {
                    if let Some((_, arguments)) = self.calls.last_mut() {
                        arguments.push_str(&json);
                    }
                }
            }
        }
        out
    }

    /// The closing lines: the tool calls (streamed), then `done`.
    fn end(&mut self) -> Vec<Value> {
        let held = self.translator.flush();
        let mut out = self.pieces(held);
        let calls: Vec<Value> = std::mem::take(&mut self.calls)
            .into_iter()
            .map(|(name, arguments)| {
                let arguments = match serde_json::from_str::<Value>(&arguments) {
                    Ok(value @ Value::Object(_)) => value,
                    _ if arguments.is_empty() => json!({}),
                    _ => {
                        tracing::warn!("tool call '{name}' has arguments that are not a JSON object; they are left empty: {}",
                            arguments.chars().take(200).collect::<String>());
                        json!({})
                    }
                };
                json!({ "function": { "name": name, "arguments": arguments } })
            })
            .collect();
        let thinking = (self.think && !self.thinking.is_empty()).then_some(self.thinking.as_str());
        let mut last = line(self.kind, &self.model, &self.text, thinking);
        if !calls.is_empty() {
            match (self.kind, self.stream) {
                (Kind::Chat, true) => {
                    let mut calling = line(self.kind, &self.model, "", None);
                    calling["message"]["tool_calls"] = Value::Array(calls);
                    out.push(Value::Object(calling));
                }
                (Kind::Chat, false) => last["message"]["tool_calls"] = Value::Array(calls),
                (Kind::Generate, _) => {}
            }
        }
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let now = Instant::now();
        let first = self.first.unwrap_or(now);
        let reason = match self.translator.stop_reason() {
            "max_tokens" => "length",
            _ => "stop",
        };
        last.insert("done".into(), json!(true));
        last.insert("done_reason".into(), json!(reason));
        last.insert("total_duration".into(), json!(ns(now - self.started)));
        // The load, when there was one, is inside the wait for the first
        // token: Hangar does not tell them apart per request.
        last.insert("load_duration".into(), json!(0));
        last.insert(
            "prompt_eval_count".into(),
            json!(self.translator.input_tokens.unwrap_or(0)),
        );
        last.insert(
            "prompt_eval_duration".into(),
            json!(ns(first - self.started)),
        );
        last.insert(
            "eval_count".into(),
            json!(self.translator.output_tokens.unwrap_or(0)),
        );
        last.insert("eval_duration".into(), json!(ns(now - first)));
        out.push(Value::Object(last));
        out
    }
}

/// One answer from the proxy's events to Ollama's lines.
struct Pump {
    body: Option<Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, axum::Error>> + Send>>>,
    framer: SseFramer,
    ends: Vec<usize>,
    reply: Reply,
    /// The model to unload once the answer is over.
    after: Option<(Arc<App>, String)>,
}

impl Pump {
    /// The next lines; `None` once the answer is over.
    async fn next(&mut self) -> Option<Vec<Value>> {
        loop {
            let chunk = self.body.as_mut()?.next().await;
            let mut out = Vec::new();
            match chunk {
                Some(Ok(chunk)) => {
                    let run = self.framer.push(chunk, &mut self.ends);
                    let mut start = 0;
                    for &end in &self.ends {
                        match self.reply.translator.event(&run[start..end]) {
                            Step::Pieces(pieces) => out.extend(self.reply.pieces(pieces)),
                            Step::Error(e) => {
                                out.push(error_line(&e));
                                self.finish();
                                return Some(out);
                            }
                        }
                        start = end;
                        if self.reply.translator.done {
                            out.extend(self.reply.end());
                            self.finish();
                            return Some(out);
                        }
                    }
                }
                Some(Err(e)) => {
                    out.push(error_line(&ApiError::engine(format!(
                        "the stream broke: {e}"
                    ))));
                    self.finish();
                }
                // The proxy ends a failed stream with an error event; one
                // that ends without `[DONE]` still gets its final line.
                None => {
                    out.extend(self.reply.end());
                    self.finish();
                }
            }
            if !out.is_empty() {
                return Some(out);
            }
        }
    }

    /// Drops the engine's stream (its slot with it), then unloads the
    /// model if the client asked to.
    fn finish(&mut self) {
        self.body = None;
        if let Some((app, model)) = self.after.take() {
            app.scheduler.unload(&model);
        }
    }
}
