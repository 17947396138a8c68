//! Ollama's native API, for the apps that speak only it: `/api/chat`,
//! `/api/generate`, `/api/embed`, `/api/tags`, `/api/show`, `/api/ps`, `/api/version`,
//! translated by the host to the OpenAI requests every engine serves.
//!
//! Hangar's own `/api/*` is its management API, so on Hangar's port these
//! routes live under [`PREFIX`] (`/ollama/api/chat`; the `ollama` Python
//! client takes `Client(host="http://HOST:PORT/ollama")`). With
//! `hangar serve --ollama-port 11434` a second listener answers them at its
//! root, where Ollama's clients look by default ([`root_router`]).
//!
//! Like `/v1/messages`, a request is validated here field by field (every
//! refusal a 400 naming the field), turned into an OpenAI request (always
//! streamed, with usage) and sent through [`super::openai::proxy`], so that
//! API keys, validation, gating, admission, health waits and metrics are the
//! chat routes' own. The engine's chunks become Ollama's NDJSON lines
//! (`application/x-ndjson`, a final object with `done: true`, why and the
//! counts and durations in nanoseconds), or, for `"stream": false`, one
//! object. `keep_alive` sets how long the model stays loaded once idle (see
//! [`request::KeepAlive`]).
//!
//! `DELETE /api/delete` removes a model from disk as
//! `DELETE /api/models/{id}?force=true` does (a loaded model is unloaded
//! first, as `ollama rm` stops a running one). Ollama's management verbs
//! that Hangar has no counterpart for (`pull`, `push`, `create`, `copy`,
//! `blobs`) answer 501 saying what to use instead. `/api/embed` and `/api/embeddings` go the way of
//! `/v1/embeddings` ([`embed`]).
//!
//! Every error is in Ollama's shape, `{"error": "..."}`, with the status
//! the OpenAI routes would give; an unknown model is a 404
//! `model 'x' not found`, as Ollama says it.

mod answer;
pub(super) mod embed;
mod request;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde_json::{json, Map, Value};

use super::{ApiError, App};
use hangar_engine::models::Model;
use request::{Ask, KeepAlive};

/// Where Ollama's routes live on Hangar's own port.
pub(crate) const PREFIX: &str = "/ollama";

/// Ollama's routes, at their own paths (`/api/chat`): nested under
/// [`PREFIX`] on Hangar's port, at the root of the `--ollama-port` one.
pub(super) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/api/tags", get(tags))
        .route("/api/show", post(show))
        .route("/api/chat", post(chat))
        .route("/api/generate", post(generate))
        .route("/api/ps", get(ps))
        .route("/api/version", get(version))
        .route("/api/embed", post(embed::embed))
        .route("/api/embeddings", post(embed::embeddings))
        .route("/api/pull", post(pull))
        .route("/api/push", post(push))
        .route("/api/create", post(create))
        .route("/api/copy", post(copy))
        .route("/api/delete", delete(remove))
        .route("/api/blobs/{digest}", post(blobs))
}

/// The router of the `--ollama-port` listener: Ollama's API at its root,
/// behind the same key, body limit and stall watch as Hangar's port, and
/// `GET /` answering `Ollama is running`, as clients probe it.
pub(crate) fn root_router(app: Arc<App>) -> Router {
    routes()
        .layer(middleware::from_fn_with_state(app.clone(), authorize))
        .route("/", get(|| async { "Ollama is running" }))
        .layer(DefaultBodyLimit::max(super::MAX_BODY_MIB * 1024 * 1024))
        .layer(middleware::from_fn_with_state(
            app.clone(),
            super::stall::watch,
        ))
        .fallback(|| async {
            Refusal(ApiError::not_found(
                "no such route; Ollama's API here is /api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version",
            ))
        })
        .with_state(app)
}

async fn authorize(
    State(app): State<Arc<App>>,
    request: Request,
    next: Next,
) -> Result<Response, Refusal> {
    match app.authorized(request.headers()) {
        true => Ok(next.run(request).await),
        false => Err(Refusal(ApiError::unauthorized())),
    }
}

/// An error in Ollama's shape, `{"error": "..."}`.
#[derive(Debug)]
pub(super) struct Refusal(pub(super) ApiError);

impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Refusal {
        Refusal(e)
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response =
            (self.0.status, Json(json!({ "error": self.0.message }))).into_response();
        if let Some(secs) = self.0.retry_after {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert("retry-after", v);
            }
        }
        response
    }
}

