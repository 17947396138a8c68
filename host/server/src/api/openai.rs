//! The OpenAI-compatible routes: `POST /v1/chat/completions` and
//! `POST /v1/completions` proxied to the model's engine, and
//! `GET /v1/models`.
//!
//! Streams pass through as they arrive, every event that one read of the
//! engine's socket brings in one write to the client: the proxy only
//! frames server-sent events so that it can rewrite each event's `model`
//! to the client's model id and, if the engine dies mid-stream, end the
//! stream with one final error event instead of a torn one.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::BytesMut;
use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use super::images::ImageNames;
use super::inprocess::Route;
use super::sse::{self, ModelRewrite, SseFramer};
use super::upstream::{self, Wait};
use super::{ApiError, App};
use crate::metrics::StreamMetrics;
use crate::sessions::{Backend, InFlight, Session, Sessions};
use crate::supervisor::client;
use crate::supervisor::health::{State as EngineState, Streaming};
use hangar_engine::loader::wasm::{Direction, WasmPlugin};
use hangar_engine::models::Model;

/// `POST /v1/chat/completions`.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai",
    request_body(content = super::schema::ChatRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The answer, whole or streamed", content((super::schema::ChatCompletion = "application/json"), (super::schema::SseEvent = "text/event-stream"))),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn chat_completions(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    counted(app, "/v1/chat/completions", body).await
}

/// `POST /v1/completions`.
#[utoipa::path(post, path = "/v1/completions", tag = "openai",
    request_body(content = super::schema::CompletionRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The completion, whole or streamed", content((super::schema::Completion = "application/json"), (super::schema::SseEvent = "text/event-stream"))),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn completions(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    counted(app, "/v1/completions", body).await
}

async fn counted(
    app: Arc<App>,
    path: &'static str,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request = body.map_err(ApiError::from).and_then(|body| {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::bad_request(format!("the request body is not a JSON object: {e}"), None)
        })
    });
    proxy(app, path, path, request, ImageNames::default()).await
}

/// Hook (metrics): forwards an OpenAI `request` to the engine's `path`
/// and counts its answer under `route` by model (`-` until the model is
/// known, so that unknown ids add no series), route and status. Every
/// route that reaches an engine comes through here (`/v1/messages` with its
/// request translated), so that validation, admission, health waits and
/// metrics are the same for all. `images` names the request's image parts
/// as the client sent them (a translated request's own paths).
pub(super) async fn proxy(
    app: Arc<App>,
    route: &'static str,
    path: &'static str,
    request: Result<Map<String, Value>, ApiError>,
    images: ImageNames,
) -> Result<Response, ApiError> {
    let mut model = String::from("-");
    let mut plan = None;
    let result = match request {
        Ok(request) => forward(app.clone(), path, request, &images, &mut model, &mut plan).await,
        Err(e) => Err(e),
    };
    // Hook (tools and reasoning): the answer split the same for every engine.
    let result = match (result, plan) {
        (Ok(response), Some(plan)) => Ok(super::split::apply(response, plan).await),
        (result, _) => result,
    };
    let status = match &result {
        Ok(r) => r.status(),
        Err(e) => e.status,
    };
    app.sessions
        .metrics()
        .request(&model, route, status.as_u16());
    // A client that stalls while this answer is sent is recorded against
    // the model.
    result.map(|mut response| {
        response
            .extensions_mut()
            .insert(super::stall::AnswerOf(model));
        response
    })
}

