//! The stable contract between the Hangar host and its engine plugins.
//!
//! This is the only crate that plugins and the host share. It holds plain
//! data and nothing of the host:
//!
//! - [`manifest`]: the `plugin.toml` every plugin folder carries, read and
//!   validated by the host *without running plugin code*;
//! - [`platform`]: operating systems, architectures and accelerators, and how
//!   a manifest's platform list matches a machine;
//! - [`capability`]: the capability ids that engines gate on versions;
//! - [`settings`]: the settings a plugin declares, with types, defaults and
//!   the capability each needs;
//! - [`wire`]: the messages that cross the plugin boundary (descriptions,
//!   probe input and report, load requests and launch plans);
//! - [`abi`]: the `abi_stable` root module a native plugin exports.
//!
//! # Versioning
//!
//! The crate is versioned 1.x. The compatibility rule is written once, in
//! [`is_compatible`]: a plugin that requires `plugin_api = "^1.2"` loads in
//! any host whose plugin-api is 1.x with x ≥ 2. Within 1.x the contract only
//! grows: new functions are appended to the root module after its last
//! prefix field (old plugins simply lack them), and new message fields carry
//! `#[serde(default)]` (old plugins never send them, old hosts ignore them).
#![deny(missing_docs)]

#[cfg(not(target_family = "wasm"))]
pub mod abi;
pub mod capability;
pub mod manifest;
pub mod platform;
pub mod settings;
pub mod wire;

pub use manifest::{ContentCheck, Manifest, ManifestError, PluginKind, RecognitionRule};
pub use platform::{Accelerator, Platform, PlatformSpec};

/// The version of this contract, as the host and plugins were built with it.
pub const PLUGIN_API_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Whether a plugin that requires `requirement` of the plugin API can be
/// loaded by a host built with [`PLUGIN_API_VERSION`].
///
/// This is the one compatibility rule of the contract: a plain semver match,
/// and additionally the same major version, so that a requirement such as
/// `>=1.0` cannot accept a future 2.0 host by accident.
pub fn is_compatible(requirement: &semver::VersionReq) -> bool {
    let host = host_version();
    requirement.matches(&host) && requirement_major(requirement) == Some(host.major)
}

/// The parsed [`PLUGIN_API_VERSION`].
pub fn host_version() -> semver::Version {
    semver::Version::parse(PLUGIN_API_VERSION).expect("the crate version is valid semver")
}

fn requirement_major(requirement: &semver::VersionReq) -> Option<u64> {
    let majors: Vec<u64> = requirement.comparators.iter().map(|c| c.major).collect();
    match majors.split_first() {
        Some((first, rest)) if rest.iter().all(|m| m == first) => Some(*first),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compatibility_is_one_semver_comparison_within_a_major() {
        let req = |s: &str| semver::VersionReq::parse(s).unwrap();
        assert!(is_compatible(&req("^1.0")));
        assert!(is_compatible(&req("1")));
        assert!(!is_compatible(&req("^2.0")));
        assert!(!is_compatible(&req(">=0.9")));
        assert!(!is_compatible(&req("^1.99")));
    }
}
