//! Settings, in layers: the engine's built-in defaults < app defaults
//! (generation defaults for every model, the default engine of each format,
//! global settings of each engine) < per-model overrides < per-request
//! fields.
//!
//! The stored layers live in `settings.toml` (beside `config.toml`), which
//! the API reads and writes; every write is validated against the serving
//! plugin's declared settings and its engine's capabilities first, and
//! replaces the file atomically.
//!
//! ```toml
//! [defaults]                 # generation defaults, for every model
//! max_tokens = 512
//! [default_engines]          # format → plugin
//! mlx = "mlx-lm"
//! [engines.mlxcel]           # one engine's settings, for every model it serves
//! parallel = 2
//! [models.tiny-llama]        # one model's settings
//! kv_cache_type = "int8"
//! [serving]                  # the host's own: timeouts, health, fallback
//! first_byte_timeout_ms = 120000
//! fallback = true
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use hangar_plugin_api::capability;
use hangar_plugin_api::settings::{EnumValue, SettingSpec, SettingType};
use hangar_plugin_api::wire::settings as names;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::supervisor::health::ServingSettings;
use hangar_engine::registry::{CapabilityState, Engine, PluginEntry};

/// A map of settings by name.
pub(crate) type SettingMap = BTreeMap<String, Value>;

/// The stored layers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Stored {
    /// Generation defaults for every model (the names in [`generation`]).
    #[serde(default)]
    pub defaults: SettingMap,
    /// Format → the plugin to prefer for it.
    #[serde(default)]
    pub default_engines: BTreeMap<String, String>,
    /// Plugin id → settings for every model it serves.
    #[serde(default)]
    pub engines: BTreeMap<String, SettingMap>,
    /// Model id → that model's settings.
    #[serde(default)]
    pub models: BTreeMap<String, SettingMap>,
    /// Timeouts, health polling and fallback (`[serving]`).
    #[serde(default)]
    pub serving: ServingSettings,
}

/// The app-wide layers, as `GET/PUT /api/settings` carry them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AppSettings {
    /// Generation defaults.
    #[serde(default)]
    pub defaults: SettingMap,
    /// Per-format default engine.
    #[serde(default)]
    pub default_engines: BTreeMap<String, String>,
    /// Global engine settings.
    #[serde(default)]
    pub engines: BTreeMap<String, SettingMap>,
    /// Timeouts, health polling and fallback.
    #[serde(default)]
    pub serving: ServingSettings,
}

/// The generation defaults an operator may set for every model: each is
/// passed only to engines that declare a setting of the same name.
pub(crate) fn generation() -> Vec<SettingSpec> {
    let spec =
        |name: &str, kind, min: Option<f64>, max: Option<f64>, description: &str| SettingSpec {
            name: name.into(),
            kind,
            description: description.into(),
            default: None,
            capability: None,
            values: vec![],
            min,
            max,
        };
    vec![
        spec(
            names::CONTEXT_LENGTH,
            SettingType::Integer,
            Some(1.0),
            None,
            "context length in tokens",
        ),
        spec(
            names::MAX_TOKENS,
            SettingType::Integer,
            Some(1.0),
            None,
            "default maximum tokens per answer",
        ),
        spec(
            names::TEMPERATURE,
            SettingType::Number,
            Some(0.0),
            Some(2.0),
            "default sampling temperature",
        ),
        spec(
            names::TOP_P,
            SettingType::Number,
            Some(0.0),
            Some(1.0),
            "default nucleus sampling mass",
        ),
        spec(
            names::TOP_K,
            SettingType::Integer,
            Some(0.0),
            None,
            "default top-k",
        ),
        spec(
            names::MIN_P,
            SettingType::Number,
            Some(0.0),
            Some(1.0),
            "default min-p",
        ),
        SettingSpec {
            kind: SettingType::Enum,
            values: REASONING_EFFORTS.iter().map(|v| EnumValue::Plain(v.to_string())).collect(),
            ..spec(
                names::REASONING_EFFORT,
                SettingType::Enum,
                None,
                None,
                "default reasoning effort of chat requests, for engines with the reasoning_effort capability",
            )
        },
    ]
}

/// The values of `reasoning_effort`, as OpenAI's chat API takes them.
pub(crate) const REASONING_EFFORTS: &[&str] = &["low", "medium", "high"];

