//! The unified HTTP API (axum): OpenAI-compatible routes for clients and
//! management routes for operators, over every session of the host.
//!
//! | route | what |
//! |---|---|
//! | `GET /health` | `healthy` (200) or `loading` (503 until every pinned model is ready), with the sessions |
//! | `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions` | OpenAI-compatible |
//! | `POST /v1/embeddings`, `POST /v1/rerank` | OpenAI's embeddings; the Jina/Cohere rerank shape (vLLM's, LocalAI's); for models of those kinds |
//! | `POST /v1/messages` | Anthropic's Messages API, translated to the engine's chat API |
//! | `POST /v1/responses`, `GET/DELETE /v1/responses/{id}` | OpenAI's Responses API, translated to the engine's chat API; stored responses |
//! | `/ollama/api/*` (`chat`, `generate`, `tags`, `show`, `ps`, `version`, …) | Ollama's API, translated likewise; also at the root of `--ollama-port` |
//! | `GET /api/plugins` | every plugin, as `hangar plugins --json` |
//! | `GET /api/resolve?model=ID_OR_FORMAT` | the resolution trace |
//! | `GET /api/models` | discovered models, their state, size on disk, path, source, session, and folders that are not models |
//! | `POST /api/models/rescan` | scan the model dirs now (they are also watched), then as `GET /api/models` |
//! | `POST /api/models/{id}/load`, `POST /api/models/{id}/unload` | load or stop a model (`/` in ids as `%2F`) |
//! | `POST /api/models/pull` | pull a model from the hub into the Hugging Face cache (as `hangar pull`), as a task: 202 with its status |
//! | `GET /api/models/pulls`, `GET/DELETE /api/models/pulls/{id}`, `GET /api/models/pulls/{id}/events` | the pulls; one's status, cancel (kept for resume), progress as server-sent events |
//! | `GET /api/hub/models?search=TEXT`, `GET /api/hub/models/{owner}/{name}[?revision=REV]` | the hub's model search; a repository's files, sizes and what Hangar would serve it with (the admin page's Browse tab) |
//! | `DELETE /api/models/{id}[?force=true]` | remove a model from disk (409 while loaded unless `force`, which unloads first), then rescan |
//! | `GET/PUT /api/settings` | app defaults, default engines, engine settings |
//! | `GET/PUT /api/models/{id}/settings`, `GET /api/models/{id}/settings/schema` | one model's settings, and what its engine supports now |
//! | `GET /api/sessions`, `GET /api/sessions/{id}/logs` | running engines (with idle time and TTL left) and their output |
//! | `GET /api/events` | loads, unloads, crashes, failures, hangs, fallbacks |
//! | `GET /api/events/stream`, `GET /api/sessions/{id}/logs/stream` | the same, live (server-sent events) |
//! | `GET /admin` | the operator's page (public; its calls need the key) |
//! | `GET /openapi.json` | this API as an OpenAPI 3.1 document |
//! | `GET /metrics` | Prometheus (OpenMetrics) text: requests, tokens, token timings, events, states, memory |
//!
//! When the host was started with an API key, every route but `/health`,
//! `/openapi.json` and the `/admin` page's files needs `Authorization: Bearer KEY` (or Anthropic's `x-api-key: KEY`);
//! `/health` without it gives the status alone, not model ids, pids and
//! ports.

mod admin;
mod embeddings;
mod error;
mod hub;
pub(crate) mod images;
pub(crate) mod inprocess;
pub(crate) use embeddings::{worker_embeddings, worker_rerank};
pub(crate) mod listen;
mod live;
mod manage;
mod messages;
pub(crate) mod ollama;
mod openai;
mod openapi;
mod pieces;
pub(crate) mod pull;
mod remove;
pub(crate) mod responses;
mod schema;
mod settings;
mod split;
mod sse;
pub(crate) mod stall;
mod tools;
mod upstream;
pub(crate) mod validate;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;

pub(crate) use error::ApiError;
use subtle::ConstantTimeEq;

use crate::catalog::Catalog;
use crate::names::{self, Named, Unnamed};
use crate::scheduler::driver::Driver;
use crate::sessions::Sessions;
use hangar_engine::models::{Discovery, Model};

