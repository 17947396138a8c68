//! `plugin.toml`: what a plugin declares about itself, read by the host
//! before any plugin code runs.
//!
//! ```toml
//! id = "mlx-lm"
//! name = "mlx-lm (Python mlx_lm.server)"
//! version = "0.1.0"
//! plugin_api = "^1.0"
//! kind = "native"
//! artifact = "hangar_plugin_mlx_lm"   # a library base name, or an exact file name
//! formats = ["mlx"]
//! priority = 10
//! programs = ["python3"]
//!
//! [aliases]
//! safetensors = "mlx"
//!
//! [[platforms]]
//! os = "linux"
//! arch = "x86_64"
//! accelerators = ["cpu", "cuda13"]
//! # formats = ["mlx"]   # optional (1.x): the formats this build serves
//!
//! [probe]
//! program = "python3"
//! args = ["-c", "import mlx_lm; print(mlx_lm.__version__)"]
//!
//! [capabilities]
//! kv_cache_quantization = ">=0.20.0"
//!
//! # how a model of a format looks on disk (see [`RecognitionRule`])
//! [[recognize]]
//! format = "mlx"
//! folder = ["config.json", "*.safetensors"]
//!
//! [conformance]
//! fixture = "fixtures/tiny-llama"      # a representative model, for the suite
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use semver::{Version, VersionReq};
use serde::{Deserialize, Serialize};

use crate::capability;
use crate::platform::PlatformSpec;
use crate::settings::{SettingSpec, SettingType};

/// The name of the manifest file in a plugin folder.
pub const MANIFEST_FILE: &str = "plugin.toml";

/// How a plugin's artifact is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginKind {
    /// A native library built with `abi_stable` (`.so`, `.dylib`, `.dll`).
    Native,
    /// A WebAssembly component run in a wasmtime sandbox.
    Wasm,
}

impl std::fmt::Display for PluginKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PluginKind::Native => "native",
            PluginKind::Wasm => "wasm",
        })
    }
}

