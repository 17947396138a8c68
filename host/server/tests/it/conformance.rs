//! The conformance suite against the SDK's example plugins, native and
//! built for WebAssembly: the honest ones pass; each broken one fails the
//! check that names what is wrong.
//! (The repo's engine plugins run the suite in their own `cargo test`,
//! through the test kit, as a third party's would.)

use std::path::Path;

use expect_test::{expect, Expect};
use hangar_engine::conformance::{self, Outcome, PluginTest};

use crate::fixtures::{allow_python, manifest, Scenario, ECHO_EXTRA};

/// Runs the suite on the plugin folder `dir`: each check's outcome, and
/// each failure's verdict (passes say how long things took, which varies).
fn check(s: &Scenario, dir: &Path, expected: Expect) {
    check_test(s, &s.plugin_test(dir), expected)
}

/// [`check`] on a prepared [`PluginTest`].
fn check_test(s: &Scenario, test: &PluginTest, expected: Expect) {
    let report = conformance::run(test);
    let root = s.root.path().display().to_string();
    let mut out = format!("plugin {}\n", report.plugin);
    for c in &report.checks {
        let line = match c.outcome {
            Outcome::Pass => format!("pass {}\n", c.name),
            Outcome::Skip => format!("skip {}\n", c.name),
            Outcome::Fail => format!("FAIL {}: {}\n", c.name, c.verdict.replace(&root, "$ROOT")),
        };
        out.push_str(&line);
    }
    expected.assert_eq(&out);
}

/// alpha: serves mlx, two gated capabilities, plans its probed engine.
fn alpha(s: &Scenario) -> std::path::PathBuf {
    let program = s.engine_program("alpha-engine", "alpha 1.5.0");
    let extra = format!(
        "[aliases]\nsafetensors = \"mlx\"\n[probe]\nprogram = \"{}\"\n[capabilities]\nkv_cache_quantization = \">=1.0\"\npaged_attention = \">=2.0\"\n",
        program.display()
    );
    s.plugin(
        "alpha",
        &manifest("alpha", "engine_alpha", &["mlx"], 20, &extra),
        Some("engine_alpha"),
    )
}

/// beta: plans `python3 -m http.server`; `programs` as given, and the
/// operator allows it python3.
fn beta(s: &Scenario, programs: &str) -> std::path::PathBuf {
    s.config(&allow_python(&["beta"]));
    let program = s.engine_program("beta-engine", "beta 0.9.0");
    let extra = format!(
        "programs = {programs}\n[probe]\nprogram = \"{}\"\n",
        program.display()
    );
    s.plugin(
        "beta",
        &manifest("beta", "engine_beta", &["mlx", "gguf"], 10, &extra),
        Some("engine_beta"),
    )
}