/// Everything the handlers share.
pub(crate) struct App {
    /// The scheduler: admission, residency, memory guard.
    pub scheduler: Arc<Driver>,
    /// The sessions (and through them, the registry).
    pub sessions: Arc<Sessions>,
    /// The models of the model dirs.
    pub catalog: Arc<Catalog>,
    /// The key clients must send, if any.
    pub api_key: Option<String>,
    /// The stored responses of `/v1/responses`.
    pub responses: Arc<responses::Store>,
    /// The pulls of `POST /api/models/pull`.
    pub pulls: Arc<pull::Pulls>,
    /// The images requests name by URL, read or fetched as `[images]` allows.
    pub images: Arc<images::Images>,
}

impl App {
    /// The models, as the catalog last scanned them.
    pub(crate) fn discovery(&self) -> Arc<Discovery> {
        self.catalog.current()
    }

    /// The model with this id or alias, or a 404 that lists the ones there
    /// are (or says why a folder of that name is not a model). A profile's
    /// name (`MODEL:PROFILE`) is a 400 here: loads, settings, files and
    /// embeddings are the model's own.
    pub(crate) fn find_model(&self, id: &str) -> Result<Model, ApiError> {
        let named = self.find_named(id)?;
        match named.profile {
            None => Ok(named.model),
            Some((profile, _)) => Err(ApiError::bad_request(
                format!(
                    "'{id}' is the profile '{profile}' of model '{model}': profiles are for chat and \
                     completion requests; here name the model itself, '{model}'",
                    model = named.model.id
                ),
                None,
            )),
        }
    }

    /// The model (and profile) a request's `model` names: an id, an alias,
    /// or either as `MODEL:PROFILE`; a 404 as [`App::find_model`]'s
    /// otherwise.
    pub(crate) fn find_named(&self, id: &str) -> Result<Named, ApiError> {
        let discovery = self.discovery();
        let found = self
            .sessions
            .settings()
            .read(|stored| names::resolve(&discovery, stored, id));
        match found {
            Ok(named) => Ok(named),
            Err(Unnamed::NoProfile {
                model,
                profile,
                known,
            }) => Err(ApiError {
                param: Some("model".into()),
                ..ApiError::not_found(format!(
                    "model '{model}' has no profile '{profile}' ({}); see GET /v1/models",
                    match known.is_empty() {
                        true => "it has none".to_string(),
                        false => format!("its profiles: {}", known.join(", ")),
                    }
                ))
            }),
            Err(Unnamed::Unknown) => {
                if let Some(reason) = not_a_model(&discovery, id) {
                    return Err(ApiError::not_found(format!(
                        "model '{id}' cannot be served: {reason}"
                    )));
                }
                let ids: Vec<String> = discovery.models.iter().map(|m| m.id.clone()).collect();
                Err(ApiError::model_not_found(id, &ids))
            }
        }
    }
}

/// Why the folder or file a client called `id` is not a model, if one of
/// that name was rejected.
pub(crate) fn not_a_model<'a>(discovery: &'a Discovery, id: &str) -> Option<&'a str> {
    discovery
        .rejected
        .iter()
        .find(|r| {
            r.path.file_name().and_then(|n| n.to_str()) == Some(id)
                || r.path.file_stem().and_then(|n| n.to_str()) == Some(id)
        })
        .map(|r| r.reason.as_str())
}

/// The `{id}` segment of a route, percent-decoded; one that is not UTF-8
/// is a 400 in OpenAI's error shape, like every other refusal.
pub(crate) struct PathId(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for PathId {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(id) =
            axum::extract::Path::<String>::from_request_parts(parts, state).await?;
        Ok(PathId(id))
    }
}

/// The router over `app`.
pub(crate) fn router(app: Arc<App>) -> Router {
    // Before routing: a layer of `routes` itself would run after it.
    Router::new()
        .fallback_service(routes(app))
        .layer(middleware::map_request(models_named_as_routes))
}

/// The management API's own paths under `/api/models/`, which a model may
/// be called too.
const OWN_PATHS: [&str; 3] = ["pull", "pulls", "rescan"];

