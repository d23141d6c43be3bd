//! The official RocketMQ 5 Python client (`rocketmq-python-client==5.1.2`) rides out
//! the death of any node of a group, its access node included, in the setup the
//! README documents: one DNS name for the group's nodes, each node serving the same
//! port on its own address, and `client_endpoint` set to that name, so routes
//! advertise it and grpc-core resolves every address and fails over inside its
//! channel.
//!
//! Each test makes a network namespace whose hosts file maps `ledgermq-group` to
//! 127.0.0.1-3 (the machine's `/etc/hosts` is not touched), starts the name server
//! and three nodes in it, and runs `tests/python/failover_check.py` there with
//! `ledgermq-group:8081` as the client's endpoint. The script sends normal and FIFO
//! messages one at a time, SIGKILLs a node part way (the client's access node, a
//! follower; the leader; the leader as the access node), consumes, and fails on a
//! failed send or a lost acknowledged message. The longest send pause is printed,
//! not asserted (timing on a shared machine is noisy). Needs root and iproute2;
//! skipped with a message otherwise.
//!
//! To compare, `LEDGERMQ_PY_FAILOVER_SETUP=one-address` runs the previous setup
//! (no `client_endpoint`, the client given its access node's own address), and
//! `LEDGERMQ_PY_FAILOVER_SETUP=name-only` gives the client the DNS name but leaves
//! `client_endpoint` unset (routes name each node's own address).

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledgermq_jepsen::workload::in_namespace;
use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};
use ledgermq_tests::netns::NetNs;

/// The group's DNS name in the namespace's hosts file.
const NAME: &str = "ledgermq-group";
/// Node i's address (each node serves port 8081 on its own address).
const ADDRS: [&str; 3] = ["127.0.0.1", "127.0.0.2", "127.0.0.3"];
/// The client port of every node.
const PORT: u16 = 8081;
/// Bound on the whole script (it bounds its own waits; this bounds a hang).
const SCRIPT_LIMIT: Duration = Duration::from_secs(150);

/// Which node dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Victim {
    /// The node the client's channel is connected to (a follower).
    AccessNode,
    /// The group's leader (not the access node).
    Leader,
    /// The leader, which is also the client's access node.
    LeaderAsAccessNode,
}

#[test]
fn python_client_rides_out_its_access_node_dying() {
    run(Victim::AccessNode, "access");
}

#[test]
fn python_client_rides_out_the_leader_dying() {
    run(Victim::Leader, "leader");
}

#[test]
fn python_client_rides_out_its_access_node_dying_as_leader() {
    run(Victim::LeaderAsAccessNode, "both");
}

fn run(victim: Victim, tag: &str) {
    if let Some(why) = NetNs::skip_reason() {
        eprintln!("SKIPPED python_failover ({tag}): {why}");
        return;
    }
    let setup = std::env::var("LEDGERMQ_PY_FAILOVER_SETUP").unwrap_or_default();
    let (one_address, advertise) = match setup.as_str() {
        "one-address" => (true, false),
        "name-only" => (false, false),
        _ => (false, true),
    };
    let ns = Arc::new(NetNs::create("lmqpy", tag, &[(NAME, &ADDRS[..])]).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let (ns2, path) = (ns.clone(), dir.path().to_owned());
    let outcome = in_namespace(ns.name(), move || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(scenario(&ns2, &path, victim, one_address, advertise))
    })
    .expect("the namespace thread ran");
    drop(ns);
    match outcome {
        Ok(summary) => println!("{tag}: {summary}"),
        Err(e) => panic!("{tag}: {e}\n(logs kept in {})", dir.keep().display()),
    }
}

/// Starts the cluster, runs the script, returns its summary line or why it failed.
/// `one_address`: the client is given its access node's address instead of the
/// name; `advertise`: the nodes' `client_endpoint` is the name.
async fn scenario(
    ns: &NetNs,
    dir: &std::path::Path,
    victim: Victim,
    one_address: bool,
    advertise: bool,
) -> Result<String, String> {
    let opts = ClusterOptions {
        netns: Some(ns.name().to_owned()),
        node_per_address: true,
        client_endpoint: advertise.then(|| format!("{NAME}:{PORT}")),
        ..ClusterOptions::default()
    };
    let cluster = LocalCluster::start(dir, &opts)
        .await
        .map_err(|e| format!("cluster start: {e:#}"))?;
    let leader = cluster
        .prepare(
            "broker-a",
            &[
                &["updateTopic", "-t", "PfNormal", "-q", "4"],
                &["updateTopic", "-t", "PfFifo", "-q", "4", "--fifo"],
                &["updateSubGroup", "-g", "PfSimple"],
            ],
        )
        .await
        .map_err(|e| format!("prepare: {e:#}"))?;
    // The access node is a follower (or the leader); the client's channel tries
    // the name's addresses in hosts-file order, so it is listed first.
    let access = match victim {
        Victim::LeaderAsAccessNode => leader,
        _ => (0..3).find(|i| *i != leader).unwrap_or(0),
    };
    let mut order = vec![ADDRS[access]];
    order.extend((0..3).filter(|i| *i != access).map(|i| ADDRS[i]));
    ns.set_hosts(&[(NAME, &order[..])])
        .map_err(|e| format!("hosts file: {e:#}"))?;
    let target = match victim {
        Victim::AccessNode => access,
        Victim::Leader | Victim::LeaderAsAccessNode => leader,
    };
    let pid = cluster.nodes[target].pid().ok_or("victim not running")?;
    let endpoint = if one_address {
        cluster.nodes[access].client_addr.clone()
    } else {
        format!("{NAME}:{PORT}")
    };
    println!(
        "access node {access} ({}), leader {leader}, killing node {target} ({victim:?}), client endpoint {endpoint}",
        ADDRS[access]
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/failover_check.py");
    let err_path = dir.join("failover_check.err");
    let mut child = ns
        .command("python3")
        .arg(script)
        .args(["--access", &endpoint, "--kill-pid", &pid.to_string()])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err_path).map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| format!("python3 (scripts/test installs the client): {e}"))?;
    let deadline = Instant::now() + SCRIPT_LIMIT;
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        use std::io::Read;
        let _ = out.read_to_string(&mut stdout);
    }
    let summary = stdout.lines().last().unwrap_or("").to_owned();
    if status.is_some_and(|s| s.success()) {
        return Ok(summary);
    }
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
    Err(format!(
        "failover_check.py failed or hung ({status:?}): {summary}\n{}",
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    ))
}
