//! The management routes: plugins, resolution, models, sessions, logs,
//! events and health.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{ApiError, App, PathId};
use crate::metrics::{Gauges, SessionGauges};
use hangar_engine::models::{Discovery, Model};

/// `GET /health`: 503 `loading` until every pinned model is ready, then
/// 200 `healthy` (`loading` while any other model loads). The status for
/// anyone; with the API key (or without a key set), also what is loading,
/// the pinned models, every model's state and every session.
#[utoipa::path(get, path = "/health", tag = "meta",
    responses(
        (status = 200, description = "Healthy: every pinned model is ready", body = super::schema::Health),
        (status = 503, description = "Loading: a pinned model is not ready yet", body = super::schema::Health)
    ))]
pub(super) async fn health(
    State(app): State<Arc<App>>,
    headers: axum::http::HeaderMap,
) -> (StatusCode, Json<Value>) {
    let loading = app.sessions.loading();
    let pinned = app.scheduler.pinned();
    let ready = pinned.iter().all(|(_, state)| state == "ready");
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let status = if ready && loading.is_empty() {
        "healthy"
    } else {
        "loading"
    };
    if !app.authorized(&headers) {
        return (code, Json(json!({ "status": status })));
    }
    let sessions: Vec<_> = app.sessions.list().iter().map(|s| s.info()).collect();
    let pinned: serde_json::Map<String, Value> =
        pinned.into_iter().map(|(id, s)| (id, json!(s))).collect();
    (
        code,
        Json(json!({
            "status": status,
            "loading": loading,
            "pinned": pinned,
            "models": model_states(&app),
            "sessions": sessions,
        })),
    )
}

/// Each model's state (loading, ready, busy, hung, failed), with why for
/// the last two.
fn model_states(app: &App) -> Value {
    let states: serde_json::Map<String, Value> = app
        .sessions
        .states()
        .into_iter()
        .map(|(id, state, why)| (id, json!({ "state": state, "reason": why })))
        .collect();
    Value::Object(states)
}