/// A parsed and validated `plugin.toml`.
///
/// Read from a file, never built by a plugin: `#[non_exhaustive]`, so that
/// a 1.x addition (such as `tool_parser`) breaks no plugin's source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Manifest {
    /// Unique id: lowercase letters, digits and `-` (`mlx-lm`).
    pub id: String,
    /// Human-readable name.
    pub name: String,
    /// The plugin's own version.
    pub version: Version,
    /// Which plugin-api versions the plugin was written against.
    pub plugin_api: VersionReq,
    /// How the artifact is loaded.
    pub kind: PluginKind,
    /// The artifact file, relative to the plugin folder. For native plugins a
    /// name without a `.` is a library base name and gets this platform's
    /// prefix and suffix (`foo` → `libfoo.so` on Linux, `libfoo.dylib` on
    /// macOS, `foo.dll` on Windows), so one manifest serves every platform;
    /// for WebAssembly plugins it gets `.wasm` (`foo` → `foo.wasm`).
    pub artifact: String,
    /// One line on what the plugin serves.
    #[serde(default)]
    pub description: String,
    /// Canonical model formats served (`mlx`, `gguf`).
    pub formats: Vec<String>,
    /// Other names for formats (`safetensors` → `mlx`).
    #[serde(default)]
    pub aliases: BTreeMap<String, String>,
    /// Platforms the engine runs on.
    pub platforms: Vec<PlatformSpec>,
    /// Higher wins among compatible plugins.
    #[serde(default)]
    pub priority: i32,
    /// How the engine's version is read.
    #[serde(default)]
    pub probe: ProbeSpec,
    /// Programs this plugin's launch plans may start. The probe's program is
    /// always allowed.
    #[serde(default)]
    pub programs: Vec<String>,
    /// Capability id → engine versions that have it.
    #[serde(default)]
    pub capabilities: BTreeMap<String, VersionReq>,
    /// Whether the plugin runs inference itself (its `load_in_process()`
    /// serves models) rather than planning engine processes. The host runs
    /// such an engine in a `hangar worker` child process by default, or in
    /// the host itself when the operator sets `isolation = "none"`.
    #[serde(default)]
    pub in_process: bool,
    /// The settings the plugin understands.
    #[serde(default)]
    pub settings: Vec<SettingSpec>,
    /// Request fields that need a capability (`thinking_budget_tokens` →
    /// `reasoning_budget`): a request that sends one while the capability is
    /// off is refused.
    #[serde(default)]
    pub request_fields: BTreeMap<String, String>,
    /// How models of the plugin's formats are recognised on disk, beside
    /// the host's built-in rules (`mlx`, `gguf`). Added in 1.0 with a
    /// default: a manifest without rules serves formats the host already
    /// recognises.
    #[serde(default)]
    pub recognize: Vec<RecognitionRule>,
    /// What the conformance suite tests the plugin with.
    #[serde(default)]
    pub conformance: ConformanceSpec,
    /// The tool-call markup the engine's models write, for models whose
    /// chat template does not tell the host (`hermes`, `llama3_json`,
    /// `mistral`, `qwen3_xml`, `gemma`): the host parses answers in it.
    /// A model's template, and the operator's `tool_parser` model setting,
    /// come first. Added in 1.x with a default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_parser: Option<String>,
    /// How the engine's command-line surface is read, and which of its
    /// options each capability needs, so that capabilities follow what the
    /// binary accepts rather than a version table. Added in 1.3 with a
    /// default: none read.
    #[serde(default, skip_serializing_if = "FlagSurfaceSpec::is_empty")]
    pub flag_surface: FlagSurfaceSpec,
    /// The model families the engine loads, as a model folder's
    /// `config.json` names them in `model_type` (`llama`, `qwen3_moe`).
    /// Where the list is not empty, resolution passes this plugin over for
    /// a model whose `model_type` it does not list, so that a model goes to
    /// an engine that can load it rather than failing and falling back. A
    /// model without a `model_type` (a GGUF file, a folder without one) is
    /// not checked. Added in 1.7 with a default: every family; a manifest
    /// that uses it needs `plugin_api = "^1.7"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub model_types: Vec<String>,
}

/// `[flag_surface]`: after the version probe the host runs the probe's
/// program with each of `args` in turn, until one exits 0, and hands that
/// run to the plugin's `probe()` (`ProbeInput::surface`), which reports
/// the options the engine accepts (`ProbeReport::flags`). Where it does, a
/// capability listed in `capabilities` is on exactly when the engine
/// accepts every one of its options, whatever its version says; the
/// others, and every capability of an engine whose surface could not be
/// read, stay gated on `[capabilities]`' version requirements.
///
/// ```toml
/// [flag_surface]
/// args = [["--dump-flag-surface"], ["--help"]]
///
/// [flag_surface.capabilities]
/// kv_cache_quantization = ["--cache-type-k", "--cache-type-v"]
/// ```
///
/// Added in 1.3; a manifest that uses it needs `plugin_api = "^1.3"`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct FlagSurfaceSpec {
    /// Argument lists that make the probe's program print the options it
    /// accepts, tried in order.
    #[serde(default)]
    pub args: Vec<Vec<String>>,
    /// Capability id → the options (`--cache-type-k`, `-c`) it needs.
    #[serde(default)]
    pub capabilities: BTreeMap<String, Vec<String>>,
}

impl FlagSurfaceSpec {
    /// Whether the manifest has no `[flag_surface]`.
    pub fn is_empty(&self) -> bool {
        self.args.is_empty() && self.capabilities.is_empty()
    }

    /// Whether `word` looks like a command-line option: `-x` or `--name`.
    pub fn is_option(word: &str) -> bool {
        let name = word
            .strip_prefix("--")
            .or_else(|| word.strip_prefix('-'))
            .unwrap_or("");
        !name.is_empty()
            && !name.starts_with('-')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
    }
}

