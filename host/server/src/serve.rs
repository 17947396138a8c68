//! `hangar serve`: discover models, bind the API, serve until a signal,
//! then stop every engine before exiting.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};

use tokio_util::sync::CancellationToken;

use crate::api::{router, App};
use crate::catalog::Catalog;
use crate::model_store::Sources;
use crate::scheduler::driver::Driver;
use crate::sessions::Sessions;
use crate::settings::SettingsStore;
use crate::supervisor::signal::Signals;
use hangar_engine::registry::Registry;

/// How long open connections get to finish once shutdown begins: as long
/// as an engine gets between TERM and KILL, since by then every session
/// has ended and its requests have been told why. A client stalled in its
/// headers is not waited for beyond it.
const SHUTDOWN_DRAIN: Duration = crate::sessions::STOP_GRACE;

/// How to serve: what `hangar serve`'s flags say, as plain data.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// Model dirs besides the config's `model_dirs`.
    pub model_dirs: Vec<PathBuf>,
    /// The address to bind; anything but loopback needs an API key.
    pub host: std::net::IpAddr,
    /// The port to bind (0 picks a free one).
    pub port: u16,
    /// A second port, on the same address, whose root is Ollama's API
    /// (`/api/chat`; on `port` it is under `/ollama`), for the clients
    /// that only know Ollama's default, 11434.
    pub ollama_port: Option<u16>,
    /// The key clients must send, if any.
    pub api_key: Option<String>,
    /// Where sessions keep their work folders (default: the data dir's
    /// `hangar/state`).
    pub state_dir: Option<PathBuf>,
    /// Admission, residency and memory limits.
    pub limits: crate::scheduler::machine::Limits,
}

