//! `DELETE /api/models/{id}`: removes a model from disk (as `hangar rm`),
//! refusing while it is loaded unless `?force=true`, which unloads it first.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{ApiError, App, PathId};
use crate::model_store;

/// The query of `DELETE /api/models/{id}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RemoveQuery {
    /// Unload the model first when it is loaded.
    #[serde(default)]
    force: bool,
}

/// `DELETE /api/models/{id}`.
#[utoipa::path(delete, path = "/api/models/{id}", tag = "manage",
    params(
        ("id" = String, Path, description = "The model id (`/` as %2F)"),
        ("force" = Option<bool>, Query, description = "Unload the model first when it is loaded (else a loaded model is a 409)")
    ),
    responses(
        (status = 200, description = "Removed; the catalog was rescanned", body = super::schema::Removed),
        (status = 409, description = "The model is loaded (pass force=true to unload it first)", body = super::schema::Error),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn remove(
    State(app): State<Arc<App>>,
    PathId(id): PathId,
    query: Result<Query<RemoveQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = query?;
    remove_model(&app, &id, q.force).await.map(Json)
}

/// Removes the model `name` names (its id or an alias) from disk and
/// rescans the catalog; a loaded model is unloaded first when `force`, else
/// a 409. Answers what was removed.
pub(super) async fn remove_model(app: &App, name: &str, force: bool) -> Result<Value, ApiError> {
    let model = app.find_model(name)?;
    let id = model.id.clone();
    let mut unloaded = false;
    if is_loaded(app, &id) {
        if !force {
            return Err(ApiError {
                status: StatusCode::CONFLICT,
                code: "model_loaded",
                ..ApiError::bad_request(
                    format!("model '{id}' is loaded; unload it first (POST /api/models/{{id}}/unload) or pass force=true to unload and remove it"),
                    Some("force"),
                )
            });
        }
        unload_and_wait(app, &id).await?;
        unloaded = true;
    }
    let dirs = app.catalog.dirs().to_vec();
    let removal = tokio::task::spawn_blocking(move || {
        let removal = model_store::plan_removal(&model, &dirs)?;
        model_store::remove(&removal).map_err(|e| e.to_string())?;
        Ok::<_, String>(removal)
    })
    .await
    .map_err(|e| ApiError::internal(format!("the removal failed: {e}")))?
    .map_err(|e| ApiError::internal(format!("cannot remove model '{id}': {e}")))?;
    app.catalog.rescan().await;
    Ok(json!({
        "removed": true,
        "model": id,
        "unloaded": unloaded,
        "bytes": removal.bytes,
        "paths": removal.paths,
    }))
}

/// Whether `id` has a session, or one is loading.
fn is_loaded(app: &App, id: &str) -> bool {
    app.sessions.of_model(id).is_some() || app.sessions.loading().iter().any(|m| m == id)
}

/// Unloads `id` and waits until its engine has stopped (draining requests
/// may finish first), so that no engine reads files being removed.
async fn unload_and_wait(app: &App, id: &str) -> Result<(), ApiError> {
    use crate::scheduler::driver::Unloaded;
    let drain = match app.scheduler.unload(id) {
        Unloaded::Draining { within, .. } => Duration::from_millis(within),
        Unloaded::Stopped | Unloaded::LoadCancelled | Unloaded::NotLoaded => Duration::ZERO,
    };
    let deadline = Instant::now() + drain + crate::sessions::STOP_GRACE + Duration::from_secs(5);
    loop {
        let resident = app
            .scheduler
            .view()
            .models
            .iter()
            .any(|m| m.model == id && m.state != "absent");
        if !resident && !is_loaded(app, id) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(ApiError {
                status: StatusCode::CONFLICT,
                code: "model_loaded",
                ..ApiError::bad_request(
                    format!("model '{id}' is still stopping; try again in a few seconds"),
                    None,
                )
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