/// The model a client names: its id, alias or profile (`MODEL:PROFILE`),
/// or any of those with Ollama's default tag (`tiny-llama:latest`); with
/// the name as Hangar knows it (the tag dropped), or a 404 in Ollama's
/// words when there is none.
fn find(app: &App, name: &str) -> Result<(Model, String), ApiError> {
    let found = app
        .find_named(name)
        .map(|n| (n.model, name.to_string()))
        .or_else(|e| match name.strip_suffix(":latest") {
            Some(id) => app.find_named(id).map(|n| (n.model, id.to_string())),
            None => Err(e),
        });
    found.map_err(|e| match e.code {
        "model_not_found" => ApiError {
            message: format!("model '{name}' not found; GET /api/tags lists the models there are"),
            ..e
        },
        _ => e,
    })
}

/// The model a management request names: its id or alias, with or
/// without Ollama's default tag; a profile's name is a 400 (a profile is no
/// model of its own), an unknown name a 404 in Ollama's words.
fn find_own(app: &App, name: &str) -> Result<Model, ApiError> {
    let found = app
        .find_model(name)
        .or_else(|e| match name.strip_suffix(":latest") {
            Some(id) if e.status == StatusCode::NOT_FOUND => app.find_model(id),
            _ => Err(e),
        });
    found.map_err(|e| match e.code {
        "model_not_found" => ApiError {
            message: format!("model '{name}' not found; GET /api/tags lists the models there are"),
            ..e
        },
        _ => e,
    })
}

/// `POST /api/chat`.
#[utoipa::path(post, path = "/ollama/api/chat", tag = "ollama",
    request_body(content = super::schema::OllamaChatRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The answer, whole or as NDJSON lines (`stream` is true unless false)", content((super::schema::OllamaChatLine = "application/json"), (super::schema::OllamaChatLine = "application/x-ndjson"))),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::OllamaError),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::OllamaError)
    ))]
pub(super) async fn chat(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let ask = body.map_err(ApiError::from).and_then(|b| request::chat(&b));
    serve(app, "/ollama/api/chat", ask).await
}

/// `POST /api/generate`.
#[utoipa::path(post, path = "/ollama/api/generate", tag = "ollama",
    request_body(content = super::schema::OllamaGenerateRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The completion, whole or as NDJSON lines (`stream` is true unless false); without a prompt, the model loaded (or unloaded, with keep_alive 0)", content((super::schema::OllamaGenerateLine = "application/json"), (super::schema::OllamaGenerateLine = "application/x-ndjson"))),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::OllamaError),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::OllamaError)
    ))]
pub(super) async fn generate(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let ask = body
        .map_err(ApiError::from)
        .and_then(|b| request::generate(&b));
    serve(app, "/ollama/api/generate", ask).await
}

/// Serves a translated request: through the proxy, or, without a prompt,
/// a load or an unload.
async fn serve(app: Arc<App>, route: &'static str, ask: Result<Ask, ApiError>) -> Response {
    let model = ask.and_then(|ask| find(&app, &ask.name).map(|found| (ask, found)));
    let (mut ask, (model, name)) = match model {
        Ok(found) => found,
        // Counted like any refusal of the chat routes.
        Err(e) => {
            let e = super::openai::proxy(app, route, "", Err(e), Default::default())
                .await
                .err();
            return Refusal(e.unwrap_or_else(|| ApiError::internal("refused, then served")))
                .into_response();
        }
    };
    let unload = hold(&app, &model, ask.keep_alive);
    let Some(mut openai) = ask.openai.take() else {
        return load_or_unload(&app, &ask, &model, unload).await;
    };
    // The name, not the id: a profile's settings apply in the proxy.
    openai.insert("model".into(), json!(name));
    match super::openai::proxy(app.clone(), route, ask.path, Ok(openai), Default::default()).await {
        Ok(response) => {
            let of = response
                .extensions()
                .get::<super::stall::AnswerOf>()
                .cloned();
            let after = unload.then(|| (app.clone(), model.id.clone()));
            let mut translated = answer::answer(response, ask, after).await;
            if let Some(of) = of {
                translated.extensions_mut().insert(of);
            }
            translated
        }
        Err(e) => Refusal(e).into_response(),
    }
}

/// Holds `keep_alive` for `model`: how long it stays, from this request
/// on, as Ollama does (none given: back to the model's settings). Returns
/// whether the model is to be unloaded once this request is answered.
fn hold(app: &App, model: &Model, keep_alive: Option<KeepAlive>) -> bool {
    let ttl = match keep_alive {
        None | Some(KeepAlive::Unload) => None,
        Some(KeepAlive::Forever) => Some(None),
        Some(KeepAlive::For(d)) => Some(Some(d.as_millis().try_into().unwrap_or(u64::MAX))),
    };
    app.scheduler.keep_alive(&model.id, ttl);
    keep_alive == Some(KeepAlive::Unload)
}