/// Runs the server; returns when it has shut down.
pub(crate) fn run(
    registry: Registry,
    settings: SettingsStore,
    args: Options,
) -> anyhow::Result<ExitCode> {
    if let Some(key) = &args.api_key {
        check_api_key(key)?;
    }
    // The file is checked as a PUT would be: a zero timeout would spin.
    let problems = settings.get().serving.problems();
    if !problems.is_empty() {
        bail!(
            "settings.toml: {}; fix the [serving] table (or remove the entry for its default)",
            problems.join("; ")
        );
    }
    if !args.host.is_loopback() && args.api_key.is_none() {
        bail!(
            "refusing to bind {} without an API key: anything beyond loopback must be protected; pass --api-key or set HANGAR_API_KEY",
            args.host
        );
    }
    for d in registry.diagnostics() {
        tracing::warn!(location = %d.location.display(), "plugin skipped: {}", d.reason);
    }
    let sources = Sources::new(
        &args.model_dirs,
        registry.config(),
        crate::model_store::hf_cache(),
    );
    match &sources.hf_cache {
        // Where `hangar pull` puts models: what was pulled stays served
        // after a restart.
        Some(cache) if !crate::model_store::covers(&sources.dirs, cache) => eprintln!(
            "hangar: reading the Hugging Face cache {} too (where hangar pull puts models; hf_cache = false in config.toml turns this off)",
            cache.display()
        ),
        None if sources.dirs.is_empty() => bail!(
            "no model dirs: pass --model-dir DIR (a folder whose subfolders are models) or set model_dirs in the config{}",
            if registry.config().hf_cache {
                " (there is no home folder, so no Hugging Face cache either: set HF_HUB_CACHE)"
            } else {
                ", or remove hf_cache = false from it to serve what hangar pull fetched"
            }
        ),
        _ => {}
    }
    let images = Arc::new(crate::api::images::Images::new(&registry.config().images)?);
    let state_dir = match &args.state_dir {
        Some(dir) => dir.clone(),
        None => dirs::data_dir()
            .map(|d| d.join("hangar").join("state"))
            .unwrap_or_else(|| std::env::temp_dir().join("hangar-state")),
    };
    // Absolute, since workers read their load requests from it while
    // running in their sessions' folders.
    let state_dir = std::path::absolute(&state_dir).unwrap_or(state_dir);
    let keeper: PathBuf =
        std::env::current_exe().context("cannot find the hangar binary to run engines under")?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let client = reqwest::Client::builder()
            .connect_timeout(settings.get().serving.connect())
            // An engine's events are small writes; Nagle would hold each
            // one back for the engine's delayed ACK.
            .tcp_nodelay(true)
            .build()?;
        let responses = Arc::new(crate::api::responses::Store::new(
            state_dir.join("responses"),
            crate::api::responses::store::LIMIT,
        ));
        let sessions = Sessions::new(
            Arc::new(registry),
            Arc::new(settings),
            keeper,
            state_dir,
            client,
        );
        let rules = sessions.registry().rules().to_vec();
        let catalog = tokio::task::spawn_blocking(move || Catalog::open(sources, rules)).await?;
        catalog.watch();
        let scheduler = Driver::new(sessions.clone(), args.limits.clone());
        tokio::spawn(scheduler.clone().run());
        let settings = sessions.settings().clone();
        let app = Arc::new(App {
            scheduler: scheduler.clone(),
            sessions: sessions.clone(),
            catalog,
            api_key: args.api_key,
            responses,
            pulls: Arc::default(),
            images,
        });
        let discovery = app.discovery();
        for bad in &discovery.rejected {
            tracing::warn!(path = %bad.path.display(), "not a model: {}", bad.reason);
        }
        scheduler.load_pinned(&discovery.models);
        let listener = tokio::net::TcpListener::bind((args.host, args.port))
            .await
            .with_context(|| format!("cannot bind {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        eprintln!(
            "hangar: serving {} model(s) on http://{addr} (try: curl http://{addr}/v1/models)",
            discovery.models.len()
        );
        let ollama = match args.ollama_port.or(settings.get().serving.ollama_port) {
            Some(port) => {
                let listener = tokio::net::TcpListener::bind((args.host, port))
                    .await
                    .with_context(|| {
                        format!("cannot bind {}:{port} for --ollama-port", args.host)
                    })?;
                let at = listener.local_addr()?;
                eprintln!("hangar: Ollama's API on http://{at} (try: curl http://{at}/api/tags)");
                Some(listener)
            }
            None => None,
        };
        // The first signal stops accepting, stops every engine and gives
        // open connections a drain period; a second exits at once (the
        // keepers then take every engine down with the host).
        let stop = CancellationToken::new();
        let mut signals = Signals::new();
        tokio::spawn({
            let stop = stop.clone();
            async move {
                signals.next().await;
                eprintln!(
                    "hangar: shutting down, stopping engines (a second signal exits at once)"
                );
                stop.cancel();
                signals.next().await;
                eprintln!("hangar: second signal, exiting now");
                std::process::exit(130);
            }
        });
        let stopping = {
            let (sessions, stop) = (sessions.clone(), stop.clone());
            async move {
                stop.cancelled().await;
                sessions.shutdown().await;
            }
        };
        let ollama = async {
            if let Some(listener) = ollama {
                let router = crate::api::ollama::root_router(app.clone());
                crate::api::listen::serve(
                    listener,
                    router,
                    stop.clone(),
                    SHUTDOWN_DRAIN,
                    settings.clone(),
                )
                .await;
            }
        };
        tokio::join!(
            crate::api::listen::serve(
                listener,
                router(app.clone()),
                stop.clone(),
                SHUTDOWN_DRAIN,
                settings.clone()
            ),
            ollama,
            stopping
        );
        sessions.shutdown().await;
        Ok(ExitCode::SUCCESS)
    })
}

/// `listener` with Nagle's algorithm off on every accepted connection.
///
/// A streamed answer is many small writes (the headers, then one event
/// per token); with Nagle on, the first event after the headers waits for
/// the client's delayed ACK, about 40 ms on Linux, before it leaves.
pub(crate) fn no_delay(
    listener: tokio::net::TcpListener,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = std::net::SocketAddr> {
    use axum::serve::ListenerExt;
    listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("cannot turn Nagle's algorithm off on a connection: {e}");
        }
    })
}

/// A key that no client could send, or that guards nothing (empty, blank,
/// padded with spaces that `Authorization` headers lose, control
/// characters), is refused rather than served with.
fn check_api_key(key: &str) -> anyhow::Result<()> {
    if key.trim().is_empty() {
        bail!("--api-key is empty or blank, which would guard nothing; pass a real key or leave the flag out");
    }
    if key.trim() != key || key.chars().any(|c| c.is_control() || c == ' ') {
        bail!("--api-key contains spaces or control characters, which an Authorization header cannot carry intact; use letters, digits and punctuation");
    }
    Ok(())
}
