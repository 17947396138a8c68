//! Loads WebAssembly plugins: components of the `hangar:engine@1.0.0` world
//! (`plugin-api/wit/engine.wit`), run in a wasmtime sandbox.
//!
//! - The world imports nothing but `host.panicked`: a guest cannot spawn a
//!   process, open a file or reach the network. It only plans; the host
//!   runs the plan, and only programs the manifest declares.
//! - Every call gets a fresh instance under an epoch deadline and a memory
//!   cap ([`WasmConfig`]). A guest that traps, loops or grows past its cap
//!   is stopped; the caller gets an error that says which, and nothing else
//!   in the host is touched.
//! - A plugin's artifact may be a component, or the core module that
//!   `cargo build --target wasm32-unknown-unknown` writes with the SDK (it
//!   carries the world's type information; `wit-component` turns it into a
//!   component).
//! - Compiled components are cached on disk, keyed by the artifact's
//!   SHA-256, this host's version and wasmtime's compatibility hash, so a
//!   plugin is compiled once, not at every start.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, ResourceLimiter, Store, Trap};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../plugin-api/wit",
        world: "engine",
    });
}

use bindings::exports::hangar::engine::plugin::Guest;

use crate::config::WasmConfig;

/// How often the epoch advances: the resolution of call deadlines.
const TICK: Duration = Duration::from_millis(10);

static CONFIG: OnceLock<WasmConfig> = OnceLock::new();

/// Sets the runtime's settings for this process; the first call wins, and
/// a process that never calls it uses the defaults.
pub fn configure(config: &WasmConfig) {
    let _ = CONFIG.set(config.clone());
}

fn config() -> &'static WasmConfig {
    CONFIG.get_or_init(WasmConfig::default)
}

/// The process's one wasmtime engine, with a thread that advances its epoch
/// every [`TICK`].
fn engine() -> Result<&'static Engine, String> {
    static ENGINE: OnceLock<Result<Engine, String>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let mut config = Config::new();
            config.epoch_interruption(true);
            config.max_wasm_stack(1 << 20);
            let engine = Engine::new(&config)
                .map_err(|e| format!("cannot start the WebAssembly runtime: {e}"))?;
            let ticker = engine.weak();
            std::thread::Builder::new()
                .name("hangar-wasm-epoch".into())
                .spawn(move || {
                    while let Some(engine) = ticker.upgrade() {
                        engine.increment_epoch();
                        drop(engine);
                        std::thread::sleep(TICK);
                    }
                })
                .map_err(|e| format!("cannot start the WebAssembly epoch thread: {e}"))?;
            Ok(engine)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// What one instance holds: its memory cap, and what went wrong.
struct GuestState {
    memory_cap: usize,
    /// Linear memory the guest asked for past its cap, in bytes.
    refused_growth: Option<usize>,
    /// The guest's panic message, sent just before it trapped.
    panicked: Option<String>,
}

impl ResourceLimiter for GuestState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_cap {
            self.refused_growth = Some(desired);
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }
}

impl bindings::hangar::engine::host::Host for GuestState {
    fn panicked(&mut self, message: String) {
        self.panicked = Some(message);
    }
}

/// Which body a plugin's mapping sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// A client's request, before the host forwards it to the engine.
    Request,
    /// The engine's non-streaming response, before the host returns it.
    Response,
}

impl Direction {
    fn function(self) -> &'static str {
        match self {
            Direction::Request => "map_request",
            Direction::Response => "map_response",
        }
    }
}

/// A loaded WebAssembly plugin.
#[derive(Clone)]
pub struct WasmPlugin {
    pre: Arc<bindings::EnginePre<GuestState>>,
    limits: &'static WasmConfig,
}

impl std::fmt::Debug for WasmPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmPlugin")
            .field("call_timeout_ms", &self.limits.call_timeout_ms)
            .field("memory_mib", &self.limits.memory_mib)
            .finish()
    }
}

impl WasmPlugin {
    /// Compiles (or takes from the cache) and links the component at
    /// `path`, with this process's limits.
    pub fn load(path: &Path) -> Result<WasmPlugin, String> {
        let engine = engine()?;
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let component = compile_cached(engine, path, &bytes)?;
        let mut linker = Linker::<GuestState>::new(engine);
        bindings::Engine::add_to_linker::<_, HasSelf<GuestState>>(&mut linker, |s| s)
            .map_err(|e| format!("cannot link {}: {e}", path.display()))?;
        let pre = linker.instantiate_pre(&component).map_err(|e| {
            format!(
                "{} is not a plugin of the hangar:engine@1.0.0 world: {e:#}; build it with hangar-sdk's export_plugin!",
                path.display()
            )
        })?;
        let pre = bindings::EnginePre::new(pre).map_err(|e| {
            format!(
                "{} does not export the hangar:engine@1.0.0 world's plugin interface: {e:#}",
                path.display()
            )
        })?;
        Ok(WasmPlugin {
            pre: Arc::new(pre),
            limits: config(),
        })
    }

