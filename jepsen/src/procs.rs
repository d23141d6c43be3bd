//! The cluster's processes on the namespaced hosts: a 3-node broker group on hosts
//! 0-2, the name server on host 3, clients on host 4. Each process runs inside its
//! host's namespace (`ip netns exec`) with its log in the run folder; the nemesis
//! kills (SIGKILL), pauses (SIGSTOP / SIGCONT) and restarts them.
//!
//! Binaries are found with [`bin`]: `LEDGERMQ_BIN_DIR`, else next to the running
//! executable or one directory up (test executables live in `deps/`).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use crate::access::Access;
use crate::hosts::Network;
use crate::net::host_addr;
use crate::node_env::{self, NodeDisk};
use crate::JepsenError;
use ledgermq_testkit::BrokerToml;

/// Broker nodes (hosts 0..3).
pub const NODES: usize = 3;
/// The name server's host.
pub const NAMESRV_HOST: usize = 3;
/// The clients' host.
pub const CLIENT_HOST: usize = 4;
/// Hosts in all.
pub const HOSTS: usize = 5;
/// Client gRPC port on every node.
pub const CLIENT_PORT: u16 = 8081;
/// Raft port on every node.
pub const RAFT_PORT: u16 = 40911;
/// Name server port.
pub const NAMESRV_PORT: u16 = 9876;

/// The path of a workspace binary (see the module docs). Error: `Host` naming the
/// directories searched.
pub fn bin(name: &str) -> Result<PathBuf, JepsenError> {
    ledgermq_testkit::bin(name).map_err(|e| JepsenError::Host(e.to_string()))
}

/// `host:port` of the name server.
pub fn namesrv_addr() -> String {
    format!("{}:{NAMESRV_PORT}", host_addr(NAMESRV_HOST))
}

/// `host:port` of node `i`'s client service.
pub fn client_addr(i: usize) -> String {
    format!("{}:{CLIENT_PORT}", host_addr(i))
}

/// The TOML configuration of broker node `i` (`flush`: `sync` or `async`), with
/// small CommitLog segments ([`crate::retention::SEGMENT_BYTES`]), frequent
/// retention runs ([`crate::retention::RETENTION_INTERVAL`]) and, in a secure
/// run, TLS and ACLs ([`Access::configure_broker`]).
pub fn broker_config(i: usize, store_root: &Path, flush: &str, access: &Access) -> String {
    let raft: Vec<String> = (0..NODES)
        .map(|j| format!("{}:{RAFT_PORT}", host_addr(j)))
        .collect();
    let client: Vec<String> = (0..NODES).map(client_addr).collect();
    let mut toml = BrokerToml::member("JepsenCluster", "broker-a", i, &raft, &client, store_root);
    toml.namesrv_addrs = vec![namesrv_addr()];
    toml.flush = flush.to_owned();
    toml.commit_log_segment_bytes = Some(crate::retention::SEGMENT_BYTES);
    toml.namesrv_heartbeat_ms = Some(1000);
    toml.disk_space_warning_ratio = Some(0.99);
    toml.retention_interval_ms = Some(crate::retention::RETENTION_INTERVAL.as_millis() as u64);
    access.configure_broker(&mut toml, i);
    toml.to_toml()
}

/// One process of the cluster.
struct Proc {
    host: usize,
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    /// Extra environment ([`crate::node_env::node_env`] for broker nodes).
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl Proc {
    fn spawn(&mut self, net: &Network) -> Result<(), JepsenError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let program = self.program.to_string_lossy().into_owned();
        let mut cmd = net.command(self.host, &program);
        // SAFETY: prctl is async-signal-safe. The node dies with the thread that
        // started it (the harness's main thread), even if the harness is killed.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .args(&self.args)
            // Text logs: the audits read their timestamps (`reverts.rs`).
            .env_remove("LEDGERMQ_LOG_FORMAT")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info,openraft=warn")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| JepsenError::Host(format!("spawning {program}: {e}")))?;
        self.child = Some(child);
        Ok(())
    }
}

/// The running cluster: name server and broker nodes. Every process is killed when
/// it is dropped, and the nodes' file systems are released
/// ([`NodeDisk::release`]).
pub struct Cluster {
    procs: Vec<Proc>,
    /// The run folder.
    dir: PathBuf,
    /// Each node's own file system; empty if they could not be made.
    disks: Vec<NodeDisk>,
    /// Why the nodes have no file systems of their own, if they have none.
    disk_error: Option<String>,
    /// The libfaketime the nodes run under, if it is installed.
    faketime: Option<PathBuf>,
    /// Nodes that crashed or did not stop as asked, found while the nemesis
    /// stopped them; taken by [`Cluster::take_findings`].
    findings: Vec<String>,
    /// How the harness's clients reach the nodes.
    access: Access,
}

