//! deploy/compose driven from a test: its image built from this checkout's
//! binaries, the project brought up with docker-compose and torn down on drop,
//! its containers stopped, cut off and restarted, and each broker group's Raft
//! state read through the RaftStatus admin call.
//!
//! Addresses are deploy/compose's fixed ones (10.213.0.0/24): name servers
//! `namesrv1` and `namesrv2` at .11 and .12, broker group `broker-a` (`a0`-`a2`)
//! at .20-.22 and `broker-b` (`b0`-`b2`) at .30-.32.
//!
//! The project has TLS and ACLs on: [`Compose::up`] makes its certificates
//! (deploy/compose/make-certs.sh) in [`certs_dir`], not in the checkout's
//! `deploy/compose/certs`, and the helpers here call over TLS checked
//! against its CA, signing as the configs' admin user ([`ADMIN`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ledgermq_broker::admin_pb::broker_admin_client::BrokerAdminClient;
use ledgermq_broker::admin_pb::{RaftStatusRequest, RaftStatusResponse};

/// The compose network's name inside the project (`ledgermq`).
const NETWORK: &str = "ledgermq";
/// The first three octets of its subnet, dot included.
const SUBNET_PREFIX: &str = "10.213.0.";

/// The admin user deploy/compose's broker configs create: (access key,
/// secret key).
pub const ADMIN: (&str, &str) = ("admin", "compose-admin-secret");

/// The test's certificates for deploy/compose (deploy/compose/make-certs.sh
/// makes them; `docker-compose.yml` mounts them from `LEDGERMQ_CERTS`):
/// `target/lmqcompose-certs`.
pub fn certs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/lmqcompose-certs")
}

/// Its CA certificate, PEM. Error: not made yet.
pub fn ca_pem() -> Result<Vec<u8>> {
    let p = certs_dir().join("ca.pem");
    std::fs::read(&p).with_context(|| format!("reading {}", p.display()))
}

/// How the harness reaches the nodes as `user` (access key, secret key).
pub fn secure_as(user: (&str, &str)) -> Result<crate::grpc::Secure> {
    Ok(crate::grpc::Secure {
        ca_pem: ca_pem()?,
        creds: ledgermq_proto::signature::Credentials {
            access_key: user.0.to_owned(),
            secret_key: user.1.to_owned(),
        },
    })
}

/// A service's fixed address: `namesrv1`, `namesrv2`, `a0`..`a2`, `b0`..`b2`.
/// Panics on another name.
pub fn service_ip(service: &str) -> String {
    let last = match service {
        "namesrv1" => 11,
        "namesrv2" => 12,
        s => {
            let (g, i) = s.split_at(1);
            let base = match g {
                "a" => 20,
                "b" => 30,
                _ => panic!("no service {s}"),
            };
            base + i.parse::<u32>().expect("a node number")
        }
    };
    format!("{SUBNET_PREFIX}{last}")
}

/// Why the compose test cannot run here, if it cannot: not root (the client
/// needs its own hosts file, through a mount namespace), or no docker engine or
/// docker-compose.
pub fn skip_reason() -> Option<String> {
    if crate::netns::effective_uid() != "0" {
        return Some("needs root (unshare -m for the client's hosts file)".into());
    }
    for (prog, args) in [
        ("docker", &["info", "--format", "{{.ServerVersion}}"][..]),
        ("docker-compose", &["version", "--short"][..]),
        ("unshare", &["-m", "true"][..]),
    ] {
        match Command::new(prog).args(args).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                return Some(format!(
                    "{prog} {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&o.stderr).trim()
                ))
            }
            Err(e) => return Some(format!("{prog}: {e}")),
        }
    }
    None
}

/// Runs `prog args`; its stdout, or an error with its stderr.
pub fn run(prog: &str, args: &[&str]) -> Result<String> {
    run_env(prog, args, &[])
}