/// The app defaults the host puts into each chat request that lacks them
/// (rather than passing to the engine at load), each with the capability
/// an engine needs to take it.
const REQUEST_DEFAULTS: &[(&str, &str)] =
    &[(names::REASONING_EFFORT, capability::REASONING_EFFORT)];

/// Why the app default `name` (one of [`REQUEST_DEFAULTS`]) does not reach
/// requests to this engine, or `None` when it does.
fn request_default_off(entry: &PluginEntry, engine: &Engine, capability: &str) -> Option<String> {
    if entry.manifest.capabilities.contains_key(capability) {
        capability_off(entry, engine, capability)
    } else {
        Some(format!(
            "plugin '{}' does not declare the {capability} capability",
            entry.manifest.id
        ))
    }
}

/// The fields the app defaults add to a chat request for this engine:
/// those the request does not set and the engine can take.
pub(crate) fn request_defaults(
    stored: &Stored,
    entry: &PluginEntry,
    engine: &Engine,
    request: &serde_json::Map<String, Value>,
) -> Vec<(String, Value)> {
    REQUEST_DEFAULTS
        .iter()
        .filter(|(name, _)| request.get(*name).is_none_or(Value::is_null))
        .filter_map(|(name, cap)| {
            let value = stored.defaults.get(*name).filter(|v| !v.is_null())?;
            request_default_off(entry, engine, cap)
                .is_none()
                .then(|| (name.to_string(), value.clone()))
        })
        .collect()
}

/// The host's own per-model settings (under `[models.<id>]`, beside the
/// engine's): how the scheduler keeps the model. They never reach the
/// engine.
///
/// | setting | what |
/// |---|---|
/// | `pin` | loaded when the host starts, never evicted nor unloaded when idle |
/// | `ttl_seconds` | unloaded after that long without requests |
/// | `max_concurrent_requests` | requests served at once for this model; more wait in the queue |
/// | `drain_seconds` | how long an unload or eviction waits for in-flight requests (default 30) |
/// | `tool_parser` | the tool-call markup the model writes, where its chat template does not tell (`hermes`, `llama3_json`, `mistral`, `qwen3_xml`, `gemma`) |
pub(crate) fn residency() -> Vec<SettingSpec> {
    let spec = |name: &str, kind, min: Option<f64>, description: &str| SettingSpec {
        name: name.into(),
        kind,
        description: description.into(),
        default: None,
        capability: None,
        values: vec![],
        min,
        // Whole days at most: a larger number is a mistake, not a policy.
        max: (kind == SettingType::Integer).then_some(86_400.0 * 365.0),
    };
    vec![
        spec(
            names_residency::PIN,
            SettingType::Boolean,
            None,
            "load at start and never evict",
        ),
        spec(
            names_residency::TTL_SECONDS,
            SettingType::Integer,
            Some(1.0),
            "unload after this many seconds idle",
        ),
        spec(
            names_residency::MAX_CONCURRENT_REQUESTS,
            SettingType::Integer,
            Some(1.0),
            "requests served at once for this model",
        ),
        spec(
            names_residency::DRAIN_SECONDS,
            SettingType::Integer,
            Some(0.0),
            "seconds an unload waits for in-flight requests",
        ),
        SettingSpec {
            values: crate::toolcall::Format::names()
                .into_iter()
                .map(|n| EnumValue::Plain(n.into()))
                .collect(),
            ..spec(
                names_residency::TOOL_PARSER,
                SettingType::Enum,
                None,
                "the tool-call markup the model writes, where its chat template does not tell",
            )
        },
    ]
}

/// The names of the [`residency`] settings.
pub(crate) mod names_residency {
    /// `pin`.
    pub(crate) const PIN: &str = "pin";
    /// `ttl_seconds`.
    pub(crate) const TTL_SECONDS: &str = "ttl_seconds";
    /// `max_concurrent_requests`.
    pub(crate) const MAX_CONCURRENT_REQUESTS: &str = "max_concurrent_requests";
    /// `drain_seconds`.
    pub(crate) const DRAIN_SECONDS: &str = "drain_seconds";
    /// `tool_parser`.
    pub(crate) const TOOL_PARSER: &str = "tool_parser";
}