impl Cluster {
    /// Writes configurations and starts the name server and the three nodes under
    /// `dir` (stores in `dir/nI`, logs in `dir/*.log`). Each store root is a file
    /// system of its own and each node runs under libfaketime if it can
    /// ([`crate::node_env`]); if not, a warning says so and the faults that need
    /// them fail when drawn. `access` says whether the run is secure (its
    /// certificates already made).
    pub fn start(
        net: &Network,
        dir: &Path,
        flush: &str,
        access: Access,
    ) -> Result<Self, JepsenError> {
        std::fs::create_dir_all(dir)?;
        let faketime = node_env::libfaketime();
        for m in node_env::remove_orphan_disks() {
            eprintln!(
                "jepsen: released {}, left mounted by a killed run",
                m.display()
            );
        }
        let mut disks = Vec::new();
        let mut disk_error = None;
        for i in 0..NODES {
            match NodeDisk::create(&Self::store_root(dir, i)) {
                Ok(d) => disks.push(d),
                Err(e) => {
                    disk_error = Some(e.to_string());
                    break;
                }
            }
        }
        if let Some(e) = &disk_error {
            for d in disks.drain(..) {
                let _ = d.release();
            }
            eprintln!(
                "jepsen: the nodes share the run folder's file system ({e}): disk-full cannot run"
            );
        }
        let ns_cfg = dir.join("namesrv.toml");
        std::fs::write(
            &ns_cfg,
            format!(
                "listen = \"{}\"\nscan_interval_ms = 500\nnode_expiry_ms = 5000\n{}",
                namesrv_addr(),
                access.namesrv_tables()
            ),
        )?;
        let mut procs = vec![Proc {
            host: NAMESRV_HOST,
            program: bin("mqnamesrv")?,
            args: vec!["-c".into(), ns_cfg.display().to_string()],
            log: dir.join("namesrv.log"),
            env: Vec::new(),
            child: None,
        }];
        for i in 0..NODES {
            node_env::set_clock_offset(dir, i, 0)?;
            node_env::reboot(dir, i)?;
            let cfg = dir.join(format!("n{i}.toml"));
            std::fs::write(
                &cfg,
                broker_config(i, &Self::store_root(dir, i), flush, &access),
            )?;
            procs.push(Proc {
                host: i,
                program: bin("mqbroker")?,
                args: vec!["-c".into(), cfg.display().to_string()],
                log: dir.join(format!("n{i}.log")),
                env: node_env::node_env(dir, i, faketime.as_deref()),
                child: None,
            });
        }
        let mut c = Self {
            procs,
            dir: dir.to_path_buf(),
            disks,
            disk_error,
            faketime,
            findings: Vec::new(),
            access,
        };
        for p in &mut c.procs {
            p.spawn(net)?;
        }
        Ok(c)
    }

    /// How the harness's clients reach the nodes.
    pub fn access(&self) -> &Access {
        &self.access
    }

    /// Node `i`'s store root.
    pub fn store_root(dir: &Path, i: usize) -> PathBuf {
        dir.join(format!("n{i}"))
    }

    /// The run folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Ok if each node's store root is a file system of its own; else why not.
    pub fn own_disks(&self) -> Result<(), JepsenError> {
        match &self.disk_error {
            None => Ok(()),
            Some(e) => Err(JepsenError::Host(format!(
                "the nodes have no file systems of their own: {e}"
            ))),
        }
    }

    /// Ok if the nodes run under libfaketime (their clocks can be moved); else
    /// what to install.
    pub fn fake_clocks(&self) -> Result<(), JepsenError> {
        match &self.faketime {
            Some(_) => Ok(()),
            None => Err(JepsenError::Host(format!(
                "libfaketime is not installed (apt-get install libfaketime; looked for {:?}): the nodes' clocks cannot be moved",
                node_env::LIBFAKETIME_PATHS
            ))),
        }
    }

    /// Whether node `i` runs (was not killed, or was restarted).
    pub fn is_running(&self, i: usize) -> bool {
        self.procs[1 + i].child.is_some()
    }

    /// If node `i` exited by itself (not killed by the harness), reaps it and
    /// returns its exit status.
    pub fn exited(&mut self, i: usize) -> Option<std::process::ExitStatus> {
        let p = self.node(i);
        let status = p.child.as_mut()?.try_wait().ok().flatten()?;
        p.child = None;
        Some(status)
    }

    fn node(&mut self, i: usize) -> &mut Proc {
        &mut self.procs[1 + i]
    }

