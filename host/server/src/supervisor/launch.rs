//! Launching an engine from its plan: write the plan's files into the
//! session's work folder, start the program under the keeper, and wait
//! until it is ready (or the launch is cancelled).

use std::path::{Path, PathBuf};
use std::time::Duration;

use hangar_plugin_api::wire::LaunchPlan;
use tokio_util::sync::CancellationToken;

use super::{EngineProcess, Spawn};

/// How long an engine gets between TERM and KILL.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(5);

/// Why a launch failed.
#[derive(Debug)]
pub(crate) enum Launch {
    /// The plan itself is unusable (a file path that escapes the folder).
    Plan(String),
    /// The host could not prepare the launch (files, folders).
    Host(String),
    /// The engine did not start or become ready.
    Start(String),
    /// `cancel` fired while the engine was starting; it was stopped.
    Cancelled,
}

/// Writes the plan's files, starts its process under `keeper` and waits
/// until it is ready; a process that does not become ready, or whose
/// launch is cancelled, is stopped.
pub(crate) async fn launch(
    keeper: &Path,
    client: &reqwest::Client,
    plan: &LaunchPlan,
    program: PathBuf,
    work_dir: &Path,
    port: u16,
    cancel: &CancellationToken,
) -> Result<(EngineProcess, String), Launch> {
    for (name, contents) in &plan.files {
        let relative = Path::new(name);
        let safe = relative
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !safe {
            return Err(Launch::Plan(format!(
                "the launch plan's file '{name}' is not a plain relative path"
            )));
        }
        let path = work_dir.join(relative);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Launch::Host(format!("cannot create {}: {e}", dir.display())))?;
        }
        std::fs::write(&path, contents)
            .map_err(|e| Launch::Host(format!("cannot write {}: {e}", path.display())))?;
    }
    let spawn = Spawn {
        program,
        args: plan.args.clone(),
        env: plan.env.clone(),
        env_remove_prefixes: plan.env_remove_prefixes.clone(),
        cwd: plan
            .cwd
            .clone()
            .map(PathBuf::from)
            .unwrap_or(work_dir.to_path_buf()),
    };
    let process = EngineProcess::start(keeper, &spawn).map_err(|e| Launch::Start(e.to_string()))?;
    let base_url = format!("http://127.0.0.1:{port}");
    let timeout = Duration::from_millis(plan.start_timeout_ms);
    let ready = tokio::select! {
        r = process.wait_ready(client, &base_url, &plan.readiness, timeout) => {
            r.map_err(|e| Launch::Start(e.to_string()))
        }
        _ = cancel.cancelled() => Err(Launch::Cancelled),
    };
    match ready {
        Ok(()) => Ok((process, base_url)),
        Err(e) => {
            process.stop(STOP_GRACE).await;
            Err(e)
        }
    }
}