/// The request with the model id in its path percent-encoded where the id
/// is one of [`OWN_PATHS`] and the route a model's (`DELETE
/// /api/models/pull`, `POST /api/models/pulls/load`): the router takes a
/// fixed path over `{id}`, so `pull` would meet `POST /api/models/pull`,
/// and `pulls/load` `/api/models/pulls/{id}`; `%70ull` meets only `{id}`,
/// which decodes it to `pull`. (No pull's id is `load`, `unload` or
/// `settings`: theirs are `pull-N`.)
async fn models_named_as_routes(mut request: Request) -> Request {
    if let Some(path) = model_path(request.method(), request.uri().path()) {
        let path_and_query = match request.uri().query() {
            Some(query) => format!("{path}?{query}"),
            None => path,
        };
        let mut parts = request.uri().clone().into_parts();
        if let Ok(path_and_query) = path_and_query.parse() {
            parts.path_and_query = Some(path_and_query);
            if let Ok(uri) = axum::http::Uri::from_parts(parts) {
                *request.uri_mut() = uri;
            }
        }
    }
    request
}

/// [`models_named_as_routes`]' new path for `method path`, if it needs one.
fn model_path(method: &axum::http::Method, path: &str) -> Option<String> {
    use axum::http::Method;
    let rest = path.strip_prefix("/api/models/")?;
    let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
    let models = match tail {
        "" => method == Method::DELETE,
        "load" | "unload" => method == Method::POST,
        "settings" => method == Method::GET || method == Method::PUT,
        "settings/schema" => method == Method::GET,
        _ => false,
    };
    if !models || !OWN_PATHS.contains(&id) {
        return None;
    }
    let (first, others) = id.split_at(1);
    let tail = if tail.is_empty() {
        String::new()
    } else {
        format!("/{tail}")
    };
    Some(format!(
        "/api/models/%{:02X}{others}{tail}",
        first.as_bytes()[0]
    ))
}

/// Every route over `app`.
fn routes(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/models", get(openai::models))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/rerank", post(embeddings::rerank))
        .route("/v1/messages", post(messages::messages))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::remove),
        )
        .route("/api/plugins", get(manage::plugins))
        .route("/api/resolve", get(manage::resolve))
        .route("/api/models", get(manage::models))
        .route("/api/models/rescan", post(manage::rescan))
        .route("/api/models/{id}/load", post(manage::load))
        .route("/api/models/{id}/unload", post(manage::unload))
        .route("/api/models/{id}", delete(remove::remove))
        .route("/api/models/pull", post(pull::start))
        .route("/api/models/pulls", get(pull::list))
        .route(
            "/api/models/pulls/{id}",
            get(pull::status).delete(pull::cancel),
        )
        .route("/api/models/pulls/{id}/events", get(pull::events))
        .route("/api/hub/models", get(hub::search))
        .route("/api/hub/models/{owner}/{name}", get(hub::model))
        .route(
            "/api/settings",
            get(settings::get_app).put(settings::put_app),
        )
        .route(
            "/api/models/{id}/settings",
            get(settings::get_model).put(settings::put_model),
        )
        .route("/api/models/{id}/settings/schema", get(settings::schema))
        .route("/api/sessions", get(manage::sessions))
        .route("/api/sessions/{id}/logs", get(manage::logs))
        .route("/api/events", get(manage::events))
        .route("/api/events/stream", get(live::events))
        .route("/api/sessions/{id}/logs/stream", get(live::logs))
        .route("/metrics", get(manage::metrics))
        .nest(ollama::PREFIX, ollama::routes())
        .layer(middleware::from_fn_with_state(app.clone(), authorize))
        .route("/health", get(manage::health))
        .route("/admin", get(admin::page))
        .route("/admin/app.js", get(admin::script))
        .route("/admin/style.css", get(admin::style))
        .route("/openapi.json", get(openapi::openapi_json))
        .layer(DefaultBodyLimit::max(MAX_BODY_MIB * 1024 * 1024))
        .layer(middleware::from_fn_with_state(app.clone(), stall::watch))
        .fallback(|| async { ApiError::not_found("no such route; see GET /v1/models and /api/*") })
        .method_not_allowed_fallback(|| async {
            ApiError {
                status: axum::http::StatusCode::METHOD_NOT_ALLOWED,
                ..ApiError::bad_request(
                    "this route does not take that method (completions are POST, lists are GET)",
                    None,
                )
            }
        })
        .with_state(app)
}

