//! Resolution: which engine serves a model, and why every other one does
//! not.
//!
//! 1. canonicalise the format through the alias table;
//! 2. keep plugins that serve it and fit this platform;
//! 3. keep plugins whose code loads and whose engine the probe found;
//! 4. take the operator's default engine for the format if it survived,
//!    else sort by priority, then engine version, then id.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use semver::Version;
use serde::Serialize;

use super::{EngineState, PluginEntry, Registry};

/// The outcome of resolving one format.
#[derive(Debug, Clone, Serialize)]
pub struct Resolution {
    /// The format asked for.
    pub requested: String,
    /// Its canonical name, after aliases.
    pub format: String,
    /// The alias applied, if any (`safetensors → mlx (built-in)`).
    pub alias: Option<String>,
    /// The chosen plugin id, if any plugin can serve.
    pub chosen: Option<String>,
    /// Why the chosen plugin won.
    pub reason: String,
    /// Every plugin considered, in ranking order, with its verdict.
    pub trace: Vec<TraceEntry>,
}

/// One plugin's part in a resolution.
#[derive(Debug, Clone, Serialize)]
pub struct TraceEntry {
    /// The plugin id.
    pub plugin: String,
    /// Its manifest priority.
    pub priority: i32,
    /// The probed engine version, when known.
    pub engine_version: Option<String>,
    /// What happened to it (`verdict`, and `reason` for a rejection).
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// What resolution did with a plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", content = "reason", rename_all = "snake_case")]
pub enum Verdict {
    /// It serves the model.
    Chosen,
    /// It could serve, but another plugin ranks higher.
    Outranked,
    /// It cannot serve, for this reason.
    Rejected(String),
}

impl Registry {
    /// Resolves a format (or alias) to the engine that serves it, preferring
    /// the operator's default engine for that format (`default_engines`,
    /// keyed by canonical format) when it can serve.
    pub fn resolve(&self, format: &str, default_engines: &BTreeMap<String, String>) -> Resolution {
        let requested = format.to_ascii_lowercase();
        let canonical = self.canonical_format(&requested);
        let alias = self.aliases().get(&requested).map(|a| {
            format!(
                "{requested} → {} (declared by {})",
                a.target,
                a.declared_by.join(", ")
            )
        });
        let mut eligible: Vec<(&PluginEntry, Option<Version>)> = Vec::new();
        let mut rejected: Vec<TraceEntry> = Vec::new();
        for entry in self.plugins() {
            let m = &entry.manifest;
            let reject = |reason: String, version: Option<&Version>| TraceEntry {
                plugin: m.id.clone(),
                priority: m.priority,
                engine_version: version.map(Version::to_string),
                verdict: Verdict::Rejected(reason),
            };
            if !m.formats.contains(&canonical) {
                rejected.push(reject(
                    format!("serves [{}], not {canonical}", m.formats.join(", ")),
                    None,
                ));
                continue;
            }
            if entry.accelerator.is_none() {
                let platforms: Vec<String> = m.platforms.iter().map(ToString::to_string).collect();
                rejected.push(reject(
                    format!(
                        "runs on [{}], not on this machine ({})",
                        platforms.join(", "),
                        self.platform()
                    ),
                    None,
                ));
                continue;
            }
            match self.engine(entry) {
                EngineState::Broken(reason) => {
                    rejected.push(reject(format!("plugin is broken: {reason}"), None))
                }
                EngineState::Unavailable { reason, .. } => {
                    rejected.push(reject(format!("engine unavailable: {reason}"), None))
                }
                EngineState::Ready(engine) => eligible.push((entry, engine.version.clone())),
            }
        }
        eligible.sort_by_key(|(entry, version)| {
            (
                Reverse(entry.manifest.priority),
                Reverse(version.clone()),
                entry.manifest.id.clone(),
            )
        });
        let default = default_engines.get(&canonical);
        let mut reason = String::new();
        if let Some(default) = default {
            match eligible.iter().position(|(e, _)| &e.manifest.id == default) {
                Some(i) => {
                    let chosen = eligible.remove(i);
                    eligible.insert(0, chosen);
                    reason = format!("the configured default engine for {canonical}");
                }
                None => {
                    reason = format!(
                        "the configured default engine '{default}' for {canonical} cannot serve (see its entry); "
                    )
                }
            }
        }
        if reason.is_empty() || reason.ends_with("; ") {
            reason.push_str(&match eligible.as_slice() {
                [] => format!("no installed plugin can serve {canonical} on this machine"),
                [_] => "the only compatible plugin".to_string(),
                _ => "highest priority, then engine version, then id".to_string(),
            });
        }
        let chosen = eligible.first().map(|(e, _)| e.manifest.id.clone());
        let mut trace: Vec<TraceEntry> = eligible
            .iter()
            .enumerate()
            .map(|(i, (entry, version))| TraceEntry {
                plugin: entry.manifest.id.clone(),
                priority: entry.manifest.priority,
                engine_version: version.as_ref().map(Version::to_string),
                verdict: if i == 0 {
                    Verdict::Chosen
                } else {
                    Verdict::Outranked
                },
            })
            .collect();
        trace.extend(rejected);
        Resolution {
            requested,
            format: canonical,
            alias,
            chosen,
            reason,
            trace,
        }
    }
}
