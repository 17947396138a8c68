//! Models on disk over the API: `GET /api/models`' size, path, source and
//! loaded fields, `/api/sessions`' idle time and TTL, and
//! `DELETE /api/models/{id}` (409 while loaded, `force=true` unloading first).

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::fixtures::Scenario;
use crate::serve::{beta, Server};

/// A Hugging Face cache repository `org/m` in the scenario's model dir with
/// two snapshots sharing `config.json`'s blob; `refs/main` names `new`.
fn cache_model(s: &Scenario) {
    let repo = s.root.path().join("models/models--org--m");
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("blobs/cfg"), "{}").unwrap();
    let weights = |pad: usize| {
        let header = format!("{{}}{}", " ".repeat(pad));
        let mut w = (header.len() as u64).to_le_bytes().to_vec();
        w.extend_from_slice(header.as_bytes());
        w
    };
    std::fs::write(repo.join("blobs/w-old"), weights(0)).unwrap();
    std::fs::write(repo.join("blobs/w-new"), weights(6)).unwrap();
    for (rev, blob) in [("old", "w-old"), ("new", "w-new")] {
        let snap = repo.join("snapshots").join(rev);
        std::fs::create_dir_all(&snap).unwrap();
        std::os::unix::fs::symlink("../../blobs/cfg", snap.join("config.json")).unwrap();
        std::os::unix::fs::symlink(
            format!("../../blobs/{blob}"),
            snap.join("model.safetensors"),
        )
        .unwrap();
    }
    std::fs::write(repo.join("refs/main"), "new").unwrap();
}

fn entry<'a>(models: &'a Value, id: &str) -> Option<&'a Value> {
    models["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["model"]["id"] == id)
}

fn delete(server: &Server, path: &str) -> (u16, Value) {
    let r = reqwest::blocking::Client::new()
        .delete(format!("{}{path}", server.url))
        .timeout(std::time::Duration::from_secs(60))
        .send()
        .unwrap();
    (r.status().as_u16(), r.json().unwrap_or(Value::Null))
}

#[test]
fn the_models_list_says_size_path_source_and_whether_loaded() {
    let server = Server::with(|s| {
        beta(s);
        cache_model(s);
    });
    let (status, models) = server.get("/api/models");
    assert_eq!(status, 200, "{models}");
    let tiny = entry(&models, "tiny").expect("tiny is listed");
    // config.json (2 bytes) and the 8-byte length plus the 2-byte header.
    assert_eq!(tiny["size_bytes"], 12);
    assert_eq!(tiny["source"], "model_dir");
    assert_eq!(tiny["loaded"], false);
    assert_eq!(tiny["session_id"], Value::Null);
    assert!(
        tiny["path"].as_str().unwrap().ends_with("models/tiny"),
        "{tiny}"
    );
    let cached = entry(&models, "org/m").expect("org/m is listed");
    assert_eq!(cached["source"], "hf_cache");
    // The `new` snapshot: the shared config blob and its own weights, once
    // each; the links count nothing.
    assert_eq!(cached["size_bytes"], 2 + 16);
    assert!(
        cached["path"].as_str().unwrap().ends_with("snapshots/new"),
        "{cached}"
    );

    let session = server.load();
    let (_, models) = server.get("/api/models");
    let tiny = entry(&models, "tiny").unwrap();
    assert_eq!(tiny["loaded"], true);
    assert_eq!(tiny["session_id"], session["id"]);
    let (_, sessions) = server.get("/api/sessions");
    let listed = &sessions["sessions"][0];
    assert!(listed["idle_seconds"].is_u64(), "{listed}");
    assert_eq!(listed["pinned"], false);
    // ttl_seconds unset: it stays loaded.
    assert_eq!(listed["ttl_left_seconds"], Value::Null, "{listed}");
}

#[test]
fn the_ttl_left_counts_down_from_the_residency_ttl() {
    let server = Server::with(|s| {
        beta(s);
        s.settings("[models.tiny]\nttl_seconds = 600\n");
    });
    server.load();
    let (_, sessions) = server.get("/api/sessions");
    let left = sessions["sessions"][0]["ttl_left_seconds"]
        .as_u64()
        .expect("a TTL");
    assert!((590..=600).contains(&left), "{sessions}");
}

