//! Loads native plugins: `abi_stable` libraries that export
//! [`PluginModuleRef`].
//!
//! Before handing a file to the dynamic loader we read its object header,
//! so that a library for another machine, a truncated file or a text file
//! gets a precise diagnostic instead of the loader's terse one. Libraries
//! are never unloaded: `lib_header_from_path` leaks them on purpose, since
//! code or data from a plugin may still be referenced.

use std::path::Path;

use abi_stable::library::{lib_header_from_path, LibraryError};
use abi_stable::std_types::{RResult, RStr};
use hangar_plugin_api::abi::PluginModuleRef;

/// An engine a plugin loaded into this process.
pub type InProcessEngine =
    hangar_plugin_api::abi::InProcessEngine_TO<'static, abi_stable::std_types::RBox<()>>;
use object::{Architecture, BinaryFormat, Object};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A loaded native plugin.
#[derive(Clone, Copy)]
pub struct NativePlugin {
    module: PluginModuleRef,
}

impl std::fmt::Debug for NativePlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NativePlugin")
    }
}

impl NativePlugin {
    /// Checks and loads the library at `path`.
    pub fn load(path: &Path) -> Result<NativePlugin, String> {
        check_object(path)?;
        let header = lib_header_from_path(path).map_err(|e| explain(path, e))?;
        let module = header
            .init_root_module::<PluginModuleRef>()
            .map_err(|e| explain(path, e))?;
        Ok(NativePlugin { module })
    }

    /// The root module itself, for callers that speak the ABI's JSON
    /// directly: the conformance suite sends malformed messages through it
    /// to check that they come back as errors.
    pub fn module(&self) -> PluginModuleRef {
        self.module
    }

    /// Calls the plugin's `describe()`.
    pub fn describe(&self) -> Result<hangar_plugin_api::wire::Description, String> {
        call("describe", self.module.describe(), &serde_json::json!({}))
    }

    /// Calls the plugin's `probe()`.
    pub fn probe(
        &self,
        input: &hangar_plugin_api::wire::ProbeInput,
    ) -> Result<hangar_plugin_api::wire::ProbeReport, String> {
        call("probe", self.module.probe(), input)
    }

    /// Calls the plugin's `plan_launch()`.
    pub fn plan_launch(
        &self,
        request: &hangar_plugin_api::wire::LoadRequest,
    ) -> Result<hangar_plugin_api::wire::LaunchPlan, String> {
        call("plan_launch", self.module.plan_launch(), request)
    }

    /// Calls the plugin's `load_in_process()`: the model, loaded into an
    /// engine in this process.
    pub fn load_in_process(
        &self,
        request: &hangar_plugin_api::wire::LoadRequest,
    ) -> Result<InProcessEngine, String> {
        let json = serde_json::to_string(request)
            .map_err(|e| format!("cannot encode load_in_process() input: {e}"))?;
        match (self.module.load_in_process())(RStr::from_str(&json)) {
            RResult::ROk(engine) => Ok(engine),
            RResult::RErr(message) => Err(format!("load_in_process() failed: {message}")),
        }
    }
}

type JsonFn = extern "C" fn(
    RStr<'_>,
) -> abi_stable::std_types::RResult<
    abi_stable::std_types::RString,
    abi_stable::std_types::RString,
>;

fn call<I: Serialize, O: DeserializeOwned>(name: &str, f: JsonFn, input: &I) -> Result<O, String> {
    let json =
        serde_json::to_string(input).map_err(|e| format!("cannot encode {name}() input: {e}"))?;
    match f(RStr::from_str(&json)) {
        RResult::ROk(out) => serde_json::from_str(out.as_str())
            .map_err(|e| format!("{name}() returned a message the host cannot read: {e}")),
        RResult::RErr(message) => Err(format!("{name}() failed: {message}")),
    }
}

/// Reads the object header and checks that this machine can load it,
/// without loading it (`hangar plugin install` refuses a library built for
/// another machine this way).
pub fn check_object(path: &Path) -> Result<(), String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let cache = object::ReadCache::new(file);
    let parsed = object::File::parse(&cache).map_err(|e| {
        format!(
            "{} is not a shared library this host can read ({e}); rebuild the plugin for {}/{}",
            path.display(),
            std::env::consts::OS,
            std::env::consts::ARCH
        )
    })?;
    let (want_format, want_arch) = host_object_kind();
    let (format, arch) = (parsed.format(), parsed.architecture());
    if format != want_format || arch != want_arch {
        return Err(format!(
            "{} is {} library for {}, but this host needs {} for {}; install the plugin build for this machine",
            path.display(),
            format_name(format, true),
            arch_name(arch),
            format_name(want_format, false),
            arch_name(want_arch),
        ));
    }
    Ok(())
}

fn format_name(format: BinaryFormat, article: bool) -> String {
    let name = match format {
        BinaryFormat::Elf => "ELF",
        BinaryFormat::MachO => "Mach-O",
        BinaryFormat::Pe => "PE",
        _ => "an unknown format",
    };
    match (article, format) {
        (true, BinaryFormat::Elf) => format!("an {name}"),
        (true, _) => format!("a {name}"),
        _ => name.to_string(),
    }
}

fn arch_name(arch: Architecture) -> String {
    format!("{arch:?}").to_ascii_lowercase()
}

fn host_object_kind() -> (BinaryFormat, Architecture) {
    let format = match std::env::consts::OS {
        "macos" | "ios" => BinaryFormat::MachO,
        "windows" => BinaryFormat::Pe,
        _ => BinaryFormat::Elf,
    };
    let arch = match std::env::consts::ARCH {
        "x86_64" => Architecture::X86_64,
        "aarch64" => Architecture::Aarch64,
        "x86" => Architecture::I386,
        "arm" => Architecture::Arm,
        "riscv64" => Architecture::Riscv64,
        _ => Architecture::Unknown,
    };
    (format, arch)
}

fn explain(path: &Path, error: LibraryError) -> String {
    let file = path.display();
    match error {
        LibraryError::OpenError { err, .. } => {
            format!("the dynamic loader refused {file}: {err}")
        }
        LibraryError::GetSymbolError { .. } => format!(
            "{file} is a shared library but not a Hangar plugin: it exports no root module (build it with hangar_sdk::export_plugin!)"
        ),
        LibraryError::InvalidAbiHeader(header) => format!(
            "{file} was built with an incompatible abi_stable ({header:?}); rebuild it against this host's plugin-api"
        ),
        LibraryError::IncompatibleVersionNumber {
            expected_version,
            actual_version,
            ..
        } => format!(
            "{file} was built against plugin-api {actual_version}, this host has {expected_version}; rebuild the plugin against plugin-api {}.x",
            expected_version.major
        ),
        LibraryError::AbiInstability(_) => format!(
            "{file}'s plugin interface has a layout this host does not recognise; rebuild it against this host's plugin-api"
        ),
        other => format!("cannot load {file}: {other}"),
    }
}
