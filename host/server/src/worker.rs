//! `hangar worker`: the host's own server code in single-engine mode.
//!
//! A plugin that runs inference itself (its manifest says `in_process`)
//! is hosted here by default, in a child process the host supervises like
//! any engine: a crash in the engine (an MLX abort, a segfault) kills this
//! worker, not the host, and the host cleans it up as it would any engine
//! crash. The worker loads the plugin from its folder, loads the model from
//! the load request the host wrote, and serves the OpenAI routes on the
//! request's loopback port.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use hangar_plugin_api::wire::LoadRequest;
use hangar_plugin_api::Manifest;
use serde_json::{json, Map, Value};

use crate::api::inprocess::Route;
use crate::api::ApiError;
use crate::sessions::Served;

/// Loads the plugin in `plugin_dir` and serves the model of the load
/// request in `request` until a signal ends the process.
pub(crate) fn run(plugin_dir: &Path, request: &Path) -> anyhow::Result<ExitCode> {
    let manifest = Manifest::from_dir(plugin_dir)?;
    if !manifest.in_process {
        bail!(
            "plugin '{}' runs no in-process engine; the worker only hosts those",
            manifest.id
        );
    }
    let plugin = hangar_engine::registry::load_plugin(plugin_dir, &manifest)
        .map_err(|f| anyhow::anyhow!(f.reason))?;
    let text = std::fs::read_to_string(request)
        .with_context(|| format!("cannot read {}", request.display()))?;
    let request: LoadRequest =
        serde_json::from_str(&text).context("the load request is malformed")?;
    let engine = plugin
        .load_in_process(&request)
        .map_err(anyhow::Error::msg)?;
    let description = plugin.describe().ok();
    let served = Arc::new(Served::new(
        engine,
        description.as_ref(),
        request.model_id.clone(),
        request.settings.clone(),
    ));
    tracing::info!(model = %request.model_id, plugin = %manifest.id, "model loaded; serving on port {}", request.port);
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", request.port))
            .await
            .with_context(|| format!("cannot bind 127.0.0.1:{}", request.port))?;
        let router = Router::new()
            .route("/health", get(health))
            .route("/v1/models", get(models))
            .route("/v1/chat/completions", post(chat))
            .route("/v1/completions", post(completion))
            .route("/v1/embeddings", post(embeddings))
            .route("/v1/rerank", post(rerank))
            .with_state(served);
        axum::serve(crate::serve::no_delay(listener), router)
            .with_graceful_shutdown(crate::supervisor::signal::wait_for_signal())
            .await?;
        Ok(ExitCode::SUCCESS)
    })
}

/// Ready, with what the engine decided at load (the host shows its notes
/// with the session).
async fn health(State(served): State<Arc<Served>>) -> Json<Value> {
    Json(json!({ "status": "ok", "model": served.model_id, "notes": served.engine_notes() }))
}

async fn models(State(served): State<Arc<Served>>) -> Json<Value> {
    Json(
        json!({ "object": "list", "data": [{ "id": served.model_id, "object": "model", "owned_by": "hangar" }] }),
    )
}

async fn chat(
    State(served): State<Arc<Served>>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> Result<axum::response::Response, ApiError> {
    served.answer(Route::Chat, &parse(&body?)?).await
}

async fn completion(
    State(served): State<Arc<Served>>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> Result<axum::response::Response, ApiError> {
    served.answer(Route::Completion, &parse(&body?)?).await
}

async fn embeddings(
    State(served): State<Arc<Served>>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> Result<axum::response::Response, ApiError> {
    crate::api::worker_embeddings(&served, &body?).await
}

async fn rerank(
    State(served): State<Arc<Served>>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> Result<axum::response::Response, ApiError> {
    crate::api::worker_rerank(&served, &body?).await
}

fn parse(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("the request body is not a JSON object: {e}"), None)
    })
}
