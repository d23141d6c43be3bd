//! A 3-node RabbitMQ cluster of Debian's `rabbitmq-server` on loopback.
//!
//! Every node gets its own `RABBITMQ_NODENAME` (`benchN@localhost`),
//! `RABBITMQ_NODE_PORT` (AMQP), `RABBITMQ_DIST_PORT` (Erlang distribution), mnesia
//! and log directories; all share one Erlang cookie (`$HOME/.erlang.cookie`, with
//! `HOME` pointed into the run's directory) and a private `epmd` on a free port
//! (`ERL_EPMD_PORT`), so nothing touches a system RabbitMQ or epmd. No plugins.
//! Nodes 2 and 3 join node 1 with `rabbitmqctl join_cluster`.
//!
//! The scripts of `/usr/lib/rabbitmq/bin` are used directly (the `/usr/sbin`
//! wrappers switch to the `rabbitmq` user).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ledgermq_testkit::{free_port, wait_listening};

use super::proc::{find_binary, PeerProc};

const RABBIT_DIRS: &[&str] = &["/usr/lib/rabbitmq/bin", "/usr/sbin"];

/// The running cluster; every process (and the private epmd) is killed when it is
/// dropped.
pub struct RabbitCluster {
    /// AMQP URIs, node order.
    pub uris: Vec<String>,
    /// Erlang node names, node order.
    pub names: Vec<String>,
    nodes: Vec<PeerProc>,
    epmd: Option<PeerProc>,
    ctl: PathBuf,
    env: Vec<(String, String)>,
}

impl RabbitCluster {
    /// Starts `nodes` nodes with everything under `dir`, waits for them to boot and
    /// clusters them. Takes some 30-90 s on a 2-core machine.
    pub fn start(dir: &Path, nodes: usize) -> Result<Self> {
        let server = find_binary("rabbitmq-server", RABBIT_DIRS, "rabbitmq-server")?;
        let ctl = find_binary("rabbitmqctl", RABBIT_DIRS, "rabbitmq-server")?;
        let epmd_bin = find_binary("epmd", &["/usr/lib/erlang/bin"], "erlang-base")?;
        let home = dir.join("home");
        std::fs::create_dir_all(&home)?;
        let cookie = home.join(".erlang.cookie");
        let secret: String = (0..24)
            .map(|_| (b'A' + rand::random::<u8>() % 26) as char)
            .collect();
        std::fs::write(&cookie, secret)?;
        std::fs::set_permissions(&cookie, std::fs::Permissions::from_mode(0o400))?;
        std::fs::write(dir.join("enabled_plugins"), "[].\n")?;
        std::fs::write(dir.join("rabbitmq-env.conf"), "")?;
        let epmd_port = free_port();
        let env = vec![
            ("HOME".to_owned(), home.display().to_string()),
            ("ERL_EPMD_PORT".to_owned(), epmd_port.to_string()),
            (
                "RABBITMQ_CONF_ENV_FILE".to_owned(),
                dir.join("rabbitmq-env.conf").display().to_string(),
            ),
        ];
        let mut epmd_cmd = Command::new(&epmd_bin);
        epmd_cmd.args(["-port", &epmd_port.to_string(), "-address", "127.0.0.1"]);
        let epmd = PeerProc::spawn("epmd", epmd_cmd, &dir.join("epmd.log"))?;
        wait_listening(&format!("127.0.0.1:{epmd_port}"), Duration::from_secs(10))?;
        let mut cluster = Self {
            uris: Vec::new(),
            names: (1..=nodes).map(|i| format!("bench{i}@localhost")).collect(),
            nodes: Vec::new(),
            epmd: Some(epmd),
            ctl,
            env,
        };
        for i in 0..nodes {
            let (amqp, dist) = (free_port(), free_port());
            let conf = dir.join(format!("rabbit{}.conf", i + 1));
            std::fs::write(&conf, format!("listeners.tcp.default = {amqp}\n"))?;
            let mut cmd = Command::new(&server);
            cmd.envs(cluster.env.iter().map(|(k, v)| (k, v)))
                .env("RABBITMQ_NODENAME", &cluster.names[i])
                .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
                .env("RABBITMQ_NODE_PORT", amqp.to_string())
                .env("RABBITMQ_DIST_PORT", dist.to_string())
                .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
                .env("RABBITMQ_LOG_BASE", dir.join("log"))
                .env("RABBITMQ_CONFIG_FILE", &conf)
                .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
                .env(
                    "RABBITMQ_PID_FILE",
                    dir.join(format!("rabbit{}.pid", i + 1)),
                );
            let log = dir.join(format!("rabbit{}.out", i + 1));
            let name = format!("rabbitmq {}", cluster.names[i]);
            cluster.nodes.push(PeerProc::spawn(&name, cmd, &log)?);
            cluster
                .uris
                .push(format!("amqp://guest:guest@127.0.0.1:{amqp}/%2f"));
        }
        for i in 0..nodes {
            cluster.await_startup(i)?;
        }
        for i in 1..nodes {
            let n = cluster.names[i].clone();
            cluster.ctl(&["-n", &n, "stop_app"])?;
            cluster.ctl(&["-n", &n, "join_cluster", &cluster.names[0]])?;
            cluster.ctl(&["-n", &n, "start_app"])?;
            cluster.await_startup(i)?;
        }
        Ok(cluster)
    }

    fn await_startup(&mut self, i: usize) -> Result<()> {
        let n = self.names[i].clone();
        let deadline = Instant::now() + Duration::from_secs(150);
        loop {
            if !self.nodes[i].is_running() {
                bail!(
                    "rabbitmq {n} exited while booting; its output ends:\n{}",
                    self.nodes[i].log_tail(20)
                );
            }
            match self.ctl(&["-n", &n, "await_startup", "--timeout", "30"]) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(e.context(format!("rabbitmq {n} did not boot")))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }

    /// Runs `rabbitmqctl ARGS` with the cluster's cookie and epmd; its output, or an
    /// error with it.
    pub fn ctl(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(&self.ctl)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(args)
            .output()
            .context("running rabbitmqctl")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            bail!("rabbitmqctl {args:?} failed: {}", text.trim());
        }
        Ok(text)
    }

    /// The process group ids of the servers (each server runs in a group of
    /// its own, with whatever it started).
    pub fn process_groups(&self) -> Vec<u32> {
        self.nodes.iter().filter_map(PeerProc::pid).collect()
    }

    /// Kills every node, then the private epmd.
    pub fn stop(&mut self) {
        for n in &mut self.nodes {
            n.stop();
        }
        if let Some(mut e) = self.epmd.take() {
            e.stop();
        }
    }
}

impl Drop for RabbitCluster {
    fn drop(&mut self) {
        self.stop();
    }
}
