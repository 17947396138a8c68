//! What a model needs before it loads: its weights (the sizes of its
//! weight files, from the catalog) plus the KV cache for its context,
//! computed from the model's `config.json` when it has one.
//!
//! This is the host's estimate. The hook for a better one is
//! [`Estimate::declared`]: an engine that knows its own footprint (say,
//! quantized KV, or a paged cache with a fixed pool) can declare it, and
//! the declared bytes are used instead of weights + KV. Once measured, a
//! session's resident memory counts over either (see
//! [`super::machine::ModelState::footprint`]).

use std::io::Read as _;
use std::path::Path;

use serde_json::Value;

/// Context used for the KV estimate when neither the settings nor the
/// model's config say otherwise, and the cap on the config's
/// `max_position_embeddings` (engines allocate KV as contexts grow, so the
/// model's maximum would overstate what a typical session holds).
pub const DEFAULT_CONTEXT: u64 = 8192;

/// The most of `config.json` read: configs are a few KiB.
const CONFIG_CAP: u64 = 1 << 20;

/// A model's estimated need, in bytes, by part.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Estimate {
    /// Weight files.
    pub weights: u64,
    /// KV cache for `context` tokens (fp16 keys and values).
    pub kv_cache: u64,
    /// Tokens the KV estimate is for.
    pub context: u64,
    /// The engine's own figure, which replaces weights + KV when present.
    pub declared: Option<u64>,
}

impl Estimate {
    /// The bytes the scheduler plans with.
    pub fn total(&self) -> u64 {
        self.declared
            .unwrap_or(self.weights.saturating_add(self.kv_cache))
    }
}

/// Estimates a model at `path` (a folder, or a `.gguf` file) whose weights
/// weigh `weights` bytes, for `context` tokens (the `context_length`
/// setting, when set).
pub fn estimate(path: &Path, weights: u64, context: Option<u64>) -> Estimate {
    let config = if path.is_dir() {
        read_config(&path.join("config.json"))
    } else {
        None
    };
    from_config(config.as_ref(), weights, context)
}

/// The part of a model's need that stays on this machine when its settings
/// spread it over a cluster (`distributed` and `cluster`): each rank holds
/// a slice of every layer (tensor) or a run of layers (pipeline), so this
/// machine holds `local ranks / ranks` of it. `need` as it is otherwise.
/// The point of a cluster is a model too large for one machine: counting
/// all of it here would have the memory guard refuse exactly those.
pub fn local_share(
    need: u64,
    clusters: &std::collections::BTreeMap<String, hangar_engine::config::ClusterConfig>,
    model_settings: Option<&crate::settings::SettingMap>,
) -> u64 {
    use hangar_plugin_api::wire::settings::{CLUSTER, DISTRIBUTED};
    let Some(settings) = model_settings else {
        return need;
    };
    let set = |name: &str| settings.get(name).filter(|v| !v.is_null());
    let cluster = set(DISTRIBUTED)
        .and(set(CLUSTER))
        .and_then(Value::as_str)
        .and_then(|name| clusters.get(name));
    let Some(cluster) = cluster.filter(|c| !c.peers.is_empty()) else {
        return need;
    };
    let all = cluster.peers.len() as u64;
    let local = cluster
        .peers
        .iter()
        .filter(|p| p.ssh == hangar_engine::config::LOCAL_PEER)
        .count() as u64;
    // Rounded up: a share is never under what a rank holds.
    (need / all).saturating_mul(local) + (need % all).min(local)
}

/// What a draft model at `dir` (speculative decoding: loaded beside the
/// model, setting `draft_model`) adds: its `.safetensors` files and its KV
/// cache for `context` tokens. A folder that cannot be read adds nothing
/// (the engine refuses or ignores it at load).
pub fn draft_estimate(dir: &Path, context: Option<u64>) -> u64 {
    let weights = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        // A regular file's size, never a FIFO's or a device's.
        .filter_map(|e| e.metadata().ok().filter(|m| m.is_file()))
        .map(|m| m.len())
        .sum();
    estimate(dir, weights, context).total()
}

fn read_config(path: &Path) -> Option<Value> {
    let file = std::fs::File::open(path).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None; // never block on a FIFO or a device
    }
    let mut text = String::new();
    file.take(CONFIG_CAP).read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
}