/// `GET /v1/models`: every discovered model, in OpenAI's list shape.
#[utoipa::path(get, path = "/v1/models", tag = "openai",
    responses(
        (status = 200, description = "OK", body = super::schema::ModelList),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn models(State(app): State<Arc<App>>) -> Json<Value> {
    let discovery = app.discovery();
    let stored = app.sessions.settings().get();
    let mut data: Vec<Value> = Vec::with_capacity(discovery.models.len());
    for m in &discovery.models {
        let entry = |id: &str, of: Option<(&str, &str)>| {
            let mut entry = json!({
                "id": id,
                "object": "model",
                "created": 0,
                "owned_by": "hangar",
                "format": m.format,
                "kind": m.kind,
            });
            if let Some((field, model)) = of {
                entry[field] = json!(model);
            }
            entry
        };
        data.push(entry(&m.id, None));
        let listed = crate::names::listed_names(&discovery, &stored, &m.id);
        data.extend(
            listed
                .aliases
                .iter()
                .map(|a| entry(a, Some(("alias_of", &m.id)))),
        );
        data.extend(
            listed
                .profiles
                .iter()
                .map(|p| entry(p, Some(("profile_of", &m.id)))),
        );
    }
    Json(json!({ "object": "list", "data": data }))
}

async fn forward(
    app: Arc<App>,
    path: &'static str,
    mut request: Map<String, Value>,
    images: &ImageNames,
    label: &mut String,
    plan: &mut Option<super::split::Plan>,
) -> Result<Response, ApiError> {
    let started = std::time::Instant::now();
    let model_id = match request.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => {
            return Err(ApiError::bad_request(
                "'model' is required: name one of the models GET /v1/models lists",
                Some("model"),
            ))
        }
    };
    let route = if path.ends_with("chat/completions") {
        Route::Chat
    } else {
        Route::Completion
    };
    let stream = request
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let named = app.find_named(&model_id)?;
    let model = named.model;
    label.clone_from(&model.id);
    super::embeddings::expect_kind(&model, hangar_engine::models::ModelKind::Chat, path)?;
    // A profile's settings fill what the request leaves out, then are
    // checked like the client's own.
    if let Some((_, profile)) = &named.profile {
        crate::names::overlay(&mut request, profile, route == Route::Chat);
    }
    // Hook (validation): every known field is checked before an engine sees it.
    super::validate::check(route, &request)?;
    super::validate::top_k_within_vocabulary(&model, &request)?;
    // A negative seed goes on as its 64-bit pattern, as in-process engines
    // take it: mlx-lm's generation thread dies on a negative one (found by
    // schemathesis).
    if let Some(seed) = super::validate::seed(request.get("seed"))? {
        request.insert("seed".into(), Value::from(seed));
    }
    // A list of one prompt is that prompt: every engine takes a string,
    // and lists only where it says so (`gate_request`).
    if let Some(Value::Array(list)) = request.get("prompt") {
        if let [Value::String(one)] = list.as_slice() {
            let one = Value::String(one.clone());
            request.insert("prompt".into(), one);
        }
    }
    // An in-process engine's grammar comes from the host alone.
    request.remove(super::inprocess::GRAMMAR_FIELD);
    let mut constraint = None;
    if route == Route::Chat {
        (*plan, constraint) = super::tools::plan(&app, &model, &mut request).await?;
    }
    gate_request(&app, &model, route, &mut request).await?;
    // Images named by URL become their bytes, before a slot is taken.
    app.images.inline(&mut request, images).await?;
    let (session, in_flight) = app.scheduler.admit(&model).await?;
    if let Some(constraint) = &constraint {
        super::tools::enforce(&app, &model, &session.plugin, constraint, &mut request)?;
    }
    let (connections, upstream_model, mapper) = match &session.backend {
        Backend::Process {
            connections,
            upstream_model,
            mapper,
            ..
        } => (connections, upstream_model, mapper),
        Backend::InProcess(served) => {
            let answer = served.answer(route, &request);
            let response = tokio::select! {
                r = answer => r?,
                _ = session.ended.cancelled() => return Err(ended_error(&session)),
            };
            // A stream keeps its slot until it ends, and ends with an error
            // event when the session does (an unload's drain deadline).
            let is_sse = response
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
            let response = match is_sse {
                true => response.map(|body| until_ended(body, session)),
                false => response,
            };
            return Ok(super::stall::holding(response, in_flight));
        }
    };
    match upstream_model {
        Some(upstream) => request.insert("model".into(), Value::String(upstream.clone())),
        None => request.remove("model"),
    };
    if let Some(mapper) = mapper {
        let body = Value::Object(request);
        request = match map(mapper, Direction::Request, path, body).await? {
            Value::Object(mapped) => mapped,
            other => {
                return Err(ApiError::engine(format!(
                    "engine '{}': map_request() returned {other}, not a JSON object",
                    session.plugin
                )))
            }
        };
    }
    let body = serde_json::to_string(&request).expect("a JSON map serializes");
    // A streaming request counts as streaming from here (health: a busy
    // engine's 503 while it streams is not a failure).
    let streaming = stream
        .then(|| session.monitor.as_ref().map(|m| m.stream()))
        .flatten();
    let send = connections.post(path, body);
    // Hook (health): waits past a timeout check the engine (busy or hung).
    let answer = tokio::select! {
        r = upstream::wait(&app.sessions, &session, Wait::FirstByte, send) => r?,
        _ = session.ended.cancelled() => return Err(ended_error(&session)),
    };
    let answer = match answer {
        Ok(a) => a,
        Err(e) => return Err(failure(&session, &format!("the engine did not answer: {e}")).await),
    };
    let status = answer.status();
    let is_sse = sse::is_stream(answer.headers());
    if status.is_success() && stream && is_sse {
        return Ok(sse(
            app.sessions.clone(),
            session,
            in_flight,
            streaming,
            answer.into_body(),
            model_id,
            started,
        ));
    }
    let read = tokio::select! {
        r = upstream::wait(&app.sessions, &session, Wait::More, answer.into_body().bytes()) => r?,
        _ = session.ended.cancelled() => return Err(ended_error(&session)),
    };
    let bytes = match read {
        Ok(b) => b,
        Err(e) => {
            return Err(failure(&session, &format!("the engine broke off its answer: {e}")).await)
        }
    };
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(mut value) if status.is_success() => {
            if let Some(mapper) = mapper {
                value = map(mapper, Direction::Response, path, value).await?;
            }
            rewrite_model(&mut value, &model_id);
            if let Some(usage) = value.get("usage") {
                // By the model's id, whatever name (alias, profile) it was asked by.
                app.sessions.metrics().usage(&session.model.id, usage);
            }
            Ok((status, Json(value)).into_response())
        }
        // An engine whose context filled (llama-server, given several
        // prompts and no max_tokens, answers 500): the request asked for
        // more than fits, the client's to change (found by schemathesis).
        Ok(value) if status.is_server_error() && context_exceeded(&value) => Err(ApiError {
            code: "context_length_exceeded",
            ..ApiError::bad_request(
                format!(
                    "model '{model_id}': the engine's context filled before the answer ended ({}); send a shorter prompt or a lower 'max_tokens'",
                    value["error"]["message"].as_str().unwrap_or_default()
                ),
                Some("max_tokens"),
            )
        }),
        // The engine's own error, passed on when it is in OpenAI's shape.
        Ok(value) if value.get("error").is_some_and(Value::is_object) => {
            Ok((relayed(status), Json(value)).into_response())
        }
        _ => {
            let text: String = String::from_utf8_lossy(&bytes).chars().take(500).collect();
            let mut e = ApiError::engine(format!(
                "engine '{}' answered {status} for model '{model_id}': {text}",
                session.plugin
            ));
            if !status.is_success() {
                e.status = relayed(status);
            }
            Err(e)
        }
    }
}