/// [`run`] with `env` added to its environment.
pub fn run_env(prog: &str, args: &[&str], env: &[(&str, &str)]) -> Result<String> {
    let out = Command::new(prog)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .with_context(|| format!("running {prog}"))?;
    if !out.status.success() {
        bail!(
            "{prog} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A running deploy/compose project, taken down (volumes too) and its image
/// removed on drop.
pub struct Compose {
    project: String,
    file: PathBuf,
    image: String,
}

impl Compose {
    /// Builds image `image` from the directory holding `mqbroker`,
    /// `mqnamesrv` and `mqadmin` (deploy/compose/build-image.sh), takes down
    /// what an earlier run of `project` left (its volumes too), and brings the
    /// project up. Error: another docker network holds the project's subnet.
    pub fn up(project: &str, image: &str, bin_dir: &Path) -> Result<Self> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/compose");
        let status = Command::new(dir.join("build-image.sh"))
            .arg(bin_dir)
            .env("LEDGERMQ_IMAGE", image)
            .status()
            .context("running build-image.sh")?;
        if !status.success() {
            bail!("build-image.sh failed: {status}");
        }
        let c = Compose {
            project: project.to_owned(),
            file: dir.join("docker-compose.yml"),
            image: image.to_owned(),
        };
        c.compose(&["down", "-v", "--remove-orphans"])
            .context("taking down what an earlier run left")?;
        let own = format!("{project}_{NETWORK}");
        for net in run("docker", &["network", "ls", "--format", "{{.Name}}"])?.lines() {
            let subnets = run(
                "docker",
                &[
                    "network",
                    "inspect",
                    net,
                    "--format",
                    "{{range .IPAM.Config}}{{.Subnet}} {{end}}",
                ],
            )
            .unwrap_or_default();
            if net != own && subnets.contains(SUBNET_PREFIX) {
                bail!(
                    "docker network {net} holds {subnets}, which deploy/compose's \
                     {SUBNET_PREFIX}0/24 needs (another compose project? `docker network rm {net}`)"
                );
            }
        }
        let out = Command::new(dir.join("make-certs.sh"))
            .arg(certs_dir())
            .output()
            .context("running make-certs.sh")?;
        if !out.status.success() {
            bail!(
                "make-certs.sh (openssl) failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        c.compose(&["up", "-d"])?;
        Ok(c)
    }

    /// Runs `docker-compose -p PROJECT -f FILE args` with the image set.
    pub fn compose(&self, args: &[&str]) -> Result<String> {
        let file = self.file.to_string_lossy();
        let mut all = vec!["-p", &self.project, "-f", &file];
        all.extend_from_slice(args);
        let out = Command::new("docker-compose")
            .args(&all)
            .env("LEDGERMQ_IMAGE", &self.image)
            .env("LEDGERMQ_CERTS", certs_dir())
            .output()
            .context("running docker-compose")?;
        if !out.status.success() {
            bail!(
                "docker-compose {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The container id of `service`.
    pub fn container(&self, service: &str) -> Result<String> {
        // -a: a stopped (killed) container too.
        let id = self
            .compose(&["ps", "-a", "-q", service])?
            .trim()
            .to_owned();
        if id.is_empty() {
            bail!("service {service} has no container");
        }
        Ok(id)
    }

    /// `docker args... CONTAINER` on `service`'s container (kill, stop, start,
    /// restart -t N, ...).
    pub fn docker(&self, args: &[&str], service: &str) -> Result<()> {
        let id = self.container(service)?;
        let mut all = args.to_vec();
        all.push(&id);
        run("docker", &all).map(drop)
    }

    /// Cuts `service` off the compose network.
    pub fn disconnect(&self, service: &str) -> Result<()> {
        let net = format!("{}_{NETWORK}", self.project);
        run(
            "docker",
            &["network", "disconnect", &net, &self.container(service)?],
        )
        .map(drop)
    }

    /// Puts `service` back on the compose network at its address, with its
    /// group's alias (`broker-a` for `a0`).
    pub fn reconnect(&self, service: &str) -> Result<()> {
        let net = format!("{}_{NETWORK}", self.project);
        let alias = format!("broker-{}", &service[..1]);
        let ip = service_ip(service);
        let id = self.container(service)?;
        run(
            "docker",
            &[
                "network", "connect", "--ip", &ip, "--alias", &alias, &net, &id,
            ],
        )
        .map(drop)
    }

    /// `docker exec` of `mqadmin args` in broker node `service`'s container
    /// (it resolves the compose names, as an operator's would), signing as
    /// [`ADMIN`] and checking TLS against the CA mounted there. The secret
    /// key goes by environment, not on a command line.
    pub fn mqadmin(&self, service: &str, args: &[&str]) -> Result<String> {
        let id = self.container(service)?;
        let ca = "/etc/ledgermq/certs/ca.pem";
        let env = [
            format!("LEDGERMQ_ACCESS_KEY={}", ADMIN.0),
            // Passed on from docker's own environment (below).
            "LEDGERMQ_SECRET_KEY".to_owned(),
            format!("LEDGERMQ_TLS_CA={ca}"),
            format!("LEDGERMQ_NAMESRV_TLS_CA={ca}"),
        ];
        let mut all = vec!["exec"];
        for e in &env {
            all.extend(["-e", e]);
        }
        all.extend([id.as_str(), "/usr/local/bin/mqadmin"]);
        all.extend_from_slice(args);
        run_env("docker", &all, &[("LEDGERMQ_SECRET_KEY", ADMIN.1)])
    }

    /// The last `lines` log lines of every container (`usize::MAX`: all), for
    /// a failure report.
    pub fn logs(&self, lines: usize) -> String {
        let tail = if lines == usize::MAX {
            "all".to_owned()
        } else {
            lines.to_string()
        };
        self.compose(&["logs", "--no-color", "--tail", &tail])
            .unwrap_or_else(|e| format!("(no logs: {e:#})"))
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        if let Err(e) = self.compose(&["down", "-v", "--remove-orphans", "-t", "5"]) {
            eprintln!("could not take {} down: {e:#}", self.project);
        }
        if let Err(e) = run("docker", &["rmi", &self.image]) {
            eprintln!("could not remove image {}: {e:#}", self.image);
        }
    }
}

/// `service`'s own Raft status (RaftStatus on its client port), within 2 s.
pub async fn raft_status(service: &str) -> Result<RaftStatusResponse> {
    let addr = format!("{}:8081", service_ip(service));
    let s = secure_as(ADMIN)?;
    let channel =
        crate::grpc::channel_to(&addr, Duration::from_secs(2), Some(s.ca_pem.as_slice())).await?;
    let mut req = tonic::Request::new(RaftStatusRequest {});
    ledgermq_proto::signature::sign_request(&mut req, &s.creds);
    Ok(BrokerAdminClient::new(channel)
        .raft_status(req)
        .await?
        .into_inner())
}

/// The one service among `members` that reports itself leader, waiting up to
/// `limit` until exactly one does.
pub async fn wait_leader(members: &[&str], limit: Duration) -> Result<String> {
    let deadline = Instant::now() + limit;
    loop {
        let mut leaders = Vec::new();
        for m in members {
            if let Ok(s) = raft_status(m).await {
                if s.role == "leader" {
                    leaders.push((m.to_string(), s.node_id));
                }
            }
        }
        if let [(leader, _)] = &leaders[..] {
            return Ok(leader.clone());
        }
        if Instant::now() > deadline {
            bail!("no single leader among {members:?} within {limit:?}: {leaders:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits up to `limit` until `member` of `group`'s members leads, or follows
/// a leader with its own applied index (read from the running process) at
/// most `max_lag` below the leader's.
pub async fn wait_caught_up(
    group: &[&str],
    member: &str,
    max_lag: u64,
    limit: Duration,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    let mut last = String::new();
    loop {
        if let Ok(leader) = wait_leader(group, Duration::from_secs(1)).await {
            if leader == member {
                return Ok(());
            }
            let me = raft_status(member).await;
            let lead = raft_status(&leader).await;
            if let (Ok(me), Ok(lead)) = (me, lead) {
                // Its own applied index, read from the restarted process (the
                // leader's view of it may still be from before the restart).
                let behind = lead
                    .applied_index
                    .unwrap_or(0)
                    .saturating_sub(me.applied_index.unwrap_or(0));
                if me.role == "follower" && me.leader_id.is_some() && behind <= max_lag {
                    return Ok(());
                }
                last = format!("role {}, {behind} entries behind", me.role);
            }
        }
        if Instant::now() > deadline {
            bail!("{member} did not catch up within {limit:?} ({last})");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits up to `limit` until the name server `service` knows `nodes` broker
/// nodes (after its restart, every node has heartbeated to it again).
pub async fn wait_namesrv_nodes(service: &str, nodes: usize, limit: Duration) -> Result<()> {
    use ledgermq_namesrv::pb::name_server_client::NameServerClient;
    use ledgermq_namesrv::pb::ListClusterRequest;
    let deadline = Instant::now() + limit;
    let addr = format!("{}:9876", service_ip(service));
    let ca = ca_pem()?;
    let mut known = 0;
    loop {
        if let Ok(ch) = crate::grpc::channel_to(&addr, Duration::from_secs(2), Some(&ca)).await {
            if let Ok(r) = NameServerClient::new(ch)
                .list_cluster(ListClusterRequest {})
                .await
            {
                known = r.into_inner().nodes.len();
                if known >= nodes {
                    return Ok(());
                }
            }
        }
        if Instant::now() > deadline {
            bail!("{service} knows {known} of {nodes} nodes after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends one normal message of `topic` (body `body`, also its message id)
/// straight to `service`'s client port over gRPC, as `user` (access key,
/// secret key); an error unless it is answered OK within 5 s.
pub async fn send_probe(service: &str, topic: &str, body: &str, user: (&str, &str)) -> Result<()> {
    let addr = format!("{}:8081", service_ip(service));
    crate::grpc::send_one_as(&addr, topic, body, Some(&secure_as(user)?)).await
}
