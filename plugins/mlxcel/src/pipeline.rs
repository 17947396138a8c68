//! Pipeline serving of one model across machines, on mlxcel's own
//! distributed engine (`--distributed-config`, `--node-id`, `--node-role`);
//! Hangar only writes the cluster file and the arguments.
//!
//! The model's `pipeline` setting names this node (the one Hangar starts,
//! which serves HTTP and coordinates) and its peers, which the operator
//! starts on their machines:
//!
//! ```json
//! { "node_id": "coordinator", "host": "192.168.1.22", "port": 19000,
//!   "layers": "0-13,14-27",
//!   "peers": [ { "id": "stage-0", "host": "192.168.1.22", "port": 19001, "http_port": 18081 },
//!              { "id": "stage-1", "host": "192.168.1.24", "port": 19001 } ] }
//! ```
//!
//! - `host`/`port`: the address each node's cluster transport listens on
//!   and its peers reach it at. mlxcel reads node addresses as `IP:port`,
//!   so `host` is an IP address, never a name.
//! - `role`: this node's role; `hybrid` (the coordinator, the default) or
//!   `pipeline_stage` need `distributed_pipeline`, and the split serving
//!   roles `prefill`, `decode` and `router` need `split_prefill_decode`.
//!   A peer's role defaults to `pipeline_stage`. An explicit role is also
//!   passed as `--node-role`.
//! - `layers` (on the node or its peers) is refused before launch: with
//!   `--distributed-config` mlxcel-server partitions the layers across its
//!   stages itself, and its remote pipeline refuses `--pp-layers`, as it
//!   refuses a drafter and tensor parallelism (`resolve_remote_pipeline_topology`
//!   in mlxcel's `src/server/startup.rs`; `plan_launch` refuses those two).
//!   Stages are numbered in the order the nodes are listed.
//! - `transport`: `tcp` (default) or `thunderbolt` (TCP over a Thunderbolt
//!   Bridge network).
//! - `http_port` (peers only): the peer's own HTTP port (`--port`), needed
//!   when it shares a machine with Hangar or another mlxcel-server, since
//!   mlxcel's default (8080) is Hangar's too.
//!
//! The file's schema is *unconfirmed*: the reference names the flags but
//! not the file. What is written follows mlxcel's public source
//! (`src/distributed/config.rs`, `examples/distributed/*.toml`): a
//! `[cluster]` table (name, `pipeline_parallel_size`, `transport_backend`)
//! and `[[nodes]]` of `id`, `address` (`IP:port`), `role` and, for pipeline
//! stages, `stage`. If a release reads another shape, it refuses the file
//! and only this model's pipeline load fails; nothing else depends on it.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use hangar_sdk::wire::LoadRequest;
use serde_json::{Map, Value};

use crate::{has, off_reason, PROGRAM};

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
    /// The pipeline stages (the cluster file's `pipeline_parallel_size`):
    /// from 2 on, mlxcel-server runs its remote pipeline.
    pub stages: usize,
}

/// Node roles and the capability each needs.
const ROLES: &[(&str, &str)] = &[
    ("hybrid", "distributed_pipeline"),
    ("pipeline_stage", "distributed_pipeline"),
    ("prefill", "split_prefill_decode"),
    ("decode", "split_prefill_decode"),
    ("router", "split_prefill_decode"),
];

/// The role that holds a range of layers.
const STAGE: &str = "pipeline_stage";

/// Transports mlxcel's cluster file names.
const TRANSPORTS: &[&str] = &["tcp", "thunderbolt"];

/// mlxcel's limit on node ids and cluster names.
const MAX_ID: usize = 128;

#[derive(Debug)]
struct Node {
    id: String,
    address: SocketAddr,
    /// The role as the operator gave it (`None`: the default).
    explicit_role: Option<String>,
    role: &'static str,
    layers: Option<String>,
    http_port: Option<u16>,
}

/// Refuses keys the shape does not have (a misspelt `layer` would
/// otherwise be ignored).
fn known_keys(object: &Map<String, Value>, what: &str, allowed: &[&str]) -> Result<(), String> {
    match object.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(format!(
            "{what} has no field '{k}' (its fields: {})",
            allowed.join(", ")
        )),
        None => Ok(()),
    }
}

fn port(object: &Map<String, Value>, key: &str, what: &str) -> Result<Option<u16>, String> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|p| (1..=65535).contains(p))
            .map(|p| Some(p as u16))
            .ok_or_else(|| format!("{what}: {key} must be a port between 1 and 65535, not {v}")),
    }
}

fn text<'a>(
    object: &'a Map<String, Value>,
    key: &str,
    what: &str,
) -> Result<Option<&'a str>, String> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(format!("{what}: {key} must be a string, not {v}")),
    }
}

