//! `POST /v1/embeddings` (OpenAI's shape) and `POST /v1/rerank` (the
//! Jina/Cohere shape that vLLM, LocalAI and oMLX share), through the same
//! scheduler, admission, memory guard, metrics and API key as chat.
//!
//! An embedding model or a reranker is a model like any other: the catalog
//! reads its kind from its files ([`ModelKind`]), resolution picks an engine
//! with the `embeddings` (or `rerank`) capability, and it loads on demand.
//! An in-process engine answers through [`Served::embed`] and
//! [`Served::rerank`]; an engine process (a `hangar worker`, llama-server)
//! serves the same two routes on loopback. Everything a client controls is
//! checked here, before any engine sees it; what only the engine knows (an
//! input longer than the model reads) comes back as a refusal naming the
//! input, never as a silent truncation.

use std::sync::Arc;

use abi_stable::std_types::{RResult, RStr};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use hangar_engine::models::{Model, ModelKind};
use hangar_plugin_api::wire::{
    EmbedInput, EmbedOutcome, EmbedRequest, InputRefusal, RerankOutcome, RerankRequest,
};
use serde_json::{json, Map, Value};

use super::{validate, ApiError, App};
use crate::sessions::{Backend, Served};

/// The most inputs one request may carry (OpenAI's own limit).
pub(crate) const MAX_INPUTS: usize = 2048;

/// The most documents one rerank request may carry.
const MAX_DOCUMENTS: usize = 1024;

/// The fields `/v1/embeddings` takes.
const EMBEDDING_FIELDS: &[&str] = &["model", "input", "encoding_format", "dimensions", "user"];

/// The fields `/v1/rerank` takes.
const RERANK_FIELDS: &[&str] = &["model", "query", "documents", "top_n", "return_documents"];

/// `POST /v1/embeddings`.
#[utoipa::path(post, path = "/v1/embeddings", tag = "openai",
    request_body(content = super::schema::EmbeddingRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "One vector per input, in order", body = super::schema::EmbeddingList),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field or the input)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn embeddings(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let mut model = String::from("-");
    let result = openai_embeddings(&app, body, &mut model).await;
    counted(&app, &model, "/v1/embeddings", result)
}

/// Counts an answer under `route` by model and status, as the chat
/// routes are counted.
fn counted(
    app: &App,
    model: &str,
    route: &str,
    result: Result<Response, ApiError>,
) -> Result<Response, ApiError> {
    let status = match &result {
        Ok(r) => r.status(),
        Err(e) => e.status,
    };
    app.sessions
        .metrics()
        .request(model, route, status.as_u16());
    result
}

async fn openai_embeddings(
    app: &Arc<App>,
    body: Result<Bytes, BytesRejection>,
    label: &mut String,
) -> Result<Response, ApiError> {
    let request = validate::object_of(&body?, EMBEDDING_FIELDS)?;
    let model_id = model_field(&request)?;
    let inputs = inputs(request.get("input"), "input")?;
    let base64 = match request.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(other) => {
            return Err(ApiError::bad_request(
                format!("'encoding_format' must be \"float\" or \"base64\", got {other}"),
                Some("encoding_format"),
            ))
        }
    };
    let dimensions = dimensions(request.get("dimensions"))?;
    if let Some(user) = request
        .get("user")
        .filter(|u| !u.is_null() && !u.is_string())
    {
        return Err(ApiError::bad_request(
            format!("'user' must be a string, got {user}"),
            Some("user"),
        ));
    }
    let embedded = embed(app, &model_id, inputs, dimensions, label).await?;
    let data: Vec<Value> = embedded
        .vectors
        .iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = match base64 {
                true => Value::String(as_base64(vector)),
                false => json!(vector),
            };
            json!({ "object": "embedding", "index": index, "embedding": embedding })
        })
        .collect();
    let usage = json!({
        "prompt_tokens": embedded.prompt_tokens,
        "total_tokens": embedded.prompt_tokens,
    });
    app.sessions.metrics().usage(&embedded.model.id, &usage);
    Ok(Json(json!({
        "object": "list",
        "data": data,
        // The name the client used (an alias stays an alias).
        "model": model_id,
        "usage": usage,
    }))
    .into_response())
}