/// Ollama's answer to a request without a prompt: the model loaded, or
/// with `keep_alive` 0 unloaded.
async fn load_or_unload(app: &Arc<App>, ask: &Ask, model: &Model, unload: bool) -> Response {
    let reason = match unload {
        true => {
            app.scheduler.unload(&model.id);
            "unload"
        }
        false => match app.scheduler.load(model).await {
            Ok(_) => "load",
            Err(e) => return Refusal(e.into()).into_response(),
        },
    };
    let mut line = answer::line(ask.kind, &ask.name, "", None);
    line.insert("done".into(), json!(true));
    line.insert("done_reason".into(), json!(reason));
    Json(Value::Object(line)).into_response()
}

/// `GET /api/tags`: the models of the model dirs, in Ollama's shape.
#[utoipa::path(get, path = "/ollama/api/tags", tag = "ollama",
    responses(
        (status = 200, description = "OK", body = super::schema::OllamaTags),
        (status = "4XX", description = "The request cannot be served as sent", body = super::schema::OllamaError)
    ))]
pub(super) async fn tags(State(app): State<Arc<App>>) -> Json<Value> {
    let discovery = app.discovery();
    let stored = app.sessions.settings().get();
    let mut models = Vec::with_capacity(discovery.models.len());
    for model in &discovery.models {
        models.push(listed(model));
        // Aliases and profiles too, under their own names.
        let names = crate::names::listed_names(&discovery, &stored, &model.id);
        for name in names.aliases.into_iter().chain(names.profiles) {
            let mut row = listed(model);
            row["name"] = json!(name);
            row["model"] = json!(name);
            models.push(row);
        }
    }
    Json(json!({ "models": models }))
}

/// One model as `/api/tags` and `/api/ps` list it. The `digest` names the
/// model's path and size, not its content: Hangar reads no weights to list
/// them.
fn listed(model: &Model) -> Value {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{}\n{}", model.path.display(), model.size_bytes));
    let modified = std::fs::metadata(&model.path)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    json!({
        "name": model.id,
        "model": model.id,
        "modified_at": timestamp(modified),
        "size": model.size_bytes,
        "digest": digest.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        "details": details(model),
    })
}

/// Ollama's `details`, as far as the model's `config.json` tells.
fn details(model: &Model) -> Value {
    let config = config_of(model);
    let family = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let quantization = config
        .pointer("/quantization/bits")
        .and_then(Value::as_u64)
        .map(|bits| format!("Q{bits}"))
        .unwrap_or_default();
    json!({
        "parent_model": "",
        "format": model.format,
        "family": family,
        "families": if family.is_empty() { json!(null) } else { json!([family]) },
        "parameter_size": "",
        "quantization_level": quantization,
    })
}

/// The model's `config.json` (MLX folders have one), or `null`.
fn config_of(model: &Model) -> Value {
    std::fs::read(model.path.join("config.json"))
        .ok()
        .and_then(|text| serde_json::from_slice(&text).ok())
        .unwrap_or(Value::Null)
}

/// RFC 3339, as Ollama writes times.
fn timestamp(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

/// `POST /api/show`.
#[utoipa::path(post, path = "/ollama/api/show", tag = "ollama",
    request_body(content = super::schema::OllamaShowRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "OK", body = super::schema::OllamaShow),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::OllamaError)
    ))]
pub(super) async fn show(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, Refusal> {
    let name = body
        .map_err(ApiError::from)
        .and_then(|b| request::show(&b))?;
    let (model, _) = find(&app, &name)?;
    let config = config_of(&model);
    let mut capabilities = vec!["completion"];
    if let Some((_, engine)) = app.sessions.serving(&model).await {
        let on = |c: &str| engine.capabilities.get(c).is_some_and(|s| s.is_on());
        if on("tool_calls") {
            capabilities.push("tools");
        }
    }
    let architecture = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut info = Map::new();
    info.insert("general.architecture".into(), json!(architecture));
    if let Some(n) = config.get("max_position_embeddings") {
        info.insert(format!("{architecture}.context_length"), n.clone());
    }
    let listed = listed(&model);
    Ok(Json(json!({
        "modelfile": format!("# Served by Hangar ({} format)\nFROM {}\n", model.format, model.path.display()),
        "parameters": "",
        "template": "",
        "details": listed["details"],
        "model_info": info,
        "capabilities": capabilities,
        "modified_at": listed["modified_at"],
    })))
}

/// `GET /api/ps`: the loaded models. `size` is what the engine holds as
/// last measured (else the weights on disk); `size_vram` the same on an
/// accelerator, 0 on the CPU.
#[utoipa::path(get, path = "/ollama/api/ps", tag = "ollama",
    responses(
        (status = 200, description = "OK", body = super::schema::OllamaPs),
        (status = "4XX", description = "The request cannot be served as sent", body = super::schema::OllamaError)
    ))]