/// One way a model of `format` looks on disk: a single file whose name
/// matches `file`, or a folder that holds, for every pattern of `folder`,
/// at least one entry matching it.
///
/// Patterns match file names (never paths) with `*` (any run of
/// characters) and `?` (one character); see [`name_matches`].
///
/// ```toml
/// [[recognize]]                  # hello.toy is the model `hello`
/// format = "toy"
/// file = "*.toy"
///
/// [[recognize]]                  # a folder holding *.toy is a model named after the folder
/// format = "toy"
/// folder = ["*.toy"]
/// files = ["*.toy", "tokenizer.json"]   # what LoadRequest.model_files lists (default: every file)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecognitionRule {
    /// The format a match has; one of the manifest's `formats`.
    pub format: String,
    /// A single file is a model when its name matches; its id is the
    /// file's stem (`hello.toy` → `hello`).
    #[serde(default)]
    pub file: Option<String>,
    /// A folder is a model when each pattern matches one of its entries;
    /// its id is the folder's name.
    #[serde(default)]
    pub folder: Vec<String>,
    /// The files of a folder model the engine needs, listed to the plugin
    /// as `LoadRequest.model_files` (default: every file of the folder).
    #[serde(default)]
    pub files: Vec<String>,
    /// The files whose sizes make the model's weight size (default: the
    /// files `file` or `folder` matched).
    #[serde(default)]
    pub weights: Vec<String>,
    /// Content checks the host runs on the files a pattern matches before
    /// calling something a model, so that a truncated download is reported
    /// at discovery rather than by a failing engine.
    #[serde(default)]
    pub checks: BTreeMap<String, ContentCheck>,
}

/// A content check the host knows how to run on a model file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContentCheck {
    /// The file is valid JSON.
    Json,
    /// The file's 8-byte header length fits the file (catches truncated
    /// downloads and Git LFS pointers).
    Safetensors,
    /// The file starts with the GGUF magic `GGUF`.
    Gguf,
}

impl std::fmt::Display for ContentCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ContentCheck::Json => "json",
            ContentCheck::Safetensors => "safetensors",
            ContentCheck::Gguf => "gguf",
        })
    }
}

impl RecognitionRule {
    /// What the rule matches, in words: `*.gguf` or `a folder of
    /// config.json + *.safetensors`.
    pub fn describe(&self) -> String {
        match &self.file {
            Some(file) => file.clone(),
            None => format!("a folder of {}", self.folder.join(" + ")),
        }
    }

    /// The rule's identity for conflicts: two rules with the same
    /// signature recognise the same things.
    pub fn signature(&self) -> String {
        match &self.file {
            Some(file) => format!("file {file}"),
            None => {
                let mut patterns = self.folder.clone();
                patterns.sort();
                patterns.dedup();
                format!("folder {}", patterns.join(" + "))
            }
        }
    }

    /// Checks the rule on its own (not whether the manifest serves its
    /// format): exactly one of `file` and `folder`, and valid patterns.
    pub fn validate(&self) -> Result<(), String> {
        let what = self.describe();
        match (&self.file, self.folder.is_empty()) {
            (Some(_), false) => {
                return Err(format!(
                    "the rule for '{}' sets both `file` and `folder`; a rule recognises single files or folders, write two rules for both",
                    self.format
                ))
            }
            (None, true) => {
                return Err(format!(
                    "the rule for '{}' sets neither `file` (a pattern such as \"*.gguf\") nor `folder` (patterns a model folder holds)",
                    self.format
                ))
            }
            _ => {}
        }
        let patterns = self
            .file
            .iter()
            .chain(&self.folder)
            .chain(&self.files)
            .chain(&self.weights)
            .chain(self.checks.keys());
        for pattern in patterns {
            check_pattern(pattern)
                .map_err(|why| format!("the rule for '{}' ({what}): {why}", self.format))?;
        }
        Ok(())
    }
}