/// The estimate from a parsed `config.json` (Hugging Face names; a
/// `text_config` inside is used for multimodal models).
pub fn from_config(config: Option<&Value>, weights: u64, context: Option<u64>) -> Estimate {
    let config = config.map(|c| c.get("text_config").unwrap_or(c));
    let int = |key: &str| config.and_then(|c| c.get(key)).and_then(Value::as_u64);
    let context = context.unwrap_or_else(|| {
        int("max_position_embeddings")
            .unwrap_or(DEFAULT_CONTEXT)
            .min(DEFAULT_CONTEXT)
    });
    let kv_cache = match (int("num_hidden_layers"), int("num_attention_heads")) {
        (Some(layers), Some(heads)) if heads > 0 => {
            let kv_heads = int("num_key_value_heads").unwrap_or(heads);
            let head_dim = int("head_dim")
                .or_else(|| int("hidden_size").map(|h| h / heads))
                .unwrap_or(0);
            // Keys and values, two bytes each, per layer, head and token.
            2u64.saturating_mul(layers)
                .saturating_mul(kv_heads)
                .saturating_mul(head_dim)
                .saturating_mul(context)
                .saturating_mul(2)
        }
        _ => 0,
    };
    Estimate {
        weights,
        kv_cache,
        context,
        declared: None,
    }
}

#[cfg(test)]
mod tests {
    use expect_test::{expect, Expect};
    use serde_json::json;

    #[test]
    fn a_model_spread_over_a_cluster_counts_its_local_ranks_share() {
        let config = hangar_engine::config::Config::parse(
            "[clusters.pair]\npeers = [{ ssh = \"127.0.0.1\", ip = \"10.0.0.1\" }, { ssh = \"b\", ip = \"10.0.0.2\" }]\n\
             [clusters.loop]\npeers = [{ ssh = \"127.0.0.1\", ip = \"127.0.0.1\" }, { ssh = \"127.0.0.1\", ip = \"127.0.0.1\" }]\n",
        )
        .unwrap();
        let share = |settings: serde_json::Value| {
            let map: crate::settings::SettingMap = serde_json::from_value(settings).unwrap();
            super::local_share(1001, &config.clusters, Some(&map))
        };
        let shares = [
            share(json!({})),
            share(json!({"distributed": "tensor", "cluster": "pair"})),
            share(json!({"distributed": "pipeline", "cluster": "loop"})),
            share(json!({"cluster": "pair"})),
            share(json!({"distributed": "tensor", "cluster": "nowhere"})),
        ];
        expect!["[1001, 501, 1001, 1001, 1001]"].assert_eq(&format!("{shares:?}"));
    }

    fn check(config: serde_json::Value, context: Option<u64>, expect: Expect) {
        let e = super::from_config(Some(&config), 1000, context);
        expect.assert_eq(&format!("{e:?} total={}", e.total()));
    }

    #[test]
    fn kv_cache_follows_layers_kv_heads_head_dim_and_context() {
        // Llama-3-8B-like: 32 layers, 8 KV heads of 128, 8192 tokens: 1 GiB.
        check(
            json!({"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "hidden_size": 4096, "max_position_embeddings": 131072}),
            None,
            expect![[
                r#"Estimate { weights: 1000, kv_cache: 1073741824, context: 8192, declared: None } total=1073742824"#
            ]],
        );
        check(
            json!({"text_config": {"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16}}),
            Some(100),
            expect![[
                r#"Estimate { weights: 1000, kv_cache: 51200, context: 100, declared: None } total=52200"#
            ]],
        );
        check(
            json!({}),
            None,
            expect![[
                r#"Estimate { weights: 1000, kv_cache: 0, context: 8192, declared: None } total=1000"#
            ]],
        );
    }

    #[test]
    fn a_draft_model_adds_its_weight_files_and_its_kv_cache() {
        let dir = tempfile::tempdir().unwrap();
        let config = json!({"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16});
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        std::fs::write(dir.path().join("model.safetensors"), vec![0u8; 3000]).unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), vec![0u8; 500]).unwrap();
        // 3000 bytes of weights (not the tokenizer), KV of 2 layers x 4
        // heads x 16 x 100 tokens x 2 (keys, values) x 2 bytes.
        assert_eq!(super::draft_estimate(dir.path(), Some(100)), 3000 + 51200);
        assert_eq!(
            super::draft_estimate(&dir.path().join("absent"), Some(100)),
            0
        );
    }
}
