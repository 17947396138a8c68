//! Planning a load: resolve the model's engine and ask its plugin how to
//! serve it (a launch plan, a `hangar worker`, or an engine in the host).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hangar_plugin_api::wire::{LaunchPlan, LoadRequest};

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
    },
    /// The engine is loaded in the host already.
    InProcess {
        served: Arc<Served>,
        notes: Vec<String>,
    },
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
    work_dir: &Path,
    skip: &[String],
) -> Result<Planned, LoadError> {
    let stored = settings.get();
    let (entry, engine) = registry
        .serving_except(&model.format, &stored.default_engines, skip)
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
    let request = LoadRequest {
        model_id: model.id.clone(),
        model_path: model.path.display().to_string(),
        model_files: model.files.clone(),
        format: model.format.clone(),
        accelerator: entry
            .accelerator
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_else(|| "cpu".into()),
        engine: engine.report.clone(),
        capabilities: engine
            .capabilities
            .iter()
            .filter(|(_, s)| s.is_on())
            .map(|(id, _)| id.clone())
            .collect(),
        settings: effective.clone(),
        plugin_settings: plugin_settings.clone(),
        host: "127.0.0.1".into(),
        port,
        work_dir: work_dir.display().to_string(),
    };
    let planned = |how| Planned {
        plugin: chosen.clone(),
        engine_version: engine.version.as_ref().map(ToString::to_string),
        accelerator: request.accelerator.clone(),
        how,
    };
    if manifest.in_process {
        match plugin_settings.get("isolation").and_then(|v| v.as_str()) {
            Some("none") => {
                let engine = engine.plugin.load_in_process(&request).map_err(plan_err)?;
                notes.push("runs inside the host (isolation = \"none\"): a crash in the engine takes the host down".into());
                let served = Arc::new(Served {
                    engine: Arc::new(engine),
                    model_id: model.id.clone(),
                    defaults: effective,
                });
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
        let plan = LaunchPlan {
            program: keeper.display().to_string(),
            args: vec![
                "worker".into(),
                "--plugin-dir".into(),
                entry.dir.display().to_string(),
                "--request".into(),
                work_dir.join("load.json").display().to_string(),
            ],
            env: Default::default(),
            cwd: None,
            readiness: hangar_plugin_api::wire::Readiness {
                health_path: "/health".into(),
                ready_status: 200,
                warmup: None,
                failed_statuses: vec![],
            },
            start_timeout_ms: effective
                .get("start_timeout_ms")
                .and_then(|v| v.as_u64())
                .unwrap_or(300_000),
            protocol: Default::default(),
            upstream_model: None,
            notes,
            files: [("load.json".to_string(), load)].into_iter().collect(),
        };
        return Ok(planned(How::Launch {
            plan: Box::new(plan),
            program: keeper.to_path_buf(),
            mapper: None,
        }));
    }
    let mut plan = engine.plugin.plan_launch(&request).map_err(plan_err)?;
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
    }))
}
