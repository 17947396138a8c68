//! Planning a load: resolve the model's engine and ask its plugin how to
//! serve it (a launch plan, a `hangar worker`, or an engine in the host).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hangar_plugin_api::wire::{
    settings as names, Cluster, DistributedMode, LaunchPlan, LoadRequest,
};

use hangar_engine::loader::wasm::WasmPlugin;
use hangar_engine::models::Model;
use hangar_engine::registry::{probe::find_program, Registry};

use super::{LoadError, Served};
use crate::settings::{SettingMap, SettingsStore};

/// A planned load: who serves the model and how.
pub(super) struct Planned {
    pub(super) plugin: String,
    pub(super) engine_version: Option<String>,
    pub(super) accelerator: String,
    pub(super) how: How,
}

/// How a model will be served.
pub(super) enum How {
    /// Run this plan's program (already checked against the manifest).
    Launch {
        plan: Box<LaunchPlan>,
        program: PathBuf,
        /// The WebAssembly plugin that maps the session's requests and
        /// responses, when the plan came from one.
        mapper: Option<WasmPlugin>,
        /// The program is `hangar worker` hosting an in-process engine,
        /// whose `/health` also carries the engine's notes.
        worker: bool,
    },
    /// The engine is loaded in the host already.
    InProcess {
        served: Arc<Served>,
        notes: Vec<String>,
    },
}

/// Where a session's files go: its own work folder (removed with it) and
/// the host's state dir, under which each plugin has a cache folder that
/// outlives sessions and restarts.
pub(super) struct Dirs<'a> {
    pub work: &'a Path,
    pub state: &'a Path,
}

/// Resolves the model's engine and asks its plugin how to serve it
/// (blocking: plugin calls and probes are synchronous). A plugin that runs
/// inference itself is hosted by `hangar worker` (the `keeper` binary),
/// unless the operator set `isolation = "none"` for it. Engines in `skip`
/// (tried already: fallback) are passed over.
pub(super) fn plan(
    registry: &Registry,
    settings: &SettingsStore,
    keeper: &Path,
    model: &Model,
    port: u16,
    dirs: Dirs<'_>,
    skip: &[String],
) -> Result<Planned, LoadError> {
    let work_dir = dirs.work;
    let stored = settings.get();
    let (entry, engine) = registry
        .serving_except(&model.format, &model.needs(), &stored.default_engines, skip)
        .map_err(|reason| LoadError::NoEngine {
            model: model.id.clone(),
            format: model.format.clone(),
            path: model.path.display().to_string(),
            reason,
        })?;
    let chosen = entry.manifest.id.clone();
    let manifest = &entry.manifest;
    let plan_err = |reason: String| LoadError::Plan {
        plugin: chosen.clone(),
        model: model.id.clone(),
        reason,
    };
    let plugin_settings = registry.config().plugin_settings(&chosen);
    let (effective, mut notes) = crate::settings::effective(&stored, entry, engine, &model.id);
    let effective: SettingMap = effective.into_iter().map(|(k, e)| (k, e.value)).collect();
    let stored_model = stored.models.get(&model.id).cloned().unwrap_or_default();
    let cluster =
        cluster(registry.config(), &stored_model, &effective, &notes).map_err(plan_err)?;
    let mut request = LoadRequest::new(
        model.id.clone(),
        model.path.display().to_string(),
        model.format.clone(),
    )
    .with_model_files(model.files.clone())
    .with_accelerator(
        entry
            .accelerator
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_else(|| "cpu".into()),
    )
    .with_engine(engine.report.clone())
    .with_capabilities(
        engine
            .capabilities
            .iter()
            .filter(|(_, s)| s.is_on())
            .map(|(id, _)| id.clone())
            .collect::<Vec<_>>(),
    )
    .with_settings(effective.clone())
    .with_plugin_settings(plugin_settings.clone())
    .with_endpoint("127.0.0.1", port)
    .with_work_dir(work_dir.display().to_string())
    .with_cache_dir(dirs.state.join("cache").join(&chosen).display().to_string())
    .with_model_kind(model.kind.as_str());
    request.cluster = cluster;
    let planned = |how| Planned {
        plugin: chosen.clone(),
        engine_version: engine.version.as_ref().map(ToString::to_string),
        accelerator: request.accelerator.clone(),
        how,
    };
    if manifest.in_process && request.cluster.is_some() {
        return Err(plan_err(
            "an engine that runs inside a Hangar process cannot be spread over a cluster; remove the model's `distributed` and `cluster` settings or pick a launching engine".into(),
        ));
    }
    if manifest.in_process {
        match plugin_settings.get("isolation").and_then(|v| v.as_str()) {
            Some("none") => {
                let description = engine.plugin.describe().ok();
                let engine = engine.plugin.load_in_process(&request).map_err(plan_err)?;
                notes.push("runs inside the host (isolation = \"none\"): a crash in the engine takes the host down".into());
                let served = Arc::new(Served::new(
                    engine,
                    description.as_ref(),
                    model.id.clone(),
                    effective,
                ));
                return Ok(planned(How::InProcess { served, notes }));
            }
            None | Some("worker") => {}
            Some(other) => {
                return Err(plan_err(format!(
                "isolation = \"{other}\" is not a mode; use \"worker\" (the default) or \"none\""
            )))
            }
        }
        let load = serde_json::to_string_pretty(&request).expect("requests serialize");
        let plan = LaunchPlan::new(
            keeper.display().to_string(),
            vec![
                "worker".into(),
                "--plugin-dir".into(),
                entry.dir.display().to_string(),
                "--request".into(),
                work_dir.join("load.json").display().to_string(),
            ],
        )
        .with_readiness(hangar_plugin_api::wire::Readiness::new("/health"))
        .with_start_timeout_ms(
            effective
                .get("start_timeout_ms")
                .and_then(|v| v.as_u64())
                .unwrap_or(300_000),
        )
        .with_notes(notes)
        .with_files([("load.json".to_string(), load)].into_iter().collect());
        return Ok(planned(How::Launch {
            plan: Box::new(plan),
            program: keeper.to_path_buf(),
            mapper: None,
            worker: true,
        }));
    }
    let mut plan = engine.plugin.plan_launch(&request).map_err(plan_err)?;
    if let Some(cluster) = &request.cluster {
        check_ranks(cluster, &plan).map_err(plan_err)?;
    }
    plan.notes.splice(0..0, notes);
    // The host runs only programs the manifest declares: the probe's
    // resolved program, or a declared name found the same way.
    let probed = engine.report.program.as_deref();
    if let Some(why) = hangar_engine::registry::programs::undeclared_program(
        manifest,
        &plugin_settings,
        probed,
        &plan.program,
    ) {
        return Err(plan_err(format!(
            "the host refuses the launch plan: it {why}"
        )));
    }
    let program = if probed == Some(plan.program.as_str()) {
        PathBuf::from(&plan.program)
    } else {
        let configured = plugin_settings.get("program").and_then(|v| v.as_str());
        let configured = (manifest.probe.program.as_deref() == Some(plan.program.as_str()))
            .then_some(configured)
            .flatten();
        find_program(&plan.program, configured, &manifest.probe.search_paths).map_err(
            |searched| {
                plan_err(format!(
                    "program '{}' was not found (looked in {})",
                    plan.program,
                    searched.join(", ")
                ))
            },
        )?
    };
    Ok(planned(How::Launch {
        plan: Box::new(plan),
        program,
        mapper: engine.plugin.wasm().cloned(),
        worker: false,
    }))
}