/// The vector as OpenAI's `base64` encoding: little-endian `float32`s.
fn as_base64(vector: &[f32]) -> String {
    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The request's `model`: a non-empty string.
pub(crate) fn model_field(request: &Map<String, Value>) -> Result<String, ApiError> {
    match request.get("model") {
        Some(Value::String(m)) if !m.is_empty() => Ok(m.clone()),
        _ => Err(ApiError::bad_request(
            "'model' is required: name one of the models GET /v1/models lists",
            Some("model"),
        )),
    }
}

/// OpenAI's `input` (named `name` in the error): a string, a list of
/// strings, a list of token ids, or a list of lists of token ids; never
/// empty, no empty string, no empty token list, at most [`MAX_INPUTS`].
pub(crate) fn inputs(
    value: Option<&Value>,
    name: &'static str,
) -> Result<Vec<EmbedInput>, ApiError> {
    let refuse = |message: String| ApiError::bad_request(message, Some(name));
    let shape = "a string, a list of strings, a list of token ids or a list of lists of token ids";
    let items = match value {
        None | Some(Value::Null) => return Err(refuse(format!("'{name}' is required: {shape}"))),
        Some(Value::String(text)) => return text_input(text, name, None).map(|i| vec![i]),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(refuse(format!("'{name}' must be {shape}, got {other}"))),
    };
    if items.is_empty() {
        return Err(refuse(format!(
            "'{name}' is an empty list; send at least one input"
        )));
    }
    if items.len() > MAX_INPUTS {
        return Err(refuse(format!(
            "'{name}' holds {} inputs; at most {MAX_INPUTS} are taken per request",
            items.len()
        )));
    }
    // A flat list of numbers is one input of token ids.
    if items.iter().all(Value::is_number) {
        return token_input(items, name, None).map(|i| vec![i]);
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(text) => text_input(text, name, Some(i)),
            Value::Array(ids) => token_input(ids, name, Some(i)),
            other => Err(refuse(format!(
                "'{name}[{i}]' must be a string or a list of token ids, got {other}"
            ))),
        })
        .collect()
}

fn at(name: &str, index: Option<usize>) -> String {
    match index {
        Some(i) => format!("{name}[{i}]"),
        None => name.to_string(),
    }
}

fn text_input(
    text: &str,
    name: &'static str,
    index: Option<usize>,
) -> Result<EmbedInput, ApiError> {
    if text.is_empty() {
        return Err(ApiError::bad_request(
            format!(
                "'{}' is an empty string; there is nothing to embed",
                at(name, index)
            ),
            Some(name),
        ));
    }
    Ok(EmbedInput::text(text))
}

fn token_input(
    ids: &[Value],
    name: &'static str,
    index: Option<usize>,
) -> Result<EmbedInput, ApiError> {
    if ids.is_empty() {
        return Err(ApiError::bad_request(
            format!("'{}' is an empty list of token ids", at(name, index)),
            Some(name),
        ));
    }
    ids.iter()
        .enumerate()
        .map(|(j, id)| {
            id.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        format!(
                            "'{}[{j}]' must be a token id (a whole number from 0), got {id}",
                            at(name, index)
                        ),
                        Some(name),
                    )
                })
        })
        .collect::<Result<Vec<u32>, _>>()
        .map(EmbedInput::tokens)
}

/// OpenAI's `dimensions`: a whole number from 1, or `None`.
pub(crate) fn dimensions(value: Option<&Value>) -> Result<Option<usize>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 && n <= u32::MAX as u64 => Ok(Some(n as usize)),
            _ => Err(ApiError::bad_request(
                format!("'dimensions' must be a whole number from 1, got {v}"),
                Some("dimensions"),
            )),
        },
    }
}

/// What an embeddings request produced.
pub(crate) struct Embedded {
    /// The model that computed them.
    pub model: Model,
    /// One vector per input, in order.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens read.
    pub prompt_tokens: u32,
}