    /// Calls the plugin's `describe()`.
    pub fn describe(&self) -> Result<hangar_plugin_api::wire::Description, String> {
        let json = self.call("describe", |guest, store| guest.call_describe(store))?;
        decode("describe", &json)
    }

    /// Calls the plugin's `probe()`.
    pub fn probe(
        &self,
        input: &hangar_plugin_api::wire::ProbeInput,
    ) -> Result<hangar_plugin_api::wire::ProbeReport, String> {
        self.typed("probe", input)
    }

    /// Calls the plugin's `plan_launch()`.
    pub fn plan_launch(
        &self,
        request: &hangar_plugin_api::wire::LoadRequest,
    ) -> Result<hangar_plugin_api::wire::LaunchPlan, String> {
        self.typed("plan_launch", request)
    }

    fn typed<I: Serialize, O: DeserializeOwned>(&self, name: &str, input: &I) -> Result<O, String> {
        let json = self.call_json(name, &encode(name, input)?)?;
        decode(name, &json)
    }

    /// Calls `probe` or `plan_launch` with the message `json` as it is (the
    /// conformance suite sends malformed ones this way).
    pub fn call_json(&self, function: &str, json: &str) -> Result<String, String> {
        let json = json.to_string();
        match function {
            "probe" => self.call("probe", |guest, store| guest.call_probe(store, &json)),
            "plan_launch" => self.call("plan_launch", |guest, store| {
                guest.call_plan_launch(store, &json)
            }),
            other => Err(format!(
                "the world has no function {other}() taking one message"
            )),
        }
    }

    /// Calls the plugin's `map_request()` on a client's request body, or
    /// `map_response()` on an engine's non-streaming response body: `None`
    /// when the plugin leaves it as it is.
    pub fn map(
        &self,
        direction: Direction,
        route: &str,
        body: &serde_json::Value,
    ) -> Result<Option<serde_json::Value>, String> {
        let name = direction.function();
        let body = encode(name, body)?;
        let mapped = self.call(name, |guest, store| match direction {
            Direction::Request => guest.call_map_request(store, route, &body),
            Direction::Response => guest.call_map_response(store, route, &body),
        })?;
        mapped.map(|json| decode(name, &json)).transpose()
    }

    /// Runs `f` in a fresh instance under this plugin's limits.
    fn call<T>(
        &self,
        name: &str,
        f: impl FnOnce(&Guest, &mut Store<GuestState>) -> wasmtime::Result<Result<T, String>>,
    ) -> Result<T, String> {
        let engine = self.pre.instance_pre().engine();
        let memory_cap = usize::try_from(self.limits.memory_mib << 20).unwrap_or(usize::MAX);
        let mut store = Store::new(
            engine,
            GuestState {
                memory_cap,
                refused_growth: None,
                panicked: None,
            },
        );
        store.limiter(|state| state);
        let ticks = self
            .limits
            .call_timeout_ms
            .div_ceil(TICK.as_millis() as u64);
        store.set_epoch_deadline(ticks.max(1));
        store.epoch_deadline_trap();
        let outcome = self
            .pre
            .instantiate(&mut store)
            .and_then(|instance| f(instance.hangar_engine_plugin(), &mut store));
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(message)) => Err(format!("{name}() failed: {message}")),
            Err(error) => Err(self.explain(name, error, store.data())),
        }
    }

    /// Why a call ended in a trap, in words an operator can act on.
    fn explain(&self, name: &str, error: wasmtime::Error, state: &GuestState) -> String {
        if let Some(message) = &state.panicked {
            return format!("{name}() failed: the plugin panicked: {message}");
        }
        if let Some(asked) = state.refused_growth {
            return format!(
                "{name}() was stopped: the plugin grew past its memory cap of {} MiB (it asked for {} MiB)",
                self.limits.memory_mib,
                asked.div_ceil(1 << 20)
            );
        }
        match error.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => format!(
                "{name}() was stopped: the plugin did not answer within its limit of {} ms",
                self.limits.call_timeout_ms
            ),
            Some(trap) => format!("{name}() failed: the plugin trapped: {trap}"),
            None => format!("{name}() failed: {error:#}"),
        }
    }
}

