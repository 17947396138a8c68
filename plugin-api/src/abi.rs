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
//! the release that appends the first one puts the root module beside the
//! trait objects in `objects`, the one module that allows generated
//! `unsafe`.)
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
use abi_stable::std_types::{RBox, RResult, RStr, RString};
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
    pub plan_launch: extern "C" fn(input: RStr<'_>) -> RResult<RString, RString>,
    /// Takes a [`crate::wire::LoadRequest`], returns an engine that runs
    /// inference inside the calling process. A plugin that only plans
    /// engine processes returns an error saying so.
    #[sabi(last_prefix_field)]
    pub load_in_process:
        extern "C" fn(input: RStr<'_>) -> RResult<InProcessEngine_TO<'static, RBox<()>>, RString>,
}

pub use objects::*;

/// The trait objects that cross the boundary. `#[sabi_trait]` expands to
/// `unsafe` vtable code, so this module (and only this one in the crate)
/// allows it; nothing here is written by hand. (`non_local_definitions`:
/// the macro's expansion places impls the way abi_stable 0.11 does.)
#[allow(unsafe_code, non_local_definitions)]
mod objects {
    use abi_stable::sabi_types::RMut;
    use abi_stable::std_types::{RResult, RStr, RString};
    use abi_stable::{sabi_trait, StableAbi};

    /// What a [`TokenSink`] tells the engine after each piece of output.
    #[repr(u8)]
    #[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
    pub enum SinkControl {
        /// Keep generating.
        Continue,
        /// Stop now (the client went away, or a stop string matched).
        Stop,
    }

    /// Where an in-process engine sends its output, piece by piece. The host
    /// implements it; the engine calls it from whatever thread it generates on.
    #[sabi_trait]
    pub trait TokenSink: Send {
        /// One piece of output: `text` is complete UTF-8 (possibly empty while
        /// a character's bytes are still incomplete) and `token` the id that
        /// produced it. The answer says whether to go on.
        #[sabi(last_prefix_field)]
        fn emit(&mut self, text: RStr<'_>, token: u32) -> SinkControl;
    }

    /// An engine loaded into the calling process, serving one model. The
    /// plugin owns its threads; no async runtime crosses the boundary.
    #[sabi_trait]
    pub trait InProcessEngine: Send + Sync {
        /// Runs one [`crate::wire::GenerateRequest`] (JSON), sending output to
        /// `sink` until it finishes or the sink says stop; returns a
        /// [`crate::wire::GenerateOutcome`] (JSON). Blocks the calling thread.
        #[sabi(last_prefix_field)]
        fn generate(
            &self,
            request: RStr<'_>,
            sink: TokenSink_TO<'_, RMut<'_, ()>>,
        ) -> RResult<RString, RString>;

        /// Embeds one [`crate::wire::EmbedRequest`] (JSON); returns a
        /// [`crate::wire::EmbedOutcome`] (JSON). Blocks the calling thread.
        /// Added in 1.4: an engine built before it (or one that computes no
        /// embeddings) answers with this default's error, and the host asks
        /// only engines whose description has the `embeddings` capability.
        fn embed(&self, request: RStr<'_>) -> RResult<RString, RString> {
            let _ = request;
            RResult::RErr(RString::from("this engine computes no embeddings"))
        }

        /// Scores one [`crate::wire::RerankRequest`] (JSON); returns a
        /// [`crate::wire::RerankOutcome`] (JSON). Blocks the calling thread.
        /// Added in 1.4, like [`InProcessEngine::embed`], for engines with
        /// the `rerank` capability.
        fn rerank(&self, request: RStr<'_>) -> RResult<RString, RString> {
            let _ = request;
            RResult::RErr(RString::from("this engine reranks nothing"))
        }

        /// What the engine decided at load that an operator should know,
        /// as a JSON list of sentences (a draft model it does not use, and
        /// why); the host shows them with the session and records each as
        /// an event. Added in 1.6: an engine built before it has none.
        fn notes(&self) -> RString {
            RString::from("[]")
        }
    }
}

impl RootModule for PluginModuleRef {
    declare_root_module_statics! {PluginModuleRef}
    const BASE_NAME: &'static str = "hangar_plugin";
    const NAME: &'static str = "hangar_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}
