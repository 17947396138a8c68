//! Pipeline serving of one model across machines, on mlxcel's own
//! distributed engine (`--distributed-config`, `--node-id`, `--node-role`,
//! `--pp-layers`).
//!
//! The model's `pipeline` setting names this node and its peers:
//!
//! ```json
//! { "node_id": "a", "host": "10.0.0.1", "port": 9100, "layers": "0-13",
//!   "peers": [ { "id": "b", "host": "10.0.0.2", "port": 9100, "layers": "14-27" } ] }
//! ```
//!
//! The plan writes `distributed.toml` (through the host, into the session's
//! work dir) and passes it with this node's id. *Unconfirmed*: the
//! reference names the flags but not the file's schema; the one written
//! here (a `[[nodes]]` table of id, host, port and layers) is the most
//! plausible reading. If mlxcel wants another, the cost is this feature,
//! never a broken load: the setting is off unless an operator sets it.

use hangar_sdk::wire::LoadRequest;
use serde_json::Value;

/// The config file's name in the work dir.
pub const FILE: &str = "distributed.toml";

/// What the plan adds for pipeline serving.
#[derive(Debug)]
pub struct Planned {
    /// The distributed config's text.
    pub config: String,
    /// Flags for this node.
    pub args: Vec<String>,
    /// What the operator runs on each peer.
    pub notes: Vec<String>,
}

struct Node {
    id: String,
    host: String,
    port: u64,
    layers: Option<String>,
}

fn node(value: &Value, what: &str, id_key: &str) -> Result<Node, String> {
    let text = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_string);
    let id = text(id_key)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("pipeline {what} needs a non-empty '{id_key}'"))?;
    let host = text("host")
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("pipeline {what} '{id}' needs a 'host' its peers can reach"))?;
    let port = value
        .get("port")
        .and_then(Value::as_u64)
        .filter(|p| (1..=65535).contains(p))
        .ok_or_else(|| format!("pipeline {what} '{id}' needs a 'port' between 1 and 65535"))?;
    let layers = match value.get("layers") {
        None | Some(Value::Null) => None,
        Some(Value::String(l)) if is_layer_range(l) => Some(l.clone()),
        Some(other) => {
            return Err(format!(
                "pipeline {what} '{id}': layers must be a range like \"0-13\", not {other}"
            ))
        }
    };
    Ok(Node {
        id,
        host,
        port,
        layers,
    })
}

fn is_layer_range(text: &str) -> bool {
    match text.split_once('-') {
        Some((a, b)) => matches!((a.parse::<u32>(), b.parse::<u32>()), (Ok(a), Ok(b)) if a <= b),
        None => false,
    }
}

/// Plans this node of a pipeline.
pub fn plan(request: &LoadRequest, value: &Value) -> Result<Planned, String> {
    if !value.is_object() {
        return Err(format!("setting 'pipeline' must be an object, not {value}"));
    }
    let me = node(value, "node", "node_id")?;
    let peers: Vec<Node> = match value.get("peers") {
        Some(Value::Array(peers)) if !peers.is_empty() => {
            peers.iter().map(|p| node(p, "peer", "id")).collect::<Result<_, _>>()?
        }
        _ => return Err("setting 'pipeline' needs a non-empty 'peers' list: a pipeline spans at least two machines".into()),
    };
    let mut ids: Vec<&str> = peers
        .iter()
        .map(|p| p.id.as_str())
        .chain([me.id.as_str()])
        .collect();
    ids.sort();
    if ids.windows(2).any(|w| w[0] == w[1]) {
        return Err("pipeline node ids must be unique".into());
    }
    let role = value.get("role").and_then(Value::as_str);
    if role.is_some()
        && !request
            .capabilities
            .iter()
            .any(|c| c == "split_prefill_decode")
    {
        return Err(format!(
            "pipeline role '{}' needs split prefill/decode: {}",
            role.unwrap_or_default(),
            crate::off_reason(request, "split_prefill_decode")
        ));
    }
    if let Some(r) = role.filter(|r| !["prefill", "decode", "router"].contains(r)) {
        return Err(format!(
            "pipeline role must be prefill, decode or router, not '{r}'"
        ));
    }
    let mut config = String::from("# mlxcel distributed config, written by Hangar (schema unconfirmed: see plugins/mlxcel/README.md)\n");
    config.push_str(&format!("model = {}\n", toml_string(&request.model_path)));
    for n in std::iter::once(&me).chain(&peers) {
        config.push_str(&format!(
            "\n[[nodes]]\nid = {}\nhost = {}\nport = {}\n",
            toml_string(&n.id),
            toml_string(&n.host),
            n.port
        ));
        if let Some(l) = &n.layers {
            config.push_str(&format!("layers = {}\n", toml_string(l)));
        }
    }
    let path = format!("{}/{FILE}", request.work_dir.trim_end_matches('/'));
    let node_args = |n: &Node, config_path: &str| {
        let mut a = vec![
            "--distributed-config".to_string(),
            config_path.to_string(),
            "--node-id".into(),
            n.id.clone(),
        ];
        if let Some(l) = &n.layers {
            a.extend(["--pp-layers".into(), l.clone()]);
        }
        a
    };
    let mut args = node_args(&me, &path);
    if let Some(r) = role {
        args.extend(["--node-role".into(), r.into()]);
    }
    let notes = peers
        .iter()
        .map(|p| {
            format!(
                "pipeline peer '{}' ({}:{}): copy {path} to it and run: mlxcel-server --model {} --host {} --port {} {}",
                p.id,
                p.host,
                p.port,
                request.model_path,
                p.host,
                p.port,
                node_args(p, FILE).join(" ")
            )
        })
        .collect();
    Ok(Planned {
        config,
        args,
        notes,
    })
}

fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}
