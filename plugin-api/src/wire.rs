//! The messages that cross the plugin boundary.
//!
//! They are plain serde types; the native ABI carries them as JSON text
//! ([`crate::abi`]), so a 1.x minor release can add a field (always with
//! `#[serde(default)]`) without breaking plugins built against an older one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a plugin's code says about itself. The host compares it with the
/// manifest and refuses a plugin whose code and manifest disagree.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Description {
    /// Must equal the manifest's `id`.
    pub id: String,
    /// Must equal the manifest's `version`.
    pub version: String,
    /// The plugin-api version the plugin was built with.
    pub plugin_api: String,
    /// Must equal the manifest's `formats` (order does not matter).
    pub formats: Vec<String>,
    /// Must equal the manifest's `aliases`.
    #[serde(default)]
    pub aliases: BTreeMap<String, String>,
    /// Must equal the manifest's capability ids (the requirements are the
    /// manifest's business).
    #[serde(default)]
    pub capabilities: Vec<String>,
}

/// What the host learnt by running the manifest's probe program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeInput {
    /// The plugin's settings from the operator's config (`[plugins.ID]`).
    #[serde(default)]
    pub settings: BTreeMap<String, serde_json::Value>,
    /// The outcome of the probe program, absent when the manifest names none.
    #[serde(default)]
    pub run: Option<ProbeRun>,
}

/// The outcome of running a probe program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ProbeRun {
    /// The program ran to completion.
    Exited {
        /// The resolved path of the program.
        program: String,
        /// Exit code (`None` when killed by a signal).
        code: Option<i32>,
        /// Standard output, lossily decoded, at most 64 KiB.
        stdout: String,
        /// Standard error, lossily decoded, at most 64 KiB.
        stderr: String,
    },
    /// The program was not found in the configured path, `PATH` or the
    /// manifest's search paths.
    NotFound {
        /// Every place that was looked at.
        searched: Vec<String>,
    },
    /// The program could not be started.
    FailedToStart {
        /// The resolved path of the program.
        program: String,
        /// The operating system's error.
        error: String,
    },
    /// The program outlived the probe timeout and was killed.
    TimedOut {
        /// The resolved path of the program.
        program: String,
        /// The limit, in milliseconds.
        after_ms: u64,
    },
}

/// The plugin's reading of its engine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeReport {
    /// Whether the engine can serve at all. A plugin whose engine is missing
    /// is skipped by resolution with `detail` as the reason.
    pub available: bool,
    /// The engine version, when it could be read unambiguously. `None`
    /// keeps the engine usable with every version-gated capability off.
    #[serde(default)]
    pub version: Option<String>,
    /// The program that will serve, when there is one.
    #[serde(default)]
    pub program: Option<String>,
    /// The device the engine will use, when the plugin knows (`cpu`, `gpu`).
    #[serde(default)]
    pub device: Option<String>,
    /// Why the engine is unavailable or its version unknown; free text.
    #[serde(default)]
    pub detail: Option<String>,
}