/// The largest request body accepted, in MiB: room for long prompts and
/// inline images.
pub(crate) const MAX_BODY_MIB: usize = 64;

async fn authorize(
    State(app): State<Arc<App>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if !app.authorized(request.headers()) {
        // Anthropic's clients read errors in Anthropic's shape.
        if request.uri().path() == "/v1/messages" {
            return Ok(messages::error_response(&ApiError::unauthorized()));
        }
        // And Ollama's in Ollama's.
        if request.uri().path().starts_with(ollama::PREFIX) {
            return Ok(ollama::Refusal(ApiError::unauthorized()).into_response());
        }
        return Err(ApiError::unauthorized());
    }
    Ok(next.run(request).await)
}

impl App {
    /// Whether `headers` carry the API key (always, when there is none).
    pub(crate) fn authorized(&self, headers: &axum::http::HeaderMap) -> bool {
        let Some(key) = &self.api_key else {
            return true;
        };
        let bearer = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        // Anthropic's clients send the key as `x-api-key`.
        let sent = bearer.or_else(|| {
            headers
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
        });
        // Constant-time, so the comparison leaks nothing about the key.
        sent.is_some_and(|t| bool::from(t.as_bytes().ct_eq(key.as_bytes())))
    }
}

#[cfg(test)]
mod tests {
    use axum::http::Method;
    use expect_test::expect;

    #[test]
    fn a_model_called_as_a_management_path_is_routed_as_a_model() {
        let paths = [
            (Method::DELETE, "/api/models/pull"),
            (Method::DELETE, "/api/models/pulls"),
            (Method::DELETE, "/api/models/rescan"),
            (Method::POST, "/api/models/pulls/load"),
            (Method::POST, "/api/models/pulls/unload"),
            (Method::GET, "/api/models/pulls/settings"),
            (Method::PUT, "/api/models/rescan/settings"),
            (Method::GET, "/api/models/pulls/settings/schema"),
            // The management API's own routes, and other models, stay.
            (Method::POST, "/api/models/pull"),
            (Method::GET, "/api/models/pulls"),
            (Method::POST, "/api/models/rescan"),
            (Method::GET, "/api/models/pulls/pull-1"),
            (Method::DELETE, "/api/models/pulls/pull-1"),
            (Method::GET, "/api/models/pulls/pull-1/events"),
            (Method::DELETE, "/api/models/tiny"),
            (Method::DELETE, "/api/models/org%2Fpull"),
        ];
        let routed: Vec<String> = paths
            .iter()
            .map(|(method, path)| {
                let to = super::model_path(method, path).unwrap_or_else(|| "as is".into());
                format!("{method} {path} -> {to}")
            })
            .collect();
        expect![[r#"
            DELETE /api/models/pull -> /api/models/%70ull
            DELETE /api/models/pulls -> /api/models/%70ulls
            DELETE /api/models/rescan -> /api/models/%72escan
            POST /api/models/pulls/load -> /api/models/%70ulls/load
            POST /api/models/pulls/unload -> /api/models/%70ulls/unload
            GET /api/models/pulls/settings -> /api/models/%70ulls/settings
            PUT /api/models/rescan/settings -> /api/models/%72escan/settings
            GET /api/models/pulls/settings/schema -> /api/models/%70ulls/settings/schema
            POST /api/models/pull -> as is
            GET /api/models/pulls -> as is
            POST /api/models/rescan -> as is
            GET /api/models/pulls/pull-1 -> as is
            DELETE /api/models/pulls/pull-1 -> as is
            GET /api/models/pulls/pull-1/events -> as is
            DELETE /api/models/tiny -> as is
            DELETE /api/models/org%2Fpull -> as is"#]]
        .assert_eq(&routed.join("\n"));
    }
}