fn node(
    value: &Value,
    what: &str,
    id_key: &str,
    allowed: &[&str],
    default_role: &'static str,
) -> Result<Node, String> {
    let object = value
        .as_object()
        .ok_or_else(|| format!("{what} must be an object, not {value}"))?;
    known_keys(object, what, allowed)?;
    let id = text(object, id_key, what)?.unwrap_or_default();
    let valid_id = !id.is_empty()
        && id.len() <= MAX_ID
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !valid_id {
        return Err(format!(
            "{what}: {id_key} must be 1 to {MAX_ID} letters, digits, '-', '_' or '.', not '{id}'"
        ));
    }
    let what = format!("{what} '{id}'");
    let host = text(object, "host", &what)?
        .ok_or_else(|| format!("{what} needs a 'host': the IP address its peers reach it at"))?;
    let ip: IpAddr = host.parse().map_err(|_| {
        format!("{what}: host must be an IP address, not '{host}'; mlxcel reads node addresses as IP:port, not names")
    })?;
    if ip.is_unspecified() {
        return Err(format!(
            "{what}: host {ip} is not an address peers can reach; give the machine's own IP address"
        ));
    }
    let transport_port = port(object, "port", &what)?
        .ok_or_else(|| format!("{what} needs a 'port' for its cluster transport"))?;
    let explicit_role = text(object, "role", &what)?.map(str::to_string);
    let role = match &explicit_role {
        None => default_role,
        Some(r) => ROLES
            .iter()
            .map(|(name, _)| *name)
            .find(|name| name == r)
            .ok_or_else(|| {
                let names: Vec<&str> = ROLES.iter().map(|(n, _)| *n).collect();
                format!(
                    "{what}: role must be one of {}, not '{r}'",
                    names.join(", ")
                )
            })?,
    };
    Ok(Node {
        id: id.to_string(),
        address: SocketAddr::new(ip, transport_port),
        explicit_role,
        role,
        layers: text(object, "layers", &what)?.map(str::to_string),
        http_port: port(object, "http_port", &what)?,
    })
}

