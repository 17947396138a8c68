//! Write a Hangar engine plugin in plain Rust.
//!
//! A native plugin is a `cdylib` crate with a `plugin.toml` beside its built
//! library. Its code implements [`Plugin`] on a unit struct and exports it
//! with [`export_plugin!`]; the macro writes the `abi_stable` root module,
//! turns every panic into an error the host can report, and converts the
//! plain types of [`hangar_plugin_api::wire`] to and from the ABI's JSON.
//!
//! ```
//! use hangar_sdk::{export_plugin, Plugin, wire::*};
//!
//! struct Echo;
//!
//! impl Plugin for Echo {
//!     fn describe() -> Description {
//!         hangar_sdk::describe!("echo", formats: ["gguf"])
//!     }
//!     fn probe(input: ProbeInput) -> Result<ProbeReport, String> {
//!         Ok(hangar_sdk::version_from_output(&input, |out| out.split_whitespace().last()))
//!     }
//! }
//!
//! export_plugin!(Echo);
//! # fn main() {}
//! ```
//!
//! The crate must also depend on `abi_stable` (the root module's export
//! attribute names it by its crate name) and set
//! `crate-type = ["cdylib"]`.

pub use abi_stable;
pub use hangar_plugin_api as api;
pub use hangar_plugin_api::wire;

use std::panic::{catch_unwind, AssertUnwindSafe};

use abi_stable::std_types::{RResult, RStr, RString};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::ops::ControlFlow;

use wire::{
    Description, GenerateOutcome, GenerateRequest, LaunchPlan, LoadRequest, ProbeInput,
    ProbeReport, ProbeRun,
};

/// An engine plugin. Every function runs behind a panic guard: a panic
/// reaches the host as an error naming the plugin function, never as an
/// unwind across the library boundary.
pub trait Plugin {
    /// What the plugin is; must agree with its `plugin.toml`.
    fn describe() -> Description;

    /// Reads the engine's availability and version from what the host's
    /// probe found (see [`ProbeInput`]).
    fn probe(input: ProbeInput) -> Result<ProbeReport, String>;

    /// Plans the engine process that serves one model. The host spawns it,
    /// waits for readiness and proxies to it; the plugin never spawns.
    fn plan_launch(request: LoadRequest) -> Result<LaunchPlan, String> {
        let _ = request;
        Err("this plugin runs no engine process".into())
    }

    /// Loads the model into an engine that runs inside the calling process
    /// (the host, or a `hangar worker` child that isolates it). Plugins
    /// with `in_process = true` in their manifest implement this instead of
    /// [`Plugin::plan_launch`].
    fn load_in_process(request: LoadRequest) -> Result<Box<dyn Engine>, String> {
        let _ = request;
        Err("this plugin runs no in-process engine".into())
    }
}

/// An engine that runs inside the calling process, serving one model.
///
/// `generate` blocks its thread until the request is done. It calls `emit`
/// with each piece of output (complete UTF-8 text and the token id) and
/// stops as soon as `emit` answers [`ControlFlow::Break`]: the client went
/// away. Panics become errors for the host.
pub trait Engine: Send + Sync + 'static {
    /// Runs one request.
    fn generate(
        &self,
        request: GenerateRequest,
        emit: &mut dyn FnMut(&str, u32) -> ControlFlow<()>,
    ) -> Result<GenerateOutcome, String>;
}

/// Exports a [`Plugin`] implementation as this library's root module.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        /// The root module the Hangar host loads.
        #[::abi_stable::export_root_module]
        pub fn hangar_plugin_root_module() -> $crate::api::abi::PluginModuleRef {
            use $crate::abi_stable::prefix_type::PrefixTypeTrait;
            $crate::api::abi::PluginModule {
                describe: $crate::__private::describe::<$plugin>,
                probe: $crate::__private::probe::<$plugin>,
                plan_launch: $crate::__private::plan_launch::<$plugin>,
                load_in_process: $crate::__private::load_in_process::<$plugin>,
            }
            .leak_into_prefix()
        }
    };
}

/// A [`Description`] for the plugin's package: id and version from the
/// crate, plugin-api version from the SDK, and the given formats, aliases and
/// capabilities.
#[macro_export]
macro_rules! describe {
    ($id:expr, formats: [$($format:expr),* $(,)?]
     $(, aliases: {$($alias:expr => $target:expr),* $(,)?})?
     $(, capabilities: [$($cap:expr),* $(,)?])? $(,)?) => {
        $crate::wire::Description {
            id: ::std::string::String::from($id),
            version: ::std::string::String::from(env!("CARGO_PKG_VERSION")),
            plugin_api: ::std::string::String::from($crate::api::PLUGIN_API_VERSION),
            formats: vec![$(::std::string::String::from($format)),*],
            aliases: [$($((::std::string::String::from($alias), ::std::string::String::from($target))),*)?]
                .into_iter()
                .collect(),
            capabilities: vec![$($(::std::string::String::from($cap)),*)?],
        }
    };
}