/// What the conformance suite tests the plugin with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConformanceSpec {
    /// A representative model (a file or folder), relative to the plugin
    /// folder or crate: the suite recognises it with the plugin's rules,
    /// plans launches for it and, when the engine is installed, serves it.
    #[serde(default)]
    pub fixture: Option<String>,
}

/// Whether the file name `name` matches `pattern`: `*` matches any run of
/// characters (none included), `?` one character, anything else itself.
pub fn name_matches(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // The classic two-pointer match with one backtrack point per `*`.
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Why `pattern` is not a file-name pattern the host matches, if it is not.
fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("a pattern is empty".into());
    }
    if pattern.contains(['/', '\\']) {
        return Err(format!(
            "'{pattern}' is a path; patterns match file names inside a model dir or folder"
        ));
    }
    if let Some(c) = pattern.chars().find(|c| matches!(c, '[' | ']' | '{' | '}')) {
        return Err(format!(
            "'{pattern}' uses '{c}'; patterns know only '*' and '?'"
        ));
    }
    if pattern.chars().all(|c| c == '*' || c == '?') {
        return Err(format!(
            "'{pattern}' matches any name; name the extension or file (\"*.gguf\", \"config.json\")"
        ));
    }
    if pattern.starts_with('.') {
        return Err(format!(
            "'{pattern}' matches hidden files, which model dirs skip"
        ));
    }
    Ok(())
}

/// How the host finds the engine and reads its version.
///
/// With a `program`, the host (never the plugin) looks it up, runs it with
/// `args` under `timeout_ms`, and hands the output to the plugin's `probe()`
/// to interpret. Without one, the plugin's `probe()` inspects its own
/// in-process engine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeSpec {
    /// Program name or path; looked up in the operator's configured path for
    /// this plugin, then `PATH`, then `search_paths`.
    #[serde(default)]
    pub program: Option<String>,
    /// Arguments that make the program print its version.
    #[serde(default)]
    pub args: Vec<String>,
    /// Usual install locations to try after `PATH` (`~` is the home folder).
    #[serde(default)]
    pub search_paths: Vec<String>,
    /// How long the probe may run, in milliseconds (default 5000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

impl ProbeSpec {
    /// The probe's time limit.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.timeout_ms.unwrap_or(5000))
    }
}

/// Why a manifest was refused.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file could not be read.
    #[error("cannot read {path}: {cause}")]
    Read {
        /// The manifest path.
        path: String,
        /// The I/O error.
        cause: std::io::Error,
    },
    /// The file is not valid TOML or does not have the manifest's shape.
    #[error("plugin.toml is malformed: {0}")]
    Malformed(String),
    /// The plugin needs a plugin-api this host does not provide.
    #[error("plugin needs plugin-api {required}, but this host provides {host}; rebuild the plugin against plugin-api {host_major}.x or use a matching host")]
    IncompatibleApi {
        /// The manifest's requirement.
        required: VersionReq,
        /// The host's plugin-api version.
        host: Version,
        /// The host's major version, for the advice.
        host_major: u64,
    },
    /// A field has a value the host cannot accept.
    #[error("plugin.toml field '{field}' is invalid: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong, and what would be right.
        reason: String,
    },
}

