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

use super::super::pieces::{Piece, Step, Translator};
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
    let is_sse = super::super::sse::is_stream(response.headers());
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
fn send(stream: bool, mut lines: Vec<Value>) -> Response {
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
        None => Json(lines.pop().unwrap_or(Value::Null)).into_response(),
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

/// The proxy's answer body, as it arrives.
type Events = Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, axum::Error>> + Send>>;

/// One answer from the proxy's events to Ollama's lines.
struct Pump {
    body: Option<Events>,
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

#[cfg(test)]
mod tests {
    use expect_test::{expect, Expect};

    use super::*;

    /// The client's answer to an engine stream of `events` (the proxy's
    /// SSE `data:` payloads), times masked.
    fn check(kind: Kind, stream: bool, events: &[&str], expect: Expect) {
        let body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        let response = ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response();
        let ask = Ask {
            kind,
            name: "m".into(),
            stream,
            think: true,
            keep_alive: None,
            openai: None,
            path: "/v1/chat/completions",
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (status, text) = runtime.block_on(async {
            let answer = answer(response, ask, None).await;
            let status = answer.status();
            let bytes = axum::body::to_bytes(answer.into_body(), usize::MAX)
                .await
                .unwrap();
            (status, String::from_utf8(bytes.to_vec()).unwrap())
        });
        let mut lines = vec![status.as_u16().to_string()];
        for line in text.lines() {
            let mut value: Value = serde_json::from_str(line).unwrap();
            for key in [
                "created_at",
                "total_duration",
                "prompt_eval_duration",
                "eval_duration",
            ] {
                if let Some(v) = value.get_mut(key) {
                    *v = json!("T");
                }
            }
            lines.push(value.to_string());
        }
        expect.assert_eq(&lines.join("\n"));
    }

    fn delta(delta: Value) -> String {
        json!({"choices": [{"index": 0, "delta": delta, "finish_reason": null}]}).to_string()
    }

    const USAGE: &str = r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#;
    const LENGTH: &str = r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#;

    #[test]
    fn a_stream_becomes_ndjson_lines_then_done() {
        let events = [
            &delta(json!({"reasoning_content": "hm"})),
            &delta(json!({"content": "Hel"})),
            &delta(json!({"content": "lo"})),
            LENGTH,
            USAGE,
            "[DONE]",
        ];
        check(
            Kind::Chat,
            true,
            &events,
            expect![[r#"
                200
                {"created_at":"T","done":false,"message":{"content":"","role":"assistant","thinking":"hm"},"model":"m"}
                {"created_at":"T","done":false,"message":{"content":"Hel","role":"assistant"},"model":"m"}
                {"created_at":"T","done":false,"message":{"content":"lo","role":"assistant"},"model":"m"}
                {"created_at":"T","done":true,"done_reason":"length","eval_count":2,"eval_duration":"T","load_duration":0,"message":{"content":"","role":"assistant"},"model":"m","prompt_eval_count":5,"prompt_eval_duration":"T","total_duration":"T"}"#]],
        );
        check(
            Kind::Generate,
            false,
            &events,
            expect![[r#"
                200
                {"created_at":"T","done":true,"done_reason":"length","eval_count":2,"eval_duration":"T","load_duration":0,"model":"m","prompt_eval_count":5,"prompt_eval_duration":"T","response":"Hello","thinking":"hm","total_duration":"T"}"#]],
        );
    }

    #[test]
    fn tool_calls_come_whole() {
        let events = [
            &delta(
                json!({"tool_calls": [{"index": 0, "id": "c", "type": "function", "function": {"name": "add", "arguments": "{\"a\":"}}]}),
            ),
            &delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]})),
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ];
        check(
            Kind::Chat,
            false,
            &events,
            expect![[r#"
                200
                {"created_at":"T","done":true,"done_reason":"stop","eval_count":0,"eval_duration":"T","load_duration":0,"message":{"content":"","role":"assistant","tool_calls":[{"function":{"arguments":{"a":1},"name":"add"}}]},"model":"m","prompt_eval_count":0,"prompt_eval_duration":"T","total_duration":"T"}"#]],
        );
    }

    #[test]
    fn an_engine_error_ends_the_stream_with_an_error_line() {
        let events = [
            &delta(json!({"content": "a"})),
            r#"{"error":{"message":"engine 'mlx-lm' exited","type":"engine_error"}}"#,
        ];
        check(
            Kind::Generate,
            true,
            &events,
            expect![[r#"
                200
                {"created_at":"T","done":false,"model":"m","response":"a"}
                {"error":"engine 'mlx-lm' exited"}"#]],
        );
        check(
            Kind::Generate,
            false,
            &events,
            expect![[r#"
                502
                {"error":"engine 'mlx-lm' exited"}"#]],
        );
    }
}
