//! Discovery, validation and resolution, driven through the `hangar` binary
//! against plugin folders built from the SDK's example plugins.

use expect_test::{expect, Expect};

use crate::fixtures::{manifest, Scenario};

/// The alpha example: serves mlx, aliases safetensors, two gated
/// capabilities; its engine prints `alpha VERSION`.
fn alpha(s: &Scenario, priority: i32, engine_output: &str) {
    alpha_with(s, priority, engine_output, "");
}

/// [`alpha`] with more top-level manifest keys (`top`).
fn alpha_with(s: &Scenario, priority: i32, engine_output: &str, top: &str) {
    let program = s.engine_program("alpha-engine", engine_output);
    let extra = format!(
        r#"{top}
[aliases]
safetensors = "mlx"
[probe]
program = "{}"
args = ["--version"]
[capabilities]
kv_cache_quantization = ">=1.0"
paged_attention = ">=2.0"
"#,
        program.display()
    );
    s.plugin(
        "alpha",
        &manifest("alpha", "engine_alpha", &["mlx"], priority, &extra),
        Some("engine_alpha"),
    );
}

/// The beta example: serves mlx and gguf; its engine prints `beta VERSION`.
fn beta(s: &Scenario, priority: i32) {
    let program = s.engine_program("beta-engine", "beta 0.9.0");
    let extra = format!("[probe]\nprogram = \"{}\"\n", program.display());
    s.plugin(
        "beta",
        &manifest("beta", "engine_beta", &["mlx", "gguf"], priority, &extra),
        Some("engine_beta"),
    );
}

fn check(s: &Scenario, args: &[&str], expected: Expect) {
    let (code, out) = s.hangar(args);
    expected.assert_eq(&format!("exit {code}\n{out}"));
}

