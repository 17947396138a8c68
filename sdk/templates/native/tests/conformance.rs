//! The plugin, built and loaded the way the Hangar host loads it.

use hangar_sdk::wire::{ProbeReport, ProbeRun};
use hangar_sdk_testkit::{assert_conformant, PluginTest};

fn plugin() -> PluginTest {
    PluginTest::build(env!("CARGO_MANIFEST_DIR")).expect("the plugin builds")
}

#[test]
fn passes_the_conformance_suite() {
    assert_conformant(&plugin());
}

#[test]
fn the_prompt_cache_flag_needs_an_engine_that_has_it() {
    let plugin = plugin();
    let plan = |version: &str| {
        let engine = ProbeReport::available(Some(version.into()));
        let mut request = plugin.load_request(engine).unwrap();
        request
            .settings
            .insert("prompt_cache_size".into(), 64.into());
        plugin.plan_launch(&request).unwrap().args.join(" ")
    };
    assert!(!plan("1.0.0").contains("--prompt-cache"));
    assert!(plan("1.1.0").contains("--prompt-cache 64"));
}

#[test]
fn the_probe_reads_the_engines_version_without_the_engine() {
    // What `{{id}}-server --version` prints, handed over as the host would.
    let plugin = plugin();
    let version = |stdout: &str| {
        let run = ProbeRun::exited("/usr/bin/{{id}}-server", Some(0), stdout, "");
        plugin.probe_with(Some(run)).unwrap().version
    };
    assert_eq!(version("{{id}}-server 1.2.3\n").as_deref(), Some("1.2.3"));
    assert_eq!(
        version("{{id}}-server v2 (build 77)\n").as_deref(),
        Some("2.0.0")
    );
    assert_eq!(version("something else\n"), None);
}
