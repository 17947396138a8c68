//! Serving an in-process engine with OpenAI's request and response shapes.
//!
//! The host (with `isolation = "none"`) and `hangar worker` both use this:
//! a request becomes a [`GenerateRequest`], the engine runs on a blocking
//! thread and sends each piece of output through a [`TokenSink`] into a
//! channel, and the pieces become one JSON answer or a stream of
//! server-sent events. When the client goes away the channel closes, the
//! sink answers `Stop`, and the engine stops generating.

use std::convert::Infallible;
use std::time::{SystemTime, UNIX_EPOCH};

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RStr};
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hangar_plugin_api::abi::{SinkControl, TokenSink, TokenSink_TO};
use hangar_plugin_api::wire::{GenerateInput, GenerateOutcome, GenerateRequest};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::stall::STREAM_BUFFER;
use super::{validate, ApiError};
use crate::sessions::Served;

/// Which OpenAI route a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

enum Piece {
    Text(String),
    Done(Result<GenerateOutcome, String>),
}

/// Forwards pieces into the channel; a closed channel means the client is
/// gone, so the engine is told to stop.
struct ChannelSink(mpsc::Sender<Piece>);

impl TokenSink for ChannelSink {
    fn emit(&mut self, text: RStr<'_>, _token: u32) -> SinkControl {
        if text.is_empty() {
            return SinkControl::Continue;
        }
        match self.0.blocking_send(Piece::Text(text.to_string())) {
            Ok(()) => SinkControl::Continue,
            Err(_) => SinkControl::Stop,
        }
    }
}

/// The field in which the host hands an in-process engine (in the host or
/// in a `hangar worker`) the grammar of a constrained request (see
/// `tools::enforce`); a client's own is removed at the edge.
pub(crate) const GRAMMAR_FIELD: &str = "x_hangar_grammar";

impl Served {
    /// Answers one OpenAI request.
    pub(crate) async fn answer(
        &self,
        route: Route,
        request: &Map<String, Value>,
    ) -> Result<Response, ApiError> {
        validate::check(route, request)?;
        let generate = self.generate_request(route, request)?;
        let stream = request
            .get("stream")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let include_usage = request
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let json = serde_json::to_string(&generate).expect("requests serialize");
        // Bounded: for a client that takes its stream slowly, the engine's
        // sink blocks (generation pauses) once this many tokens wait.
        let (tx, mut rx) = mpsc::channel::<Piece>(STREAM_BUFFER);
        let engine = self.engine.clone();
        // Held until the engine returns: an engine that serves one call at a
        // time gets them one at a time.
        let permit = self
            .gate
            .clone()
            .acquire_owned()
            .await
            .expect("the gate is never closed");
        std::thread::spawn(move || {
            let _permit = permit;
            let mut sink = ChannelSink(tx.clone());
            let outcome = match engine.generate(
                RStr::from_str(&json),
                TokenSink_TO::from_ptr(&mut sink, TD_Opaque),
            ) {
                RResult::ROk(out) => serde_json::from_str::<GenerateOutcome>(out.as_str())
                    .map_err(|e| format!("the engine returned an unreadable outcome: {e}")),
                RResult::RErr(e) => Err(e.into_string()),
            };
            if let Ok(o) = &outcome {
                if o.finish_reason == "cancelled" {
                    tracing::info!(
                        "generation cancelled by the client after {} tokens",
                        o.completion_tokens
                    );
                }
            }
            let _ = tx.blocking_send(Piece::Done(outcome));
        });
        let id = format!(
            "{}-{}",
            if route == Route::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            unique()
        );
        let created = now();
        let shape = Shape {
            route,
            id,
            created,
            model: self.model_id.clone(),
        };
        if !stream {
            let mut text = String::new();
            let outcome = loop {
                match rx.recv().await {
                    Some(Piece::Text(t)) => text.push_str(&t),
                    Some(Piece::Done(outcome)) => break outcome,
                    None => break Err("the engine stopped without an answer".into()),
                }
            };
            let outcome = outcome.map_err(|e| engine_failure(&self.model_id, e))?;
            return Ok((StatusCode::OK, Json(shape.whole(&text, &outcome))).into_response());
        }
        let (out_tx, out_rx) = mpsc::channel::<Bytes>(STREAM_BUFFER);
        tokio::spawn(async move {
            let send = |v: Value| Bytes::from(format!("data: {v}\n\n"));
            let mut first = true;
            loop {
                let event = match rx.recv().await {
                    Some(Piece::Text(t)) => {
                        let chunk = shape.chunk(Some(&t), first, None);
                        first = false;
                        send(chunk)
                    }
                    Some(Piece::Done(Ok(outcome))) => {
                        let _ = out_tx
                            .send(send(shape.chunk(None, first, Some(&outcome.finish_reason))))
                            .await;
                        if include_usage {
                            let _ = out_tx.send(send(shape.usage_chunk(&outcome))).await;
                        }
                        let _ = out_tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
                        return;
                    }
                    Some(Piece::Done(Err(e))) => {
                        let error = engine_failure(&shape.model, e);
                        let _ = out_tx.send(send(error.body())).await;
                        return;
                    }
                    None => return,
                };
                if out_tx.send(event).await.is_err() {
                    return; // the client hung up; dropping `rx` stops the engine
                }
            }
        });
        let body = futures_util::stream::unfold(out_rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
        });
        Ok(super::sse::response(body))
    }

    fn generate_request(
        &self,
        route: Route,
        request: &Map<String, Value>,
    ) -> Result<GenerateRequest, ApiError> {
        let input = match route {
            Route::Chat => match request.get("messages") {
                Some(Value::Array(messages)) if !messages.is_empty() => {
                    GenerateInput::chat(messages.clone())
                }
                _ => {
                    return Err(ApiError::bad_request(
                        "'messages' must be a non-empty list",
                        Some("messages"),
                    ))
                }
            },
            Route::Completion => match request.get("prompt") {
                Some(Value::String(prompt)) => GenerateInput::completion(prompt.clone()),
                Some(Value::Array(parts)) if parts.len() == 1 && parts[0].is_string() => {
                    GenerateInput::completion(parts[0].as_str().unwrap_or_default().to_string())
                }
                _ => {
                    return Err(ApiError::bad_request(
                        "'prompt' must be a string",
                        Some("prompt"),
                    ))
                }
            },
        };
        // The request's own field wins over the model's setting; both are
        // read by the edge's rules, never cast.
        let field = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| request.get(*n).filter(|v| !v.is_null()))
                .or_else(|| self.defaults.get(names[0]))
        };
        Ok({
            let mut generate = GenerateRequest::new(input);
            generate.max_tokens = validate::count(
                field(&["max_tokens", "max_completion_tokens"]),
                "max_tokens",
            )?;
            generate.temperature =
                validate::number(field(&["temperature"]), "temperature")?.map(|n| n as f32);
            generate.top_p = validate::number(field(&["top_p"]), "top_p")?.map(|n| n as f32);
            generate.top_k = validate::count(field(&["top_k"]), "top_k")?;
            generate.min_p = validate::number(field(&["min_p"]), "min_p")?.map(|n| n as f32);
            generate.seed = validate::seed(field(&["seed"]))?;
            generate.stop = validate::stop(request.get("stop"))?;
            if let Some(Value::Array(tools)) = request.get("tools") {
                generate.tools = tools.clone();
            }
            if let Some(Value::String(grammar)) = request.get(GRAMMAR_FIELD) {
                generate.grammar = Some(grammar.clone());
            }
            if route == Route::Chat {
                generate.prediction = validate::prediction(request.get("prediction"))?;
            }
            generate
        })
    }
}