    /// SIGKILLs node `i` (and waits for it). A node found to have exited by
    /// itself already is recorded as a finding.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.node(i).child.take() {
            if let Ok(Some(status)) = c.try_wait() {
                self.findings.push(format!(
                    "node {i} exited by itself ({status}) before the nemesis stopped it; see n{i}.log"
                ));
                return;
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The findings recorded so far (crashes found at a kill, a node that did not
    /// stop cleanly on SIGTERM), emptied.
    pub fn take_findings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.findings)
    }

    /// Starts node `i` again after [`Self::kill`].
    pub fn restart(&mut self, net: &Network, i: usize) -> Result<(), JepsenError> {
        self.kill(i);
        self.node(i).spawn(net)
    }

    /// SIGTERMs node `i` and waits up to `grace` for it to exit (then reaps it);
    /// `None` if it had not exited by then, and was SIGKILLed. Either that or an
    /// unsuccessful exit is recorded as a finding.
    pub fn terminate(
        &mut self,
        i: usize,
        grace: std::time::Duration,
    ) -> Result<Option<std::process::ExitStatus>, JepsenError> {
        self.signal(i, "TERM")?;
        let deadline = std::time::Instant::now() + grace;
        while std::time::Instant::now() < deadline {
            if let Some(c) = self.node(i).child.as_mut() {
                if let Some(status) = c.try_wait()? {
                    self.node(i).child = None;
                    if !status.success() {
                        self.findings.push(format!(
                            "node {i} exited with {status} after SIGTERM; see n{i}.log"
                        ));
                    }
                    return Ok(Some(status));
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        self.kill(i);
        self.findings.push(format!(
            "node {i} did not stop within {} s of SIGTERM; killed",
            grace.as_secs()
        ));
        Ok(None)
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`) to node `i`.
    pub fn signal(&mut self, i: usize, signal: &str) -> Result<(), JepsenError> {
        let Some(pid) = self.node(i).child.as_ref().map(Child::id) else {
            return Err(JepsenError::Host(format!("node {i} is not running")));
        };
        // `ip netns exec` replaces itself with the program, so the pid is the node's.
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()?;
        if !status.success() {
            return Err(JepsenError::Host(format!("kill -{signal} {pid} failed")));
        }
        Ok(())
    }

    /// Runs `mqadmin ARGS -n NAMESRV` from the clients' host; returns its output.
    pub fn admin(&self, net: &Network, args: &[&str]) -> Result<String, JepsenError> {
        let out = net
            .command(CLIENT_HOST, &bin("mqadmin")?.to_string_lossy())
            .args(args)
            .args(["-n", &namesrv_addr()])
            .envs(self.access.admin_env())
            .output()?;
        if !out.status.success() {
            return Err(JepsenError::Host(format!(
                "mqadmin {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The nodes `mqadmin clusterList` (from the clients' host) lists with role
    /// `leader`, as (node id, term).
    pub fn leaders(&self, net: &Network) -> Result<Vec<(usize, u64)>, JepsenError> {
        Ok(parse_leaders(&self.admin(net, &["clusterList"])?))
    }
}

/// The (node id, term) of `leader` lines in `mqadmin clusterList` output (columns:
/// cluster, group, node, address, role, term, commit, silent).
pub fn parse_leaders(text: &str) -> Vec<(usize, u64)> {
    text.lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() >= 6 && cols[4] == "leader")
                .then(|| Some((cols[2].parse().ok()?, cols[5].parse().ok()?)))
                .flatten()
        })
        .collect()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for p in &mut self.procs {
            if let Some(mut c) = p.child.take() {
                // A paused process must be continued to die promptly.
                let _ = Command::new("kill")
                    .args(["-CONT", &c.id().to_string()])
                    .status();
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        for d in self.disks.drain(..) {
            if let Err(e) = d.release() {
                eprintln!("jepsen: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_name_every_member_on_its_host() {
        let c = broker_config(1, Path::new("/tmp/x/n1"), "sync", &Access::plain());
        assert!(c.contains("node_id = 1\n"));
        assert!(c.contains("client_addr = \"10.77.0.11:8081\""));
        assert!(c.contains("namesrv_addrs = [\"10.77.0.13:9876\"]"));
        assert!(c.contains("2 = \"10.77.0.12:40911\""));
        assert!(c.contains("0 = \"10.77.0.10:8081\""));
    }

    #[test]
    fn leaders_are_read_from_cluster_list() {
        let text = "cluster          group        node  address                role         term       commit   silent\n\
                    JepsenCluster    broker-a     0     10.77.0.10:8081        follower        3            9     0.1s\n\
                    JepsenCluster    broker-a     2     10.77.0.12:8081        leader          3            9     0.1s\n";
        assert_eq!(parse_leaders(text), vec![(2, 3)]);
    }
}
