//! The native plugin ABI: the `abi_stable` root module a native plugin
//! exports.
//!
//! The module is a *prefix type*: fields up to the one marked
//! `last_prefix_field` exist in every 1.x plugin; fields appended after it
//! in later 1.x releases are read through accessors that return `None` for
//! plugins built before them. Messages travel as JSON text of the
//! [`crate::wire`] types, so they too grow without breaking old plugins.
//!
//! (The `StableAbi` derive writes `unsafe` accessors for appended fields;
//! the release that appends the first one allows `unsafe_code` in this
//! module for that generated code alone.)
//!
//! Every function returns `RErr(message)` instead of unwinding: a panic must
//! never cross the boundary. The SDK's `export_plugin!` macro writes these
//! functions, with the panic guard, for a plugin author.
//!
//! The host loads a library with `abi_stable::library::lib_header_from_path`
//! and [`LibHeader::init_root_module`](abi_stable::library::LibHeader::init_root_module),
//! never with `RootModule::load_from*`, which caches one library per root
//! module type and would give every plugin the first plugin's functions.

use abi_stable::library::RootModule;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{RResult, RStr, RString};
use abi_stable::{declare_root_module_statics, package_version_strings, StableAbi};

/// The root module of a native Hangar plugin. Each function is a call
/// into the plugin: JSON in, JSON out, or an error message.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
pub struct PluginModule {
    /// Returns a [`crate::wire::Description`]; the input is `{}`.
    pub describe: extern "C" fn(input: RStr<'_>) -> RResult<RString, RString>,
    /// Takes a [`crate::wire::ProbeInput`], returns a
    /// [`crate::wire::ProbeReport`].
    pub probe: extern "C" fn(input: RStr<'_>) -> RResult<RString, RString>,
    /// Takes a [`crate::wire::LoadRequest`], returns a
    /// [`crate::wire::LaunchPlan`]: how the host should start the engine
    /// process that serves the model. A plugin that runs no engine process
    /// returns an error saying so.
    #[sabi(last_prefix_field)]
    pub plan_launch: extern "C" fn(input: RStr<'_>) -> RResult<RString, RString>,
}

impl RootModule for PluginModuleRef {
    declare_root_module_statics! {PluginModuleRef}
    const BASE_NAME: &'static str = "hangar_plugin";
    const NAME: &'static str = "hangar_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}