impl Manifest {
    /// Reads and validates `dir/plugin.toml`.
    pub fn from_dir(dir: &Path) -> Result<Manifest, ManifestError> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(|cause| ManifestError::Read {
            path: path.display().to_string(),
            cause,
        })?;
        Manifest::parse(&text)
    }

    /// Parses and validates manifest text.
    ///
    /// The plugin-api requirement is checked before any other complaint, so
    /// a plugin written for a newer 1.x (whose manifest may have fields this
    /// host does not know) is told that, not that a field is unknown. The
    /// text is parsed once; only a manifest the strict parse refuses is
    /// parsed again, loosely, to find its requirement.
    pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
        let strict = toml::from_str::<Manifest>(text);
        let api = match &strict {
            Ok(manifest) => Some(manifest.plugin_api.clone()),
            Err(_) => {
                let value: toml::Table = toml::from_str(text).map_err(malformed)?;
                match value.get("plugin_api").and_then(|v| v.as_str()) {
                    Some(api) => {
                        Some(VersionReq::parse(api).map_err(|e| ManifestError::Invalid {
                            field: "plugin_api",
                            reason: format!("'{api}' is not a semver requirement ({e})"),
                        })?)
                    }
                    None => None,
                }
            }
        };
        if let Some(required) = api.filter(|r| !crate::is_compatible(r)) {
            let host = crate::host_version();
            return Err(ManifestError::IncompatibleApi {
                required,
                host_major: host.major,
                host,
            });
        }
        let manifest = strict.map_err(malformed)?;
        manifest.validate()?;
        Ok(manifest)
    }

    /// The artifact's file name on this platform (see [`Manifest::artifact`]).
    pub fn artifact_file_name(&self) -> String {
        if self.artifact.contains('.') {
            return self.artifact.clone();
        }
        match self.kind {
            PluginKind::Native => format!(
                "{}{}{}",
                std::env::consts::DLL_PREFIX,
                self.artifact,
                std::env::consts::DLL_SUFFIX
            ),
            PluginKind::Wasm => format!("{}.wasm", self.artifact),
        }
    }

    /// Every program this plugin may have the host run.
    pub fn allowed_programs(&self) -> impl Iterator<Item = &str> {
        self.probe
            .program
            .iter()
            .chain(&self.programs)
            .map(String::as_str)
    }

    fn validate(&self) -> Result<(), ManifestError> {
        let invalid = |field, reason: String| Err(ManifestError::Invalid { field, reason });
        if !is_valid_plugin_id(&self.id) {
            return invalid(
                "id",
                format!(
                    "'{}' must be lowercase letters, digits and '-', starting with a letter",
                    self.id
                ),
            );
        }
        if self.artifact.is_empty() || self.artifact.contains(['/', '\\']) || self.artifact == ".."
        {
            return invalid(
                "artifact",
                format!(
                    "'{}' must be a file name inside the plugin folder",
                    self.artifact
                ),
            );
        }
        if self.formats.is_empty() {
            return invalid("formats", "a plugin must serve at least one format".into());
        }
        if let Some(bad) = self.formats.iter().find(|f| !is_valid_format(f)) {
            return invalid(
                "formats",
                format!("'{bad}' must be lowercase letters, digits, '-' or '_'"),
            );
        }
        for (alias, target) in &self.aliases {
            if !is_valid_format(alias) || !is_valid_format(target) {
                return invalid(
                    "aliases",
                    format!("'{alias}' = '{target}': names must be lowercase letters, digits, '-' or '_'"),
                );
            }
            if alias == target {
                return invalid("aliases", format!("'{alias}' is aliased to itself"));
            }
            if self.formats.contains(alias) {
                return invalid(
                    "aliases",
                    format!("'{alias}' is both a served format and an alias; a name is one or the other"),
                );
            }
        }
        if self.platforms.is_empty() {
            return invalid(
                "platforms",
                "a plugin must list at least one [[platforms]] entry".into(),
            );
        }
        if let Some(p) = self.platforms.iter().find(|p| p.accelerators.is_empty()) {
            return invalid(
                "platforms",
                format!(
                    "the entry for {}/{} lists no accelerators (use [\"cpu\"] for CPU engines)",
                    p.os, p.arch
                ),
            );
        }
        for p in &self.platforms {
            if let Some(f) = p.formats.iter().find(|f| !self.formats.contains(f)) {
                return invalid(
                    "platforms",
                    format!(
                        "the entry for {}/{} lists format '{f}', which is not one of the plugin's formats [{}]",
                        p.os,
                        p.arch,
                        self.formats.join(", ")
                    ),
                );
            }
        }
        if let Some(bad) = self
            .capabilities
            .keys()
            .find(|c| !capability::is_valid_id(c))
        {
            return invalid(
                "capabilities",
                format!("'{bad}' is not a capability id (lowercase snake_case)"),
            );
        }
        self.validate_flag_surface()?;
        if let Some(bad) = self.model_types.iter().find(|t| !is_valid_model_type(t)) {
            return invalid(
                "model_types",
                format!("'{bad}' is not a model_type (config.json's word: letters, digits, '_' or '-', as \"qwen3_moe\")"),
            );
        }
        if self.in_process && self.kind == PluginKind::Wasm {
            return invalid(
                "in_process",
                "a WebAssembly plugin plans engine processes; it cannot run inference in process (use kind = \"native\")".into(),
            );
        }
        self.validate_settings()?;
        if let Some(bad) = self.allowed_programs().find(|p| p.trim().is_empty()) {
            return invalid("programs", format!("'{bad}' is an empty program name"));
        }
        for (i, rule) in self.recognize.iter().enumerate() {
            rule.validate()
                .or_else(|reason| invalid("recognize", reason))?;
            if let Some(twin) = self.recognize[..i]
                .iter()
                .find(|r| r.signature() == rule.signature())
            {
                return invalid(
                    "recognize",
                    format!(
                        "two rules recognise {} (as '{}' and '{}'); keep one",
                        rule.describe(),
                        twin.format,
                        rule.format
                    ),
                );
            }
            if !self.formats.contains(&rule.format) {
                return invalid(
                    "recognize",
                    format!(
                        "the rule {} recognises format '{}', which `formats` does not list ([{}])",
                        rule.describe(),
                        rule.format,
                        self.formats.join(", ")
                    ),
                );
            }
        }
        if let Some(fixture) = &self.conformance.fixture {
            let path = Path::new(fixture);
            let inside = !fixture.is_empty()
                && path
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !inside {
                return invalid(
                    "conformance.fixture",
                    format!("'{fixture}' must be a path inside the plugin folder or crate (`fixtures/hello.toy`)"),
                );
            }
        }
        Ok(())
    }
}

