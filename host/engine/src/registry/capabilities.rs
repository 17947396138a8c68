//! Capability gating: a capability is on only where the probed engine
//! version satisfies the manifest's requirement.

use std::collections::BTreeMap;

use semver::{Version, VersionReq};
use serde::Serialize;

/// Whether one capability is on, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum CapabilityState {
    /// The engine version satisfies the requirement.
    On,
    /// Off, with a sentence saying why and what would turn it on.
    Off {
        /// Names the capability, the required and the found version.
        reason: String,
    },
}

impl CapabilityState {
    /// Whether the capability is on.
    pub fn is_on(&self) -> bool {
        matches!(self, CapabilityState::On)
    }
}

/// Gates every capability of `plugin` on the engine `version`. An unknown
/// version turns every gated capability off, keeping the engine usable.
pub fn gate(
    plugin: &str,
    requirements: &BTreeMap<String, VersionReq>,
    version: Option<&Version>,
) -> BTreeMap<String, CapabilityState> {
    requirements
        .iter()
        .map(|(id, req)| {
            let state = match version {
                Some(v) if req.matches(v) => CapabilityState::On,
                Some(v) => CapabilityState::Off {
                    reason: format!("plugin '{plugin}' needs engine {req} for {id}; found {v}"),
                },
                None => CapabilityState::Off {
                    reason: format!(
                        "plugin '{plugin}' needs engine {req} for {id}; the engine's version is unknown"
                    ),
                },
            };
            (id.clone(), state)
        })
        .collect()
}
