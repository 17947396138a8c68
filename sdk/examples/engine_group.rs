//! Example plugin `group`: serves `mlx`, one machine or a cluster
//! (`distributed_tensor`). Its engine prints `group X.Y.Z`. A cluster's plan
//! runs a stand-in launcher: it starts one process per peer, marked
//! `GROUP_RANK=i`, rank 0 being Python's `http.server` on the host's port
//! and the others sleeping, and waits on rank 0 alone, as a launcher that
//! misses a follower's exit would. The cluster tests kill a follower and
//! expect the host itself to end the group.

use hangar_sdk::wire::{
    Description, LaunchPlan, LoadRequest, ProbeInput, ProbeReport, Rank, Readiness,
};
use hangar_sdk::{export_plugin, Plugin};

struct Group;

/// The stand-in launcher: `python3 -c LAUNCHER PORT RANKS`.
const LAUNCHER: &str = "\
import os, subprocess, sys
port, n = sys.argv[1], int(sys.argv[2])
ranks = []
for i in range(n):
    env = dict(os.environ, GROUP_RANK=str(i))
    if i == 0:
        cmd = [sys.executable, '-m', 'http.server', port, '--bind', '127.0.0.1']
    else:
        cmd = [sys.executable, '-c', 'import time; time.sleep(3600)']
    ranks.append(subprocess.Popen(cmd, env=env))
sys.exit(ranks[0].wait())
";

impl Plugin for Group {
    fn describe() -> Description {
        hangar_sdk::describe!("group", formats: ["mlx"],
            capabilities: ["distributed_tensor", "distributed_pipeline"])
    }

    fn probe(input: ProbeInput) -> Result<ProbeReport, String> {
        Ok(hangar_sdk::version_from_output(&input, |out| {
            out.lines().next()?.strip_prefix("group ").map(str::trim)
        }))
    }

    fn plan_launch(request: LoadRequest) -> Result<LaunchPlan, String> {
        let port = request.port.to_string();
        let (args, ranks) = match &request.cluster {
            None => (
                vec![
                    "-m".into(),
                    "http.server".into(),
                    port,
                    "--bind".into(),
                    request.host,
                ],
                Vec::new(),
            ),
            Some(cluster) => (
                vec![
                    "-c".into(),
                    LAUNCHER.into(),
                    port,
                    cluster.peers.len().to_string(),
                ],
                cluster
                    .peers
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        Rank::new(i as u32, p.name.clone(), p.local)
                            .with_env_marker(format!("GROUP_RANK={i}"))
                    })
                    .collect(),
            ),
        };
        Ok(LaunchPlan::new("python3", args)
            .with_readiness(Readiness::new("/"))
            .with_start_timeout_ms(20_000)
            .with_ranks(ranks))
    }
}

export_plugin!(Group);
