//! A 3-node NATS JetStream cluster of Debian's `nats-server` on loopback: each node
//! with its own client port, cluster (route) port and JetStream store directory;
//! routes to the other two.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use ledgermq_testkit::{free_port, wait_listening};

use super::proc::{find_binary, PeerProc};

/// The running cluster; every process is killed when it is dropped.
pub struct NatsCluster {
    /// Client URLs, node order (`n1`, `n2`, `n3`).
    pub urls: Vec<String>,
    /// Server names, node order.
    pub names: Vec<String>,
    nodes: Vec<PeerProc>,
}

impl NatsCluster {
    /// Starts `nodes` servers with stores and logs under `dir`; returns once each
    /// accepts client connections (the JetStream metadata leader may still be
    /// being elected: see [`crate::nats::Nats::prepare`]).
    pub fn start(dir: &Path, nodes: usize) -> Result<Self> {
        let bin = find_binary("nats-server", &["/usr/sbin", "/usr/bin"], "nats-server")?;
        let client: Vec<u16> = (0..nodes).map(|_| free_port()).collect();
        let route: Vec<u16> = (0..nodes).map(|_| free_port()).collect();
        let mut cluster = Self {
            urls: client
                .iter()
                .map(|p| format!("nats://127.0.0.1:{p}"))
                .collect(),
            names: (1..=nodes).map(|i| format!("n{i}")).collect(),
            nodes: Vec::new(),
        };
        for i in 0..nodes {
            let store = dir.join(&cluster.names[i]);
            std::fs::create_dir_all(&store)?;
            let routes: Vec<String> = (0..nodes)
                .filter(|&j| j != i)
                .map(|j| format!("nats://127.0.0.1:{}", route[j]))
                .collect();
            let mut cmd = Command::new(&bin);
            cmd.args(["-a", "127.0.0.1", "-p", &client[i].to_string()])
                .args(["-n", &cluster.names[i], "-js", "-sd"])
                .arg(&store)
                .args(["--cluster_name", "bench"])
                .args(["--cluster", &format!("nats://127.0.0.1:{}", route[i])]);
            if !routes.is_empty() {
                cmd.args(["--routes", &routes.join(",")]);
            }
            let log = dir.join(format!("{}.log", cluster.names[i]));
            let name = format!("nats {}", cluster.names[i]);
            cluster.nodes.push(PeerProc::spawn(&name, cmd, &log)?);
        }
        for (i, p) in client.iter().enumerate() {
            wait_listening(&format!("127.0.0.1:{p}"), Duration::from_secs(20)).with_context(
                || {
                    format!(
                        "nats {} did not start; its log ends:\n{}",
                        cluster.names[i],
                        cluster.nodes[i].log_tail(20)
                    )
                },
            )?;
        }
        Ok(cluster)
    }

    /// The process group ids of the servers (each server runs in a group of
    /// its own, with whatever it started).
    pub fn process_groups(&self) -> Vec<u32> {
        self.nodes.iter().filter_map(PeerProc::pid).collect()
    }

    /// Kills every server.
    pub fn stop(&mut self) {
        for n in &mut self.nodes {
            n.stop();
        }
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        self.stop();
    }
}
