//! Capability gating: a capability is on only where the probed engine
//! version satisfies the manifest's requirement, or, where the plugin read
//! the engine's command-line surface and the manifest names the options a
//! capability needs, only where the engine accepts them all.

use std::collections::BTreeMap;

use hangar_plugin_api::manifest::Manifest;
use hangar_plugin_api::wire::ProbeReport;

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

/// Gates every capability of the plugin of `manifest` on its engine as the
/// plugin's `probe()` reported it: on the version, except that a
/// capability of `[flag_surface.capabilities]` follows the options the
/// engine accepts once the plugin reported them.
pub fn gate_engine(manifest: &Manifest, report: &ProbeReport) -> BTreeMap<String, CapabilityState> {
    let version = report
        .version
        .as_deref()
        .and_then(hangar_plugin_api::read_engine_version);
    let mut states = gate(&manifest.id, &manifest.capabilities, version.as_ref());
    if report.flags.is_none() {
        return states;
    }
    for (id, options) in &manifest.flag_surface.capabilities {
        let missing: Vec<&str> = options
            .iter()
            .filter(|o| report.accepts(o) == Some(false))
            .map(String::as_str)
            .collect();
        let state = if missing.is_empty() {
            CapabilityState::On
        } else {
            let engine = report.program.as_deref().unwrap_or("the engine");
            CapabilityState::Off {
                reason: format!(
                    "plugin '{}' needs {} for {id}, and {engine} does not accept {} (read from its command-line surface)",
                    manifest.id,
                    options.join(" "),
                    missing.join(", ")
                ),
            }
        };
        states.insert(id.clone(), state);
    }
    states
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest::parse(
            r#"
id = "e"
name = "e"
version = "0.1.0"
plugin_api = "^1.3"
kind = "native"
artifact = "e"
formats = ["mlx"]
[[platforms]]
os = "linux"
arch = "x86_64"
accelerators = ["cpu"]
[probe]
program = "engine"
args = ["--version"]
[capabilities]
budget = ">=0.2.0"
turbo = ">=0.1.0"
audio = ">=0.1.0"
[flag_surface]
args = [["--help"]]
[flag_surface.capabilities]
budget = ["--kv-cache-budget"]
turbo = ["--kv-bits", "--kv-quant-scheme"]
"#,
        )
        .unwrap()
    }

    fn states(report: ProbeReport) -> Vec<String> {
        gate_engine(&manifest(), &report)
            .into_iter()
            .map(|(id, state)| match state {
                CapabilityState::On => format!("{id}: on"),
                CapabilityState::Off { reason } => format!("{id}: {reason}"),
            })
            .collect()
    }

    #[test]
    fn capabilities_with_options_follow_the_surface_and_the_rest_the_version() {
        // No surface: the version table alone.
        assert_eq!(
            states(ProbeReport::available(Some("0.1.5".into()))),
            [
                "audio: on",
                "budget: plugin 'e' needs engine >=0.2.0 for budget; found 0.1.5",
                "turbo: on",
            ]
        );
        // The binary has --kv-cache-budget although its version is older,
        // and lacks --kv-quant-scheme although its version is newer.
        let report = ProbeReport::available(Some("0.1.5".into()))
            .with_program("/bin/engine")
            .with_flags(["--kv-cache-budget", "--kv-bits", "-c"]);
        assert_eq!(
            states(report),
            [
                "audio: on",
                "budget: on",
                "turbo: plugin 'e' needs --kv-bits --kv-quant-scheme for turbo, and /bin/engine does not accept --kv-quant-scheme (read from its command-line surface)",
            ]
        );
        // An unknown version: what the surface shows is still on.
        let report = ProbeReport::available(None).with_flags(["--kv-cache-budget"]);
        let states = states(report);
        assert_eq!(states[1], "budget: on");
        assert!(states[0].contains("the engine's version is unknown"));
    }

    #[test]
    fn a_surface_without_a_probe_program_or_for_an_undeclared_capability_is_refused() {
        let text = |extra: &str| {
            format!(
                "id = \"e\"\nname = \"e\"\nversion = \"0.1.0\"\nplugin_api = \"^1.3\"\nkind = \"native\"\nartifact = \"e\"\nformats = [\"mlx\"]\n[[platforms]]\nos = \"linux\"\narch = \"x86_64\"\naccelerators = [\"cpu\"]\n{extra}"
            )
        };
        let refusal = |extra: &str| Manifest::parse(&text(extra)).unwrap_err().to_string();
        assert_eq!(
            refusal("[flag_surface]\nargs = [[\"--help\"]]\n"),
            "plugin.toml field 'flag_surface' is invalid: it reads the probe's program, and [probe] names none"
        );
        assert_eq!(
            refusal("[probe]\nprogram = \"x\"\n[flag_surface]\nargs = [[\"--help\"]]\n[flag_surface.capabilities]\nturbo = [\"--kv-bits\"]\n"),
            "plugin.toml field 'flag_surface' is invalid: capability 'turbo' is not declared in [capabilities]"
        );
        assert_eq!(
            refusal("[probe]\nprogram = \"x\"\n[capabilities]\nturbo = \">=1\"\n[flag_surface]\nargs = [[\"--help\"]]\n[flag_surface.capabilities]\nturbo = [\"--kv-bits 4\"]\n"),
            "plugin.toml field 'flag_surface' is invalid: capability 'turbo': '--kv-bits 4' is not an option (write -x or --name, no value)"
        );
        assert_eq!(
            refusal("[probe]\nprogram = \"x\"\n[flag_surface]\nargs = [[]]\n"),
            "plugin.toml field 'flag_surface' is invalid: an entry of args is empty; each is the argument list of one run"
        );
    }
}
