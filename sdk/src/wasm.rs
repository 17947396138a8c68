//! The WebAssembly export: the `hangar:engine@1.0.0` world
//! (`plugin-api/wit/engine.wit`), for a plugin built with
//! `cargo build --target wasm32-unknown-unknown`.
//!
//! [`export_plugin!`](crate::export_plugin) puts a [`Plugin`] behind the
//! world's `plugin` interface: messages are the same JSON documents of
//! [`crate::wire`] that the native ABI carries. A panic aborts a wasm guest
//! (it traps), so the SDK's panic hook first hands the message to the
//! host's `panicked` import, and the host reports it with the trap.

use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::Plugin;

wit_bindgen::generate!({
    world: "engine",
    path: "../plugin-api/wit",
    pub_export_macro: true,
    export_macro_name: "__export_engine",
    default_bindings_module: "hangar_sdk::wasm",
    runtime_path: "hangar_sdk::wasm::__rt",
});

#[doc(hidden)]
pub use wit_bindgen::rt as __rt;

use exports::hangar::engine::plugin::{Guest, Json};

/// The world's `plugin` interface, implemented by a [`Plugin`].
#[doc(hidden)]
pub struct Adapter<P>(PhantomData<P>);

impl<P: Plugin> Guest for Adapter<P> {
    fn describe() -> Result<Json, String> {
        report_panics();
        answer(Ok(P::describe()))
    }

    fn probe(input: Json) -> Result<Json, String> {
        report_panics();
        answer(decode(&input).and_then(P::probe))
    }

    fn plan_launch(request: Json) -> Result<Json, String> {
        report_panics();
        answer(decode(&request).and_then(P::plan_launch))
    }

    fn map_request(route: String, body: Json) -> Result<Option<Json>, String> {
        report_panics();
        answer_mapped(decode(&body).and_then(|body| P::map_request(&route, body)))
    }

    fn map_response(route: String, body: Json) -> Result<Option<Json>, String> {
        report_panics();
        answer_mapped(decode(&body).and_then(|body| P::map_response(&route, body)))
    }
}

fn decode<T: DeserializeOwned>(json: &str) -> Result<T, String> {
    serde_json::from_str(json)
        .map_err(|e| format!("the host sent a message this plugin cannot read: {e}"))
}

fn answer<T: Serialize>(value: Result<T, String>) -> Result<Json, String> {
    let value = value?;
    serde_json::to_string(&value)
        .map_err(|e| format!("the plugin returned unserializable data: {e}"))
}

fn answer_mapped(value: Result<Option<serde_json::Value>, String>) -> Result<Option<Json>, String> {
    value?.map(|v| answer(Ok(v))).transpose()
}

/// Sends a panic's message and place to the host before the guest traps.
fn report_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            hangar::engine::host::panicked(&crate::panic_text(info));
        }));
    });
}

/// Exports a [`Plugin`] implementation as this component's `plugin`
/// interface.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        type __HangarWasmPlugin = $crate::wasm::Adapter<$plugin>;
        $crate::wasm::__export_engine!(__HangarWasmPlugin with_types_in $crate::wasm);
    };
}