/// One line from a TOML error: where, then what.
fn malformed(e: toml::de::Error) -> ManifestError {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    // An error without a message (toml 0.8 gave none for a value cut off
    // by the end of the file) still says what went wrong.
    let what = match e.message().trim() {
        "" => "a value is missing or cut off",
        message => message,
    };
    let at = first
        .strip_prefix("TOML parse error ")
        .map(|at| format!(" ({at})"))
        .unwrap_or_default();
    ManifestError::Malformed(format!("{what}{at}"))
}

impl Manifest {
    /// The declared setting called `name`.
    pub fn setting(&self, name: &str) -> Option<&SettingSpec> {
        self.settings.iter().find(|s| s.name == name)
    }

    fn validate_flag_surface(&self) -> Result<(), ManifestError> {
        let invalid = |reason: String| {
            Err(ManifestError::Invalid {
                field: "flag_surface",
                reason,
            })
        };
        let surface = &self.flag_surface;
        if surface.is_empty() {
            return Ok(());
        }
        if self.probe.program.is_none() {
            return invalid("it reads the probe's program, and [probe] names none".into());
        }
        if surface.args.iter().any(Vec::is_empty) {
            return invalid(
                "an entry of args is empty; each is the argument list of one run".into(),
            );
        }
        if surface.args.is_empty() {
            return invalid(
                "capabilities are listed but args is empty: nothing would read the surface".into(),
            );
        }
        for (cap, options) in &surface.capabilities {
            if !self.capabilities.contains_key(cap) {
                return invalid(format!(
                    "capability '{cap}' is not declared in [capabilities]"
                ));
            }
            if options.is_empty() {
                return invalid(format!("capability '{cap}' lists no options"));
            }
            if let Some(bad) = options.iter().find(|o| !FlagSurfaceSpec::is_option(o)) {
                return invalid(format!(
                    "capability '{cap}': '{bad}' is not an option (write -x or --name, no value)"
                ));
            }
        }
        Ok(())
    }