#[test]
fn deleting_a_model_refuses_while_loaded_and_force_unloads_first() {
    let server = Server::with(|s| {
        beta(s);
        cache_model(s);
    });
    let (status, body) = delete(&server, "/api/models/nope");
    assert_eq!(status, 404, "{body}");
    let (status, body) = delete(&server, "/api/models/tiny?force=maybe");
    assert_eq!(status, 400, "{body}");

    let session = server.load();
    let (_, models) = server.get("/api/models");
    let tiny_path = PathBuf::from(entry(&models, "tiny").unwrap()["path"].as_str().unwrap());
    let (status, body) = delete(&server, "/api/models/tiny");
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("force=true"),
        "{body}"
    );
    assert!(tiny_path.exists(), "nothing is removed on a refusal");

    let (status, body) = delete(&server, "/api/models/tiny?force=true");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["unloaded"], true);
    assert_eq!(body["bytes"], 12);
    assert!(!tiny_path.exists());
    assert!(
        !crate::serve::alive(crate::serve::pid_of(&session)),
        "the engine was stopped first"
    );
    let (_, sessions) = server.get("/api/sessions");
    assert_eq!(sessions["sessions"], json!([]));
    let (_, models) = server.get("/api/models");
    assert!(
        entry(&models, "tiny").is_none(),
        "the catalog was rescanned: {models}"
    );

    // The cache model's newest snapshot: the blob the older one shares stays.
    let (status, body) = delete(&server, "/api/models/org%2Fm");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["unloaded"], false);
    assert_eq!(body["bytes"], 16);
    let (_, models) = server.get("/api/models");
    let older = entry(&models, "org/m").expect("the older snapshot is the model now");
    assert!(
        older["path"].as_str().unwrap().ends_with("snapshots/old"),
        "{older}"
    );
    let repo = PathBuf::from(older["path"].as_str().unwrap()).join("../..");
    assert!(repo.join("blobs/cfg").exists());
    assert!(!repo.join("blobs/w-new").exists());
    assert!(!repo.join("refs/main").exists());
}

/// Regression: a model called `pull` or `pulls` could not be deleted (the
/// management API's own paths won), nor `pulls` loaded or set.
#[test]
fn models_named_as_the_management_paths_are_managed_like_any() {
    let server = Server::with(|s| {
        beta(s);
        for name in ["pull", "pulls", "rescan"] {
            crate::serve::model(s, name, 0);
        }
    });
    let client = reqwest::blocking::Client::new();
    let call = |method: &str, path: &str| -> (u16, Value) {
        let url = format!("{}{path}", server.url);
        let request = match method {
            "GET" => client.get(url),
            "PUT" => client.put(url).json(&json!({"ttl_seconds": 7})),
            "POST" => client.post(url),
            _ => client.delete(url),
        };
        let r = request
            .timeout(std::time::Duration::from_secs(60))
            .send()
            .unwrap();
        (r.status().as_u16(), r.json().unwrap_or(Value::Null))
    };
    for name in ["pull", "pulls", "rescan"] {
        let model = format!("/api/models/{name}");
        let (status, body) = call("PUT", &format!("{model}/settings"));
        assert_eq!(status, 200, "{name}: {body}");
        let (status, body) = call("GET", &format!("{model}/settings"));
        assert_eq!(
            (status, &body["model"], &body["stored"]["ttl_seconds"]),
            (200, &json!(name), &json!(7)),
            "{name}: {body}"
        );
        let (status, body) = call("GET", &format!("{model}/settings/schema"));
        assert_eq!(status, 200, "{name}: {body}");
        let (status, body) = call("POST", &format!("{model}/load"));
        assert_eq!(status, 200, "{name}: {body}");
        assert_eq!(body["session"]["model"], name, "{body}");
        let (status, body) = call("POST", &format!("{model}/unload"));
        assert_eq!(status, 200, "{name}: {body}");
        let (status, body) = call("DELETE", &model);
        assert_eq!((status, &body["model"]), (200, &json!(name)), "{body}");
        let (status, body) = call("DELETE", &model);
        assert_eq!(status, 404, "{name} is gone: {body}");
    }
    // The pulls' own routes are as they were.
    let (status, body) = call("GET", "/api/models/pulls");
    assert_eq!((status, &body["pulls"]), (200, &json!([])), "{body}");
    let (status, body) = call("GET", "/api/models/pulls/pull-1");
    assert_eq!(status, 404, "{body}");
    let (status, body) = call("POST", "/api/models/pulls/pull-1");
    assert_eq!(status, 405, "{body}");
    let (_, models) = server.get("/api/models");
    for name in ["pull", "pulls", "rescan"] {
        assert!(entry(&models, name).is_none(), "{name}: {models}");
    }
}
