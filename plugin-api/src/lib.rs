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

pub use manifest::{
    ContentCheck, FlagSurfaceSpec, Manifest, ManifestError, PluginKind, RecognitionRule,
};
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

/// Reads an engine's version as Hangar compares versions (capability
/// requirements such as `prompt_cache = ">=1.1.0"` are semver).
///
/// The rule, written once for the host and the SDK: take the first word of
/// `text` (anything after whitespace is ignored), drop a leading `v` or
/// `V`, and read `MAJOR[.MINOR[.PATCH]][-PRE][+BUILD]`, where a missing
/// minor or patch is 0. So `1.5` is 1.5.0, `v2` is 2.0.0 and
/// `2.3.1-beta (build x)` is 2.3.1-beta. Anything else (`1.2.3.4`,
/// `latest`, an empty text) is no version: the engine stays usable with
/// every version-gated capability off.
///
/// ```
/// use hangar_plugin_api::read_engine_version;
/// assert_eq!(read_engine_version("v2").unwrap().to_string(), "2.0.0");
/// assert_eq!(read_engine_version("2.3.1-beta (build x)").unwrap().to_string(), "2.3.1-beta");
/// assert_eq!(read_engine_version("nightly"), None);
/// ```
pub fn read_engine_version(text: &str) -> Option<semver::Version> {
    let word = text.split_whitespace().next()?;
    let word = word.strip_prefix(['v', 'V']).unwrap_or(word);
    let (core, rest) = word.split_at(word.find(['-', '+']).unwrap_or(word.len()));
    let numbers: Vec<&str> = core.split('.').collect();
    let numeric = |n: &&str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    if numbers.len() > 3 || !numbers.iter().all(numeric) {
        return None;
    }
    let missing = ".0".repeat(3 - numbers.len());
    semver::Version::parse(&format!("{core}{missing}{rest}")).ok()
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

    #[test]
    fn engine_versions_read_as_the_guide_says() {
        fn check(texts: &[&str], expect: expect_test::Expect) {
            let read: Vec<String> = texts
                .iter()
                .map(|text| {
                    let version = read_engine_version(text);
                    format!(
                        "{text:?} → {}",
                        version.map_or("none".into(), |v| v.to_string())
                    )
                })
                .collect();
            expect.assert_eq(&read.join("\n"));
        }
        check(
            &[
                "1.5",
                "v2",
                "2.3.1-beta (build x)",
                "0.31.1",
                "  V1.2.3+abc.5 extra",
                "1.2-rc.1",
                "10",
                "1.2.3.4",
                "1..2",
                "01.2",
                "latest",
                "v",
                "",
                "mlx-lm 0.31.1",
            ],
            expect_test::expect![[r#"
                "1.5" → 1.5.0
                "v2" → 2.0.0
                "2.3.1-beta (build x)" → 2.3.1-beta
                "0.31.1" → 0.31.1
                "  V1.2.3+abc.5 extra" → 1.2.3+abc.5
                "1.2-rc.1" → 1.2.0-rc.1
                "10" → 10.0.0
                "1.2.3.4" → none
                "1..2" → none
                "01.2" → none
                "latest" → none
                "v" → none
                "" → none
                "mlx-lm 0.31.1" → none"#]],
        );
    }
}