/// Embeds `inputs` with the model `model_id` (`label` gets its id once
/// known, for the metrics); `dimensions` shortens the vectors where the
/// model allows it.
pub(crate) async fn embed(
    app: &Arc<App>,
    model_id: &str,
    inputs: Vec<EmbedInput>,
    dimensions: Option<usize>,
    label: &mut String,
) -> Result<Embedded, ApiError> {
    let model = app.find_model(model_id)?;
    label.clone_from(&model.id);
    expect_kind(&model, ModelKind::Embedding, "/v1/embeddings")?;
    let (session, _in_flight) = app.scheduler.admit(&model).await?;
    let outcome = match &session.backend {
        Backend::InProcess(served) => served.embed(inputs).await?,
        Backend::Process {
            base_url,
            upstream_model,
            ..
        } => {
            let input: Vec<Value> = inputs
                .iter()
                .map(|i| match i {
                    EmbedInput::Text(t) => json!(t),
                    EmbedInput::Tokens(ids) => json!(ids),
                    _ => Value::Null,
                })
                .collect();
            let mut body = json!({ "input": input, "encoding_format": "float" });
            if let Some(upstream) = upstream_model {
                body["model"] = json!(upstream);
            }
            let answer = post(
                app,
                &session.plugin,
                &format!("{base_url}/v1/embeddings"),
                &body,
                "input",
            )
            .await?;
            read_embeddings(&answer, inputs.len())
                .map_err(|e| ApiError::engine(format!("engine '{}': {e}", session.plugin)))?
        }
    };
    if let Some(refused) = &outcome.refused {
        return Err(refusal("input", refused));
    }
    let mut vectors = outcome.embeddings;
    if let Some(wanted) = dimensions {
        shorten(&model, &mut vectors, wanted, outcome.normalized).await?;
    }
    Ok(Embedded {
        model,
        vectors,
        prompt_tokens: outcome.prompt_tokens,
    })
}

/// A request of the wrong kind for `model` is the client's mistake: a 400
/// naming the model's kind and the route its kind takes.
pub(crate) fn expect_kind(model: &Model, wanted: ModelKind, route: &str) -> Result<(), ApiError> {
    if model.kind == wanted {
        return Ok(());
    }
    let (article, serves) = match model.kind {
        ModelKind::Chat => ("a", "chat and completions (/v1/chat/completions, /v1/completions, /v1/messages, /v1/responses)"),
        ModelKind::Embedding => ("an", "embeddings (/v1/embeddings)"),
        ModelKind::Rerank => ("a", "reranking (/v1/rerank)"),
    };
    Err(ApiError {
        code: "wrong_model_kind",
        ..ApiError::bad_request(
            format!(
                "model '{}' is {article} {} model: it serves {serves}, not {route}; \
                 GET /v1/models lists every model with its kind",
                model.id, model.kind
            ),
            Some("model"),
        )
    })
}

/// An engine's refusal of one input: a 400 naming it.
fn refusal(field: &'static str, refused: &InputRefusal) -> ApiError {
    ApiError::bad_request(
        format!("'{field}[{}]': {}", refused.input, refused.message),
        Some(field),
    )
}

/// Sends `body` to an engine process and reads its JSON answer; the
/// engine's own 4xx in OpenAI's shape is passed on as the client's, and so
/// is its 5xx for an input too long to read (`field` names what carries
/// the inputs).
async fn post(
    app: &App,
    plugin: &str,
    url: &str,
    body: &Value,
    field: &'static str,
) -> Result<Value, ApiError> {
    let response = app
        .sessions
        .client()
        .post(url)
        .json(body)
        .send()
        .await
        .map_err(|e| ApiError::engine(format!("engine '{plugin}' did not answer: {e}")))?;
    let status = response.status();
    let bytes = response
        .bytes()
        .await
        .map_err(|e| ApiError::engine(format!("engine '{plugin}' broke off its answer: {e}")))?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|_| {
        let text: String = String::from_utf8_lossy(&bytes).chars().take(300).collect();
        ApiError::engine(format!("engine '{plugin}' answered {status}: {text}"))
    })?;
    if status.is_success() {
        return Ok(value);
    }
    Err(engine_refusal(plugin, status, &value, field))
}

