//! `hangar plugins` as data: every plugin folder, loaded and probed where it
//! fits this machine, with its status and what is wrong with it. The CLI
//! prints it as a table, the API as JSON.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{CapabilityState, EngineState, Registry};

/// One row of `hangar plugins`.
#[derive(Debug, Serialize)]
pub struct PluginRow {
    /// Plugin id, or the folder name for a broken plugin.
    pub id: String,
    /// `ready`, `unavailable`, `unsupported-platform`, `broken`.
    pub status: &'static str,
    /// Plugin folder.
    pub dir: PathBuf,
    /// Formats served.
    pub formats: Vec<String>,
    /// Platform entries.
    pub platforms: Vec<String>,
    /// Priority.
    pub priority: Option<i32>,
    /// Probed engine version.
    pub engine_version: Option<String>,
    /// Capabilities that are on.
    pub capabilities_on: Vec<String>,
    /// Capabilities that are off, with the reason.
    pub capabilities_off: Vec<String>,
    /// Why the plugin is not ready, or a note from its probe.
    pub detail: Option<String>,
    /// The recognition rules the manifest declares (`toy: *.toy`).
    pub recognizes: Vec<String>,
}

/// `hangar plugins`, as data.
#[derive(Debug, Serialize)]
pub struct PluginsReport {
    /// The machine.
    pub platform: String,
    /// Every plugin folder, valid or not.
    pub plugins: Vec<PluginRow>,
    /// Problems that belong to no single plugin folder.
    pub registry_errors: Vec<String>,
}

/// Loads every plugin that fits this machine and reports on all of them.
pub fn plugins_report(registry: &Registry) -> PluginsReport {
    let mut plugins: Vec<PluginRow> = registry
        .plugins()
        .iter()
        .map(|entry| {
            let m = &entry.manifest;
            let mut row = PluginRow {
                id: m.id.clone(),
                status: "ready",
                dir: entry.dir.clone(),
                formats: m.formats.clone(),
                platforms: m.platforms.iter().map(ToString::to_string).collect(),
                priority: Some(m.priority),
                engine_version: None,
                capabilities_on: Vec::new(),
                capabilities_off: Vec::new(),
                detail: None,
                recognizes: m
                    .recognize
                    .iter()
                    .map(|r| format!("{}: {}", r.format, r.describe()))
                    .collect(),
            };
            if entry.accelerator.is_none() {
                row.status = "unsupported-platform";
                row.detail = Some(format!("does not run on {}", registry.platform()));
                return row;
            }
            match registry.engine(entry) {
                EngineState::Broken(reason) => {
                    row.status = "broken";
                    row.detail = Some(reason.clone());
                }
                EngineState::Unavailable { reason, .. } => {
                    row.status = "unavailable";
                    row.detail = Some(reason.clone());
                }
                EngineState::Ready(engine) => {
                    row.engine_version = engine
                        .version
                        .as_ref()
                        .map(ToString::to_string)
                        .or_else(|| Some("unknown".into()));
                    for (id, state) in &engine.capabilities {
                        match state {
                            CapabilityState::On => row.capabilities_on.push(id.clone()),
                            CapabilityState::Off { reason } => {
                                row.capabilities_off.push(reason.clone())
                            }
                        }
                    }
                    row.detail = engine.report.detail.clone();
                }
            }
            row
        })
        .collect();
    let mut registry_errors = Vec::new();
    for d in registry.diagnostics() {
        if d.location == Path::new("<registry>") {
            registry_errors.push(d.reason.clone());
            continue;
        }
        plugins.push(PluginRow {
            id: d.plugin.clone().unwrap_or_else(|| {
                d.location
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            }),
            status: "broken",
            dir: d.location.clone(),
            formats: Vec::new(),
            platforms: Vec::new(),
            priority: None,
            engine_version: None,
            capabilities_on: Vec::new(),
            capabilities_off: Vec::new(),
            detail: Some(d.reason.clone()),
            recognizes: Vec::new(),
        });
    }
    PluginsReport {
        platform: registry.platform().to_string(),
        plugins,
        registry_errors,
    }
}