/// How long an unload waits for in-flight requests unless `drain_seconds`
/// says otherwise.
pub(crate) const DEFAULT_DRAIN_SECONDS: u64 = 30;

/// A model's residency settings, typed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Residency {
    /// `pin`.
    pub pin: bool,
    /// `ttl_seconds`.
    pub ttl_seconds: Option<u64>,
    /// `max_concurrent_requests`.
    pub max_concurrent_requests: Option<u64>,
    /// `drain_seconds`.
    pub drain_seconds: u64,
}

/// Whether `name` is one of the host's own per-model settings, which never
/// reach the engine: the [`residency`] settings, aliases and profiles.
pub(crate) fn is_host_own(name: &str) -> bool {
    is_residency(name) || is_name_setting(name)
}

/// The setting that holds a model's aliases (see `names`).
pub(crate) const ALIASES: &str = "aliases";
/// The setting that holds a model's profiles (see `names`).
pub(crate) const PROFILES: &str = "profiles";

/// Whether `name` is [`ALIASES`] or [`PROFILES`].
fn is_name_setting(name: &str) -> bool {
    name == ALIASES || name == PROFILES
}

fn is_residency(name: &str) -> bool {
    use names_residency::*;
    [
        PIN,
        TTL_SECONDS,
        MAX_CONCURRENT_REQUESTS,
        DRAIN_SECONDS,
        TOOL_PARSER,
    ]
    .contains(&name)
}

/// The model's residency settings from the stored layers (checked when
/// they were stored).
pub(crate) fn residency_of(stored: &Stored, model: &str) -> Residency {
    use names_residency::*;
    let map = stored.models.get(model);
    let get = |name: &str| map.and_then(|m| m.get(name));
    Residency {
        pin: get(PIN).and_then(Value::as_bool).unwrap_or(false),
        ttl_seconds: get(TTL_SECONDS).and_then(Value::as_u64),
        max_concurrent_requests: get(MAX_CONCURRENT_REQUESTS).and_then(Value::as_u64),
        drain_seconds: get(DRAIN_SECONDS)
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_DRAIN_SECONDS),
    }
}

/// Checks a model's settings map: the host's [`residency`] settings by
/// type and range, the rest against the plugin and its engine (aliases and
/// profiles are checked by the `names` module).
pub(crate) fn check_model_map(
    entry: &PluginEntry,
    engine: &Engine,
    map: &SettingMap,
) -> Result<(), Refused> {
    let specs = residency();
    let (host, rest): (SettingMap, SettingMap) = map
        .clone()
        .into_iter()
        .filter(|(name, _)| !is_name_setting(name))
        .partition(|(name, _)| is_residency(name));
    let mut problems: Vec<String> = host
        .iter()
        .filter(|(_, v)| !v.is_null())
        .filter_map(|(name, value)| {
            let spec = specs.iter().find(|s| &s.name == name)?;
            check_value(spec, value, |_| true).err()
        })
        .collect();
    if let Err(Refused(p)) = check_map(entry, engine, &rest) {
        problems.extend(p);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Refused(problems))
    }
}

/// Why settings were refused: every problem, each a full sentence. The API
/// answers 422 with them.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", .0.join("; "))]
pub(crate) struct Refused(pub Vec<String>);

/// Why the settings file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    /// Reading or writing failed.
    #[error("settings file {path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        cause: std::io::Error,
    },
    /// The file is not valid.
    #[error("settings file {path} is invalid: {message}; fix it or move it aside")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// The stored layers, shared by the host, and the file they persist to.
#[derive(Debug)]
pub(crate) struct SettingsStore {
    path: Option<PathBuf>,
    stored: RwLock<Stored>,
    /// Bumped by every write, so that what was derived from the settings
    /// (resolutions) knows when to derive it again.
    generation: AtomicU64,
}

