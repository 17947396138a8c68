//! The settings routes: `GET/PUT /api/settings` (app defaults, default
//! engines, engine settings), `GET/PUT /api/models/{id}/settings` and
//! `GET /api/models/{id}/settings/schema`.
//!
//! Every write is checked first against the serving plugin's declared
//! settings and its engine's capabilities; a refusal is a 422 naming each
//! problem (for a gated setting: the capability, the required and the
//! found engine version). Stored changes apply from the model's next load.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::{ApiError, App, PathId};
use crate::settings::{self, AppSettings, Refused, SettingMap, Stored};
use hangar_engine::models::Model;
use hangar_engine::registry::{Engine, PluginEntry, Registry};
use hangar_plugin_api::wire::settings as names;

/// `GET /api/settings`.
#[utoipa::path(get, path = "/api/settings", tag = "settings",
    responses(
        (status = 200, description = "App defaults, default engines, engine settings", body = Object),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn get_app(State(app): State<Arc<App>>) -> Json<Value> {
    let stored = app.sessions.settings().get();
    Json(json!(AppSettings {
        defaults: stored.defaults,
        default_engines: stored.default_engines,
        engines: stored.engines,
        serving: stored.serving,
    }))
}

/// `PUT /api/settings`: replaces the app-wide layers.
#[utoipa::path(put, path = "/api/settings", tag = "settings",
    request_body(content = Object, content_type = "application/json"),
    responses(
        (status = 200, description = "The settings as stored", body = Object),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn put_app(
    State(app): State<Arc<App>>,
    body: Result<Json<AppSettings>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(new) =
        body.map_err(|e| ApiError::unprocessable(format!("invalid settings: {}", e.body_text())))?;
    let registry = app.sessions.registry().clone();
    let checked = new.clone();
    tokio::task::spawn_blocking(move || check_app(&registry, &checked))
        .await
        .expect("checks do not panic")
        .map_err(refused)?;
    app.sessions
        .settings()
        .update(|stored| {
            stored.defaults = strip_nulls(new.defaults);
            stored.default_engines = new.default_engines;
            stored.serving = new.serving;
            stored.engines = new
                .engines
                .into_iter()
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect();
        })
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(get_app(State(app)).await)
}

/// `GET /api/models/{id}/settings`.
#[utoipa::path(get, path = "/api/models/{id}/settings", tag = "settings",
    params(("id" = String, Path, description = "The model id (`/` as %2F)")),
    responses(
        (status = 200, description = "The model's settings", body = Object),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn get_model(
    State(app): State<Arc<App>>,
    PathId(id): PathId,
) -> Result<Json<Value>, ApiError> {
    let model = app.find_model(&id)?;
    model_view(&app, model).await
}

/// `PUT /api/models/{id}/settings`: replaces the model's own settings
/// (`{}` clears them).
#[utoipa::path(put, path = "/api/models/{id}/settings", tag = "settings",
    params(("id" = String, Path, description = "The model id (`/` as %2F)")),
    request_body(content = Object, content_type = "application/json"),
    responses(
        (status = 200, description = "The model's settings as stored", body = Object),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn put_model(
    State(app): State<Arc<App>>,
    PathId(id): PathId,
    body: Result<Json<SettingMap>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(map) = body.map_err(|e| {
        ApiError::unprocessable(format!(
            "model settings must be a JSON object of name → value: {}",
            e.body_text()
        ))
    })?;
    let model = app.find_model(&id)?;
    let id = model.id.clone();
    let map = strip_nulls(map);
    let checked = map.clone();
    let discovery = app.discovery();
    with_engine(&app, &model, move |entry, engine, stored| {
        let mut problems = match settings::check_model_map(entry, engine, &checked) {
            Ok(()) => vec![],
            Err(Refused(p)) => p,
        };
        problems.extend(check_names(
            &discovery, stored, entry, engine, &id, &checked,
        ));
        match problems.is_empty() {
            true => Ok(()),
            false => Err(Refused(problems)),
        }
    })
    .await?
    .map_err(refused)?;
    let id = model.id.clone();
    app.sessions
        .settings()
        .update(|stored| {
            if map.is_empty() {
                stored.models.remove(&id);
            } else {
                stored.models.insert(id.clone(), map);
            }
        })
        .map_err(|e| ApiError::internal(e.to_string()))?;
    model_view(&app, model).await
}

/// `GET /api/models/{id}/settings/schema`: the settings the resolved engine
/// supports now, with type, default, current value and capability; and the
/// ones it does not, with why.
#[utoipa::path(get, path = "/api/models/{id}/settings/schema", tag = "settings",
    params(("id" = String, Path, description = "The model id (`/` as %2F)")),
    responses(
        (status = 200, description = "The settings the resolved engine supports now, and those it does not with why", body = Object),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The host or the engine failed, or nothing can serve now", body = super::schema::Error)
    ))]
pub(super) async fn schema(
    State(app): State<Arc<App>>,
    PathId(id): PathId,
) -> Result<Json<Value>, ApiError> {
    let model = app.find_model(&id)?;
    let model_id = model.id.clone();
    with_engine(&app, &model, move |entry, engine, stored| {
        let (effective, _) = settings::effective(stored, entry, engine, &model_id);
        let enabled = |cap: &str| engine.capabilities.get(cap).is_some_and(|s| s.is_on());
        let mut available = Vec::new();
        let mut unavailable = Vec::new();
        for spec in &entry.manifest.settings {
            if let Some(reason) = spec
                .capability
                .as_deref()
                .and_then(|c| settings::capability_off(entry, engine, c))
            {
                unavailable.push(
                    json!({ "name": spec.name, "capability": spec.capability, "reason": reason }),
                );
                continue;
            }
            let values: Vec<&str> = spec
                .values
                .iter()
                .filter(|v| v.capability().is_none_or(enabled))
                .map(|v| v.value())
                .collect();
            let current = effective.get(&spec.name);
            available.push(json!({
                "name": spec.name,
                "type": spec.kind,
                "description": spec.description,
                "default": spec.default,
                "capability": spec.capability,
                "values": if values.is_empty() { Value::Null } else { json!(values) },
                "min": spec.min,
                "max": spec.max,
                "value": current.map(|e| e.value.clone()),
                "source": current.map(|e| json!(e.source)),
            }));
        }
        json!({
            "model": model_id,
            "plugin": entry.manifest.id,
            "engine_version": engine.version.as_ref().map(ToString::to_string),
            "settings": available,
            "unavailable": unavailable,
        })
    })
    .await
    .map(Json)
}

/// The problems of the aliases and profiles in `map`, the settings about to
/// be stored for model `id`: a profile's request fields are checked as a
/// request's are, and its other settings must be the model's own (a
/// profile shares the model's loaded engine).
fn check_names(
    discovery: &hangar_engine::models::Discovery,
    stored: &Stored,
    entry: &PluginEntry,
    engine: &Engine,
    id: &str,
    map: &SettingMap,
) -> Vec<String> {
    let mut next = stored.clone();
    next.models.insert(id.to_string(), map.clone());
    let (loads_with, _) = settings::effective(&next, entry, engine, id);
    let check_request = |fields: &serde_json::Map<String, Value>| {
        let mut request = fields.clone();
        request.insert("messages".into(), json!([{"role": "user", "content": "-"}]));
        super::validate::check(super::inprocess::Route::Chat, &request).map_err(|e| e.message)?;
        if let Some(effort) = fields.get(names::REASONING_EFFORT) {
            let known = effort
                .as_str()
                .is_some_and(|e| settings::REASONING_EFFORTS.contains(&e));
            if !known {
                return Err(format!(
                    "'reasoning_effort' must be one of {}, not {effort}",
                    settings::REASONING_EFFORTS.join(", ")
                ));
            }
        }
        match settings::refused_request_fields(entry, engine, fields).as_slice() {
            [] => Ok(()),
            refused => Err(refused.join("; ")),
        }
    };
    let check_load = |name: &str, value: &Value| {
        if settings::is_host_own(name) {
            return Err(format!(
                "'{name}' is the model's own setting, and a profile shares the model's session: set it on the model"
            ));
        }
        settings::check_setting(entry, engine, name, value)?;
        let current = loads_with.get(name).map(|e| &e.value);
        if current == Some(value) {
            return Ok(());
        }
        Err(format!(
            "'{name}' = {value} is a load-time setting, and the model loads with {}: a profile runs on \
             the model's loaded engine and changes only request fields ({}), so set '{name}' on the \
             model itself, or serve a copy of the model folder with it",
            current.map_or("the engine's default".to_string(), ToString::to_string),
            crate::names::PROFILE_FIELDS.join(", ")
        ))
    };
    crate::names::check(discovery, stored, id, map, check_request, check_load)
}

async fn model_view(app: &Arc<App>, model: Model) -> Result<Json<Value>, ApiError> {
    let loaded = app.sessions.of_model(&model.id).is_some();
    let model_id = model.id.clone();
    let discovery = app.discovery();
    with_engine(app, &model, move |entry, engine, stored| {
        let (effective, mut notes) = settings::effective(stored, entry, engine, &model_id);
        let own = stored.models.get(&model_id).cloned().unwrap_or_default();
        // The file may have been edited by hand since the last PUT.
        notes.extend(
            check_names(&discovery, stored, entry, engine, &model_id, &own)
                .into_iter()
                .map(|p| format!("stored {p}: fix it with PUT (a model's id wins over an alias; a profile's bad request field fails its requests)")),
        );
        json!({
            "model": model_id,
            "plugin": entry.manifest.id,
            "aliases": crate::names::aliases_of(stored, &model_id),
            "profiles": crate::names::profiles_of(stored, &model_id),
            "stored": own,
            "effective": effective,
            "notes": notes,
            "applies": if loaded { "on the model's next load (unload it to apply now)" } else { "when the model loads" },
        })
    })
    .await
    .map(Json)
}

/// Runs `f` with the plugin and engine that serve `model` (blocking work:
/// resolution may load and probe plugins).
async fn with_engine<T: Send + 'static>(
    app: &Arc<App>,
    model: &Model,
    f: impl FnOnce(&PluginEntry, &Engine, &Stored) -> T + Send + 'static,
) -> Result<T, ApiError> {
    let registry = app.sessions.registry().clone();
    let stored = app.sessions.settings().get();
    let (format, needs) = (model.format.clone(), model.needs());
    let id = model.id.clone();
    tokio::task::spawn_blocking(move || {
        let (entry, engine) = registry
            .serving_except(&format, &needs, &stored.default_engines, &[])
            .map_err(|reason| {
                ApiError::unavailable(format!("no engine can serve model '{id}': {reason}"))
            })?;
        Ok(f(entry, engine, &stored))
    })
    .await
    .expect("settings work does not panic")
}

fn check_app(registry: &Registry, new: &AppSettings) -> Result<(), Refused> {
    let mut problems = match settings::check_defaults(&new.defaults) {
        Ok(()) => vec![],
        Err(Refused(p)) => p,
    };
    problems.extend(new.serving.problems());
    for (format, plugin) in &new.default_engines {
        let canonical = registry.canonical_format(format);
        match registry.plugin(plugin) {
            None => problems.push(format!("default engine '{plugin}' for {format} is not an installed plugin")),
            Some(entry) if !entry.manifest.formats.contains(&canonical) => problems.push(format!(
                "default engine '{plugin}' for {format} does not serve {canonical} (it serves {})",
                entry.manifest.formats.join(", ")
            )),
            Some(_) if &canonical != format => problems.push(format!(
                "default engines are keyed by canonical format: use '{canonical}', not the alias '{format}'"
            )),
            Some(_) => {}
        }
    }
    for (plugin, map) in &new.engines {
        let Some(entry) = registry.plugin(plugin) else {
            problems.push(format!("engines.{plugin}: no such plugin is installed"));
            continue;
        };
        match registry.engine(entry) {
            hangar_engine::registry::EngineState::Ready(engine) => {
                if let Err(Refused(p)) = settings::check_map(entry, engine, map) {
                    problems.extend(p.into_iter().map(|e| format!("engines.{plugin}: {e}")));
                }
            }
            // The engine is not installed yet: check names and types, since
            // its capabilities cannot be known.
            _ => problems.extend(map.iter().filter(|(_, v)| !v.is_null()).filter_map(
                |(name, value)| {
                    match entry.manifest.setting(name) {
                        None => Some(format!(
                            "engines.{plugin}: plugin '{plugin}' has no setting '{name}'"
                        )),
                        Some(spec) => settings::check_value(spec, value, |_| true)
                            .err()
                            .map(|e| format!("engines.{plugin}: {e}")),
                    }
                },
            )),
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Refused(problems))
    }
}

fn strip_nulls(map: SettingMap) -> SettingMap {
    map.into_iter().filter(|(_, v)| !v.is_null()).collect()
}

fn refused(r: Refused) -> ApiError {
    ApiError::unprocessable(r.to_string())
}
