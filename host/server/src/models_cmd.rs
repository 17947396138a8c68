//! `hangar models`, `hangar rm MODEL` and `hangar ps`: what is on disk,
//! removing it, and what the running server has loaded.
//!
//! The disk is read here, with the same discovery and model dirs as
//! `hangar serve` (`--model-dir`, the config's `model_dirs` and the
//! Hugging Face cache `hangar pull` fills); what is
//! loaded comes from the running server's API (`--url`, by default where
//! `hangar serve` listens by default), with `HANGAR_API_KEY` when it has
//! one. No server answering is not an error for `models` and `rm` (nothing
//! is loaded then); for `ps` it is.

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use serde::Serialize;
use serde_json::Value;

use crate::model_store;
use crate::output::outln;
use crate::scheduler::guard::bytes;
use hangar_engine::models::{self, Discovery, Model};
use hangar_engine::registry::Registry;
use hangar_engine::text::table;

/// Where the running server is, for the commands that ask it.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// The running `hangar serve` (default: where it listens by default).
    #[arg(long, env = "HANGAR_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The key the server was started with.
    #[arg(long, env = "HANGAR_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// Options of `hangar models`.
#[derive(Debug, Args)]
pub struct ModelsArgs {
    /// A model dir (or Hugging Face cache) besides the config's
    /// `model_dirs`; repeatable, as for `hangar serve`.
    #[arg(long = "model-dir", env = "HANGAR_MODEL_DIR", value_delimiter = ':')]
    pub model_dirs: Vec<PathBuf>,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// Options of `hangar rm`.
#[derive(Debug, Args)]
pub struct RmArgs {
    /// The model id, as `hangar models` lists it.
    pub model: String,
    /// Unload the model first when the running server has it loaded.
    #[arg(long)]
    pub force: bool,
    /// Remove without asking.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// A model dir (or Hugging Face cache) besides the config's
    /// `model_dirs`; repeatable, as for `hangar serve`.
    #[arg(long = "model-dir", env = "HANGAR_MODEL_DIR", value_delimiter = ':')]
    pub model_dirs: Vec<PathBuf>,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// Options of `hangar ps`.
#[derive(Debug, Args)]
pub struct PsArgs {
    #[command(flatten)]
    pub server: ServerArgs,
}

/// The running server's API, or `None` from every call when none answers.
struct Server {
    client: reqwest::Client,
    url: String,
    key: Option<String>,
    runtime: tokio::runtime::Runtime,
}

impl Server {
    fn new(args: &ServerArgs) -> anyhow::Result<Server> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(30))
            .build()?;
        Ok(Server {
            client,
            url: args.url.trim_end_matches('/').to_string(),
            key: args.api_key.clone(),
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
        })
    }

    /// `method path`'s JSON answer; `Ok(None)` when nothing listens at the
    /// URL; an error for any answer but a 2xx, with the server's message.
    fn call(&self, method: reqwest::Method, path: &str) -> anyhow::Result<Option<Value>> {
        let url = format!("{}{path}", self.url);
        let mut request = self.client.request(method, &url);
        if let Some(key) = &self.key {
            request = request.bearer_auth(key);
        }
        self.runtime.block_on(async {
            let response = match request.send().await {
                Ok(r) => r,
                Err(e) if e.is_connect() => return Ok(None),
                Err(e) => return Err(anyhow!("{url}: {e}")),
            };
            let status = response.status();
            let body: Value = response.json().await.with_context(|| {
                format!("{url} answered {status} with no JSON: is it hangar serve?")
            })?;
            if !status.is_success() {
                let message = body["error"]["message"].as_str().unwrap_or("no message");
                let hint = if status == reqwest::StatusCode::UNAUTHORIZED {
                    " (set HANGAR_API_KEY or pass --api-key)"
                } else {
                    ""
                };
                bail!("{url} answered {status}: {message}{hint}");
            }
            Ok(Some(body))
        })
    }

    /// `GET /api/sessions`, or `None` when no server runs.
    fn sessions(&self) -> anyhow::Result<Option<Value>> {
        self.call(reqwest::Method::GET, "/api/sessions")
    }
}

/// The ids the server has loaded or is loading, by id → session id
/// (`None` while loading).
fn loaded_models(sessions: &Value) -> BTreeMap<String, Option<String>> {
    let mut loaded = BTreeMap::new();
    for s in sessions["sessions"].as_array().into_iter().flatten() {
        if let Some(model) = s["model"].as_str() {
            loaded.insert(model.to_string(), s["id"].as_str().map(str::to_string));
        }
    }
    for (model, state) in sessions["models"].as_object().into_iter().flatten() {
        if state["state"] == "loading" {
            loaded.entry(model.clone()).or_insert(None);
        }
    }
    loaded
}

