//! Resolution: which engine serves a model, and why every other one does
//! not.
//!
//! 1. canonicalise the format through the alias table;
//! 2. keep plugins that serve it and fit this platform;
//! 3. keep plugins whose code loads and whose engine the probe found;
//! 4. take the operator's default engine for the format if it survived,
//!    else sort by priority, then engine version, then id.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use hangar_plugin_api::{Platform, PlatformSpec};
use semver::Version;
use serde::{Serialize, Serializer};

use super::{EngineState, PluginEntry, Registry};
use crate::models::Needs;

/// The outcome of resolving one format, borrowing from the registry.
///
/// Rejections are kept as data and worded only when shown or serialized:
/// a resolution over hundreds of plugins, most of which serve other
/// formats, formats nothing on the request path.
#[derive(Debug, Clone, Serialize)]
pub struct Resolution<'r> {
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
    pub trace: Vec<TraceEntry<'r>>,
}

/// One plugin's part in a resolution.
#[derive(Debug, Clone, Serialize)]
pub struct TraceEntry<'r> {
    /// The plugin id.
    pub plugin: &'r str,
    /// Its manifest priority.
    pub priority: i32,
    /// The probed engine version, when known.
    pub engine_version: Option<&'r Version>,
    /// What happened to it (`verdict`, and `reason` for a rejection).
    #[serde(flatten)]
    pub verdict: Verdict<'r>,
}

/// What resolution did with a plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", content = "reason", rename_all = "snake_case")]
pub enum Verdict<'r> {
    /// It serves the model.
    Chosen,
    /// It could serve, but another plugin ranks higher.
    Outranked,
    /// It cannot serve, for this reason.
    Rejected(Rejection<'r>),
}

/// Why a plugin cannot serve; shown (and serialized) as a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection<'r> {
    /// It does not serve the format.
    Format {
        /// The formats it serves.
        serves: &'r [String],
        /// The format asked for, canonical.
        format: Cow<'r, str>,
    },
    /// None of its platforms is this machine.
    Platform {
        /// The platforms it runs on.
        runs_on: &'r [PlatformSpec],
        /// This machine.
        machine: &'r Platform,
    },
    /// It runs on this machine, but serves the format only on others.
    FormatElsewhere {
        /// The platforms it runs on (those serving the format are named).
        runs_on: &'r [PlatformSpec],
        /// The format asked for, canonical.
        format: Cow<'r, str>,
        /// This machine.
        machine: &'r Platform,
    },
    /// Its artifact or code is broken.
    Broken(&'r str),
    /// Its engine is not available here (from the probe).
    Unavailable(&'r str),
    /// It lists the model families it loads, and not the model's.
    ModelType {
        /// The families it loads (the manifest's `model_types`).
        loads: &'r [String],
        /// The model's `model_type`.
        model_type: &'r str,
    },
    /// Its engine lacks the capability the model's kind needs
    /// (`embeddings` for an embedding model, `rerank` for a reranker).
    Lacks {
        /// The capability.
        capability: &'r str,
        /// Why it is off, when the manifest gates it on a version.
        off: Option<&'r str>,
    },
}

impl fmt::Display for Rejection<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Format { serves, format } => {
                write!(f, "serves [{}], not {format}", serves.join(", "))
            }
            Rejection::Platform { runs_on, machine } => {
                f.write_str("runs on [")?;
                for (i, spec) in runs_on.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{spec}")?;
                }
                write!(f, "], not on this machine ({machine})")
            }
            Rejection::FormatElsewhere {
                runs_on,
                format,
                machine,
            } => {
                let on: Vec<String> = runs_on
                    .iter()
                    .filter(|p| p.serves(format))
                    .map(|p| format!("{}/{}", p.os, p.arch))
                    .collect();
                write!(
                    f,
                    "serves {format} only on [{}], not on this machine ({machine})",
                    on.join(", ")
                )
            }
            Rejection::ModelType { loads, model_type } => write!(
                f,
                "loads model types [{}], not {model_type}",
                loads.join(", ")
            ),
            Rejection::Broken(reason) => write!(f, "plugin is broken: {reason}"),
            Rejection::Unavailable(reason) => write!(f, "engine unavailable: {reason}"),
            Rejection::Lacks { capability, off } => match off {
                Some(why) => write!(f, "the model needs '{capability}', which is off: {why}"),
                None => write!(
                    f,
                    "the model needs '{capability}', which this engine does not have"
                ),
            },
        }
    }
}