/// An engine's error answer as the host's. llama-server answers 500 for
/// an input longer than one physical batch ("input (N tokens) is too large
/// to process"), which for an encoder is an input longer than the model
/// reads at once: the client's to shorten, so a 400 naming `field`, not an
/// engine failure.
fn engine_refusal(
    plugin: &str,
    status: StatusCode,
    value: &Value,
    field: &'static str,
) -> ApiError {
    let message = value
        .pointer("/error/message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| value.to_string());
    // The field a refusal names (a worker's, llama-server's), where it is
    // one of this route's.
    let param = value
        .pointer("/error/param")
        .and_then(Value::as_str)
        .and_then(|p| {
            EMBEDDING_FIELDS
                .iter()
                .chain(RERANK_FIELDS)
                .find(|f| **f == p)
        })
        .copied();
    let lower = message.to_ascii_lowercase();
    let too_long = lower.contains("too large to process")
        || (lower.contains("context") && lower.contains("exceed"));
    if too_long {
        return ApiError {
            code: "context_length_exceeded",
            ..ApiError::bad_request(
                format!(
                    "an entry of '{field}' is longer than the model reads at once \
                     (engine '{plugin}': {message}); shorten or split it"
                ),
                Some(field),
            )
        };
    }
    let mut error = match status.is_client_error() {
        true => ApiError::bad_request(message, param),
        false => ApiError::engine(format!("engine '{plugin}' answered {status}: {message}")),
    };
    error.status = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    error
}

/// An OpenAI embeddings answer as an [`EmbedOutcome`], checked: one vector
/// per input, all of one length.
fn read_embeddings(answer: &Value, inputs: usize) -> Result<EmbedOutcome, String> {
    let data = answer
        .get("data")
        .and_then(Value::as_array)
        .ok_or("its embeddings answer has no 'data' list")?;
    let mut vectors = vec![Vec::new(); data.len()];
    for (i, item) in data.iter().enumerate() {
        let index = item
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or(i as u64) as usize;
        let vector = item
            .get("embedding")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("embedding {i} is not a list of numbers"))?
            .iter()
            .map(|x| x.as_f64().map(|x| x as f32))
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| format!("embedding {i} is not a list of numbers"))?;
        *vectors
            .get_mut(index)
            .ok_or_else(|| format!("embedding {i} has index {index}, past the inputs"))? = vector;
    }
    if vectors.len() != inputs
        || vectors
            .iter()
            .any(|v| v.is_empty() || v.len() != vectors[0].len())
    {
        return Err(format!(
            "it answered {} vectors of uneven or zero length for {inputs} inputs",
            vectors.len()
        ));
    }
    let tokens = answer
        .pointer("/usage/prompt_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let normalized = vectors.iter().all(|v| (norm(v) - 1.0).abs() < 1e-3);
    Ok(EmbedOutcome::new(
        vectors,
        tokens.min(u32::MAX as u64) as u32,
        "",
        normalized,
    ))
}

fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