    fn validate_settings(&self) -> Result<(), ManifestError> {
        let invalid = |reason: String| {
            Err(ManifestError::Invalid {
                field: "settings",
                reason,
            })
        };
        let declared = |cap: &str| self.capabilities.contains_key(cap);
        let mut seen = std::collections::BTreeSet::new();
        for s in &self.settings {
            if !capability::is_valid_id(&s.name) {
                return invalid(format!(
                    "'{}' is not a setting name (lowercase snake_case)",
                    s.name
                ));
            }
            if !seen.insert(&s.name) {
                return invalid(format!("'{}' is declared twice", s.name));
            }
            let caps = s.capability.iter().map(String::as_str);
            let value_caps = s.values.iter().filter_map(|v| v.capability());
            if let Some(cap) = caps.chain(value_caps).find(|c| !declared(c)) {
                return invalid(format!(
                    "'{}' needs capability '{cap}', which [capabilities] does not declare",
                    s.name
                ));
            }
            if (s.kind == SettingType::Enum) == s.values.is_empty() {
                return invalid(format!(
                    "'{}': enum settings list their values, and only enum settings do",
                    s.name
                ));
            }
            if let Some(default) = &s.default {
                if let Err(e) = s.check(default, |_| true) {
                    return invalid(format!("the default of '{}' is invalid: {e}", s.name));
                }
            }
        }
        if let Some((field, cap)) = self.request_fields.iter().find(|(_, c)| !declared(c)) {
            return Err(ManifestError::Invalid {
                field: "request_fields",
                reason: format!(
                    "'{field}' needs capability '{cap}', which [capabilities] does not declare"
                ),
            });
        }
        Ok(())
    }
}

/// Whether `id` is a valid plugin id.
pub fn is_valid_plugin_id(id: &str) -> bool {
    let mut chars = id.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && id.len() <= 64
}

