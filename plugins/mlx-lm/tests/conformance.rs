//! The conformance suite against this plugin's build, loaded the way the
//! host loads it. The probe runs the interpreter in HANGAR_PYTHON (the
//! venv of scripts/python-env.sh, with mlx-lm) when it is set, as an
//! operator's `[plugins.mlx-lm] program` would; otherwise `python3` from
//! PATH, which usually lacks mlx-lm: the plugin must then answer
//! "unavailable" in time, which passes.

use hangar_sdk_testkit::{assert_conformant, PluginTest};

#[test]
fn passes_the_conformance_suite() {
    let mut plugin = PluginTest::build(env!("CARGO_MANIFEST_DIR")).expect("the plugin builds");
    if let Some(python) = std::env::var_os("HANGAR_PYTHON") {
        let program = python.to_string_lossy().into_owned();
        plugin = plugin.with_settings([("program".to_string(), program.into())].into());
    }
    let report = assert_conformant(&plugin);
    let probe = &report.check("probe_terminates").unwrap().verdict;
    if std::env::var_os("HANGAR_PYTHON").is_some() {
        assert!(probe.contains("available, engine"), "{probe}");
    }
}
