//! The plugin, built for WebAssembly and loaded the way the Hangar host
//! loads it.

use hangar_sdk::wire::ProbeReport;
use hangar_sdk_testkit::{assert_conformant, PluginTest};

fn plugin() -> PluginTest {
    PluginTest::build(env!("CARGO_MANIFEST_DIR")).expect("the plugin builds")
}

#[test]
fn passes_the_conformance_suite() {
    assert_conformant(&plugin());
}

#[test]
fn the_sandboxed_build_plans_what_the_native_one_does() {
    let plugin = plugin();
    let engine =
        ProbeReport::available(Some("4589.0.0".into())).with_program("/usr/local/bin/llama-server");
    let request = plugin.load_request(engine).unwrap();
    let plan = plugin.plan_launch(&request).unwrap();
    assert_eq!(plan.program, "/usr/local/bin/llama-server");
    let model = format!("{}/model.gguf", request.model_path);
    assert_eq!(plan.args[..2], ["--model".to_string(), model]);
}