/// A `model_type` as config.json writes it (`qwen3_moe`, `xlm-roberta`).
fn is_valid_model_type(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn is_valid_format(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        id = "demo"
        name = "Demo"
        version = "0.1.0"
        plugin_api = "^1.0"
        kind = "native"
        artifact = "demo"
        formats = ["mlx"]
        [[platforms]]
        os = "linux"
        arch = "x86_64"
        accelerators = ["cpu"]
    "#;

    fn error_of(text: &str) -> String {
        Manifest::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn a_minimal_manifest_parses() {
        let m = Manifest::parse(GOOD).unwrap();
        assert_eq!(m.priority, 0);
        assert_eq!(
            m.artifact_file_name(),
            format!(
                "{}demo{}",
                std::env::consts::DLL_PREFIX,
                std::env::consts::DLL_SUFFIX
            )
        );
    }

    #[test]
    fn errors_say_what_and_where() {
        assert!(error_of("id = ").starts_with("plugin.toml is malformed"));
        assert!(error_of(&GOOD.replace("native", "python")).contains("unknown variant `python`"));
        assert!(error_of(&GOOD.replace("^1.0", "^2.0")).contains("needs plugin-api ^2.0"));
        assert!(error_of(&GOOD.replace("\"demo\"\n", "\"Demo!\"\n")).contains("field 'id'"));
        assert!(error_of(&format!("{GOOD}\npriorty = 3")).contains("unknown field `priorty`"));
        assert!(error_of(&GOOD.replace("[\"mlx\"]", "[]")).contains("at least one format"));
    }

    #[test]
    fn model_types_default_to_every_family_and_are_checked() {
        assert!(Manifest::parse(GOOD).unwrap().model_types.is_empty());
        let with = |types: &str| format!("model_types = {types}\n{GOOD}");
        let m = Manifest::parse(&with(r#"["llama", "qwen3_moe", "xlm-roberta"]"#)).unwrap();
        assert_eq!(m.model_types, ["llama", "qwen3_moe", "xlm-roberta"]);
        assert!(error_of(&with(r#"["llama", "qwen 3"]"#))
            .contains("field 'model_types' is invalid: 'qwen 3' is not a model_type"));
        assert!(error_of(&with(r#"[""]"#)).contains("field 'model_types'"));
    }

    #[test]
    fn recognition_rules_and_fixtures_are_validated() {
        let with = |extra: &str| format!("{GOOD}\n{extra}");
        let rule = |body: &str| with(&format!("[[recognize]]\n{body}"));
        let m = Manifest::parse(&rule("format = \"mlx\"\nfile = \"*.toy\"")).unwrap();
        assert_eq!(m.recognize[0].describe(), "*.toy");
        let errors = [
            rule("format = \"toy\"\nfile = \"*.toy\""),
            rule("format = \"mlx\""),
            rule("format = \"mlx\"\nfile = \"*.toy\"\nfolder = [\"*.toy\"]"),
            rule("format = \"mlx\"\nfile = \"models/*.toy\""),
            rule("format = \"mlx\"\nfolder = [\"*\"]"),
            rule("format = \"mlx\"\nfolder = [\"*.[ch]\"]"),
            rule("format = \"mlx\"\nfile = \"*.toy\"\nchecks = { \"*.toy\" = \"crc\" }"),
            rule("format = \"mlx\"\nfolder = [\"a.x\", \"*.y\"]\n[[recognize]]\nformat = \"mlx\"\nfolder = [\"*.y\", \"a.x\"]"),
            with("[conformance]\nfixture = \"../models/x.toy\""),
            with("[conformance]\nfixture = \"/models/x.toy\""),
        ];
        let errors: Vec<String> = errors.iter().map(|t| error_of(t)).collect();
        expect_test::expect![[r#"
            plugin.toml field 'recognize' is invalid: the rule *.toy recognises format 'toy', which `formats` does not list ([mlx])
            plugin.toml field 'recognize' is invalid: the rule for 'mlx' sets neither `file` (a pattern such as "*.gguf") nor `folder` (patterns a model folder holds)
            plugin.toml field 'recognize' is invalid: the rule for 'mlx' sets both `file` and `folder`; a rule recognises single files or folders, write two rules for both
            plugin.toml field 'recognize' is invalid: the rule for 'mlx' (models/*.toy): 'models/*.toy' is a path; patterns match file names inside a model dir or folder
            plugin.toml field 'recognize' is invalid: the rule for 'mlx' (a folder of *): '*' matches any name; name the extension or file ("*.gguf", "config.json")
            plugin.toml field 'recognize' is invalid: the rule for 'mlx' (a folder of *.[ch]): '*.[ch]' uses '['; patterns know only '*' and '?'
            plugin.toml is malformed: unknown variant `crc`, expected one of `json`, `safetensors`, `gguf` (at line 17, column 22)
            plugin.toml field 'recognize' is invalid: two rules recognise a folder of *.y + a.x (as 'mlx' and 'mlx'); keep one
            plugin.toml field 'conformance.fixture' is invalid: '../models/x.toy' must be a path inside the plugin folder or crate (`fixtures/hello.toy`)
            plugin.toml field 'conformance.fixture' is invalid: '/models/x.toy' must be a path inside the plugin folder or crate (`fixtures/hello.toy`)
        "#]]
        .assert_eq(&(errors.join("\n") + "\n"));
    }

    #[test]
    fn patterns_match_names_with_star_and_question_mark() {
        let cases = [
            ("*.gguf", "llama.Q4_K_M.gguf", true),
            ("*.gguf", "llama.gguf.part", false),
            ("config.json", "config.json", true),
            ("config.json", "xconfig.json", false),
            (
                "model-?????-of-*.safetensors",
                "model-00001-of-00002.safetensors",
                true,
            ),
            (
                "model-?????-of-*.safetensors",
                "model-1-of-2.safetensors",
                false,
            ),
            ("*.toy", ".toy", true),
            ("a*b*c", "abxbc", true),
            ("a*b*c", "acb", false),
        ];
        for (pattern, name, expected) in cases {
            assert_eq!(name_matches(pattern, name), expected, "{pattern} vs {name}");
        }
    }
}