/// A probe report read from a probe program's output: unavailable when the
/// program was missing, failed or timed out; available with the version
/// `parse` finds in its standard output (then standard error) otherwise,
/// or available with an unknown version when `parse` finds none.
pub fn version_from_output(
    input: &ProbeInput,
    parse: impl Fn(&str) -> Option<&str>,
) -> ProbeReport {
    let unavailable = |detail: String| ProbeReport {
        available: false,
        detail: Some(detail),
        ..ProbeReport::default()
    };
    match &input.run {
        None => unavailable("the manifest names no probe program".into()),
        Some(ProbeRun::NotFound { searched }) => {
            unavailable(format!("not installed (looked in {})", searched.join(", ")))
        }
        Some(ProbeRun::FailedToStart { program, error }) => {
            unavailable(format!("{program} could not be started: {error}"))
        }
        Some(ProbeRun::TimedOut { program, after_ms }) => ProbeReport {
            available: true,
            program: Some(program.clone()),
            detail: Some(format!(
                "{program} did not print its version within {after_ms} ms; version unknown, gated capabilities off"
            )),
            ..ProbeReport::default()
        },
        Some(ProbeRun::Exited {
            program,
            code,
            stdout,
            stderr,
        }) => {
            if *code != Some(0) {
                let tail = stderr.lines().last().unwrap_or("").trim();
                return unavailable(format!(
                    "{program} exited with {} while probing: {tail}",
                    code.map_or("a signal".to_string(), |c| format!("code {c}"))
                ));
            }
            let version = parse(stdout).or_else(|| parse(stderr));
            let detail = match version {
                Some(v) if semver::Version::parse(v).is_ok() => None,
                Some(v) => Some(format!(
                    "version '{v}' is not semver; gated capabilities off"
                )),
                None => Some(format!(
                    "could not read a version from {program}'s output ({:?}); gated capabilities off",
                    stdout.trim().chars().take(80).collect::<String>()
                )),
            };
            ProbeReport {
                available: true,
                version: version
                    .filter(|v| semver::Version::parse(v).is_ok())
                    .map(str::to_string),
                program: Some(program.clone()),
                device: None,
                detail,
            }
        }
    }
}

#[doc(hidden)]
pub mod __private {
    use super::*;
    use abi_stable::sabi_trait::TD_Opaque;
    use abi_stable::sabi_types::RMut;
    use abi_stable::std_types::RBox;
    use hangar_plugin_api::abi::{InProcessEngine, InProcessEngine_TO, SinkControl, TokenSink_TO};

    pub extern "C" fn describe<P: Plugin>(_input: RStr<'_>) -> RResult<RString, RString> {
        guarded("describe", || Ok(P::describe()))
    }

    pub extern "C" fn probe<P: Plugin>(input: RStr<'_>) -> RResult<RString, RString> {
        guarded("probe", || P::probe(decode(input)?))
    }

    pub extern "C" fn plan_launch<P: Plugin>(input: RStr<'_>) -> RResult<RString, RString> {
        guarded("plan_launch", || P::plan_launch(decode(input)?))
    }

    pub extern "C" fn load_in_process<P: Plugin>(
        input: RStr<'_>,
    ) -> RResult<InProcessEngine_TO<'static, RBox<()>>, RString> {
        quiet_panics();
        match catch_unwind(AssertUnwindSafe(|| {
            decode(input).and_then(P::load_in_process)
        })) {
            Ok(Ok(engine)) => RResult::ROk(InProcessEngine_TO::from_value(
                EngineAdapter(engine),
                TD_Opaque,
            )),
            Ok(Err(message)) => RResult::RErr(message.into()),
            Err(_) => RResult::RErr(panic_message().into()),
        }
    }

    /// Puts an SDK [`Engine`] behind the ABI's trait object.
    struct EngineAdapter(Box<dyn Engine>);

    impl InProcessEngine for EngineAdapter {
        fn generate(
            &self,
            request: RStr<'_>,
            mut sink: TokenSink_TO<'_, RMut<'_, ()>>,
        ) -> RResult<RString, RString> {
            guarded("generate", || {
                let request = decode(request)?;
                self.0.generate(request, &mut |text, token| match sink
                    .emit(RStr::from_str(text), token)
                {
                    SinkControl::Continue => ControlFlow::Continue(()),
                    SinkControl::Stop => ControlFlow::Break(()),
                })
            })
        }
    }

    fn panic_message() -> String {
        let message = LAST_PANIC
            .with(|p| p.borrow_mut().take())
            .unwrap_or_else(|| "unknown panic".into());
        format!("the plugin panicked: {message}")
    }

    fn decode<T: DeserializeOwned>(input: RStr<'_>) -> Result<T, String> {
        serde_json::from_str(input.as_str())
            .map_err(|e| format!("the host sent a message this plugin cannot read: {e}"))
    }

    thread_local! {
        static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
    }

    /// Replaces the library's panic hook (each plugin library has its own
    /// copy of std, so this touches neither the host nor other plugins): a
    /// panic is reported to the host as an error, not printed to its stderr.
    fn quiet_panics() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            std::panic::set_hook(Box::new(|info| {
                let message = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a non-string panic payload".into());
                let at = info
                    .location()
                    .map(|l| format!(" at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{message}{at}")));
            }));
        });
    }

    fn guarded<T: Serialize>(
        function: &str,
        call: impl FnOnce() -> Result<T, String>,
    ) -> RResult<RString, RString> {
        quiet_panics();
        match catch_unwind(AssertUnwindSafe(call)) {
            Ok(Ok(value)) => match serde_json::to_string(&value) {
                Ok(json) => RResult::ROk(json.into()),
                Err(e) => {
                    RResult::RErr(format!("{function}() returned unserializable data: {e}").into())
                }
            },
            Ok(Err(message)) => RResult::RErr(message.into()),
            Err(_) => RResult::RErr(panic_message().into()),
        }
    }
}
