//! The hub, as the admin page's Browse tab sees it: `GET /api/hub/models`
//! searches the hub's model API (`HF_ENDPOINT`, with `HF_TOKEN`), and `GET
//! /api/hub/models/{owner}/{name}` shows a repository's files and sizes
//! and what Hangar would serve it with (the plan `hangar pull` shows),
//! before anything is fetched.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::pull::refused;
use super::{ApiError, App};
use crate::pull::{self, RepoRef};

/// The most results a search returns.
const LIMIT: usize = 20;

/// The longest search text taken.
const MAX_SEARCH: usize = 200;

/// The query of `GET /api/hub/models`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SearchQuery {
    /// Text the repository ids must hold (empty: the hub's first ones).
    #[serde(default)]
    search: String,
}

/// One repository the hub found, as its model search lists it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct HubHit {
    /// `ORG/NAME`.
    id: String,
    #[serde(default)]
    downloads: Option<u64>,
    #[serde(default)]
    likes: Option<u64>,
    #[serde(default)]
    tags: Vec<String>,
}

/// `GET /api/hub/models`.
#[derive(Serialize, ToSchema)]
pub(crate) struct HubSearch {
    /// Where it searched.
    endpoint: String,
    models: Vec<HubHit>,
}

/// One file of a repository.
#[derive(Serialize, ToSchema)]
pub(crate) struct HubFile {
    path: String,
    size: u64,
    /// Whether it is already complete in the cache.
    cached: bool,
}

/// `GET /api/hub/models/{owner}/{name}`: what a pull would do.
#[derive(Serialize, ToSchema)]
pub(crate) struct HubModel {
    repo: String,
    revision: String,
    commit: String,
    endpoint: String,
    files: Vec<HubFile>,
    total_bytes: u64,
    /// Bytes not yet in the cache.
    to_fetch: u64,
    /// The format Hangar's recognition rules see, if any.
    format: Option<String>,
    /// The engine that would serve it (null: none can; a pull needs force).
    engine: Option<String>,
    /// Why that engine, or why none.
    reason: String,
    /// The memory estimate, the memory guard's ceiling, and whether it fits.
    need_bytes: u64,
    ceiling_bytes: Option<u64>,
    fits: Option<bool>,
    /// The Hugging Face cache a pull fills.
    cache: String,
}

/// The query of `GET /api/hub/models/{owner}/{name}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ModelQuery {
    /// A branch, tag or commit (default `main`).
    revision: Option<String>,
}

/// `GET /api/hub/models`.
#[utoipa::path(get, path = "/api/hub/models", tag = "manage",
    params(("search" = Option<String>, Query, description = "Text the repository ids must hold")),
    responses(
        (status = 200, description = "The hub's first 20 matches", body = HubSearch),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field), or the hub refused it", body = super::schema::Error),
        (status = "5XX", description = "The hub cannot be reached, or the host failed", body = super::schema::Error)
    ))]
pub(super) async fn search(
    query: Result<Query<SearchQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<HubSearch>, ApiError> {
    let Query(q) = query?;
    if q.search.chars().count() > MAX_SEARCH {
        return Err(ApiError::bad_request(
            format!("'search' is longer than {MAX_SEARCH} characters"),
            Some("search"),
        ));
    }
    let hub = pull::Hub::from_env().map_err(refused)?;
    let url = format!(
        "{}/api/models?search={}&limit={LIMIT}",
        hub.endpoint,
        pull::encode(&q.search, false)
    );
    let mut models: Vec<HubHit> = hub
        .json(&url, "search", "the model search")
        .await
        .map_err(refused)?;
    models.truncate(LIMIT);
    Ok(Json(HubSearch {
        endpoint: hub.endpoint,
        models,
    }))
}

/// `GET /api/hub/models/{owner}/{name}`.
#[utoipa::path(get, path = "/api/hub/models/{owner}/{name}", tag = "manage",
    params(
        ("owner" = String, Path, description = "The repository's owner"),
        ("name" = String, Path, description = "The repository's name"),
        ("revision" = Option<String>, Query, description = "A branch, tag or commit (default main)")
    ),
    responses(
        (status = 200, description = "The repository's files and what Hangar would serve it with", body = HubModel),
        (status = "4XX", description = "A bad name or revision (named), a repository the hub does not have or will not show (set HF_TOKEN on the server)", body = super::schema::Error),
        (status = "5XX", description = "The hub cannot be reached, or the host failed", body = super::schema::Error)
    ))]
pub(super) async fn model(
    State(app): State<Arc<App>>,
    path: Result<Path<(String, String)>, axum::extract::rejection::PathRejection>,
    query: Result<Query<ModelQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<HubModel>, ApiError> {
    let Path((owner, name)) = path?;
    let Query(q) = query?;
    let repo = format!("{owner}/{name}");
    let bad = |e: String, field| ApiError::bad_request(e, Some(field));
    let target = RepoRef::parse(&repo).map_err(|e| bad(e, "name"))?;
    let target = match &q.revision {
        Some(revision) => {
            RepoRef::parse(&format!("{repo}@{revision}")).map_err(|e| bad(e, "revision"))?
        }
        None => target,
    };
    let (_, cache, plan) = super::pull::plan_of(&app, &target, &[]).await?;
    let blobs = cache.join(target.folder_name()).join("blobs");
    let files = plan
        .files
        .iter()
        .map(|f| HubFile {
            path: f.path.clone(),
            size: f.size,
            cached: std::fs::metadata(blobs.join(&f.blob)).is_ok_and(|m| m.len() == f.size),
        })
        .collect();
    Ok(Json(HubModel {
        repo: plan.repo,
        revision: plan.revision,
        commit: plan.commit,
        endpoint: plan.endpoint,
        files,
        total_bytes: plan.total_bytes,
        to_fetch: plan.to_fetch,
        format: plan.format,
        engine: plan.engine,
        reason: plan.reason,
        need_bytes: plan.need_bytes,
        ceiling_bytes: plan.ceiling_bytes,
        fits: plan.fits,
        cache: plan.cache.display().to_string(),
    }))
}
