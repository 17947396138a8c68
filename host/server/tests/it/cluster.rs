//! One model over a cluster: the example `group` plugin plans a stand-in
//! launcher with one process per peer (two peers on 127.0.0.1). The host
//! must show every rank, end the group when any rank dies (even one its
//! launcher does not watch), leave no rank behind, start the group again on
//! the next load, and refuse cluster settings it cannot honour before
//! anything starts.

use std::time::Duration;

use expect_test::{expect, Expect};
use serde_json::{json, Value};

use crate::fixtures::manifest;
use crate::serve::{eventually, pid_of, Server};

/// A server whose model `tiny` has `settings` (TOML lines of
/// `[models.tiny]`), served by `group` 1.0.0: `distributed_tensor` on,
/// `distributed_pipeline` (from 2.0) off.
fn group(settings: &str) -> Server {
    Server::with(|s| {
        let probe = s.engine_program("group-engine", "group 1.0.0");
        let extra = format!(
            r#"programs = ["python3"]
[probe]
program = "{}"
[capabilities]
distributed_tensor = ">=1.0"
distributed_pipeline = ">=2.0"
[[settings]]
name = "distributed"
type = "enum"
values = [{{ value = "tensor", capability = "distributed_tensor" }}, {{ value = "pipeline", capability = "distributed_pipeline" }}]
[[settings]]
name = "cluster"
type = "string"
"#,
            probe.display()
        );
        s.plugin(
            "group",
            &manifest("group", "engine_group", &["mlx"], 10, &extra),
            Some("engine_group"),
        );
        s.config(
            "[plugins.group]\nallow_programs = [\"python3\"]\n\
             [clusters.loop]\npeers = [\n\
             { name = \"first\", ssh = \"127.0.0.1\", ip = \"127.0.0.1\" },\n\
             { name = \"second\", ssh = \"127.0.0.1\", ip = \"127.0.0.1\" },\n]\n",
        );
        s.settings(&format!("[models.tiny]\n{settings}"));
    })
}

fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn ranks(session: &Value) -> Vec<(u64, String, bool, u64)> {
    session["ranks"]
        .as_array()
        .expect("a distributed session lists its ranks")
        .iter()
        .map(|r| {
            (
                r["rank"].as_u64().unwrap(),
                r["peer"].as_str().unwrap().to_string(),
                r["local"].as_bool().unwrap(),
                r["pid"].as_u64().expect("a local rank's pid"),
            )
        })
        .collect()
}

#[test]
fn a_dead_rank_ends_the_whole_group_and_the_next_load_starts_it_again() {
    let server = group("distributed = \"tensor\"\ncluster = \"loop\"\n");
    let session = server.load();
    let first = ranks(&session);
    let peers: Vec<(u64, &str, bool)> = first.iter().map(|r| (r.0, r.1.as_str(), r.2)).collect();
    assert_eq!(peers, [(0, "first", true), (1, "second", true)]);
    let launcher = pid_of(&session);
    let pids = [launcher, first[0].3, first[1].3];
    assert!(pids.iter().all(|&p| alive(p)), "{pids:?}");

    // The stand-in launcher waits on rank 0 alone: only the host sees
    // rank 1 go.
    std::process::Command::new("kill")
        .args(["-KILL", &first[1].3.to_string()])
        .status()
        .unwrap();
    eventually("the group's end", Duration::from_secs(5), || {
        pids.iter().all(|&p| !alive(p))
    });
    assert_eq!(server.get("/api/sessions").1["sessions"], json!([]));
    let (_, events) = server.get("/api/events");
    let crashed: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "crashed")
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    assert_eq!(crashed.len(), 1, "{crashed:?}");
    assert!(
        crashed[0].starts_with(&format!(
            "rank 1 on peer 'second' (pid {}) of engine 'group' serving model 'tiny' died; every rank was stopped",
            first[1].3
        )),
        "{}",
        crashed[0]
    );

    let again = ranks(&server.load());
    assert!(again.iter().all(|r| !pids.contains(&r.3)), "{again:?}");
}

fn check(settings: &str, expect: Expect) {
    let server = group(settings);
    let (status, body) = server.post("/api/models/tiny/load", json!({}));
    let message = body["error"]["message"].as_str().unwrap_or_default();
    expect.assert_eq(&format!("{status} {message}"));
}

#[test]
fn cluster_settings_the_host_cannot_honour_refuse_the_load() {
    check("distributed = \"tensor\"\n", expect!["422 plugin 'group' cannot serve model 'tiny': the model sets 'distributed' but no 'cluster'; name a [clusters.NAME] of config.toml"]);
    check(
        "distributed = \"tensor\"\ncluster = \"nowhere\"\n",
        expect!["422 plugin 'group' cannot serve model 'tiny': setting 'cluster' names cluster 'nowhere', which config.toml does not define (defined: loop); add [clusters.nowhere] with its peers"],
    );
    check(
        "distributed = \"pipeline\"\ncluster = \"loop\"\n",
        expect!["422 plugin 'group' cannot serve model 'tiny': the model's setting 'distributed' cannot be applied (stored setting 'distributed' was not applied: value 'pipeline' of setting 'distributed' needs capability distributed_pipeline, which is off: plugin 'group' needs group-engine >=2.0 for distributed_pipeline; found 1.0.0), and a model meant for a cluster is not loaded on one machine"],
    );
}

#[test]
fn a_plugin_that_plans_one_process_for_a_cluster_is_refused() {
    // `beta` takes the settings but knows nothing of clusters.
    let server = Server::with(|s| {
        let probe = s.engine_program("beta-engine", "beta 0.9.0");
        let extra = format!(
            "programs = [\"python3\"]\n[probe]\nprogram = \"{}\"\n\
             [[settings]]\nname = \"distributed\"\ntype = \"enum\"\nvalues = [\"tensor\"]\n\
             [[settings]]\nname = \"cluster\"\ntype = \"string\"\n",
            probe.display()
        );
        s.plugin(
            "beta",
            &manifest("beta", "engine_beta", &["mlx", "gguf"], 10, &extra),
            Some("engine_beta"),
        );
        s.config(
            "[plugins.beta]\nallow_programs = [\"python3\"]\n[clusters.loop]\npeers = [\n\
             { ssh = \"127.0.0.1\", ip = \"127.0.0.1\" },\n{ ssh = \"127.0.0.1\", ip = \"127.0.0.1\" },\n]\n",
        );
        s.settings("[models.tiny]\ndistributed = \"tensor\"\ncluster = \"loop\"\n");
    });
    let (status, body) = server.post("/api/models/tiny/load", json!({}));
    let message = body["error"]["message"].as_str().unwrap_or_default();
    expect!["422 plugin 'beta' cannot serve model 'tiny': the host refuses the launch plan: the model is set to run on cluster 'loop', but the plugin planned one process with no ranks (it does not serve clusters); remove the model's `distributed` and `cluster` settings"].assert_eq(&format!("{status} {message}"));
    assert_eq!(server.get("/api/sessions").1["sessions"], json!([]));
}

#[test]
fn a_mode_whose_capability_is_off_is_refused_with_a_422() {
    let server = group("");
    let (status, body) = server.put(
        "/api/models/tiny/settings",
        json!({"distributed": "pipeline", "cluster": "loop"}),
    );
    assert_eq!(status, 422, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    expect!["value 'pipeline' of setting 'distributed' needs capability distributed_pipeline, which is off: plugin 'group' needs group-engine >=2.0 for distributed_pipeline; found 1.0.0"].assert_eq(message);
}