impl SettingsStore {
    /// Reads `path` (a missing file is empty settings). `None` keeps
    /// settings in memory only.
    pub(crate) fn open(path: Option<PathBuf>) -> Result<SettingsStore, StoreError> {
        let stored = match &path {
            Some(path) => match std::fs::read_to_string(path) {
                Ok(text) => toml::from_str(&text).map_err(|e| StoreError::Invalid {
                    path: path.clone(),
                    message: e.message().to_string(),
                })?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Stored::default(),
                Err(cause) => {
                    return Err(StoreError::Io {
                        path: path.clone(),
                        cause,
                    })
                }
            },
            None => Stored::default(),
        };
        Ok(SettingsStore {
            path,
            stored: RwLock::new(stored),
            generation: AtomicU64::new(0),
        })
    }

    /// A copy of every stored layer.
    pub(crate) fn get(&self) -> Stored {
        self.stored.read().expect("settings lock").clone()
    }

    /// `f` of the stored layers, without copying them.
    pub(crate) fn read<T>(&self, f: impl FnOnce(&Stored) -> T) -> T {
        f(&self.stored.read().expect("settings lock"))
    }

    /// Replaces the stored layers after `check` accepted them, then writes
    /// the file (atomically: a temporary file renamed over the old one).
    pub(crate) fn update(&self, change: impl FnOnce(&mut Stored)) -> Result<(), StoreError> {
        let mut guard = self.stored.write().expect("settings lock");
        let mut next = guard.clone();
        change(&mut next);
        if let Some(path) = &self.path {
            write_atomically(path, &next)?;
        }
        *guard = next;
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// How many writes the settings have had.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

fn write_atomically(path: &Path, stored: &Stored) -> Result<(), StoreError> {
    let io = |cause| StoreError::Io {
        path: path.to_path_buf(),
        cause,
    };
    let text = toml::to_string_pretty(stored).map_err(|e| StoreError::Invalid {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(
        &tmp,
        format!("# Written by hangar; edit with care, or use the /api/settings routes.\n{text}"),
    )
    .map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// The words for an engine in refusals: its probe program's name
/// (`mlxcel-server`), or `engine`.
fn engine_name(entry: &PluginEntry) -> String {
    entry
        .manifest
        .probe
        .program
        .as_deref()
        .and_then(|p| Path::new(p).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "engine".into())
}

/// Why `capability` is off, in a sentence naming the plugin, the engine,
/// the required and the found version.
pub(crate) fn capability_off(
    entry: &PluginEntry,
    engine: &Engine,
    capability: &str,
) -> Option<String> {
    let required = entry.manifest.capabilities.get(capability)?;
    match engine.capabilities.get(capability) {
        Some(CapabilityState::On) => None,
        _ => Some(format!(
            "plugin '{}' needs {} {required} for {capability}; found {}",
            entry.manifest.id,
            engine_name(entry),
            engine
                .version
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_else(|| "an unknown version".into())
        )),
    }
}

/// Checks one setting for a plugin and its engine: declared, well typed,
/// and available at the engine's version.
pub(crate) fn check_setting(
    entry: &PluginEntry,
    engine: &Engine,
    name: &str,
    value: &Value,
) -> Result<(), String> {
    let manifest = &entry.manifest;
    let Some(spec) = manifest.setting(name) else {
        let known: Vec<&str> = manifest.settings.iter().map(|s| s.name.as_str()).collect();
        return Err(format!(
            "plugin '{}' has no setting '{name}' (its settings: {})",
            manifest.id,
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ));
    };
    if let Some(reason) = spec
        .capability
        .as_deref()
        .and_then(|c| capability_off(entry, engine, c))
    {
        return Err(format!("setting '{name}' is unavailable: {reason}"));
    }
    let enabled = |cap: &str| {
        engine
            .capabilities
            .get(cap)
            .is_some_and(CapabilityState::is_on)
    };
    check_value(spec, value, enabled).map_err(|e| {
        match spec
            .values
            .iter()
            .find(|v| Some(v.value()) == value.as_str())
        {
            Some(v) if v.capability().is_some_and(|c| !enabled(c)) => {
                let cap = v.capability().unwrap_or_default();
                format!(
                    "{e}: {}",
                    capability_off(entry, engine, cap).unwrap_or_default()
                )
            }
            _ => e,
        }
    })
}

/// The longest string a setting may hold, in bytes: room for any path.
pub(crate) const MAX_STRING: usize = 4096;

/// The largest value a setting may hold, as JSON, in bytes.
pub(crate) const MAX_VALUE: usize = 64 * 1024;

/// Checks `value` against `spec` (type, range, gated enum values) and that
/// `settings.toml` can hold it: TOML has no null and no integer beyond
/// 64-bit signed, so such a value is refused here, at check time, rather
/// than failing the file write. Strings and whole values are capped.
pub(crate) fn check_value(
    spec: &SettingSpec,
    value: &Value,
    enabled: impl Fn(&str) -> bool,
) -> Result<(), String> {
    storable(&spec.name, value)?;
    spec.check(value, enabled)
}

fn storable(name: &str, value: &Value) -> Result<(), String> {
    let size = serde_json::to_string(value).map(|s| s.len()).unwrap_or(0);
    if size > MAX_VALUE {
        return Err(format!(
            "setting '{name}' is {size} bytes of JSON; settings hold at most {MAX_VALUE}"
        ));
    }
    fn walk(name: &str, at: &str, value: &Value) -> Result<(), String> {
        match value {
            Value::Null if !at.is_empty() => Err(format!(
                "setting '{name}' has null at {at}; settings.toml cannot hold null, leave the entry out"
            )),
            Value::Number(n) if n.is_u64() && n.as_i64().is_none() => Err(format!(
                "setting '{name}'{} is {n}, beyond the largest whole number settings.toml holds ({})",
                if at.is_empty() { String::new() } else { format!(" at {at}") },
                i64::MAX
            )),
            Value::String(s) if s.len() > MAX_STRING => Err(format!(
                "setting '{name}'{} is a string of {} bytes; settings hold strings of at most {MAX_STRING}",
                if at.is_empty() { String::new() } else { format!(" at {at}") },
                s.len()
            )),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .try_for_each(|(i, v)| walk(name, &format!("{at}[{i}]"), v)),
            Value::Object(map) if at.is_empty() => map.iter().try_for_each(|(k, v)| walk(name, k, v)),
            Value::Object(map) => map
                .iter()
                .try_for_each(|(k, v)| walk(name, &format!("{at}.{k}"), v)),
            _ => Ok(()),
        }
    }
    walk(name, "", value)
}

/// Checks a whole settings map for one plugin; collects every problem.
pub(crate) fn check_map(
    entry: &PluginEntry,
    engine: &Engine,
    map: &SettingMap,
) -> Result<(), Refused> {
    let problems: Vec<String> = map
        .iter()
        .filter(|(_, v)| !v.is_null())
        .filter_map(|(k, v)| check_setting(entry, engine, k, v).err())
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Refused(problems))
    }
}

/// Checks the generation defaults (engine-independent: type and range).
pub(crate) fn check_defaults(defaults: &SettingMap) -> Result<(), Refused> {
    let specs = generation();
    let problems: Vec<String> = defaults
        .iter()
        .filter(|(_, v)| !v.is_null())
        .filter_map(|(name, value)| match specs.iter().find(|s| &s.name == name) {
            None => Some(format!(
                "'{name}' is not a generation default (they are: {}); engine settings go under engines.<plugin> or a model's settings",
                specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
            )),
            Some(spec) => check_value(spec, value, |_| true).err(),
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Refused(problems))
    }
}

/// Where an effective setting came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Layer {
    /// `[defaults]`.
    AppDefault,
    /// `[engines.<plugin>]`.
    Engine,
    /// `[models.<id>]`.
    Model,
}

/// One effective setting.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Effective {
    /// The value.
    pub value: Value,
    /// The layer it came from.
    pub source: Layer,
}

/// The settings a model gets from the stored layers, for the plugin that
/// serves it: app defaults the plugin declares < engine settings < model
/// settings. A stored value the engine cannot take now (its version
/// changed since it was stored) is left out, with a note saying why.
pub(crate) fn effective(
    stored: &Stored,
    entry: &PluginEntry,
    engine: &Engine,
    model: &str,
) -> (BTreeMap<String, Effective>, Vec<String>) {
    let mut out = BTreeMap::new();
    let mut notes = Vec::new();
    let empty = SettingMap::new();
    let layers = [
        (Layer::AppDefault, &stored.defaults),
        (
            Layer::Engine,
            stored.engines.get(&entry.manifest.id).unwrap_or(&empty),
        ),
        (Layer::Model, stored.models.get(model).unwrap_or(&empty)),
    ];
    for (layer, map) in layers {
        for (name, value) in map {
            if value.is_null() {
                out.remove(name);
                continue;
            }
            if layer == Layer::Model && is_host_own(name) {
                continue; // the host's own: the scheduler and the API read it
            }
            if let Some((_, cap)) = REQUEST_DEFAULTS
                .iter()
                .find(|(n, _)| layer == Layer::AppDefault && n == name)
            {
                // Not a launch setting: the host adds it to each request.
                if let Some(reason) = request_default_off(entry, engine, cap) {
                    notes.push(format!(
                        "app default '{name}' is not passed to this model's requests: {reason}"
                    ));
                }
                continue;
            }
            if layer == Layer::AppDefault && entry.manifest.setting(name).is_none() {
                continue; // a generation default this engine has no setting for
            }
            match check_setting(entry, engine, name, value) {
                Ok(()) => {
                    out.insert(
                        name.clone(),
                        Effective {
                            value: value.clone(),
                            source: layer,
                        },
                    );
                }
                Err(reason) => {
                    notes.push(format!("stored setting '{name}' was not applied: {reason}"))
                }
            }
        }
    }
    (out, notes)
}

/// The content parts that need a capability, and what they carry: OpenAI's
/// `input_audio` parts need `audio_input`, `image_url` parts `vision`.
const GATED_PARTS: &[(&str, &str, &str)] = &[
    ("input_audio", capability::AUDIO_INPUT, "audio"),
    ("image_url", capability::VISION, "images"),
];

/// Where the first content part of type `kind` is in a chat request's
/// `messages` (`messages[0].content[1]`), if it has one.
pub(crate) fn first_part(request: &serde_json::Map<String, Value>, kind: &str) -> Option<String> {
    let messages = request.get("messages")?.as_array()?;
    messages.iter().enumerate().find_map(|(m, message)| {
        let parts = message.get("content")?.as_array()?;
        let p = parts
            .iter()
            .position(|part| part.get("type").and_then(Value::as_str) == Some(kind))?;
        Some(format!("messages[{m}].content[{p}]"))
    })
}

/// The chat message parts an engine cannot take now (audio to an engine
/// without audio input): a sentence for each kind, naming the first part.
pub(crate) fn refused_request_parts(
    entry: &PluginEntry,
    engine: &Engine,
    request: &serde_json::Map<String, Value>,
) -> Vec<String> {
    GATED_PARTS
        .iter()
        .filter_map(|(kind, cap, what)| {
            let at = first_part(request, kind)?;
            let reason = request_default_off(entry, engine, cap)?;
            Some(format!(
                "{at} is an {kind} part, which needs the {cap} capability: {reason}; send text only, or serve the model with an engine that takes {what}"
            ))
        })
        .collect()
}

/// Why a completion's `prompt` is refused for this engine, if it is: a
/// list of several prompts, or of token ids, needs the `prompt_lists`
/// capability (mlx_lm.server's generation thread dies on any list). A
/// list of one string never gets here: the edge sends it as the string.
pub(crate) fn refused_prompt_list(
    entry: &PluginEntry,
    engine: &Engine,
    request: &serde_json::Map<String, Value>,
) -> Option<String> {
    let list = request.get("prompt")?.as_array()?;
    let what = match list.first() {
        Some(Value::String(_)) => format!("a list of {} prompts", list.len()),
        _ => "a list of token ids".to_string(),
    };
    let cap = capability::PROMPT_LISTS;
    let reason = request_default_off(entry, engine, cap)?;
    Some(format!(
        "'prompt' is {what}, which needs the {cap} capability: {reason}; send one prompt as a string, or serve the model with an engine that takes lists"
    ))
}

/// The request fields an engine cannot take now: a sentence for each.
pub(crate) fn refused_request_fields(
    entry: &PluginEntry,
    engine: &Engine,
    request: &serde_json::Map<String, Value>,
) -> Vec<String> {
    entry
        .manifest
        .request_fields
        .iter()
        .filter(|(field, _)| request.get(*field).is_some_and(|v| !v.is_null()))
        .filter_map(|(field, cap)| {
            capability_off(entry, engine, cap)
                .map(|reason| format!("request field '{field}' is unavailable: {reason}"))
        })
        .collect()
}
