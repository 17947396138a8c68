//! Test a Hangar engine plugin the way the host loads it.
//!
//! Add the test kit under `[dev-dependencies]` and run the conformance
//! suite from the plugin's own `cargo test`:
//!
//! ```no_run
//! // tests/conformance.rs
//! use hangar_sdk_testkit::{assert_conformant, PluginTest};
//!
//! #[test]
//! fn passes_the_conformance_suite() {
//!     let plugin = PluginTest::build(env!("CARGO_MANIFEST_DIR")).expect("the plugin builds");
//!     assert_conformant(&plugin);
//! }
//! ```
//!
//! [`PluginTest::build`] runs `cargo build` for the crate and assembles a
//! plugin folder from its `plugin.toml` and the library cargo built;
//! [`PluginTest::new`] takes a folder that is already built. Either way the
//! plugin is loaded by the host's own code: `plugin.toml` read and
//! validated, the library's object header checked, the library loaded
//! through `abi_stable`, and `describe()` compared with the manifest. A
//! plugin that passes here loads in `hangar serve`.
//!
//! [`conformance`] runs every check and returns a [`Report`] (one named
//! [`Check`] per row, each with a verdict in words); [`assert_conformant`]
//! panics with the whole report when a check fails. The checks are listed
//! in [`CHECKS`]; `hangar plugin check DIR` runs the same suite from the
//! command line.
//!
//! The suite tests the plugin with its fixture: a small real model the
//! manifest names (`[conformance] fixture = "fixtures/hello.toy"`, relative
//! to the crate) or [`PluginTest::with_fixture`] gives. It must be a model
//! the host's and the plugin's recognition rules (`[[recognize]]`)
//! recognise; plans are checked against its real files, and when the
//! engine is installed the suite serves it and sends one chat request,
//! streamed and not (`serves_fixture`).
//!
//! Beyond the suite, [`PluginTest`] calls the plugin through the ABI as the
//! host would ([`PluginTest::probe`], [`PluginTest::load_request`],
//! [`PluginTest::plan_launch`], [`PluginTest::load_in_process`]), for a
//! plugin's own tests of its plans.
//!
//! The test kit is a crate of its own rather than a feature of
//! `hangar-sdk`: it links the host's engine library (`hangar-engine`: the
//! registry, the loaders, the suite; no HTTP server), which must reach the
//! plugin's test binaries only, never the library the host loads.
//!
//! A WebAssembly plugin's tests turn on the `wasm` feature, which brings
//! the wasmtime runtime; a native plugin's tests build without it.

pub use hangar_engine::conformance::{
    assert_conformant, Check, Limits, Outcome, PluginTest, Report, CHECKS,
};
pub use hangar_engine::plugin_folder::Profile;

/// Runs every conformance check against `plugin` and returns the report.
pub fn conformance(plugin: &PluginTest) -> Report {
    hangar_engine::conformance::run(plugin)
}
