//! The conformance suite against this plugin's build, loaded the way the
//! host loads it. mlxcel-server is usually not installed where the suite
//! runs: the probe must then answer "unavailable" in time, and the plan
//! for a model is still checked, against an engine of unknown version.

use hangar_sdk_testkit::{assert_conformant, PluginTest};

#[test]
fn passes_the_conformance_suite() {
    let plugin = PluginTest::build(env!("CARGO_MANIFEST_DIR")).expect("the plugin builds");
    assert_conformant(&plugin);
}
