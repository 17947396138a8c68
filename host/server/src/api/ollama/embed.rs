//! Ollama's `/api/embed` (a string or a list of strings) and its older
//! `/api/embeddings` (one `prompt`), through the same embedding path as
//! OpenAI's `/v1/embeddings`: an embedding model, its engine's
//! `embeddings` capability, admission and metrics.
//!
//! Ollama truncates an input longer than the model reads unless told
//! `truncate: false`; Hangar never truncates silently, so such an input is
//! a 400 naming it either way (the field is accepted, and `false` is what
//! Hangar always does).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::super::embeddings::{self, Embedded};
use super::super::{validate, ApiError, App};
use super::{request, Refusal};

const EMBED_FIELDS: &[&str] = &[
    "model",
    "input",
    "truncate",
    "options",
    "keep_alive",
    "dimensions",
];
const EMBEDDINGS_FIELDS: &[&str] = &["model", "prompt", "options", "keep_alive"];

/// `POST /api/embed`.
#[utoipa::path(post, path = "/ollama/api/embed", tag = "ollama",
    request_body(content = super::super::schema::OllamaEmbedRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "One vector per input, in order", body = super::super::schema::OllamaEmbed),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field or the input)", body = super::super::schema::OllamaError),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::super::schema::OllamaError)
    ))]
pub(in super::super) async fn embed(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let mut label = String::from("-");
    let answer = async {
        let request = validate::object_of(&body?, EMBED_FIELDS)?;
        validate::flag(request.get("truncate"), "truncate")?;
        let inputs = match request.get("input") {
            // Ollama's clients send `input: []` to load the model.
            Some(Value::Array(a)) if a.is_empty() => Vec::new(),
            Some(Value::String(_)) | Some(Value::Array(_)) => {
                let inputs = embeddings::inputs(request.get("input"), "input")?;
                if inputs
                    .iter()
                    .any(|i| !matches!(i, hangar_plugin_api::wire::EmbedInput::Text(_)))
                {
                    return Err(ApiError::bad_request(
                        "'input' must be a string or a list of strings",
                        Some("input"),
                    ));
                }
                inputs
            }
            other => {
                return Err(ApiError::bad_request(
                    format!(
                        "'input' is required: a string or a list of strings, got {}",
                        other.map_or("nothing".into(), Value::to_string)
                    ),
                    Some("input"),
                ))
            }
        };
        let dimensions = embeddings::dimensions(request.get("dimensions"))?;
        let (name, model, unload) = prepare(&app, &request, &mut label)?;
        if inputs.is_empty() {
            match unload {
                true => drop(app.scheduler.unload(&model.id)),
                false => drop(app.scheduler.load(&model).await?),
            }
            return Ok(json!({ "model": name, "embeddings": [] }));
        }
        let Embedded {
            vectors,
            prompt_tokens,
            ..
        } = embeddings::embed(&app, &model.id, inputs, dimensions, &mut label).await?;
        if unload {
            app.scheduler.unload(&model.id);
        }
        Ok(json!({
            "model": name,
            "embeddings": vectors,
            "total_duration": started.elapsed().as_nanos() as u64,
            "load_duration": 0,
            "prompt_eval_count": prompt_tokens,
        }))
    }
    .await;
    finish(&app, &label, "/ollama/api/embed", answer)
}

/// `POST /api/embeddings` (Ollama's older route).
#[utoipa::path(post, path = "/ollama/api/embeddings", tag = "ollama",
    request_body(content = super::super::schema::OllamaEmbeddingsRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The prompt's vector", body = super::super::schema::OllamaEmbedding),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::super::schema::OllamaError),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::super::schema::OllamaError)
    ))]
pub(in super::super) async fn embeddings(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let mut label = String::from("-");
    let answer = async {
        let request = validate::object_of(&body?, EMBEDDINGS_FIELDS)?;
        let prompt = match request.get("prompt") {
            Some(Value::String(p)) if !p.is_empty() => p.clone(),
            _ => {
                return Err(ApiError::bad_request(
                    "'prompt' is required and must be a non-empty string",
                    Some("prompt"),
                ))
            }
        };
        let (_, model, unload) = prepare(&app, &request, &mut label)?;
        let inputs = vec![hangar_plugin_api::wire::EmbedInput::text(prompt)];
        let embedded = embeddings::embed(&app, &model.id, inputs, None, &mut label).await?;
        if unload {
            app.scheduler.unload(&model.id);
        }
        Ok(json!({ "embedding": embedded.vectors.into_iter().next().unwrap_or_default() }))
    }
    .await;
    finish(&app, &label, "/ollama/api/embeddings", answer)
}

/// The request's model, its `options` checked (sampling options mean
/// nothing to an embedder, but a malformed one is still refused) and its
/// `keep_alive` held for it; and whether to unload it after answering.
fn prepare(
    app: &App,
    request: &serde_json::Map<String, Value>,
    label: &mut String,
) -> Result<(String, hangar_engine::models::Model, bool), ApiError> {
    request::options(request.get("options"))?;
    let keep_alive = request::keep_alive(request.get("keep_alive"))?;
    let name = embeddings::model_field(request)?;
    let (model, _) = super::find(app, &name)?;
    label.clone_from(&model.id);
    let unload = super::hold(app, &model, keep_alive);
    Ok((name, model, unload))
}

fn finish(app: &App, label: &str, route: &str, answer: Result<Value, ApiError>) -> Response {
    let status = match &answer {
        Ok(_) => 200,
        Err(e) => e.status.as_u16(),
    };
    app.sessions.metrics().request(label, route, status);
    match answer {
        Ok(value) => Json(value).into_response(),
        Err(e) => Refusal(e).into_response(),
    }
}