#[test]
fn the_highest_priority_compatible_plugin_wins() {
    let s = Scenario::new();
    alpha(&s, 20, "alpha 1.5.0");
    beta(&s, 10);
    check(
        &s,
        &["resolve", "mlx"],
        expect![[r#"
            exit 0
            mlx → alpha (highest priority, then engine version, then id)
             PLUGIN  PRIORITY  ENGINE  VERDICT   
             alpha   20        1.5.0   chosen    
             beta    10        0.9.0   outranked 
        "#]],
    );
    check(
        &s,
        &["resolve", "gguf"],
        expect![[r#"
            exit 0
            gguf → beta (the only compatible plugin)
             PLUGIN  PRIORITY  ENGINE  VERDICT                          
             beta    10        0.9.0   chosen                           
             alpha   20                rejected: serves [mlx], not gguf 
        "#]],
    );
}

#[test]
fn a_per_format_default_engine_overrides_priority() {
    let s = Scenario::new();
    alpha(&s, 20, "alpha 1.5.0");
    beta(&s, 10);
    s.settings("[default_engines]\nmlx = \"beta\"\n");
    check(
        &s,
        &["resolve", "mlx"],
        expect![[r#"
        exit 0
        mlx → beta (the configured default engine for mlx)
         PLUGIN  PRIORITY  ENGINE  VERDICT   
         beta    10        0.9.0   chosen    
         alpha   20        1.5.0   outranked 
    "#]],
    );
}

#[test]
fn a_default_engine_that_cannot_serve_falls_back_to_priority() {
    let s = Scenario::new();
    alpha(&s, 20, "alpha 1.5.0");
    s.settings("[default_engines]\nmlx = \"beta\"\n");
    check(
        &s,
        &["resolve", "mlx"],
        expect![[r#"
        exit 0
        mlx → alpha (the configured default engine 'beta' for mlx cannot serve (see its entry); the only compatible plugin)
         PLUGIN  PRIORITY  ENGINE  VERDICT 
         alpha   20        1.5.0   chosen  
    "#]],
    );
}

#[test]
fn safetensors_resolves_to_mlx_and_model_folders_are_detected() {
    let s = Scenario::new();
    beta(&s, 10);
    check(
        &s,
        &["resolve", "safetensors"],
        expect![[r#"
        exit 0
        alias: safetensors → mlx (declared by built-in)
        mlx → beta (the only compatible plugin)
         PLUGIN  PRIORITY  ENGINE  VERDICT 
         beta    10        0.9.0   chosen  
    "#]],
    );
    let model = s.root.path().join("models/tiny");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(model.join("config.json"), "{}").unwrap();
    // An empty weights file is no model: resolve inspects as serving does.
    std::fs::write(model.join("model.safetensors"), "").unwrap();
    let (code, out) = s.hangar(&["resolve", model.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        out.contains("model.safetensors is 0 bytes, too short"),
        "{out}"
    );
    let mut weights = 2u64.to_le_bytes().to_vec();
    weights.extend(b"{}");
    std::fs::write(model.join("model.safetensors"), weights).unwrap();
    let (code, out) = s.hangar(&["resolve", model.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("model: tiny ($ROOT/models/tiny, rule mlx: a folder of config.json + *.safetensors (built-in); files: config.json, model.safetensors)\nmlx → beta"),
        "{out}"
    );
    std::fs::remove_file(model.join("model.safetensors")).unwrap();
    check(
        &s,
        &["resolve", model.to_str().unwrap()],
        expect![[r#"
            exit 1
            error: $ROOT/models/tiny has config.json but no *.safetensors, which the rule mlx: a folder of config.json + *.safetensors (built-in) needs; the download may be incomplete: download the model again or copy the missing files into the folder
        "#]],
    );
}

#[test]
fn a_plugin_that_lists_the_families_it_loads_is_passed_over_for_others() {
    let s = Scenario::new();
    alpha_with(&s, 20, "alpha 1.5.0", r#"model_types = ["llama", "qwen3"]"#);
    beta(&s, 10);
    let folder = |name: &str, config: &str| {
        let model = s.root.path().join("models").join(name);
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("config.json"), config).unwrap();
        let mut weights = 2u64.to_le_bytes().to_vec();
        weights.extend(b"{}");
        std::fs::write(model.join("model.safetensors"), weights).unwrap();
        model.to_str().unwrap().to_string()
    };
    check(
        &s,
        &[
            "resolve",
            &folder("gemma", r#"{"model_type": "gemma3_text"}"#),
        ],
        expect![[r#"
            exit 0
            model: gemma ($ROOT/models/gemma, rule mlx: a folder of config.json + *.safetensors (built-in); model_type gemma3_text; files: config.json, model.safetensors)
            mlx → beta (the only compatible plugin)
             PLUGIN  PRIORITY  ENGINE  VERDICT                                                     
             beta    10        0.9.0   chosen                                                      
             alpha   20                rejected: loads model types [llama, qwen3], not gemma3_text 
        "#]],
    );
    // A family it lists, a folder that names none, and a format alone: it
    // ranks as before.
    for model in [
        folder("qwen", r#"{"model_type": "qwen3"}"#),
        folder("untyped", "{}"),
        "mlx".to_string(),
    ] {
        let (code, out) = s.hangar(&["resolve", &model]);
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("mlx → alpha (highest priority"), "{out}");
    }
    // The JSON answer names the model type and the reason too.
    let (code, out) = s.hangar(&[
        "--json",
        "resolve",
        &folder("moe", r#"{"model_type": "qwen3_moe"}"#),
    ]);
    assert_eq!(code, 0, "{out}");
    let answer: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(answer["model"]["model_type"], "qwen3_moe");
    assert_eq!(answer["chosen"], "beta");
    assert_eq!(
        answer["trace"][1]["reason"],
        "loads model types [llama, qwen3], not qwen3_moe"
    );
}

#[test]
fn a_plugin_for_another_platform_is_rejected_with_that_reason() {
    let s = Scenario::new();
    beta(&s, 10);
    let mac_only = manifest(
        "alpha",
        "engine_alpha",
        &["mlx"],
        50,
        "[aliases]\nsafetensors = \"mlx\"\n",
    )
    .replace("os = \"linux\"", "os = \"macos\"")
    .replace("x86_64", "aarch64")
    .replace("[\"cpu\", \"cuda13\"]", "[\"metal\"]");
    s.plugin("alpha", &mac_only, Some("engine_alpha"));
    check(
        &s,
        &["resolve", "mlx"],
        expect![[r#"
        exit 0
        mlx → beta (the only compatible plugin)
         PLUGIN  PRIORITY  ENGINE  VERDICT                                                                         
         beta    10        0.9.0   chosen                                                                          
         alpha   50                rejected: runs on [macos/aarch64/metal], not on this machine (linux/x86_64/cpu) 
    "#]],
    );
}

#[test]
fn gated_capabilities_follow_the_probed_version() {
    for (output, expected) in [
        (
            "alpha 1.5.0",
            expect![[r#"
            exit 0
            platform: linux/x86_64/cpu
             PLUGIN  STATUS  FORMATS  PLATFORMS                PRIORITY  ENGINE  CAPABILITIES          
             alpha   ready   mlx      linux/x86_64/cpu,cuda13  20        1.5.0   kv_cache_quantization 
            - alpha: off: plugin 'alpha' needs engine >=2.0 for paged_attention; found 1.5.0
        "#]],
        ),
        (
            "alpha 2.1.0",
            expect![[r#"
            exit 0
            platform: linux/x86_64/cpu
             PLUGIN  STATUS  FORMATS  PLATFORMS                PRIORITY  ENGINE  CAPABILITIES                          
             alpha   ready   mlx      linux/x86_64/cpu,cuda13  20        2.1.0   kv_cache_quantization,paged_attention 
        "#]],
        ),
        (
            "alpha 0.9.3",
            expect![[r#"
            exit 0
            platform: linux/x86_64/cpu
             PLUGIN  STATUS  FORMATS  PLATFORMS                PRIORITY  ENGINE  CAPABILITIES 
             alpha   ready   mlx      linux/x86_64/cpu,cuda13  20        0.9.3                
            - alpha: off: plugin 'alpha' needs engine >=1.0 for kv_cache_quantization; found 0.9.3
            - alpha: off: plugin 'alpha' needs engine >=2.0 for paged_attention; found 0.9.3
        "#]],
        ),
    ] {
        let s = Scenario::new();
        alpha(&s, 20, output);
        check(&s, &["plugins"], expected);
    }
}

#[test]
fn an_ambiguous_version_keeps_the_engine_with_gated_capabilities_off() {
    let s = Scenario::new();
    alpha(&s, 20, "alpha nightly-2026-11");
    check(
        &s,
        &["plugins"],
        expect![[r#"
            exit 0
            platform: linux/x86_64/cpu
             PLUGIN  STATUS  FORMATS  PLATFORMS                PRIORITY  ENGINE   CAPABILITIES 
             alpha   ready   mlx      linux/x86_64/cpu,cuda13  20        unknown               
            - alpha ($ROOT/plugins/alpha): version 'nightly-2026-11' is not MAJOR[.MINOR[.PATCH]][-PRE]; version unknown, gated capabilities off
            - alpha: off: plugin 'alpha' needs engine >=1.0 for kv_cache_quantization; the engine's version is unknown
            - alpha: off: plugin 'alpha' needs engine >=2.0 for paged_attention; the engine's version is unknown
        "#]],
    );
    let (code, out) = s.hangar(&["resolve", "mlx"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("mlx → alpha"), "{out}");
}

#[test]
fn every_malformed_plugin_is_reported_and_the_rest_still_load() {
    let s = Scenario::new();
    alpha(&s, 20, "alpha 1.5.0");
    beta(&s, 10);
    let ok = |id: &str, lib: &str| manifest(id, lib, &["mlx"], 1, "");
    s.plugin("bad-toml", "id = \"bad\"\nname = ", None);
    s.plugin(
        "unknown-kind",
        &ok("kindless", "engine_beta").replace("\"native\"", "\"python\""),
        None,
    );
    s.plugin("missing-artifact", &ok("ghost", "engine_ghost"), None);
    let text = s.plugin("text-file", &ok("text", "engine_text"), None);
    std::fs::write(
        text.join(crate::fixtures::lib_file("engine_text")),
        "just text\n",
    )
    .unwrap();
    let truncated = s.plugin("truncated", &ok("truncated", "engine_truncated"), None);
    let bytes = std::fs::read(crate::fixtures::example_library("engine_beta")).unwrap();
    std::fs::write(
        truncated.join(crate::fixtures::lib_file("engine_truncated")),
        &bytes[..4096],
    )
    .unwrap();
    let arm = s.plugin("wrong-arch", &ok("arm", "engine_arm"), None);
    let mut elf = bytes.clone();
    elf[18..20].copy_from_slice(&183u16.to_le_bytes()); // e_machine = EM_AARCH64
    std::fs::write(arm.join(crate::fixtures::lib_file("engine_arm")), elf).unwrap();
    s.plugin(
        "no-root",
        &ok("no-root", "no_root_module"),
        Some("no_root_module"),
    );
    s.plugin(
        "api-2",
        &ok("future", "engine_beta").replace("^1.0", "^2.0"),
        Some("engine_beta"),
    );
    s.plugin("liar", &ok("liar", "engine_liar"), Some("engine_liar"));
    s.plugin(
        "panics",
        &ok("panics", "engine_panics"),
        Some("engine_panics"),
    );
    s.plugin(
        "zz-duplicate",
        &ok("beta", "engine_beta"),
        Some("engine_beta"),
    );
    s.plugin(
        "conflict",
        &ok("conflict", "engine_beta").replace(
            "priority = 1\n",
            "priority = 1\n[aliases]\nsafetensors = \"gguf\"\n",
        ),
        Some("engine_beta"),
    );
    std::fs::create_dir_all(s.plugins_dir().join("not-a-plugin")).unwrap();
    check(
        &s,
        &["plugins"],
        expect![[r#"
            exit 0
            platform: linux/x86_64/cpu
             PLUGIN        STATUS  FORMATS   PLATFORMS                PRIORITY  ENGINE  CAPABILITIES          
             alpha         ready   mlx       linux/x86_64/cpu,cuda13  20        1.5.0   kv_cache_quantization 
             beta          ready   mlx,gguf  linux/x86_64/cpu,cuda13  10        0.9.0                         
             conflict      broken  mlx       linux/x86_64/cpu,cuda13  1                                       
             liar          broken  mlx       linux/x86_64/cpu,cuda13  1                                       
             no-root       broken  mlx       linux/x86_64/cpu,cuda13  1                                       
             panics        broken  mlx       linux/x86_64/cpu,cuda13  1                                       
             text          broken  mlx       linux/x86_64/cpu,cuda13  1                                       
             truncated     broken  mlx       linux/x86_64/cpu,cuda13  1                                       
             arm           broken  mlx       linux/x86_64/cpu,cuda13  1                                       
             future        broken                                                                             
             bad-toml      broken                                                                             
             ghost         broken                                                                             
             not-a-plugin  broken                                                                             
             kindless      broken                                                                             
             beta          broken                                                                             
            - alpha: off: plugin 'alpha' needs engine >=2.0 for paged_attention; found 1.5.0
            - conflict ($ROOT/plugins/conflict): the plugin's code disagrees with its plugin.toml (code vs manifest: id 'beta' vs 'conflict'; formats [mlx, gguf] vs [mlx]; aliases {} vs {"safetensors": "gguf"}); the plugin is refused
            - liar ($ROOT/plugins/liar): the plugin's code disagrees with its plugin.toml (code vs manifest: formats [gguf] vs [mlx]); the plugin is refused
            - no-root ($ROOT/plugins/no-root): $ROOT/plugins/no-root/libno_root_module.so is a shared library but not a Hangar plugin: it exports no root module (build it with hangar_sdk::export_plugin!)
            - panics ($ROOT/plugins/panics): describe() failed: the plugin panicked: the engine adapter is broken at sdk/examples/engine_panics.rs:11
            - text ($ROOT/plugins/text-file): $ROOT/plugins/text-file/libengine_text.so is not a shared library this host can read (Could not read file magic); rebuild the plugin for linux/x86_64
            - truncated ($ROOT/plugins/truncated): $ROOT/plugins/truncated/libengine_truncated.so is not a shared library this host can read (Invalid ELF section header offset/size/alignment); rebuild the plugin for linux/x86_64
            - arm ($ROOT/plugins/wrong-arch): $ROOT/plugins/wrong-arch/libengine_arm.so is an ELF library for aarch64, but this host needs ELF for x86_64; install the plugin build for this machine
            - future ($ROOT/plugins/api-2): plugin needs plugin-api ^2.0, but this host provides 1.7.0; rebuild the plugin against plugin-api 1.x or use a matching host
            - bad-toml ($ROOT/plugins/bad-toml): plugin.toml is malformed: string values must be quoted, expected literal string (at line 2, column 8)
            - ghost ($ROOT/plugins/missing-artifact): artifact $ROOT/plugins/missing-artifact/libengine_ghost.so is missing; build the plugin or reinstall its folder
            - not-a-plugin ($ROOT/plugins/not-a-plugin): no plugin.toml in this folder; a plugin folder holds plugin.toml and its artifact
            - kindless ($ROOT/plugins/unknown-kind): plugin.toml is malformed: unknown variant `python`, expected `native` or `wasm` (at line 5, column 8)
            - beta ($ROOT/plugins/zz-duplicate): duplicate plugin id 'beta': $ROOT/plugins/beta was found first and is used; remove one of them
            - format alias 'safetensors' is declared with different targets (conflict → gguf; built-in, alpha → mlx); the alias is ignored until the plugins agree
        "#]],
    );
    let (code, out) = s.hangar(&["resolve", "mlx"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("mlx → alpha"), "{out}");
}

#[test]
fn json_output_is_machine_readable() {
    let s = Scenario::new();
    alpha(&s, 20, "alpha 1.5.0");
    let (code, out) = s.hangar(&["resolve", "safetensors", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["chosen"], "alpha");
    assert_eq!(v["format"], "mlx");
    let (_, out) = s.hangar(&["plugins", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["plugins"][0]["capabilities_on"][0],
        "kv_cache_quantization"
    );
    let (_, out) = s.hangar(&["platform", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["os"], "linux");
}

#[test]
fn conflicting_recognition_rules_are_reported_and_the_plugins_still_load() {
    let s = Scenario::new();
    let rule = |format: &str, file: &str| {
        format!("[[recognize]]\nformat = \"{format}\"\nfile = \"{file}\"\n")
    };
    let alpha_rules = rule("mlx", "*.npz") + &rule("mlx", "*.mlxfile");
    let beta_rules = rule("gguf", "*.npz") + &rule("gguf", "*.gguf");
    for (id, library, formats, rules) in [
        ("alpha", "engine_alpha", &["mlx"][..], alpha_rules),
        ("beta", "engine_beta", &["mlx", "gguf"][..], beta_rules),
    ] {
        let program = s.engine_program(&format!("{id}-engine"), &format!("{id} 1.5.0"));
        let extra = format!("{rules}[probe]\nprogram = \"{}\"\n", program.display());
        let manifest = manifest(id, library, formats, 10, &extra);
        let manifest = match id {
            "alpha" => format!("{manifest}[aliases]\nsafetensors = \"mlx\"\n[capabilities]\nkv_cache_quantization = \">=1.0\"\npaged_attention = \">=2.0\"\n"),
            _ => manifest,
        };
        s.plugin(id, &manifest, Some(library));
    }
    let models = s.root.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    for (name, content) in [("a.npz", "x"), ("b.mlxfile", "x"), ("c.gguf", "GGUF")] {
        std::fs::write(models.join(name), content).unwrap();
    }
    check(
        &s,
        &["plugins"],
        expect![[r#"
            exit 0
            platform: linux/x86_64/cpu
             PLUGIN  STATUS  FORMATS   PLATFORMS                PRIORITY  ENGINE  CAPABILITIES          
             alpha   ready   mlx       linux/x86_64/cpu,cuda13  10        1.5.0   kv_cache_quantization 
             beta    ready   mlx,gguf  linux/x86_64/cpu,cuda13  10        1.5.0                         
            - alpha: off: plugin 'alpha' needs engine >=2.0 for paged_attention; found 1.5.0
            - alpha: recognises mlx: *.npz; mlx: *.mlxfile
            - beta: recognises gguf: *.npz; gguf: *.gguf
            - recognition rule '*.npz' is declared for different formats (alpha → mlx; beta → gguf); the rule is ignored until the plugins agree
        "#]],
    );
    let resolve = |name: &str| s.hangar(&["resolve", models.join(name).to_str().unwrap()]);
    let mut out = String::new();
    for name in ["a.npz", "b.mlxfile", "c.gguf"] {
        let (code, text) = resolve(name);
        out.push_str(&format!(
            "exit {code}\n{}",
            text.lines().next().unwrap_or_default()
        ));
        out.push('\n');
    }
    expect![[r#"
        exit 1
        error: $ROOT/models/a.npz is not a model: no rule recognises the file (tried gguf: *.gguf (built-in, beta); mlx: *.mlxfile (alpha))
        exit 0
        model: b ($ROOT/models/b.mlxfile, rule mlx: *.mlxfile (alpha); files: b.mlxfile)
        exit 0
        model: c ($ROOT/models/c.gguf, rule gguf: *.gguf (built-in, beta); files: c.gguf)
    "#]].assert_eq(&out);
}

/// Issue 10: a sandboxed WebAssembly plugin that names `/bin/sh` as a
/// program got the host to run `/bin/sh -c <anything>`. Shells and
/// interpreters now run only where the operator allows them, native or
/// wasm, and the refusal names the line to add.
#[test]
fn shells_and_interpreters_run_only_where_the_operator_allows_them() {
    // The beta example, native or wasm, declaring `programs`.
    let beta = |wasm: bool, programs: &str| {
        let s = Scenario::new();
        let program = s.engine_program("beta-engine", "beta 0.9.0");
        let extra = format!(
            "programs = {programs}\n[probe]\nprogram = \"{}\"\n",
            program.display()
        );
        let manifest = manifest("beta", "engine_beta", &["mlx", "gguf"], 10, &extra);
        match wasm {
            true => s.wasm_plugin("beta", &manifest, "engine_beta"),
            false => s.plugin("beta", &manifest, Some("engine_beta")),
        };
        s
    };
    let s = beta(true, "[\"/bin/sh\"]");
    check(
        &s,
        &["plugins"],
        expect![[r#"
        exit 0
        platform: linux/x86_64/cpu
         PLUGIN  STATUS       FORMATS   PLATFORMS                PRIORITY  ENGINE  CAPABILITIES 
         beta    unavailable  mlx,gguf  linux/x86_64/cpu,cuda13  10                             
        - beta ($ROOT/plugins/beta): plugin.toml names '/bin/sh' as a program to run, and a shell or interpreter runs whatever code the plugin hands it; the host runs it only where the operator allows it for this plugin: add `allow_programs = ["/bin/sh"]` under `[plugins.beta]` in config.toml
    "#]],
    );
    check(
        &s,
        &["resolve", "gguf"],
        expect![[r#"
        exit 2
        gguf → no engine (no installed plugin can serve gguf on this machine)
         PLUGIN  PRIORITY  ENGINE  VERDICT                                                                                                                                                                                                                                                                                        
         beta    10                rejected: engine unavailable: plugin.toml names '/bin/sh' as a program to run, and a shell or interpreter runs whatever code the plugin hands it; the host runs it only where the operator allows it for this plugin: add `allow_programs = ["/bin/sh"]` under `[plugins.beta]` in config.toml 
    "#]],
    );
    s.config("[plugins.beta]\nallow_programs = [\"sh\"]\n");
    check(
        &s,
        &["plugins"],
        expect![[r#"
        exit 0
        platform: linux/x86_64/cpu
         PLUGIN  STATUS  FORMATS   PLATFORMS                PRIORITY  ENGINE  CAPABILITIES 
         beta    ready   mlx,gguf  linux/x86_64/cpu,cuda13  10        0.9.0                
    "#]],
    );

    let s = beta(false, "[\"python3\", \"bash\"]");
    s.config("[plugins.beta]\nallow_programs = [\"python3\"]\n");
    check(
        &s,
        &["plugins"],
        expect![[r#"
        exit 0
        platform: linux/x86_64/cpu
         PLUGIN  STATUS       FORMATS   PLATFORMS                PRIORITY  ENGINE  CAPABILITIES 
         beta    unavailable  mlx,gguf  linux/x86_64/cpu,cuda13  10                             
        - beta ($ROOT/plugins/beta): plugin.toml names 'bash' as a program to run, and a shell or interpreter runs whatever code the plugin hands it; the host runs it only where the operator allows it for this plugin: add `allow_programs = ["python3", "bash"]` under `[plugins.beta]` in config.toml
    "#]],
    );
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    // Regression: `hangar resolve mlx | head -1` panicked ("failed printing
    // to stdout: Broken pipe") once head had exited.
    let s = Scenario::new();
    alpha(&s, 10, "alpha 1.2.0");
    for args in [
        &["resolve", "mlx"][..],
        &["plugins"],
        &["plugins", "--json"],
    ] {
        // A socket whose reader is gone answers writes with EPIPE, as a
        // pipe does once `head` has exited.
        let (writer, reader) = std::os::unix::net::UnixStream::pair().unwrap();
        drop(reader);
        let stdout = std::process::Stdio::from(std::os::fd::OwnedFd::from(writer));
        let out = s.command(args).stdout(stdout).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.is_empty(),
            "hangar {args:?} into a closed pipe: {:?}\n{stderr}",
            out.status
        );
    }
}

/// A plugin may serve a format on some of its platforms only (mlx-lm reads
/// `gguf` on macOS arm64 alone): elsewhere resolution rejects it for that
/// format, naming where it serves it, and still picks it for the others.
#[test]
fn a_format_declared_for_one_platform_resolves_only_there() {
    let mut s = Scenario::new();
    let program = s.engine_program("beta-engine", "beta 0.9.0");
    let manifest = manifest(
        "beta",
        "engine_beta",
        &["mlx", "gguf"],
        10,
        &format!("[probe]\nprogram = \"{}\"\n", program.display()),
    )
    .replace(
        "accelerators = [\"cpu\", \"cuda13\"]",
        "accelerators = [\"cpu\", \"cuda13\"]\nformats = [\"mlx\"]\n\n[[platforms]]\nos = \"macos\"\narch = \"aarch64\"\naccelerators = [\"metal\"]",
    );
    s.plugin("beta", &manifest, Some("engine_beta"));
    check(
        &s,
        &["resolve", "gguf"],
        expect![[r#"
            exit 2
            gguf → no engine (no installed plugin can serve gguf on this machine)
             PLUGIN  PRIORITY  ENGINE  VERDICT                                                                               
             beta    10                rejected: serves gguf only on [macos/aarch64], not on this machine (linux/x86_64/cpu) 
        "#]],
    );
    check(
        &s,
        &["resolve", "mlx"],
        expect![[r#"
            exit 0
            mlx → beta (the only compatible plugin)
             PLUGIN  PRIORITY  ENGINE  VERDICT 
             beta    10        0.9.0   chosen  
        "#]],
    );
    s.platform = "macos/aarch64/metal".into();
    check(
        &s,
        &["resolve", "gguf"],
        expect![[r#"
            exit 0
            gguf → beta (the only compatible plugin)
             PLUGIN  PRIORITY  ENGINE  VERDICT 
             beta    10        0.9.0   chosen  
        "#]],
    );
}

/// A platform entry may list only formats the plugin serves.
#[test]
fn a_platform_format_the_plugin_does_not_serve_is_reported() {
    let s = Scenario::new();
    let broken = manifest("beta", "engine_beta", &["mlx"], 10, "").replace(
        "accelerators = [\"cpu\", \"cuda13\"]",
        "accelerators = [\"cpu\"]\nformats = [\"gguf\"]",
    );
    s.plugin("beta", &broken, Some("engine_beta"));
    check(
        &s,
        &["plugins"],
        expect![[r#"
            exit 0
            platform: linux/x86_64/cpu
             PLUGIN  STATUS  FORMATS  PLATFORMS  PRIORITY  ENGINE  CAPABILITIES 
             beta    broken                                                     
            - beta ($ROOT/plugins/beta): plugin.toml field 'platforms' is invalid: the entry for linux/x86_64 lists format 'gguf', which is not one of the plugin's formats [mlx]
        "#]],
    );
}