/// The status a client gets for an engine's error: the engine's own, but
/// 502 for a 404. The host found the model and the route before it asked,
/// so an engine that answers "not found" failed (mlx_lm.server answers
/// 404 "generation thread died" for any error in generation); the client's
/// request was not the cause, and a 404 would tell it the model is gone.
fn relayed(status: StatusCode) -> StatusCode {
    if status == StatusCode::NOT_FOUND {
        StatusCode::BAD_GATEWAY
    } else {
        status
    }
}

/// Whether an engine's error says its context is exceeded.
fn context_exceeded(value: &Value) -> bool {
    let message = value
        .pointer("/error/message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_ascii_lowercase();
    message.contains("context") && message.contains("exceed")
}

/// Runs a WebAssembly plugin's `map_request` or `map_response` on `body`
/// (off the async threads: a call may take up to its deadline); `None`
/// from the plugin keeps `body`.
async fn map(
    mapper: &WasmPlugin,
    direction: Direction,
    route: &'static str,
    body: Value,
) -> Result<Value, ApiError> {
    let mapper = mapper.clone();
    tokio::task::spawn_blocking(move || match mapper.map(direction, route, &body) {
        Ok(mapped) => Ok(mapped.unwrap_or(body)),
        Err(reason) => Err(ApiError::engine(format!("the engine's plugin {reason}"))),
    })
    .await
    .map_err(|e| ApiError::engine(format!("the engine's plugin did not answer: {e}")))?
}

/// A request field or content part whose capability is off for the
/// serving engine is refused (422) before anything loads, rather than sent
/// to an engine version that does not know it; then the app defaults the
/// host passes per request (`reasoning_effort`) fill what a chat request
/// leaves out, where the engine takes them.
async fn gate_request(
    app: &App,
    model: &Model,
    route: Route,
    request: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    // An image is for a vision-language model only, whatever its engine.
    if let Some(at) = crate::settings::first_part(request, "image_url") {
        if !model.vision {
            // Where the catalog looks for the tower, so that a user who has
            // one knows where to put it.
            let tower = if model.format == "gguf" {
                "no mmproj-*.gguf projector beside its weights in a model folder"
            } else {
                "no vision_config in its config.json"
            };
            return Err(ApiError::bad_request(
                format!(
                    "{at} is an image, and model '{}' takes text only: it has no vision tower ({tower}), so it lacks the {} capability an image needs; send text only, or ask a vision-language model",
                    model.id,
                    hangar_plugin_api::capability::VISION
                ),
                Some("messages"),
            ));
        }
    }
    // Without an engine, loading reports the missing one with the whole story.
    let Some((entry, engine)) = app.sessions.serving(model).await else {
        return Ok(());
    };
    let mut refused = crate::settings::refused_request_fields(entry, engine, request);
    refused.extend(crate::settings::refused_request_parts(
        entry, engine, request,
    ));
    if route == Route::Completion {
        refused.extend(crate::settings::refused_prompt_list(entry, engine, request));
    }
    if !refused.is_empty() {
        return Err(ApiError::unprocessable(refused.join("; ")));
    }
    if route == Route::Chat {
        let stored = app.sessions.settings().get();
        request.extend(crate::settings::request_defaults(
            &stored, entry, engine, request,
        ));
    }
    Ok(())
}

/// The error for a request whose session ended under it.
fn ended_error(session: &Session) -> ApiError {
    let reason = session
        .end_reason()
        .unwrap_or("the model's engine stopped")
        .to_string();
    match session.state() {
        EngineState::Hung => upstream::hung_error(reason),
        _ => ApiError::engine(reason),
    }
}

/// A transport failure: when the engine died, say so (its exit is noticed
/// within moments of the broken connection), else report the failure.
async fn failure(session: &Session, what: &str) -> ApiError {
    let _ = tokio::time::timeout(Duration::from_secs(1), session.ended.cancelled()).await;
    if session.ended.is_cancelled() {
        ended_error(session)
    } else {
        ApiError::engine(format!(
            "engine '{}' serving model '{}' failed: {what}",
            session.plugin, session.model.id
        ))
    }
}

/// The engine's event stream, passed on to the client as it arrives: no
/// task or channel between the two connections. Each read of the engine's
/// socket takes every event that has arrived, and they leave in one write,
/// the client's model id put in; a read is never delayed for more, so a
/// paced stream's token leaves as soon as it comes. A client that hangs
/// up drops this stream, and with it the engine's connection.
fn sse(
    sessions: Arc<Sessions>,
    session: Arc<Session>,
    in_flight: InFlight,
    streaming: Option<Streaming>,
    body: client::Body,
    model_id: String,
    started: std::time::Instant,
) -> Response {
    let state = Relay {
        body,
        payload: BytesMut::new(),
        ended: Box::pin(session.ended.clone().cancelled_owned()),
        timings: sessions.metrics().stream(&session.model.id, started),
        streaming,
        sessions,
        session,
        _in_flight: in_flight,
        framer: SseFramer::default(),
        ends: Vec::new(),
        rewrite: ModelRewrite::new(&model_id),
        out: BytesMut::new(),
        done: false,
        finished: false,
        turn: false,
    };
    let stream = futures_util::stream::unfold(state, |mut relay| async move {
        let next = relay.next().await?;
        Some((Ok::<_, Infallible>(next), relay))
    });
    super::sse::response(stream)
}

/// One stream's relay from the engine to the client.
struct Relay {
    /// The engine's answer, read in this task.
    body: client::Body,
    /// What the last read brought of the body, unframed.
    payload: BytesMut,
    ended: std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    /// Token timings and usage, for the metrics.
    timings: StreamMetrics,
    /// Tells the health poll that this engine streams (busy, not failed).
    streaming: Option<Streaming>,
    sessions: Arc<Sessions>,
    session: Arc<Session>,
    _in_flight: InFlight,
    framer: SseFramer,
    ends: Vec<usize>,
    rewrite: ModelRewrite,
    /// Where rewritten events are written.
    out: BytesMut,
    /// Whether `data: [DONE]` went by.
    done: bool,
    /// Whether the stream has ended (after its final error event, if any).
    finished: bool,
    /// Whether the next bytes wait for the other tasks' turn.
    turn: bool,
}

impl Relay {
    /// The next bytes for the client: the events the next read completes,
    /// or one final error event; `None` once the stream is over.
    async fn next(&mut self) -> Option<Bytes> {
        if self.finished {
            return None;
        }
        // An engine that sent more than one read takes (an unpaced one,
        // or a stream that waited on a busy host) could keep this
        // connection's task running through its whole answer, while other
        // streams wait for their first token: the client's write goes out
        // and the other tasks get a turn first.
        if std::mem::take(&mut self.turn) {
            tokio::task::yield_now().await;
        }
        loop {
            if self.session.ended.is_cancelled() {
                self.finished = true;
                return Some(error_event(&ended_error(&self.session)));
            }
            let read = {
                let read = self.body.read(&mut self.payload);
                tokio::pin!(read);
                // What has already arrived is taken at once: the silence
                // timer below is armed only when the stream has to wait.
                match futures_util::poll!(read.as_mut()) {
                    std::task::Poll::Ready(read) => read,
                    std::task::Poll::Pending => {
                        // Hook (health): silence past the stream's timeout
                        // checks the engine (busy or hung).
                        let waited =
                            upstream::wait(&self.sessions, &self.session, Wait::More, read);
                        tokio::select! {
                            read = waited => match read {
                                Ok(read) => read,
                                Err(hung) => {
                                    self.finished = true;
                                    return Some(error_event(&hung));
                                }
                            },
                            _ = &mut self.ended => {
                                self.finished = true;
                                return Some(error_event(&ended_error(&self.session)));
                            }
                        }
                    }
                }
            };
            let what = match read {
                Ok(true) => {
                    if let Some(streaming) = &self.streaming {
                        streaming.chunk();
                    }
                    self.turn = self.body.more_waiting();
                    let run = self
                        .framer
                        .push(self.payload.split().freeze(), &mut self.ends);
                    if run.is_empty() {
                        continue;
                    }
                    let mut start = 0;
                    for &end in &self.ends {
                        self.timings.event(&run[start..end]);
                        self.done |= sse::is_done(&run[start..end]);
                        start = end;
                    }
                    return Some(
                        match self.rewrite.rewrite_run(&run, &self.ends, &mut self.out) {
                            // Split off, so that the buffer's memory is reused
                            // once the client's connection has written it.
                            true => self.out.split().freeze(),
                            false => run,
                        },
                    );
                }
                Err(e) => format!("the stream broke: {e}"),
                Ok(false) if self.done => {
                    self.finished = true;
                    return None;
                }
                // An engine that dies mid-stream may close the connection
                // cleanly; without [DONE] that is still a failure.
                Ok(false) => "the stream ended before [DONE]".to_string(),
            };
            self.finished = true;
            return Some(error_event(&failure(&self.session, &what).await));
        }
    }
}

/// An in-process engine's event stream, cut with a final error event when
/// its session ends under it.
fn until_ended(body: axum::body::Body, session: Arc<Session>) -> axum::body::Body {
    let ended = Box::pin(session.ended.clone().cancelled_owned());
    let state = Some((body.into_data_stream(), ended, session));
    axum::body::Body::from_stream(futures_util::stream::unfold(state, |state| async move {
        let (mut body, mut ended, session) = state?;
        tokio::select! {
            chunk = body.next() => chunk.map(|c| (c, Some((body, ended, session)))),
            _ = &mut ended => Some((Ok(error_event(&ended_error(&session))), None)),
        }
    }))
}

/// The final event of a stream that failed.
fn error_event(error: &ApiError) -> Bytes {
    Bytes::from(format!("data: {}\n\n", error.body()))
}

fn rewrite_model(value: &mut Value, model_id: &str) {
    if let Some(m) = value.get_mut("model") {
        *m = Value::String(model_id.to_string());
    }
}