/// Cuts every vector to `wanted` dimensions (re-normalised when they were
/// normalised), where the model was trained for it: its `config.json`
/// declares `matryoshka_dimensions` (and `wanted` is one of them) or
/// `is_matryoshka`. Its own dimension is always accepted.
async fn shorten(
    model: &Model,
    vectors: &mut [Vec<f32>],
    wanted: usize,
    normalized: bool,
) -> Result<(), ApiError> {
    let full = vectors.first().map_or(0, Vec::len);
    if wanted == full {
        return Ok(());
    }
    let refuse = |why: String| ApiError::bad_request(why, Some("dimensions"));
    if wanted > full {
        return Err(refuse(format!(
            "model '{}' computes {full} dimensions; 'dimensions' may not ask for {wanted}",
            model.id
        )));
    }
    let path = model.path.join("config.json");
    let config: Value = tokio::task::spawn_blocking(move || {
        std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    })
    .await
    .ok()
    .flatten()
    .unwrap_or(Value::Null);
    let allowed: Option<Vec<u64>> = config
        .get("matryoshka_dimensions")
        .and_then(Value::as_array)
        .map(|d| d.iter().filter_map(Value::as_u64).collect());
    let trained = match &allowed {
        Some(dims) => dims.contains(&(wanted as u64)),
        None => config.get("is_matryoshka").and_then(Value::as_bool) == Some(true),
    };
    if !trained {
        let which = match allowed {
            Some(dims) => format!(
                "only {} (its matryoshka_dimensions) or {full}",
                dims.iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => format!("only its own {full} (it declares no matryoshka dimensions)"),
        };
        return Err(refuse(format!(
            "model '{}' was not trained to be cut to {wanted} dimensions: 'dimensions' may be {which}",
            model.id
        )));
    }
    for v in vectors.iter_mut() {
        v.truncate(wanted);
        if normalized {
            let n = norm(v);
            if n > 0.0 {
                v.iter_mut().for_each(|x| *x /= n);
            }
        }
    }
    Ok(())
}

/// `POST /v1/rerank`.
#[utoipa::path(post, path = "/v1/rerank", tag = "openai",
    request_body(content = super::schema::RerankRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The documents' scores, best first", body = super::schema::RerankAnswer),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field or the document)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn rerank(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let mut model = String::from("-");
    let result = rerank_answer(&app, body, &mut model).await;
    counted(&app, &model, "/v1/rerank", result)
}

async fn rerank_answer(
    app: &Arc<App>,
    body: Result<Bytes, BytesRejection>,
    label: &mut String,
) -> Result<Response, ApiError> {
    let request = validate::object_of(&body?, RERANK_FIELDS)?;
    let model_id = model_field(&request)?;
    let query = match request.get("query") {
        Some(Value::String(q)) if !q.is_empty() => q.clone(),
        Some(Value::String(_)) => {
            return Err(ApiError::bad_request(
                "'query' is an empty string",
                Some("query"),
            ))
        }
        other => {
            return Err(ApiError::bad_request(
                format!(
                    "'query' is required and must be a string, got {}",
                    shown(other)
                ),
                Some("query"),
            ))
        }
    };
    let documents = documents(request.get("documents"))?;
    let top_n = match request.get("top_n") {
        None | Some(Value::Null) => documents.len(),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => (n as usize).min(documents.len()),
            _ => {
                return Err(ApiError::bad_request(
                    format!("'top_n' must be a whole number from 1, got {v}"),
                    Some("top_n"),
                ))
            }
        },
    };
    let return_documents =
        validate::flag(request.get("return_documents"), "return_documents")?.unwrap_or(true);
    let model = app.find_model(&model_id)?;
    label.clone_from(&model.id);
    expect_kind(&model, ModelKind::Rerank, "/v1/rerank")?;
    let (session, _in_flight) = app.scheduler.admit(&model).await?;
    let (scores, tokens) = match &session.backend {
        Backend::InProcess(served) => {
            let outcome = served.rerank(query, documents.clone()).await?;
            if let Some(refused) = &outcome.refused {
                return Err(refusal("documents", refused));
            }
            (relevance(&outcome.scores), outcome.prompt_tokens)
        }
        Backend::Process {
            base_url,
            upstream_model,
            ..
        } => {
            let mut body =
                json!({ "query": query, "documents": documents, "return_documents": false });
            if let Some(upstream) = upstream_model {
                body["model"] = json!(upstream);
            }
            let answer = post(
                app,
                &session.plugin,
                &format!("{base_url}/v1/rerank"),
                &body,
                "documents",
            )
            .await?;
            read_scores(&answer, documents.len())
                .map_err(|e| ApiError::engine(format!("engine '{}': {e}", session.plugin)))?
        }
    };
    let mut order: Vec<usize> = (0..scores.len()).collect();
    // Best first; ties keep the documents' order.
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let results: Vec<Value> = order
        .into_iter()
        .take(top_n)
        .map(|i| {
            let mut result = json!({ "index": i, "relevance_score": scores[i] });
            if return_documents {
                result["document"] = json!({ "text": documents[i] });
            }
            result
        })
        .collect();
    let usage = json!({ "prompt_tokens": tokens, "total_tokens": tokens });
    app.sessions.metrics().usage(&model.id, &usage);
    Ok(Json(json!({
        "id": format!("rerank-{}", super::inprocess::unique()),
        "model": model_id,
        "results": results,
        "usage": usage,
    }))
    .into_response())
}

fn shown(value: Option<&Value>) -> String {
    value.map_or_else(|| "nothing".to_string(), Value::to_string)
}