/// An engine's failure to answer: one it reports as `invalid request: ...`
/// (how in-process engines say the request, not the engine, is at fault:
/// an empty prompt, for one) is the client's 400; anything else a 502.
fn engine_failure(model: &str, error: String) -> ApiError {
    match error.strip_prefix("invalid request: ") {
        Some(why) => ApiError::bad_request(
            format!("model '{model}' cannot serve this request: {why}"),
            None,
        ),
        None => ApiError::engine(format!("engine for model '{model}' failed: {error}")),
    }
}

/// The OpenAI response shapes of one request.
struct Shape {
    route: Route,
    id: String,
    created: u64,
    model: String,
}

impl Shape {
    /// OpenAI's usage; where the engine speculated, with OpenAI's
    /// prediction counts and Hangar's `speculation` (passes, tokens
    /// proposed and kept).
    fn usage(outcome: &GenerateOutcome) -> Value {
        let mut usage = json!({
            "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens,
            "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": outcome.cached_tokens },
        });
        if let Some(spec) = &outcome.speculation {
            usage["completion_tokens_details"] = json!({
                "accepted_prediction_tokens": spec.accepted_prediction_tokens,
                "rejected_prediction_tokens": spec.rejected_prediction_tokens,
            });
            usage["speculation"] = json!({
                "verifications": spec.verifications,
                "proposed_tokens": spec.proposed_tokens,
                "accepted_tokens": spec.accepted_tokens,
            });
            if let Some(ms) = spec.time_saved_ms {
                usage["speculation"]["time_saved_ms"] = json!(ms);
            }
        }
        usage
    }

    fn finish(reason: &str) -> &str {
        // A cancelled request has no client left to read this; say `stop`.
        if reason == "cancelled" {
            "stop"
        } else {
            reason
        }
    }

    fn whole(&self, text: &str, outcome: &GenerateOutcome) -> Value {
        let finish = Shape::finish(&outcome.finish_reason);
        match self.route {
            Route::Chat => json!({
                "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{ "index": 0, "message": { "role": "assistant", "content": text }, "finish_reason": finish }],
                "usage": Shape::usage(outcome),
            }),
            Route::Completion => json!({
                "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{ "index": 0, "text": text, "finish_reason": finish, "logprobs": null }],
                "usage": Shape::usage(outcome),
            }),
        }
    }

    fn chunk(&self, text: Option<&str>, first: bool, finish: Option<&str>) -> Value {
        let finish = finish.map(Shape::finish);
        match self.route {
            Route::Chat => {
                let mut delta = Map::new();
                if first {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({
                    "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                    "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
                })
            }
            Route::Completion => json!({
                "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{ "index": 0, "text": text.unwrap_or(""), "finish_reason": finish, "logprobs": null }],
            }),
        }
    }

    fn usage_chunk(&self, outcome: &GenerateOutcome) -> Value {
        let object = match self.route {
            Route::Chat => "chat.completion.chunk",
            Route::Completion => "text_completion",
        };
        json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [], "usage": Shape::usage(outcome),
        })
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A unique id suffix (seconds and a counter, in hex) for answers' ids.
pub(crate) fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{:x}{:04x}",
        now(),
        NEXT.fetch_add(1, Ordering::Relaxed) & 0xffff
    )
}
