//! The native export: an `abi_stable` root module.

use std::ops::ControlFlow;
use std::panic::{catch_unwind, AssertUnwindSafe};

use abi_stable::std_types::{RResult, RStr, RString};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::Engine;

/// Exports a [`Plugin`](crate::Plugin) implementation as this library's root module.
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

#[doc(hidden)]
pub mod __private {
    use super::*;
    use crate::Plugin;
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

        fn embed(&self, request: RStr<'_>) -> RResult<RString, RString> {
            guarded("embed", || self.0.embed(decode(request)?))
        }

        fn rerank(&self, request: RStr<'_>) -> RResult<RString, RString> {
            guarded("rerank", || self.0.rerank(decode(request)?))
        }

        fn notes(&self) -> RString {
            // A panicking `notes` has nothing to say.
            let notes = catch_unwind(AssertUnwindSafe(|| self.0.notes())).unwrap_or_default();
            RString::from(serde_json::to_string(&notes).expect("strings serialize"))
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
                let text = crate::panic_text(info);
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(text));
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