/// `documents`: a non-empty list of strings (or of `{"text": …}` objects,
/// as Jina's clients send), at most [`MAX_DOCUMENTS`].
fn documents(value: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let refuse = |m: String| ApiError::bad_request(m, Some("documents"));
    let Some(Value::Array(items)) = value else {
        return Err(refuse(format!(
            "'documents' is required and must be a list of strings, got {}",
            shown(value)
        )));
    };
    if items.is_empty() {
        return Err(refuse(
            "'documents' is an empty list; send at least one".into(),
        ));
    }
    if items.len() > MAX_DOCUMENTS {
        return Err(refuse(format!(
            "'documents' holds {} documents; at most {MAX_DOCUMENTS} are taken per request",
            items.len()
        )));
    }
    items
        .iter()
        .enumerate()
        .map(
            |(i, d)| match d.as_str().or_else(|| d.get("text")?.as_str()) {
                Some(text) if !text.is_empty() => Ok(text.to_string()),
                Some(_) => Err(refuse(format!("'documents[{i}]' is an empty string"))),
                None => Err(refuse(format!(
                    "'documents[{i}]' must be a string or {{\"text\": string}}, got {d}"
                ))),
            },
        )
        .collect()
}

/// A cross-encoder's raw scores as relevance in 0..1 (the logistic
/// function, as sentence-transformers' `CrossEncoder` and vLLM give for
/// one-label models).
fn relevance(logits: &[f32]) -> Vec<f32> {
    logits.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect()
}

/// A rerank answer's scores by document index, checked.
fn read_scores(answer: &Value, documents: usize) -> Result<(Vec<f32>, u32), String> {
    let results = answer
        .get("results")
        .and_then(Value::as_array)
        .ok_or("its rerank answer has no 'results' list")?;
    let mut scores = vec![None; documents];
    for r in results {
        let index = r
            .get("index")
            .and_then(Value::as_u64)
            .ok_or("a result has no index")? as usize;
        let score = r
            .get("relevance_score")
            .and_then(Value::as_f64)
            .ok_or("a result has no relevance_score")?;
        *scores
            .get_mut(index)
            .ok_or_else(|| format!("a result has index {index}, past the documents"))? =
            Some(score as f32);
    }
    let scores = scores
        .into_iter()
        .collect::<Option<Vec<f32>>>()
        .ok_or("it scored fewer documents than it was sent")?;
    let tokens = answer
        .pointer("/usage/total_tokens")
        .or_else(|| answer.pointer("/usage/prompt_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Ok((scores, tokens.min(u32::MAX as u64) as u32))
}

impl Served {
    /// Embeds `inputs` with the in-process engine, off the async threads.
    pub(crate) async fn embed(&self, inputs: Vec<EmbedInput>) -> Result<EmbedOutcome, ApiError> {
        let json = serde_json::to_string(&EmbedRequest::new(inputs)).expect("requests serialize");
        self.call(move |engine| engine.embed(RStr::from_str(&json)))
            .await
    }

    /// Scores `documents` against `query` with the in-process engine.
    pub(crate) async fn rerank(
        &self,
        query: String,
        documents: Vec<String>,
    ) -> Result<RerankOutcome, ApiError> {
        let json = serde_json::to_string(&RerankRequest::new(query, documents))
            .expect("requests serialize");
        self.call(move |engine| engine.rerank(RStr::from_str(&json)))
            .await
    }

    /// Runs one blocking call into the engine under the session's gate and
    /// reads its JSON answer.
    async fn call<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
        call: impl FnOnce(
                &hangar_engine::loader::native::InProcessEngine,
            )
                -> RResult<abi_stable::std_types::RString, abi_stable::std_types::RString>
            + Send
            + 'static,
    ) -> Result<T, ApiError> {
        let engine = self.engine.clone();
        let permit = self
            .gate
            .clone()
            .acquire_owned()
            .await
            .expect("the gate is never closed");
        let model = self.model_id.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            match call(&engine) {
                RResult::ROk(out) => serde_json::from_str::<T>(out.as_str()).map_err(|e| {
                    ApiError::engine(format!("the engine returned an unreadable answer: {e}"))
                }),
                RResult::RErr(e) => Err(ApiError::engine(format!("model '{model}': {e}"))),
            }
        })
        .await
        .map_err(|e| ApiError::engine(format!("the engine's call did not finish: {e}")))?
    }
}