/// The folders `hangar serve` reads: the flag's model dirs, then the
/// config's, then the pull cache (unless `hf_cache = false`) once it
/// exists; absolute.
fn model_dirs(extra: &[PathBuf], registry: &Registry) -> anyhow::Result<Vec<PathBuf>> {
    let sources = model_store::Sources::new(extra, registry.config(), model_store::hf_cache());
    let dirs = sources.scanned();
    if dirs.is_empty() {
        match &sources.hf_cache {
            Some(cache) => bail!(
                "no model dirs, and nothing pulled yet ({} does not exist): pass --model-dir DIR \
                 (as for hangar serve), set model_dirs in the config, or fetch a model with hangar pull",
                cache.display()
            ),
            None => bail!(
                "no model dirs: pass --model-dir DIR (as for hangar serve) or set model_dirs in the config"
            ),
        }
    }
    Ok(dirs)
}

/// One row of `hangar models`.
#[derive(Serialize)]
struct Row {
    id: String,
    format: String,
    kind: String,
    /// The plugin that would serve it (`None`: none can).
    engine: Option<String>,
    size_bytes: u64,
    /// `None` when no server answers.
    loaded: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<String>,
    source: &'static str,
    path: PathBuf,
}

/// `hangar models`.
pub(crate) fn models(
    args: &ModelsArgs,
    registry: &Registry,
    defaults: &BTreeMap<String, String>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let dirs = model_dirs(&args.model_dirs, registry)?;
    let discovery = models::discover(&dirs, registry.rules());
    let server = Server::new(&args.server)?;
    let loaded = server.sessions()?.as_ref().map(loaded_models);
    let rows: Vec<Row> = discovery
        .models
        .iter()
        .map(|m| {
            let needs = m.needs();
            let resolution = registry.resolve_needing(&m.format, &needs, defaults);
            Row {
                id: m.id.clone(),
                format: m.format.clone(),
                kind: serde_json::to_value(m.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                engine: resolution.chosen,
                size_bytes: model_store::size_on_disk(m),
                loaded: loaded.as_ref().map(|l| l.contains_key(&m.id)),
                session: loaded
                    .as_ref()
                    .and_then(|l| l.get(&m.id).cloned().flatten()),
                source: model_store::source_name(m),
                path: m.path.clone(),
            }
        })
        .collect();
    if json {
        let answer = serde_json::json!({
            "models": rows,
            "server": if loaded.is_some() { "running" } else { "not running" },
            "url": server.url,
            "not_models": discovery.rejected,
        });
        outln!("{}", serde_json::to_string_pretty(&answer)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = table(&[
        "MODEL", "FORMAT", "KIND", "ENGINE", "SIZE", "LOADED", "SOURCE", "PATH",
    ]);
    for r in &rows {
        t.add_row(vec![
            r.id.clone(),
            r.format.clone(),
            r.kind.clone(),
            r.engine.clone().unwrap_or_else(|| "none".into()),
            bytes(r.size_bytes),
            match r.loaded {
                Some(true) => "yes".into(),
                Some(false) => "no".into(),
                None => "not running".into(),
            },
            r.source.into(),
            r.path.display().to_string(),
        ]);
    }
    if rows.is_empty() {
        outln!("no models in {}", list_dirs(&dirs))?;
    } else {
        outln!("{t}")?;
    }
    if loaded.is_none() {
        outln!("(no server answers at {}: loaded is unknown)", server.url)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn list_dirs(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The model `id` in `discovery`, or an error naming it.
fn find<'d>(discovery: &'d Discovery, id: &str, dirs: &[PathBuf]) -> anyhow::Result<&'d Model> {
    discovery.find(id).ok_or_else(|| {
        anyhow!(
            "no model '{id}' in the model dirs ({}); `hangar models` lists them",
            list_dirs(dirs)
        )
    })
}

/// `hangar rm MODEL`.
pub(crate) fn rm(args: &RmArgs, registry: &Registry, json: bool) -> anyhow::Result<ExitCode> {
    let dirs = model_dirs(&args.model_dirs, registry)?;
    let discovery = models::discover(&dirs, registry.rules());
    let model = find(&discovery, &args.model, &dirs)?;
    let removal = model_store::plan_removal(model, &dirs).map_err(anyhow::Error::msg)?;
    let server = Server::new(&args.server)?;
    let running = server.sessions()?;
    let loaded = running
        .as_ref()
        .is_some_and(|s| loaded_models(s).contains_key(&model.id));
    if loaded && !args.force {
        bail!(
            "model '{}' is loaded in the server at {}; unload it first or pass --force to unload and remove it",
            model.id,
            server.url
        );
    }
    let mut plan = format!(
        "will remove model '{}' ({}{}):",
        model.id,
        bytes(removal.bytes),
        if loaded { ", unloading it first" } else { "" }
    );
    for path in &removal.paths {
        plan.push_str(&format!("\n  {}", path.display()));
    }
    if !args.yes {
        if !std::io::stdin().is_terminal() {
            bail!("{plan}\nnot asking, as stdin is not a terminal: pass --yes to remove it");
        }
        eprint!("{plan}\nremove? [y/N] ");
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            eprintln!("nothing removed");
            return Ok(ExitCode::FAILURE);
        }
    } else if !json {
        eprintln!("{plan}");
    }
    if loaded {
        let path = format!("/api/models/{}/unload", encode(&model.id));
        server.call(reqwest::Method::POST, &path)?;
        wait_unloaded(&server, &model.id)?;
    }
    model_store::remove(&removal)?;
    if running.is_some() {
        // The watch would notice too; this makes the catalog current now.
        server.call(reqwest::Method::POST, "/api/models/rescan")?;
    }
    if json {
        let answer = serde_json::json!({
            "removed": true, "model": model.id, "unloaded": loaded,
            "bytes": removal.bytes, "paths": removal.paths,
        });
        outln!("{}", serde_json::to_string_pretty(&answer)?)?;
    } else {
        outln!("removed '{}', freed {}", model.id, bytes(removal.bytes))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A model id as one path segment (`org/m` as `org%2Fm`).
fn encode(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Waits until the server no longer has `id` loaded (its requests may
/// drain first).
fn wait_unloaded(server: &Server, id: &str) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let Some(sessions) = server.sessions()? else {
            return Ok(());
        };
        let resident = sessions["scheduler"]["models"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["model"] == id && m["state"] != "absent");
        if !resident && !loaded_models(&sessions).contains_key(id) {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            bail!("model '{id}' did not unload within 120 s; nothing removed");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One row of `hangar ps`.
#[derive(Serialize)]
struct PsRow {
    model: String,
    session: String,
    engine: String,
    engine_version: Option<String>,
    state: String,
    /// The memory guard's estimate.
    estimate_bytes: Option<u64>,
    /// Measured resident memory of the engine.
    measured_bytes: Option<u64>,
    idle_seconds: u64,
    pinned: bool,
    /// `None`: it stays loaded (pinned, or no idle TTL).
    ttl_left_seconds: Option<u64>,
}

/// `hangar ps`.
pub(crate) fn ps(args: &PsArgs, json: bool) -> anyhow::Result<ExitCode> {
    let server = Server::new(&args.server)?;
    let Some(answer) = server.sessions()? else {
        eprintln!(
            "error: no hangar server answers at {} (start one with `hangar serve`, or pass --url)",
            server.url
        );
        return Ok(ExitCode::FAILURE);
    };
    let scheduler: Vec<&Value> = answer["scheduler"]["models"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let rows: Vec<PsRow> = answer["sessions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let model = s["model"].as_str().unwrap_or_default().to_string();
            let view = scheduler.iter().find(|m| m["model"] == model.as_str());
            PsRow {
                session: s["id"].as_str().unwrap_or_default().into(),
                engine: s["plugin"].as_str().unwrap_or_default().into(),
                engine_version: s["engine_version"].as_str().map(str::to_string),
                state: s["state"].as_str().unwrap_or_default().into(),
                estimate_bytes: view.and_then(|v| v["need_bytes"].as_u64()),
                measured_bytes: view.and_then(|v| v["held_bytes"].as_u64()),
                idle_seconds: s["idle_seconds"].as_u64().unwrap_or(0),
                pinned: s["pinned"].as_bool().unwrap_or(false),
                ttl_left_seconds: s["ttl_left_seconds"].as_u64(),
                model,
            }
        })
        .collect();
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "sessions": rows }))?
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        outln!("no models loaded (server at {})", server.url)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = table(&["MODEL", "ENGINE", "STATE", "MEMORY", "IDLE", "TTL LEFT"]);
    for r in &rows {
        let engine = match &r.engine_version {
            Some(v) => format!("{} {v}", r.engine),
            None => r.engine.clone(),
        };
        let memory = match (r.estimate_bytes, r.measured_bytes) {
            (Some(e), Some(m)) => format!("{} (est. {})", bytes(m), bytes(e)),
            (Some(e), None) => format!("est. {}", bytes(e)),
            (None, Some(m)) => bytes(m),
            (None, None) => "unknown".into(),
        };
        let ttl = match (r.pinned, r.ttl_left_seconds) {
            (true, _) => "pinned".into(),
            (false, None) => "never".into(),
            (false, Some(s)) => format!("{s} s"),
        };
        t.add_row(vec![
            r.model.clone(),
            engine,
            r.state.clone(),
            memory,
            format!("{} s", r.idle_seconds),
            ttl,
        ]);
    }
    outln!("{t}")?;
    Ok(ExitCode::SUCCESS)
}
