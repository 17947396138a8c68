//! WebAssembly plugins in the host: listed and diagnosed like native ones,
//! compiled once into the on-disk cache, and sandboxed: a guest that loops,
//! traps or allocates without bound is stopped within its limits and
//! reported, and the host's other models keep answering.

use std::time::{Duration, Instant};

use expect_test::expect;
use serde_json::json;

use crate::fixtures::{allow_python, manifest, Scenario};
use crate::serve::Server;

#[test]
fn wasm_plugins_are_listed_and_broken_ones_diagnosed() {
    let s = Scenario::new();
    let probe = s.engine_program("beta-engine", "beta 0.9.0");
    let extra = format!("[probe]\nprogram = \"{}\"\n", probe.display());
    s.wasm_plugin(
        "beta",
        &manifest("beta", "engine_beta", &["mlx", "gguf"], 10, &extra),
        "engine_beta",
    );
    s.wasm_plugin(
        "panics",
        &manifest("panics", "engine_panics", &["gguf"], 5, ""),
        "engine_panics",
    );
    let text = s.plugin("text", &manifest("text", "text", &["gguf"], 1, ""), None);
    let text_manifest =
        manifest("text", "text", &["gguf"], 1, "").replace("\"native\"", "\"wasm\"");
    std::fs::write(text.join("plugin.toml"), text_manifest).unwrap();
    std::fs::write(text.join("text.wasm"), "not wasm\n").unwrap();
    // A valid, empty core module: WebAssembly, but no plugin.
    let empty = s.plugin("empty", "", None);
    let empty_manifest =
        manifest("empty", "empty", &["gguf"], 1, "").replace("\"native\"", "\"wasm\"");
    std::fs::write(empty.join("plugin.toml"), empty_manifest).unwrap();
    std::fs::write(empty.join("empty.wasm"), b"\0asm\x01\0\0\0").unwrap();

    let (code, out) = s.hangar(&["plugins"]);
    expect![[r#"
        exit 0
        platform: linux/x86_64/cpu
         PLUGIN  STATUS  FORMATS   PLATFORMS                PRIORITY  ENGINE  CAPABILITIES 
         beta    ready   mlx,gguf  linux/x86_64/cpu,cuda13  10        0.9.0                
         empty   broken  gguf      linux/x86_64/cpu,cuda13  1                              
         panics  broken  gguf      linux/x86_64/cpu,cuda13  5                              
         text    broken  gguf      linux/x86_64/cpu,cuda13  1                              
        - empty ($ROOT/plugins/empty): $ROOT/plugins/empty/empty.wasm does not export the hangar:engine@1.0.0 world's plugin interface: no exported instance named `hangar:engine/plugin@1.0.0`
        - panics ($ROOT/plugins/panics): describe() failed: the plugin panicked: the engine adapter is broken at sdk/examples/engine_panics.rs:11
        - text ($ROOT/plugins/text): $ROOT/plugins/text/text.wasm is not a WebAssembly file; rebuild the plugin with `cargo build --target wasm32-unknown-unknown --release`
    "#]]
    .assert_eq(&format!("exit {code}\n{out}"));

    // Compiled once: the cache holds the three that compile (panics' code
    // panics; empty has no plugin interface), keyed by content. A damaged entry is compiled
    // again, not trusted.
    let cache = s.root.path().join(".cache/hangar/wasm");
    let mut entries: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    assert_eq!(entries.len(), 3, "{entries:?}");
    for entry in &entries {
        std::fs::write(entry, "damaged").unwrap();
    }
    let (code, again) = s.hangar(&["plugins"]);
    assert_eq!(code, 0, "{again}");
    assert!(again.starts_with(&out), "{again}");
    assert_eq!(
        again
            .matches("ignoring a cached WebAssembly plugin")
            .count(),
        3,
        "{again}"
    );
    assert!(std::fs::metadata(&entries[0]).unwrap().len() > 1000);
}

#[test]
fn a_guest_that_loops_traps_or_hoards_is_stopped_and_the_host_keeps_serving() {
    let server = Server::with(|s| {
        let probe = s.engine_program("beta-engine", "beta 0.9.0");
        let extra = format!(
            "programs = [\"python3\"]\n[probe]\nprogram = \"{}\"\n",
            probe.display()
        );
        s.plugin(
            "beta",
            &manifest("beta", "engine_beta", &["mlx", "gguf"], 10, &extra),
            Some("engine_beta"),
        );
        s.wasm_plugin(
            "misbehaves",
            &manifest("misbehaves", "wasm_misbehaves", &["gguf"], 20, &extra),
            "wasm_misbehaves",
        );
        let models = s.root.path().join("models");
        std::fs::create_dir_all(&models).unwrap();
        for model in ["spin", "trap", "hog", "fine"] {
            std::fs::write(models.join(format!("{model}.gguf")), b"GGUF").unwrap();
        }
        s.config(&format!(
            "{}[wasm]\ncall_timeout_ms = 500\nmemory_mib = 32\ncache_dir = \"{}\"\n",
            allow_python(&["beta", "misbehaves"]),
            s.root.path().join("wasm-cache").display()
        ));
        // The guest's own failure is what this test reads, not the native
        // plugin taking its models over.
        s.settings("[serving]\nfallback = false\n");
    });
    // The native plugin's model serves throughout.
    server.load();
    let load = |model: &str| {
        let started = Instant::now();
        let (status, body) = server.post(&format!("/api/models/{model}/load"), json!({}));
        (status, body, started.elapsed())
    };

    // The first call compiles the component (cached on disk after that),
    // which on a loaded 2-core machine alone can take seconds: time the
    // second, which only the deadline can stop.
    let _ = load("spin");
    let warm_up = server.event_log("load_failed");
    let (status, body, took) = load("spin");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert_ne!(status, 200, "{body}");
    assert!(
        message.contains(
            "plan_launch() was stopped: the plugin did not answer within its limit of 500 ms"
        ),
        "{message}"
    );
    assert!(took < Duration::from_secs(5), "stopped after {took:?}");

    let (status, body, _) = load("trap");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert_ne!(status, 200, "{body}");
    assert!(
        message.contains("plan_launch() failed: the plugin panicked: the adapter cannot plan trap at sdk/examples/wasm_misbehaves.rs"),
        "{message}"
    );

    let (status, body, took) = load("hog");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert_ne!(status, 200, "{body}");
    assert!(
        message
            .contains("plan_launch() was stopped: the plugin grew past its memory cap of 32 MiB"),
        "{message}"
    );
    assert!(took < Duration::from_secs(5), "stopped after {took:?}");

    // The same plugin still plans, and the other model still answers.
    let (status, body, _) = load("fine");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["session"]["plugin"], "misbehaves", "{body}");
    let (status, body) = server.get("/api/sessions");
    assert_eq!(status, 200, "{body}");
    let models: Vec<&str> = body["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["model"].as_str().unwrap())
        .collect();
    assert!(
        models.contains(&"tiny") && models.contains(&"fine"),
        "{body}"
    );
    assert_eq!(server.load()["model"], "tiny");
    // Each checked failure is one event, and nothing else failed to load
    // (the unchecked warm-up above may have failed as spin only).
    let failed = server.event_log("load_failed");
    let model = |e: &String| e.split(':').next().unwrap().to_string();
    assert!(
        warm_up.iter().all(|e| model(e) == "spin") && failed.starts_with(&warm_up),
        "{failed:#?}"
    );
    let checked: Vec<String> = failed[warm_up.len()..].iter().map(model).collect();
    assert_eq!(checked, ["spin", "trap", "hog"], "{failed:#?}");
}