/// The cluster a model's settings ask for: `distributed` (the mode, which
/// settings already gated on the engine's capability) and `cluster` (a
/// `[clusters.NAME]` of config.toml) go together. A model whose operator
/// asked for a cluster never quietly loads on one machine: a setting the
/// engine cannot take is an error here, with the note that says why.
fn cluster(
    config: &hangar_engine::config::Config,
    stored_model: &SettingMap,
    effective: &SettingMap,
    notes: &[String],
) -> Result<Option<Cluster>, String> {
    let set = |name: &str| effective.get(name).filter(|v| !v.is_null());
    for name in [names::DISTRIBUTED, names::CLUSTER] {
        if stored_model.get(name).is_some_and(|v| !v.is_null()) && set(name).is_none() {
            let why = notes
                .iter()
                .find(|n| n.contains(&format!("'{name}'")))
                .map_or_else(
                    || "the engine declares no such setting".to_string(),
                    Clone::clone,
                );
            return Err(format!(
                "the model's setting '{name}' cannot be applied ({why}), and a model meant for a cluster is not loaded on one machine"
            ));
        }
    }
    let (mode, name) = match (set(names::DISTRIBUTED), set(names::CLUSTER)) {
        (None, None) => return Ok(None),
        (Some(mode), Some(name)) => (mode, name),
        (Some(_), None) => {
            return Err(format!(
                "the model sets '{}' but no '{}'; name a [clusters.NAME] of config.toml",
                names::DISTRIBUTED,
                names::CLUSTER
            ))
        }
        (None, Some(_)) => {
            return Err(format!(
                "the model sets '{}' but no '{}'; set it to \"tensor\" or \"pipeline\"",
                names::CLUSTER,
                names::DISTRIBUTED
            ))
        }
    };
    let mode: DistributedMode = serde_json::from_value(mode.clone()).map_err(|_| {
        format!(
            "setting '{}' = {mode} is not a mode; use \"tensor\" or \"pipeline\"",
            names::DISTRIBUTED
        )
    })?;
    let name = name.as_str().ok_or_else(|| {
        format!(
            "setting '{}' = {name} must be a cluster's name (a string)",
            names::CLUSTER
        )
    })?;
    let Some(found) = config.clusters.get(name) else {
        let known: Vec<&str> = config.clusters.keys().map(String::as_str).collect();
        return Err(format!(
            "setting '{}' names cluster '{name}', which config.toml does not define (defined: {}); add [clusters.{name}] with its peers",
            names::CLUSTER,
            if known.is_empty() { "none".to_string() } else { known.join(", ") }
        ));
    };
    Ok(Some(found.to_wire(name, mode)))
}

/// A distributed plan must describe one rank per peer, in order, each on
/// the peer the cluster puts it on: the host supervises what the plan
/// says, so a plan that says something else is refused.
fn check_ranks(cluster: &Cluster, plan: &LaunchPlan) -> Result<(), String> {
    let expected: Vec<(u32, &str, bool)> = cluster
        .peers
        .iter()
        .enumerate()
        .map(|(i, p)| (i as u32, p.name.as_str(), p.local))
        .collect();
    let found: Vec<(u32, &str, bool)> = plan
        .ranks
        .iter()
        .map(|r| (r.rank, r.peer.as_str(), r.local))
        .collect();
    if found.is_empty() {
        return Err(format!(
            "the host refuses the launch plan: the model is set to run on cluster '{}', but the plugin planned one process with no ranks (it does not serve clusters); remove the model's `distributed` and `cluster` settings",
            cluster.name
        ));
    }
    if expected != found {
        return Err(format!(
            "the host refuses the launch plan: cluster '{}' has {} peers, but the plan describes ranks {found:?} instead of {expected:?}",
            cluster.name,
            cluster.peers.len()
        ));
    }
    Ok(())
}