/// Plans this node of a pipeline for the model in `model_dir`.
pub fn plan(request: &LoadRequest, model_dir: &Path, value: &Value) -> Result<Planned, String> {
    let refuse = |why: String| {
        format!(
            "model '{}': setting pipeline is invalid: {why}",
            request.model_id
        )
    };
    let object = value
        .as_object()
        .ok_or_else(|| refuse(format!("it must be an object, not {value}")))?;
    let mut me = node(
        value,
        "pipeline",
        "node_id",
        &[
            "node_id",
            "host",
            "port",
            "role",
            "layers",
            "transport",
            "peers",
        ],
        "hybrid",
    )
    .map_err(&refuse)?;
    // This node's `layers` is the whole partition, not a range of its own.
    let partition = me.layers.take();
    let peers: Vec<Node> = match object.get("peers") {
        Some(Value::Array(list)) if !list.is_empty() => list
            .iter()
            .enumerate()
            .map(|(i, p)| {
                node(
                    p,
                    &format!("peer {}", i + 1),
                    "id",
                    &["id", "host", "port", "role", "layers", "http_port"],
                    STAGE,
                )
            })
            .collect::<Result<_, _>>()
            .map_err(&refuse)?,
        _ => {
            return Err(refuse(
                "it needs a non-empty 'peers' list: a pipeline spans at least two nodes".into(),
            ))
        }
    };
    let transport = text(object, "transport", "pipeline")
        .map_err(&refuse)?
        .unwrap_or("tcp");
    if !TRANSPORTS.contains(&transport) {
        return Err(refuse(format!(
            "transport must be {}, not '{transport}'",
            TRANSPORTS.join(" or ")
        )));
    }

    let nodes: Vec<&Node> = std::iter::once(&me).chain(&peers).collect();
    for (i, a) in nodes.iter().enumerate() {
        for b in &nodes[..i] {
            if a.id == b.id {
                return Err(refuse(format!("node id '{}' is used twice", a.id)));
            }
            if a.address == b.address {
                return Err(refuse(format!(
                    "nodes '{}' and '{}' both listen on {}",
                    b.id, a.id, a.address
                )));
            }
        }
        if let Some(http) = a.http_port {
            let clash = nodes.iter().find(|n| {
                n.address.ip() == a.address.ip()
                    && (n.address.port() == http || (n.id != a.id && n.http_port == Some(http)))
            });
            if let Some(n) = clash {
                return Err(refuse(format!(
                    "peer '{}': http_port {http} is taken by node '{}' on {}",
                    a.id,
                    n.id,
                    a.address.ip()
                )));
            }
        }
    }
    for n in &nodes {
        let capability = ROLES
            .iter()
            .find(|(name, _)| *name == n.role)
            .map_or("distributed_pipeline", |(_, c)| *c);
        if !has(request, capability) {
            return Err(refuse(format!(
                "node '{}' has role '{}': {}",
                n.id,
                n.role,
                off_reason(request, capability)
            )));
        }
    }

    let stages: Vec<&Node> = nodes.iter().copied().filter(|n| n.role == STAGE).collect();
    let peer_ranges: Vec<&Node> = peers.iter().filter(|p| p.layers.is_some()).collect();
    let layers = match (partition, peer_ranges.is_empty()) {
        (Some(_), false) => {
            return Err(refuse(
                "give the layers either as the whole partition in 'layers' or as a range on each stage peer, not both".into(),
            ))
        }
        (Some(spec), true) => Some(spec),
        (None, true) => None,
        (None, false) => {
            if let Some(n) = stages.iter().find(|n| n.layers.is_none()) {
                return Err(refuse(format!(
                    "pipeline stage '{}' has no layers while other peers do; give each stage peer its range, or the whole partition in 'layers'",
                    n.id
                )));
            }
            if let Some(p) = peer_ranges.iter().find(|p| p.role != STAGE) {
                return Err(refuse(format!(
                    "peer '{}' has layers but role '{}'; only pipeline stages hold layers",
                    p.id, p.role
                )));
            }
            Some(
                stages
                    .iter()
                    .filter_map(|n| n.layers.as_deref())
                    .collect::<Vec<_>>()
                    .join(","),
            )
        }
    };
    if let Some(spec) = &layers {
        return Err(refuse(format!(
            "layers '{spec}': with --distributed-config {PROGRAM} partitions the layers across its stages itself and refuses --pp-layers; leave 'layers' out of the node and its peers"
        )));
    }

    let config = cluster_file(request, transport, &nodes, stages.len());
    let path = Path::new(&request.work_dir)
        .join(FILE)
        .display()
        .to_string();
    let node_args = |n: &Node, config_path: &str| {
        let mut a = vec![
            "--distributed-config".to_string(),
            config_path.to_string(),
            "--node-id".into(),
            n.id.clone(),
        ];
        if let Some(role) = &n.explicit_role {
            a.extend(["--node-role".into(), role.clone()]);
        }
        a
    };
    let model_path = model_dir.display().to_string();
    let notes = peers
        .iter()
        .map(|p| {
            let mut command = vec![PROGRAM.to_string(), "--model".into(), model_path.clone()];
            command.extend(node_args(p, FILE));
            if let Some(http) = p.http_port {
                command.extend(["--port".into(), http.to_string()]);
            }
            command.push("--no-warmup".into());
            format!(
                "pipeline peer '{}' ({}): start it before this model loads, on the machine at {} with the same model folder and a copy of {path} (it changes only with the pipeline setting) in its working folder: {}",
                p.id,
                p.role,
                p.address.ip(),
                command.iter().map(|a| shell_word(a)).collect::<Vec<_>>().join(" ")
            )
        })
        .collect();
    Ok(Planned {
        config,
        args: node_args(&me, &path),
        notes,
        stages: stages.len().max(1),
    })
}

/// The cluster file. It depends only on the setting and the model id, so
/// a copy on a peer stays valid from one session to the next.
fn cluster_file(request: &LoadRequest, transport: &str, nodes: &[&Node], stages: usize) -> String {
    let name: String = format!("hangar-{}", request.model_id)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(MAX_ID)
        .collect();
    let mut out = format!(
        "# mlxcel-server --distributed-config for model '{}', written by Hangar's mlxcel plugin.\n\
         # Schema *unconfirmed*: taken from mlxcel's public source (src/distributed/config.rs),\n\
         # not from a release's documentation; see plugins/mlxcel/README.md.\n\
         \n[cluster]\nname = {}\npipeline_parallel_size = {}\ntransport_backend = {}\n",
        request.model_id.replace(['\n', '\r'], " "),
        toml_string(&name),
        stages.max(1),
        toml_string(transport),
    );
    let mut stage = 0;
    for n in nodes {
        out.push_str(&format!(
            "\n[[nodes]]\nid = {}\naddress = {}\nrole = {}\n",
            toml_string(&n.id),
            toml_string(&n.address.to_string()),
            toml_string(n.role)
        ));
        if n.role == STAGE {
            out.push_str(&format!("stage = {stage}\n"));
            stage += 1;
        }
    }
    out
}

fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// A word as a POSIX shell reads it back: quoted when it holds anything
/// but plain path characters.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:,=+@%".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}