#[test]
fn the_honest_examples_pass() {
    let s = Scenario::new();
    check(
        &s,
        &alpha(&s),
        expect![[r#"
            plugin alpha
            pass manifest_valid
            pass library_loads
            pass describe_answers
            pass describe_matches_manifest
            pass probe_terminates
            pass probe_without_engine
            skip fixture_recognized
            pass launch_plan_declared_programs
            skip engine_loads
            skip generate_one_outcome
            skip generate_stops_quickly
            pass errors_stay_errors
            skip serves_fixture
        "#]],
    );
    check(
        &s,
        &beta(&s, "[\"python3\"]"),
        expect![[r#"
            plugin beta
            pass manifest_valid
            pass library_loads
            pass describe_answers
            pass describe_matches_manifest
            pass probe_terminates
            pass probe_without_engine
            skip fixture_recognized
            pass launch_plan_declared_programs
            skip engine_loads
            skip generate_one_outcome
            skip generate_stops_quickly
            pass errors_stay_errors
            skip serves_fixture
        "#]],
    );
    let echo = s.plugin(
        "echo",
        &manifest("echo", "engine_echo", &["mlx"], 50, ECHO_EXTRA),
        Some("engine_echo"),
    );
    check(
        &s,
        &echo,
        expect![[r#"
            plugin echo
            pass manifest_valid
            pass library_loads
            pass describe_answers
            pass describe_matches_manifest
            pass probe_terminates
            skip probe_without_engine
            skip fixture_recognized
            skip launch_plan_declared_programs
            pass engine_loads
            pass generate_one_outcome
            pass generate_stops_quickly
            pass errors_stay_errors
            skip serves_fixture
        "#]],
    );
}

#[test]
fn a_panicking_plugin_fails_describe_answers() {
    let s = Scenario::new();
    let dir = s.plugin(
        "panics",
        &manifest("panics", "engine_panics", &["mlx"], 1, ""),
        Some("engine_panics"),
    );
    check(
        &s,
        &dir,
        expect![[r#"
            plugin panics
            pass manifest_valid
            pass library_loads
            FAIL describe_answers: describe() failed: the plugin panicked: the engine adapter is broken at sdk/examples/engine_panics.rs:11
            skip describe_matches_manifest
            skip probe_terminates
            skip probe_without_engine
            skip fixture_recognized
            skip launch_plan_declared_programs
            skip engine_loads
            skip generate_one_outcome
            skip generate_stops_quickly
            skip errors_stay_errors
            skip serves_fixture
        "#]],
    );
}

#[test]
fn a_plugin_that_lies_fails_describe_matches_manifest() {
    let s = Scenario::new();
    let dir = s.plugin(
        "liar",
        &manifest("liar", "engine_liar", &["mlx"], 1, ""),
        Some("engine_liar"),
    );
    check(
        &s,
        &dir,
        expect![[r#"
            plugin liar
            pass manifest_valid
            pass library_loads
            pass describe_answers
            FAIL describe_matches_manifest: the plugin's code disagrees with its plugin.toml (code vs manifest: formats [gguf] vs [mlx]); the plugin is refused
            skip probe_terminates
            skip probe_without_engine
            skip fixture_recognized
            skip launch_plan_declared_programs
            skip engine_loads
            skip generate_one_outcome
            skip generate_stops_quickly
            skip errors_stay_errors
            skip serves_fixture
        "#]],
    );
}

#[test]
fn broken_folders_fail_the_first_check_they_reach() {
    let s = Scenario::new();
    let no_root = s.plugin(
        "lib",
        &manifest("lib", "no_root_module", &["mlx"], 1, ""),
        Some("no_root_module"),
    );
    check(
        &s,
        &no_root,
        expect![[r#"
            plugin lib
            pass manifest_valid
            FAIL library_loads: $ROOT/plugins/lib/libno_root_module.so is a shared library but not a Hangar plugin: it exports no root module (build it with hangar_sdk::export_plugin!)
            skip describe_answers
            skip describe_matches_manifest
            skip probe_terminates
            skip probe_without_engine
            skip fixture_recognized
            skip launch_plan_declared_programs
            skip engine_loads
            skip generate_one_outcome
            skip generate_stops_quickly
            skip errors_stay_errors
            skip serves_fixture
        "#]],
    );
    let bad = s.plugin(
        "bad",
        &manifest("Bad!", "engine_alpha", &["mlx"], 1, ""),
        None,
    );
    check(
        &s,
        &bad,
        expect![[r#"
            plugin bad
            FAIL manifest_valid: $ROOT/plugins/bad/plugin.toml: plugin.toml field 'id' is invalid: 'Bad!' must be lowercase letters, digits and '-', starting with a letter
            skip library_loads
            skip describe_answers
            skip describe_matches_manifest
            skip probe_terminates
            skip probe_without_engine
            skip fixture_recognized
            skip launch_plan_declared_programs
            skip engine_loads
            skip generate_one_outcome
            skip generate_stops_quickly
            skip errors_stay_errors
            skip serves_fixture
        "#]],
    );
}

#[test]
fn a_plan_naming_an_undeclared_program_fails() {
    let s = Scenario::new();
    let report = conformance::run(&s.plugin_test(&beta(&s, "[]")));
    let failures: Vec<String> = report
        .failures()
        .map(|c| {
            format!(
                "{}: {}",
                c.name,
                c.verdict
                    .replace(&s.root.path().display().to_string(), "$ROOT")
            )
        })
        .collect();
    expect![[r#"
        [
            "launch_plan_declared_programs: the host would refuse the plan: it names program 'python3', which plugin.toml does not declare (declared: $ROOT/bin/beta-engine) and the probe did not resolve; declare it in `programs`, or plan the probe's program",
        ]
    "#]]
    .assert_debug_eq(&failures);
}

#[test]
fn an_interpreter_the_operator_did_not_allow_fails_with_the_line_to_add() {
    let s = Scenario::new();
    let dir = beta(&s, "[\"python3\"]");
    s.config("");
    let report = conformance::run(&s.plugin_test(&dir));
    let failures: Vec<String> = report
        .failures()
        .map(|c| format!("{}: {}", c.name, c.verdict))
        .collect();
    expect![[r#"
        [
            "probe_terminates: the host refuses plugin 'beta': plugin.toml names 'python3' as a program to run, and a shell or interpreter runs whatever code the plugin hands it; the host runs it only where the operator allows it for this plugin: add `allow_programs = [\"python3\"]` under `[plugins.beta]` in config.toml",
            "launch_plan_declared_programs: the host would refuse the plan: it names program 'python3', a shell or interpreter the operator has not allowed for plugin 'beta' (add `allow_programs = [\"python3\"]` under `[plugins.beta]` in config.toml)",
        ]
    "#]]
    .assert_debug_eq(&failures);
}

#[test]
fn hangar_plugin_check_prints_a_table_and_fails_with_the_plugin() {
    let s = Scenario::new();
    s.plugin(
        "panics",
        &manifest("panics", "engine_panics", &["mlx"], 1, ""),
        Some("engine_panics"),
    );
    let dir = s.plugins_dir().join("panics");
    let (code, out) = s.hangar(&["plugin", "check", dir.to_str().unwrap()]);
    expect![[r#"
        exit 1
        plugin panics
         CHECK                          RESULT  VERDICT                                                                                               
         manifest_valid                 pass    panics 0.1.0 (native) serves [mlx] at priority 1                                                      
         library_loads                  pass    libengine_panics.so loads on linux/x86_64                                                             
         describe_answers               FAIL    describe() failed: the plugin panicked: the engine adapter is broken at sdk/examples/engine_panics.r… 
         describe_matches_manifest      skip    needs the plugin's code to load                                                                       
         probe_terminates               skip    needs the plugin's code to load                                                                       
         probe_without_engine           skip    needs the plugin's code to load                                                                       
         fixture_recognized             skip    needs the plugin's code to load                                                                       
         launch_plan_declared_programs  skip    needs the plugin's code to load                                                                       
         engine_loads                   skip    needs the plugin's code to load                                                                       
         generate_one_outcome           skip    needs the plugin's code to load                                                                       
         generate_stops_quickly         skip    needs the plugin's code to load                                                                       
         errors_stay_errors             skip    needs the plugin's code to load                                                                       
         serves_fixture                 skip    needs the plugin's code to load                                                                       
        2 passed, 1 failed, 10 skipped
        - describe_answers: describe() failed: the plugin panicked: the engine adapter is broken at sdk/examples/engine_panics.rs:11
    "#]]
    .assert_eq(&format!("exit {code}\n{out}"));
}

#[test]
fn the_same_examples_built_for_webassembly_pass_and_fail_alike() {
    let s = Scenario::new();
    let program = s.engine_program("beta-engine", "beta 0.9.0");
    let extra = format!(
        "programs = [\"python3\"]\n[probe]\nprogram = \"{}\"\n",
        program.display()
    );
    s.config(&allow_python(&["beta"]));
    let beta = s.wasm_plugin(
        "beta",
        &manifest("beta", "engine_beta", &["mlx", "gguf"], 10, &extra),
        "engine_beta",
    );
    check(
        &s,
        &beta,
        expect![[r#"
            plugin beta
            pass manifest_valid
            pass library_loads
            pass describe_answers
            pass describe_matches_manifest
            pass probe_terminates
            pass probe_without_engine
            skip fixture_recognized
            pass launch_plan_declared_programs
            skip engine_loads
            skip generate_one_outcome
            skip generate_stops_quickly
            pass errors_stay_errors
            skip serves_fixture
        "#]],
    );
    // A panic traps the guest; the host reports it as the native one's.
    let panics = s.wasm_plugin(
        "panics",
        &manifest("panics", "engine_panics", &["mlx"], 1, ""),
        "engine_panics",
    );
    check(
        &s,
        &panics,
        expect![[r#"
            plugin panics
            pass manifest_valid
            pass library_loads
            FAIL describe_answers: describe() failed: the plugin panicked: the engine adapter is broken at sdk/examples/engine_panics.rs:11
            skip describe_matches_manifest
            skip probe_terminates
            skip probe_without_engine
            skip fixture_recognized
            skip launch_plan_declared_programs
            skip engine_loads
            skip generate_one_outcome
            skip generate_stops_quickly
            skip errors_stay_errors
            skip serves_fixture
        "#]],
    );
}

#[test]
fn the_fixture_is_recognised_planned_against_and_served() {
    let s = Scenario::new();
    let dir = alpha(&s);
    let models = s.root.path().join("models");
    std::fs::create_dir_all(models.join("tiny")).unwrap();
    std::fs::write(models.join("tiny/config.json"), "{}").unwrap();
    let mut weights = 2u64.to_le_bytes().to_vec();
    weights.extend(b"{}");
    std::fs::write(models.join("tiny/model.safetensors"), weights).unwrap();
    std::fs::write(models.join("tiny.gguf"), "GGUF").unwrap();
    std::fs::write(models.join("notes.txt"), "hi").unwrap();
    let only = |names: &[&str], test: PluginTest| {
        let report = conformance::run(&test);
        let root = s.root.path().display().to_string();
        let mut out = String::new();
        for c in report.checks.iter().filter(|c| names.contains(&c.name)) {
            let verdict = c.verdict.replace(&root, "$ROOT");
            out.push_str(&format!("{:?} {}: {verdict}\n", c.outcome, c.name));
        }
        out
    };
    let checks = [conformance::FIXTURE_RECOGNIZED, conformance::SERVES_FIXTURE];
    // The alpha engine here only prints its version: it is found, started
    // for the fixture, and exits instead of serving.
    expect![[r#"
        Pass fixture_recognized: $ROOT/models/tiny is the mlx model 'tiny' (rule mlx: a folder of config.json + *.safetensors (built-in)); model_files [config.json, model.safetensors]
        Fail serves_fixture: serving the fixture failed: the engine exited (exit status: 0) before it was ready; its last output: alpha 1.5.0
    "#]]
    .assert_eq(&only(&checks, PluginTest::new(&dir).with_fixture(models.join("tiny"))));
    expect![[r#"
        Fail fixture_recognized: the fixture $ROOT/models/tiny.gguf is a 'gguf' model (rule gguf: *.gguf (built-in)), a format the plugin does not serve ([mlx])
        Skip serves_fixture: no representative load request: the fixture $ROOT/models/tiny.gguf is a 'gguf' model (rule gguf: *.gguf (built-in)), a format the plugin does not serve ([mlx])
    "#]]
    .assert_eq(&only(&checks, PluginTest::new(&dir).with_fixture(models.join("tiny.gguf"))));
    expect![[r#"
        Fail fixture_recognized: $ROOT/models/notes.txt is not a model: no rule recognises the file (tried gguf: *.gguf (built-in))
        Skip serves_fixture: no representative load request: $ROOT/models/notes.txt is not a model: no rule recognises the file (tried gguf: *.gguf (built-in))
    "#]]
    .assert_eq(&only(&checks, PluginTest::new(&dir).with_fixture(models.join("notes.txt"))));
    // Declared in plugin.toml but absent from an installed folder (packages
    // carry no fixture): skipped, saying so.
    let manifest = std::fs::read_to_string(dir.join("plugin.toml")).unwrap();
    std::fs::write(
        dir.join("plugin.toml"),
        format!("{manifest}\n[conformance]\nfixture = \"fixtures/tiny\"\n"),
    )
    .unwrap();
    expect![[r#"
        Skip fixture_recognized: plugin.toml's fixture $ROOT/plugins/alpha/fixtures/tiny is not in this folder: an installed plugin's package carries no fixture, so plans are checked against a scratch model; check the plugin's crate, or pass --model
        Skip serves_fixture: no fixture to serve (see fixture_recognized)
    "#]].assert_eq(&only(&checks, PluginTest::new(&dir)));
}
