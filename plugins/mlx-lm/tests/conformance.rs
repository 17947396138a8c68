//! The conformance suite against this plugin's build, loaded the way the
//! host loads it. The probe runs the interpreter in HANGAR_PYTHON (the
//! venv of scripts/python-env.sh, with mlx-lm) when it is set, as an
//! operator's `[plugins.mlx-lm] program` would; otherwise `python3` from
//! PATH, which usually lacks mlx-lm: the plugin must then answer
//! "unavailable" in time, which passes. Either way the operator's
//! `allow_programs = ["python3"]` is given: the host runs no interpreter
//! without it.

use hangar_sdk_testkit::{assert_conformant, conformance, PluginTest};
use serde_json::{json, Value};

fn settings() -> std::collections::BTreeMap<String, Value> {
    let mut settings: std::collections::BTreeMap<String, Value> =
        [("allow_programs".to_string(), json!(["python3"]))].into();
    if let Some(python) = std::env::var_os("HANGAR_PYTHON") {
        let program = python.to_string_lossy().into_owned();
        settings.insert("program".to_string(), program.into());
    }
    settings
}

#[test]
fn passes_the_conformance_suite() {
    let plugin = PluginTest::build(env!("CARGO_MANIFEST_DIR"))
        .expect("the plugin builds")
        .with_settings(settings());
    let report = assert_conformant(&plugin);
    let probe = &report.check("probe_terminates").unwrap().verdict;
    if std::env::var_os("HANGAR_PYTHON").is_some() {
        assert!(probe.contains("available, engine"), "{probe}");
    }
}

#[test]
fn without_the_operators_leave_python_is_never_run() {
    let plugin = PluginTest::build(env!("CARGO_MANIFEST_DIR")).expect("the plugin builds");
    let report = conformance(&plugin);
    let probe = report.check("probe_terminates").unwrap();
    assert!(
        probe.verdict.contains(
            "add `allow_programs = [\"python3\"]` under `[plugins.mlx-lm]` in config.toml"
        ),
        "{}",
        probe.verdict
    );
}
