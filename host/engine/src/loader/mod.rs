//! Loaders turn a plugin's artifact into callable code: native libraries
//! ([`native`]) and WebAssembly components ([`wasm`]).

pub mod native;
#[cfg(feature = "wasm")]
pub mod wasm;

use std::path::Path;

use hangar_plugin_api::wire::{Description, LaunchPlan, LoadRequest, ProbeInput, ProbeReport};
use hangar_plugin_api::PluginKind;

use native::{InProcessEngine, NativePlugin};
#[cfg(feature = "wasm")]
use wasm::WasmPlugin;

/// A plugin's code, loaded: a native library or a WebAssembly component.
/// Both answer the same calls with the same messages.
#[derive(Debug, Clone)]
pub enum LoadedPlugin {
    /// An `abi_stable` library in this process.
    Native(NativePlugin),
    /// A component in the wasmtime sandbox.
    #[cfg(feature = "wasm")]
    Wasm(WasmPlugin),
}

impl LoadedPlugin {
    /// Loads the artifact at `path` as a plugin of `kind`.
    pub fn load(kind: PluginKind, path: &Path) -> Result<LoadedPlugin, String> {
        match kind {
            PluginKind::Native => NativePlugin::load(path).map(LoadedPlugin::Native),
            #[cfg(feature = "wasm")]
            PluginKind::Wasm => WasmPlugin::load(path).map(LoadedPlugin::Wasm),
            #[cfg(not(feature = "wasm"))]
            PluginKind::Wasm => Err(format!(
                "{} is a WebAssembly plugin, and this build has no WebAssembly runtime; \
                 build with hangar-engine's `wasm` feature (for a plugin's tests: \
                 hangar-sdk-testkit's `wasm` feature)",
                path.display()
            )),
        }
    }

    /// The plugin's `describe()`.
    pub fn describe(&self) -> Result<Description, String> {
        match self {
            LoadedPlugin::Native(p) => p.describe(),
            #[cfg(feature = "wasm")]
            LoadedPlugin::Wasm(p) => p.describe(),
        }
    }

    /// The plugin's `probe()`.
    pub fn probe(&self, input: &ProbeInput) -> Result<ProbeReport, String> {
        match self {
            LoadedPlugin::Native(p) => p.probe(input),
            #[cfg(feature = "wasm")]
            LoadedPlugin::Wasm(p) => p.probe(input),
        }
    }

    /// The plugin's `plan_launch()`.
    pub fn plan_launch(&self, request: &LoadRequest) -> Result<LaunchPlan, String> {
        match self {
            LoadedPlugin::Native(p) => p.plan_launch(request),
            #[cfg(feature = "wasm")]
            LoadedPlugin::Wasm(p) => p.plan_launch(request),
        }
    }

    /// The plugin's `load_in_process()`: native plugins only.
    pub fn load_in_process(&self, request: &LoadRequest) -> Result<InProcessEngine, String> {
        match self {
            LoadedPlugin::Native(p) => p.load_in_process(request),
            #[cfg(feature = "wasm")]
            LoadedPlugin::Wasm(_) => {
                Err("a WebAssembly plugin cannot run an engine in process".into())
            }
        }
    }

    /// The component, for callers that map requests through it.
    #[cfg(feature = "wasm")]
    pub fn wasm(&self) -> Option<&WasmPlugin> {
        match self {
            LoadedPlugin::Wasm(p) => Some(p),
            LoadedPlugin::Native(_) => None,
        }
    }
}