impl Serialize for Rejection<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl Registry {
    /// Resolves a format (or alias) to the engine that serves it, preferring
    /// the operator's default engine for that format (`default_engines`,
    /// keyed by canonical format) when it can serve.
    pub fn resolve<'r>(
        &'r self,
        format: &'r str,
        default_engines: &BTreeMap<String, String>,
    ) -> Resolution<'r> {
        const NOTHING: &Needs = &Needs {
            capability: None,
            model_type: None,
        };
        self.resolve_needing(format, NOTHING, default_engines)
    }

    /// [`Registry::resolve`] for a model with `needs` (its
    /// [`crate::models::Model::needs`]): engines without the capability its
    /// kind needs (`embeddings`, `rerank`) on, and engines that list the
    /// families they load without its `model_type`, are rejected, saying so.
    pub fn resolve_needing<'r>(
        &'r self,
        format: &'r str,
        needs: &'r Needs,
        default_engines: &BTreeMap<String, String>,
    ) -> Resolution<'r> {
        let requested = format.to_ascii_lowercase();
        let alias = self.aliases().get(&requested);
        // Borrowed wherever it can be, since every rejection names it.
        let canonical: Cow<'r, str> = match alias {
            Some(a) => Cow::Borrowed(&a.target),
            None if requested == format => Cow::Borrowed(format),
            None => Cow::Owned(requested.clone()),
        };
        let alias = alias.map(|a| {
            format!(
                "{requested} → {} (declared by {})",
                a.target,
                a.declared_by.join(", ")
            )
        });
        let mut eligible: Vec<(&PluginEntry, Option<&Version>)> = Vec::new();
        let mut rejected: Vec<TraceEntry<'r>> = Vec::new();
        for entry in self.plugins() {
            let m = &entry.manifest;
            let rejection = if !m.formats.iter().any(|f| *f == *canonical) {
                Rejection::Format {
                    serves: &m.formats,
                    format: canonical.clone(),
                }
            } else if let Some(rejection) = unloadable(m.model_types.as_slice(), needs) {
                rejection
            } else if entry.accelerator.is_none() {
                Rejection::Platform {
                    runs_on: &m.platforms,
                    machine: self.platform(),
                }
            } else if !entry.serves_here(&canonical, self.platform()) {
                Rejection::FormatElsewhere {
                    runs_on: &m.platforms,
                    format: canonical.clone(),
                    machine: self.platform(),
                }
            } else {
                match self.engine(entry) {
                    EngineState::Broken(reason) => Rejection::Broken(reason),
                    EngineState::Unavailable { reason, .. } => Rejection::Unavailable(reason),
                    EngineState::Ready(engine) => match lacks(engine, needs.capability) {
                        Some(rejection) => rejection,
                        None => {
                            eligible.push((entry, engine.version.as_ref()));
                            continue;
                        }
                    },
                }
            };
            rejected.push(TraceEntry {
                plugin: &m.id,
                priority: m.priority,
                engine_version: None,
                verdict: Verdict::Rejected(rejection),
            });
        }
        eligible.sort_by(|(a, va), (b, vb)| {
            (b.manifest.priority.cmp(&a.manifest.priority))
                .then_with(|| vb.cmp(va))
                .then_with(|| a.manifest.id.cmp(&b.manifest.id))
        });
        let default = default_engines.get(&*canonical);
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
        let mut trace: Vec<TraceEntry<'r>> = Vec::with_capacity(eligible.len() + rejected.len());
        trace.extend(
            eligible
                .iter()
                .enumerate()
                .map(|(i, (entry, version))| TraceEntry {
                    plugin: &entry.manifest.id,
                    priority: entry.manifest.priority,
                    engine_version: *version,
                    verdict: if i == 0 {
                        Verdict::Chosen
                    } else {
                        Verdict::Outranked
                    },
                }),
        );
        trace.extend(rejected);
        Resolution {
            requested,
            format: canonical.into_owned(),
            alias,
            chosen,
            reason,
            trace,
        }
    }
}

/// Why an engine that loads the families `loads` (all when empty) cannot
/// load a model with `needs`, if it cannot.
fn unloadable<'r>(loads: &'r [String], needs: &'r Needs) -> Option<Rejection<'r>> {
    let model_type = needs.model_type.as_deref()?;
    (!loads.is_empty() && !loads.iter().any(|t| t == model_type))
        .then_some(Rejection::ModelType { loads, model_type })
}

/// Why `engine` cannot serve a model that needs `capability`, if it cannot.
fn lacks<'r>(engine: &'r super::Engine, capability: Option<&'r str>) -> Option<Rejection<'r>> {
    let capability = capability?;
    match engine.capabilities.get(capability) {
        Some(super::CapabilityState::On) => None,
        Some(super::CapabilityState::Off { reason }) => Some(Rejection::Lacks {
            capability,
            off: Some(reason),
        }),
        None => Some(Rejection::Lacks {
            capability,
            off: None,
        }),
    }
}
