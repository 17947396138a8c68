//! Engine fallback: `alpha` (priority 20) is chosen for the `mlx` model but
//! its engine cannot load it (it exits at once, as an engine does with an
//! architecture it does not support); `beta` (priority 10) can. The host
//! falls back to `beta` and records both reasons, unless `[serving]
//! fallback = false`.

use serde_json::json;

use crate::fixtures::{allow_python, make_executable, manifest, Scenario};
use crate::serve::Server;

fn two_engines(s: &Scenario, settings: &str) {
    let alpha = s.root.path().join("bin/alpha-engine");
    std::fs::create_dir_all(alpha.parent().unwrap()).unwrap();
    std::fs::write(
        &alpha,
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'alpha 1.0.0'; exit 0; fi\n\
         echo 'alpha: unsupported model architecture: mamba' >&2\nexit 1\n",
    )
    .unwrap();
    make_executable(&alpha);
    let extra = format!(
        "[probe]\nprogram = \"{}\"\nargs = [\"--version\"]\n[aliases]\nsafetensors = \"mlx\"\n\
         [capabilities]\nkv_cache_quantization = \">=1.0\"\npaged_attention = \">=2.0\"\n",
        alpha.display()
    );
    s.plugin(
        "alpha",
        &manifest("alpha", "engine_alpha", &["mlx"], 20, &extra),
        Some("engine_alpha"),
    );
    let beta = s.engine_program("beta-engine", "beta 0.9.0");
    let extra = format!(
        "programs = [\"python3\"]\n[probe]\nprogram = \"{}\"\n",
        beta.display()
    );
    s.plugin(
        "beta",
        &manifest("beta", "engine_beta", &["mlx", "gguf"], 10, &extra),
        Some("engine_beta"),
    );
    s.config(&allow_python(&["beta"]));
    s.settings(settings);
}

#[test]
fn a_model_only_the_lower_priority_engine_loads_falls_back_to_it() {
    let server = Server::with(|s| two_engines(s, ""));
    let session = server.load();
    assert_eq!(session["plugin"], "beta", "{session}");
    let notes = session["notes"].to_string();
    assert!(
        notes.contains("fell back: engine 'alpha' failed to start model 'tiny'")
            && notes.contains("unsupported model architecture"),
        "{notes}"
    );
    let (_, events) = server.get("/api/events");
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["fallback", "loaded"], "{events}");
    let fallback = events["events"][0]["message"].as_str().unwrap();
    assert!(
        fallback.contains("unsupported model architecture")
            && fallback.contains("trying the next compatible engine, 'beta'"),
        "{fallback}"
    );
    let loaded = events["events"][1]["message"].as_str().unwrap();
    assert!(loaded.contains("served by beta"), "{loaded}");
}

#[test]
fn fallback_false_keeps_the_first_engines_failure() {
    let server = Server::with(|s| two_engines(s, "[serving]\nfallback = false\n"));
    let (status, body) = server.post("/api/models/tiny/load", json!({}));
    assert_eq!(status, 503, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("engine 'alpha' failed to start model 'tiny'"),
        "{message}"
    );
    assert_eq!(server.events("fallback"), 0);
    assert_eq!(server.events("load_failed"), 1);
}