fn encode<T: Serialize>(name: &str, value: &T) -> Result<String, String> {
    serde_json::to_string(value).map_err(|e| format!("cannot encode {name}() input: {e}"))
}

fn decode<T: DeserializeOwned>(name: &str, json: &str) -> Result<T, String> {
    serde_json::from_str(json)
        .map_err(|e| format!("{name}() returned a message the host cannot read: {e}"))
}

/// The compiled component for `bytes`, from the on-disk cache when it holds
/// it; compiled (and stored) otherwise. A cache that cannot be read or
/// written costs a compile, never a failure.
fn compile_cached(engine: &Engine, path: &Path, bytes: &[u8]) -> Result<Component, String> {
    let entry = cache_dir().map(|dir| dir.join(cache_key(engine, bytes)));
    if let Some(entry) = entry.as_deref().filter(|e| e.is_file()) {
        if let Some(component) = cached::load(engine, entry) {
            return Ok(component);
        }
    }
    let component_bytes = componentize(path, bytes)?;
    let component = Component::new(engine, &component_bytes).map_err(|e| {
        format!(
            "{} is not a valid WebAssembly component: {e:#}",
            path.display()
        )
    })?;
    if let Some(entry) = &entry {
        match component.serialize() {
            Ok(compiled) => store_entry(entry, &compiled),
            Err(e) => tracing::warn!("cannot serialize a compiled WebAssembly plugin: {e:#}"),
        }
    }
    Ok(component)
}

/// A component: `bytes` as they are, or the SDK's core module encoded as one.
fn componentize(path: &Path, bytes: &[u8]) -> Result<Vec<u8>, String> {
    if wasmparser::Parser::is_component(bytes) {
        return Ok(bytes.to_vec());
    }
    if !wasmparser::Parser::is_core_wasm(bytes) {
        return Err(format!(
            "{} is not a WebAssembly file; rebuild the plugin with `cargo build --target wasm32-unknown-unknown --release`",
            path.display()
        ));
    }
    wit_component::ComponentEncoder::default()
        .module(bytes)
        .and_then(|encoder| encoder.validate(true).encode())
        .map_err(|e| {
            format!(
                "{} is a WebAssembly module but not a Hangar plugin ({e:#}); build it with hangar-sdk's export_plugin!",
                path.display()
            )
        })
}

fn cache_dir() -> Option<PathBuf> {
    config()
        .cache_dir
        .as_deref()
        .map(|dir| crate::config::expand_home(&dir.to_string_lossy()))
        .or_else(|| dirs::cache_dir().map(|d| d.join("hangar").join("wasm")))
}

/// `<sha256 of the artifact>-<hash of host version and wasmtime's
/// compatibility hash>.cwasm`.
fn cache_key(engine: &Engine, bytes: &[u8]) -> String {
    let artifact = Sha256::digest(bytes);
    let mut build = std::collections::hash_map::DefaultHasher::new();
    env!("CARGO_PKG_VERSION").hash(&mut build);
    engine.precompile_compatibility_hash().hash(&mut build);
    let hex: String = artifact.iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}-{:016x}.cwasm", build.finish())
}

/// Writes a cache entry through a temporary file, so a reader never sees
/// half of one.
fn store_entry(entry: &Path, compiled: &[u8]) {
    let write = || -> std::io::Result<()> {
        let dir = entry.parent().expect("cache entries live in a folder");
        std::fs::create_dir_all(dir)?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        std::io::Write::write_all(&mut tmp, compiled)?;
        tmp.persist(entry)?;
        Ok(())
    };
    if let Err(e) = write() {
        tracing::warn!(entry = %entry.display(), "cannot cache a compiled WebAssembly plugin: {e}");
    }
}

/// The one place the host runs `unsafe` code: wasmtime's deserialization
/// of compiled code.
#[allow(unsafe_code)]
mod cached {
    use std::path::Path;

    use wasmtime::component::Component;
    use wasmtime::Engine;

    /// The cached component at `entry`, or `None` when wasmtime refuses it
    /// (another wasmtime build, or a damaged file: wasmtime checks its
    /// header).
    pub(super) fn load(engine: &Engine, entry: &Path) -> Option<Component> {
        // SAFETY: the cache holds only what `Component::serialize` of this
        // host wrote (through a temporary file and a rename), in the
        // operator's own cache dir; its name carries the artifact's hash,
        // this host's version and wasmtime's compatibility hash, and
        // wasmtime validates the header before use.
        match unsafe { Component::deserialize_file(engine, entry) } {
            Ok(component) => Some(component),
            Err(e) => {
                tracing::warn!(entry = %entry.display(), "ignoring a cached WebAssembly plugin: {e:#}");
                None
            }
        }
    }
}