/// `GET /api/plugins`.
#[utoipa::path(get, path = "/api/plugins", tag = "manage",
    responses(
        (status = 200, description = "Every plugin, as `hangar plugins --json`", body = super::schema::Plugins),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn plugins(State(app): State<Arc<App>>) -> Json<Value> {
    let registry = app.sessions.registry().clone();
    let report = tokio::task::spawn_blocking(move || {
        hangar_engine::registry::report::plugins_report(&registry)
    })
    .await
    .expect("the report does not panic");
    Json(serde_json::to_value(report).expect("reports serialize"))
}

/// The query of `GET /api/resolve`.
#[derive(Deserialize)]
pub(super) struct ResolveQuery {
    model: String,
}

/// `GET /api/resolve?model=ID_OR_FORMAT`.
#[utoipa::path(get, path = "/api/resolve", tag = "manage",
    params(("model" = String, Query, description = "A model id or a format")),
    responses(
        (status = 200, description = "The resolution trace", body = super::schema::Resolved),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn resolve(
    State(app): State<Arc<App>>,
    query: Result<Query<ResolveQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = query?;
    let discovery = app.discovery();
    let model = discovery.find(&q.model).cloned();
    let needs = model.as_ref().map(Model::needs).unwrap_or_default();
    let format = match &model {
        Some(m) => m.format.clone(),
        None => {
            // A folder or file of that name that is not a model: say why
            // (which rules were tried).
            if let Some(reason) = super::not_a_model(&discovery, &q.model) {
                return Err(ApiError::not_found(format!(
                    "model '{}' cannot be served: {reason}",
                    q.model
                )));
            }
            if q.model.contains('/') {
                return Err(ApiError::model_not_found(&q.model, &[]));
            }
            q.model.clone()
        }
    };
    let registry = app.sessions.registry().clone();
    let defaults = app.sessions.settings().get().default_engines;
    let resolution = tokio::task::spawn_blocking(move || {
        serde_json::to_value(registry.resolve_needing(&format, &needs, &defaults))
            .expect("resolutions serialize")
    })
    .await
    .expect("resolution does not panic");
    Ok(Json(json!({ "model": model, "resolution": resolution })))
}

/// `GET /api/models`.
#[utoipa::path(get, path = "/api/models", tag = "manage",
    responses(
        (status = 200, description = "OK", body = super::schema::Models),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn models(State(app): State<Arc<App>>) -> Json<Value> {
    models_view(&app, &app.discovery()).await
}

/// `POST /api/models/rescan`.
#[utoipa::path(post, path = "/api/models/rescan", tag = "manage",
    responses(
        (status = 200, description = "OK", body = super::schema::Models),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn rescan(State(app): State<Arc<App>>) -> Json<Value> {
    let discovery = app.catalog.rescan().await;
    models_view(&app, &discovery).await
}

async fn models_view(app: &App, discovery: &Discovery) -> Json<Value> {
    let loading = app.sessions.loading();
    let stored = app.sessions.settings().get();
    let mut models: Vec<Value> = Vec::with_capacity(discovery.models.len());
    for m in &discovery.models {
        let names = crate::names::listed_names(discovery, &stored, &m.id);
        let session = app.sessions.of_model(&m.id).map(|s| s.info());
        let state = if session.is_some() {
            "loaded"
        } else if loading.contains(&m.id) {
            "loading"
        } else {
            "available"
        };
        let session_id = session.as_ref().map(|s| s.id.clone());
        models.push(json!({
            "model": m, "state": state, "session": session, "chat": chat_view(app, m).await,
            "size_bytes": app.catalog.size_on_disk(&m.id),
            "path": m.path,
            "source": crate::model_store::source_name(m),
            "loaded": session_id.is_some(),
            "session_id": session_id,
            "aliases": names.aliases,
            "profiles": names.profiles,
        }));
    }
    Json(json!({
        "models": models,
        "not_models": discovery.rejected,
        "rules": app.sessions.registry().rules(),
    }))
}

/// What a model's chat template says about tools and reasoning: whether a
/// template was found, whether it renders tools (`null`: unknown), the
/// parser the host reads its tool calls with, and whether it marks
/// reasoning.
async fn chat_view(app: &App, model: &hangar_engine::models::Model) -> Value {
    let chat = app.catalog.chat(&model.id);
    let entry = app.sessions.serving(model).await.map(|(e, _)| e);
    let parser = super::tools::tool_format(app, model, entry);
    json!({
        "template": chat.known,
        "takes_tools": chat.known.then_some(chat.takes_tools),
        "tool_parser": parser.map(crate::toolcall::Format::name),
        "reasoning": chat.thinks,
    })
}

/// `POST /api/models/{id}/load`.
#[utoipa::path(post, path = "/api/models/{id}/load", tag = "manage",
    params(("id" = String, Path, description = "The model id (`/` as %2F)")),
    responses(
        (status = 200, description = "OK", body = super::schema::Loaded),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn load(
    State(app): State<Arc<App>>,
    PathId(id): PathId,
) -> Result<Json<Value>, ApiError> {
    let model = app.find_model(&id)?;
    let session = app.scheduler.load(&model).await?;
    Ok(Json(json!({ "loaded": true, "session": session.info() })))
}

/// `POST /api/models/{id}/unload`.
#[utoipa::path(post, path = "/api/models/{id}/unload", tag = "manage",
    params(("id" = String, Path, description = "The model id (`/` as %2F)")),
    responses(
        (status = 200, description = "OK", body = super::schema::Unloaded),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn unload(
    State(app): State<Arc<App>>,
    PathId(id): PathId,
) -> Result<Json<Value>, ApiError> {
    use crate::scheduler::driver::Unloaded;
    // An alias names its model; an id the catalog no longer has (its folder
    // gone) may still be loaded.
    let id = match app.find_model(&id) {
        Ok(model) => model.id,
        Err(e) if e.status == axum::http::StatusCode::BAD_REQUEST => return Err(e),
        Err(_) => id,
    };
    let (outcome, message) = match app.scheduler.unload(&id) {
        Unloaded::Stopped => ("unloaded", "unloaded".to_string()),
        Unloaded::Draining { requests, within } => (
            "draining",
            format!(
                "draining {requests} request{}, done in ≤ {} s (drain_seconds); requests still running then are ended with an error",
                if requests == 1 { "" } else { "s" },
                within.div_ceil(1000)
            ),
        ),
        Unloaded::LoadCancelled => ("load_cancelled", "cancelled the load".to_string()),
        Unloaded::NotLoaded => {
            return Err(ApiError::not_found(format!(
                "model '{id}' is not loaded; GET /api/sessions lists what is"
            )))
        }
    };
    Ok(Json(
        json!({ "unloaded": true, "model": id, "outcome": outcome, "message": message }),
    ))
}

/// `GET /api/sessions`.
#[utoipa::path(get, path = "/api/sessions", tag = "manage",
    responses(
        (status = 200, description = "OK", body = super::schema::SessionList),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn sessions(State(app): State<Arc<App>>) -> Json<Value> {
    let scheduler = app.scheduler.view();
    let sessions: Vec<Value> = app
        .sessions
        .list()
        .iter()
        .map(|s| {
            let mut view = with_residency(json!(s.info()), &scheduler);
            view["speculation"] = speculation_view(&app, &s.model.id);
            view
        })
        .collect();
    Json(json!({
        "sessions": sessions,
        "models": model_states(&app),
        "scheduler": scheduler,
    }))
}

/// What speculative decoding did for `model` since the host started
/// (`null` where it never speculated): passes, tokens proposed and kept,
/// the share kept, and the tokens each pass gave (the kept ones and the
/// model's own after them).
fn speculation_view(app: &App, model: &str) -> Value {
    let Some((verifications, proposed, accepted)) = app.sessions.metrics().speculation(model)
    else {
        return Value::Null;
    };
    let ratio = |n: u64, d: u64| (d > 0).then(|| n as f64 / d as f64);
    json!({
        "verifications": verifications,
        "proposed_tokens": proposed,
        "accepted_tokens": accepted,
        "acceptance_rate": ratio(accepted, proposed),
        "tokens_per_verification": ratio(accepted + verifications, verifications),
        "time_saved_seconds": app.sessions.metrics().speculation_time_saved(model),
    })
}

/// A session's view with its model's residency: `idle_seconds`, whether
/// it is `pinned`, and `ttl_left_seconds` (`null`: it stays loaded).
fn with_residency(mut value: Value, scheduler: &crate::scheduler::driver::SchedulerView) -> Value {
    let residency = scheduler
        .models
        .iter()
        .find(|m| value["model"] == m.model.as_str());
    value["idle_seconds"] = json!(residency.map_or(0, |m| m.idle_ms / 1000));
    value["pinned"] = json!(residency.is_some_and(|m| m.pin));
    value["ttl_left_seconds"] = json!(residency.and_then(|m| m.ttl_left_ms).map(|ms| ms / 1000));
    value
}

/// `GET /api/sessions/{id}/logs`.
#[utoipa::path(get, path = "/api/sessions/{id}/logs", tag = "manage",
    params(("id" = String, Path, description = "A session id")),
    responses(
        (status = 200, description = "OK", body = super::schema::Logs),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn logs(
    State(app): State<Arc<App>>,
    PathId(id): PathId,
) -> Result<Json<Value>, ApiError> {
    let session = app.sessions.by_id(&id).ok_or_else(|| {
        ApiError::not_found(format!(
            "no running session '{id}'; GET /api/sessions lists them"
        ))
    })?;
    let (lines, dropped) = match session.process() {
        Some(process) => process.log.snapshot(),
        None => (
            vec!["(the engine runs inside the host: its output is the host's)".into()],
            0,
        ),
    };
    Ok(Json(
        json!({ "session": id, "model": session.model.id, "dropped": dropped, "lines": lines }),
    ))
}

/// `GET /api/events`.
#[utoipa::path(get, path = "/api/events", tag = "manage",
    responses(
        (status = 200, description = "OK", body = super::schema::Events),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn events(State(app): State<Arc<App>>) -> Json<Value> {
    Json(json!({ "events": app.sessions.events() }))
}

/// `GET /metrics`.
#[utoipa::path(get, path = "/metrics", tag = "manage",
    responses(
        (status = 200, description = "Prometheus (OpenMetrics) text", body = String, content_type = "application/openmetrics-text"),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn metrics(State(app): State<Arc<App>>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let text = tokio::task::spawn_blocking(move || {
        let gauges = gauges(&app);
        app.sessions.metrics().scrape(gauges)
    })
    .await
    .unwrap_or_default();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// What `/metrics`' gauges show now: the sessions and the scheduler.
fn gauges(app: &App) -> Gauges {
    let scheduler = app.scheduler.view();
    Gauges {
        states: app
            .sessions
            .states()
            .into_iter()
            .map(|(id, state, _)| (id, state))
            .collect(),
        sessions: app
            .sessions
            .list()
            .iter()
            .map(|s| SessionGauges {
                model: s.model.id.clone(),
                session: s.id.clone(),
                in_flight: s.info().in_flight,
                resident_bytes: s.process().and_then(|p| p.resident_bytes()),
            })
            .collect(),
        queued: scheduler
            .models
            .iter()
            .map(|m| (m.model.clone(), m.queued))
            .collect(),
        memory_used: scheduler.memory.used_bytes,
        memory_ceiling: scheduler.memory.ceiling_bytes,
        guard: scheduler.memory.guard,
        pressure: scheduler.memory.pressure.is_some(),
    }
}