/// The worker's `/v1/embeddings`: the in-process engine's vectors in
/// OpenAI's shape (floats), for the host to finish.
pub(crate) async fn worker_embeddings(served: &Served, body: &[u8]) -> Result<Response, ApiError> {
    let request = validate::object_of(body, EMBEDDING_FIELDS)?;
    let inputs = inputs(request.get("input"), "input")?;
    let outcome = served.embed(inputs).await?;
    if let Some(refused) = &outcome.refused {
        return Err(refusal("input", refused));
    }
    let data: Vec<Value> = outcome
        .embeddings
        .iter()
        .enumerate()
        .map(|(index, v)| json!({ "object": "embedding", "index": index, "embedding": v }))
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": served.model_id,
        "usage": { "prompt_tokens": outcome.prompt_tokens, "total_tokens": outcome.prompt_tokens },
    }))
    .into_response())
}

/// The worker's `/v1/rerank`: relevance by document, unsorted.
pub(crate) async fn worker_rerank(served: &Served, body: &[u8]) -> Result<Response, ApiError> {
    let request = validate::object_of(body, RERANK_FIELDS)?;
    let query = request
        .get("query")
        .and_then(Value::as_str)
        .filter(|q| !q.is_empty())
        .ok_or_else(|| ApiError::bad_request("'query' must be a non-empty string", Some("query")))?
        .to_string();
    let documents = documents(request.get("documents"))?;
    let outcome = served.rerank(query, documents).await?;
    if let Some(refused) = &outcome.refused {
        return Err(refusal("documents", refused));
    }
    let results: Vec<Value> = relevance(&outcome.scores)
        .iter()
        .enumerate()
        .map(|(index, score)| json!({ "index": index, "relevance_score": score }))
        .collect();
    Ok(Json(json!({
        "model": served.model_id,
        "results": results,
        "usage": { "prompt_tokens": outcome.prompt_tokens, "total_tokens": outcome.prompt_tokens },
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_longer_than_llama_server_reads_is_the_clients_400_naming_it() {
        // What llama-server 0.6.0-dev answered for a 522-token input to a
        // BERT GGUF of 512 positions (tests/e2e/test_embeddings_llama.py).
        let answer = json!({"error": {"code": 500, "type": "server_error", "message":
            "input (522 tokens) is too large to process. increase the physical batch size (current batch size: 512)"}});
        let e = engine_refusal(
            "llama-server",
            StatusCode::INTERNAL_SERVER_ERROR,
            &answer,
            "input",
        );
        assert_eq!(
            (e.status, e.code, e.param.as_deref()),
            (
                StatusCode::BAD_REQUEST,
                "context_length_exceeded",
                Some("input")
            )
        );
        assert!(
            e.message.contains("'input'") && e.message.contains("522 tokens"),
            "{}",
            e.message
        );
        let e = engine_refusal(
            "llama-server",
            StatusCode::INTERNAL_SERVER_ERROR,
            &answer,
            "documents",
        );
        assert_eq!(e.param.as_deref(), Some("documents"));
        // Any other engine failure stays one, with the engine's status.
        let other = json!({"error": {"message": "out of memory"}});
        let e = engine_refusal(
            "llama-server",
            StatusCode::INTERNAL_SERVER_ERROR,
            &other,
            "input",
        );
        assert_eq!(
            (e.status, e.code),
            (StatusCode::INTERNAL_SERVER_ERROR, "engine_failed")
        );
        let bad = json!({"error": {"message": "Prompt contains invalid tokens"}});
        let e = engine_refusal("llama-server", StatusCode::BAD_REQUEST, &bad, "input");
        assert_eq!(
            (e.status, e.message.as_str()),
            (StatusCode::BAD_REQUEST, "Prompt contains invalid tokens")
        );
    }

    fn read(value: Value) -> Result<Vec<EmbedInput>, String> {
        inputs(Some(&value), "input").map_err(|e| e.message)
    }

    #[test]
    fn every_openai_input_shape_is_read() {
        assert_eq!(read(json!("hi")).unwrap(), vec![EmbedInput::text("hi")]);
        assert_eq!(
            read(json!(["a", "b"])).unwrap(),
            vec![EmbedInput::text("a"), EmbedInput::text("b")]
        );
        assert_eq!(
            read(json!([1, 2, 3])).unwrap(),
            vec![EmbedInput::tokens(vec![1, 2, 3])]
        );
        assert_eq!(
            read(json!([[1, 2], [3]])).unwrap(),
            vec![EmbedInput::tokens(vec![1, 2]), EmbedInput::tokens(vec![3])]
        );
    }

    #[test]
    fn bad_inputs_are_refused_by_name_never_coerced() {
        for (value, says) in [
            (json!(""), "'input' is an empty string"),
            (json!([]), "'input' is an empty list"),
            (json!(["a", ""]), "'input[1]' is an empty string"),
            (json!([[1], []]), "'input[1]' is an empty list of token ids"),
            (json!([1, -2]), "'input[1]' must be a token id"),
            (json!([1.5]), "'input[0]' must be a token id"),
            (
                json!([[1, 4294967296u64]]),
                "'input[0][1]' must be a token id",
            ),
            (
                json!(["a", 5]),
                "'input[1]' must be a string or a list of token ids",
            ),
            (json!({"text": "a"}), "'input' must be a string"),
            (json!(null), "'input' is required"),
        ] {
            let message = read(value.clone()).unwrap_err();
            assert!(message.contains(says), "{value}: {message}");
        }
        let many = Value::Array(vec![json!("x"); MAX_INPUTS + 1]);
        assert!(read(many).unwrap_err().contains("at most 2048"));
    }

    #[test]
    fn dimensions_and_documents_are_checked() {
        assert_eq!(dimensions(Some(&json!(64))).unwrap(), Some(64));
        for bad in [json!(0), json!(-1), json!(2.5), json!("64")] {
            assert_eq!(
                dimensions(Some(&bad)).unwrap_err().param.as_deref(),
                Some("dimensions")
            );
        }
        assert_eq!(
            documents(Some(&json!(["a", {"text": "b"}]))).unwrap(),
            ["a", "b"]
        );
        for (bad, says) in [
            (json!([]), "empty list"),
            (json!(["a", ""]), "'documents[1]' is an empty string"),
            (json!(["a", 3]), "'documents[1]' must be a string"),
            (json!("a"), "must be a list of strings"),
        ] {
            let e = documents(Some(&bad)).unwrap_err();
            assert!(e.message.contains(says), "{bad}: {}", e.message);
            assert_eq!(e.param.as_deref(), Some("documents"));
        }
    }

    #[test]
    fn base64_is_little_endian_float32() {
        let encoded = as_base64(&[1.0, -2.5]);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        assert_eq!(
            bytes,
            [1.0f32.to_le_bytes(), (-2.5f32).to_le_bytes()].concat()
        );
    }

    #[test]
    fn engine_answers_are_checked_before_they_are_passed_on() {
        let answer = json!({"data": [
            {"index": 1, "embedding": [0.0, 1.0]},
            {"index": 0, "embedding": [1.0, 0.0]}
        ], "usage": {"prompt_tokens": 7}});
        let outcome = read_embeddings(&answer, 2).unwrap();
        assert_eq!(outcome.embeddings, vec![vec![1.0, 0.0], vec![0.0, 1.0]]);
        assert_eq!(outcome.prompt_tokens, 7);
        assert!(outcome.normalized);
        assert!(read_embeddings(&answer, 3).is_err());
        let uneven = json!({"data": [{"embedding": [1.0]}, {"embedding": [1.0, 0.0]}]});
        assert!(read_embeddings(&uneven, 2).is_err());
        let scores = json!({"results": [
            {"index": 1, "relevance_score": 0.25},
            {"index": 0, "relevance_score": 0.5}
        ], "usage": {"total_tokens": 9}});
        assert_eq!(read_scores(&scores, 2).unwrap(), (vec![0.5, 0.25], 9));
        assert!(read_scores(&scores, 3).is_err());
    }

    #[test]
    fn relevance_is_the_logistic_of_the_score() {
        let r = relevance(&[0.0, 2.0, -2.0]);
        assert!((r[0] - 0.5).abs() < 1e-6);
        assert!((r[1] - 0.880_797).abs() < 1e-5);
        assert!((r[1] + r[2] - 1.0).abs() < 1e-6);
    }
}