pub(super) async fn ps(State(app): State<Arc<App>>) -> Json<Value> {
    let view = app.scheduler.view();
    let now = SystemTime::now();
    let models: Vec<Value> = app
        .sessions
        .list()
        .iter()
        .map(|s| {
            let held = view
                .models
                .iter()
                .find(|m| m.model == s.model.id)
                .and_then(|m| m.held_bytes)
                .unwrap_or(s.model.size_bytes);
            // Staying for good: far off, as Ollama writes it.
            let left = app.scheduler.expires_in(&s.model.id).map_or(
                Duration::from_secs(100 * 365 * 86_400),
                Duration::from_millis,
            );
            let mut row = listed(&s.model);
            row["expires_at"] = json!(timestamp(now + left));
            row["size"] = json!(held);
            row["size_vram"] = json!(if s.info().accelerator == "cpu" {
                0
            } else {
                held
            });
            row
        })
        .collect();
    Json(json!({ "models": models }))
}

/// `GET /api/version`: Hangar's own version.
#[utoipa::path(get, path = "/ollama/api/version", tag = "ollama",
    responses((status = 200, description = "OK", body = super::schema::OllamaVersion)))]
pub(super) async fn version() -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}

/// A 501: Ollama has the route, Hangar has not; `instead` says what to use.
fn not_here(what: &str, instead: &str) -> Refusal {
    Refusal(ApiError {
        status: StatusCode::NOT_IMPLEMENTED,
        ..ApiError::internal(format!("{what} is not served by Hangar: {instead}"))
    })
}

macro_rules! not_served {
    ($($name:ident, $method:ident, $path:literal, $what:literal, $instead:expr;)*) => {$(
        #[doc = concat!("`", $path, "`: 501, ", $what, " is not served.")]
        #[utoipa::path($method, path = $path, tag = "ollama",
            responses(
                (status = 501, description = "Not served by Hangar; the message says what to use instead", body = super::schema::OllamaError),
                (status = "4XX", description = "The request cannot be served as sent", body = super::schema::OllamaError)
            ))]
        pub(super) async fn $name() -> Refusal {
            not_here($what, $instead)
        }
    )*};
}

not_served! {
    pull, post, "/ollama/api/pull", "pulling a model from Ollama's registry", "Hangar pulls from a Hugging Face-compatible hub: POST /api/models/pull {\"repo\": \"ORG/NAME\"} on Hangar's port, or hangar pull ORG/NAME; a model folder (or GGUF file) placed in a --model-dir is served too";
    push, post, "/ollama/api/push", "pushing a model", "Hangar serves local model folders and has no registry to push to";
    create, post, "/ollama/api/create", "creating a model", "put the model's folder in a --model-dir; settings (context length, sampling defaults) go in settings.toml or PUT /api/models/{id}/settings on Hangar's port";
    copy, post, "/ollama/api/copy", "copying a model", "copy the model's folder under a new name in a --model-dir";
}

/// `DELETE /api/delete`: removes the model from disk (its folder or file,
/// or its snapshot of the Hugging Face cache), unloading it first when it
/// is loaded.
#[utoipa::path(delete, path = "/ollama/api/delete", tag = "ollama",
    request_body(content = super::schema::OllamaDeleteRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Removed (unloaded first if it was loaded); the catalog was rescanned", body = super::schema::Removed),
        (status = 404, description = "No such model", body = super::schema::OllamaError),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::OllamaError),
        (status = "5XX", description = "The host failed to remove it", body = super::schema::OllamaError)
    ))]
pub(super) async fn remove(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, Refusal> {
    let name = body
        .map_err(ApiError::from)
        .and_then(|b| request::delete(&b))?;
    let model = find_own(&app, &name)?;
    // Ollama's API has no `force`: a delete of a running model stops it.
    let removed = super::remove::remove_model(&app, &model.id, true).await?;
    Ok(Json(removed))
}

/// `POST /api/blobs/{digest}`: 501, Hangar has no blob store.
#[utoipa::path(post, path = "/ollama/api/blobs/{digest}", tag = "ollama",
    params(("digest" = String, Path, description = "A blob's digest (sha256:...)")),
    responses(
        (status = 501, description = "Not served by Hangar; the message says what to use instead", body = super::schema::OllamaError),
        (status = "4XX", description = "The request cannot be served as sent", body = super::schema::OllamaError)
    ))]
pub(super) async fn blobs() -> Refusal {
    not_here(
        "uploading a blob",
        "Hangar has no blob store: place model files in a --model-dir",
    )
}
