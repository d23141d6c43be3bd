//! A 3-node group and a name server as real processes on namespaced hosts (needs
//! root, iproute2, nftables and the workspace binaries): a leader emerges; cut off
//! by a partition, it is replaced by a node with a higher term; healed, it follows;
//! a killed and restarted node rejoins; a paused leader is replaced too.

use std::time::{Duration, Instant};

use ledgermq_jepsen::access::Access;
use ledgermq_jepsen::hosts::Network;
use ledgermq_jepsen::nemesis::{isolate, Grudge};
use ledgermq_jepsen::procs::{Cluster, HOSTS};

/// Waits until the name server (asked from the clients' host) names a leader
/// other than `not` with a term above `above`.
fn wait_leader(c: &Cluster, net: &Network, not: Option<usize>, above: u64) -> (usize, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(ls) = c.leaders(net) {
            if let Some(&l) = ls
                .iter()
                .filter(|(n, t)| Some(*n) != not && *t > above)
                .max_by_key(|l| l.1)
            {
                return l;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no new leader (not {not:?}, term > {above})"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn partitions_kills_and_pauses_move_leadership() {
    let dir = tempfile::tempdir().unwrap();
    let net = Network::create(&format!("lmqc{}-", std::process::id()), HOSTS).unwrap();
    let mut c = Cluster::start(&net, dir.path(), "sync", Access::plain()).unwrap();
    let (l1, t1) = wait_leader(&c, &net, None, 0);

    net.apply(&isolate(HOSTS, l1)).unwrap();
    let (l2, t2) = wait_leader(&c, &net, Some(l1), t1);
    net.apply(&Grudge::new()).unwrap();

    c.kill(l2);
    let (l3, t3) = wait_leader(&c, &net, Some(l2), t2);
    c.restart(&net, l2).unwrap();

    c.signal(l3, "STOP").unwrap();
    let (l4, _) = wait_leader(&c, &net, Some(l3), t3);
    c.signal(l3, "CONT").unwrap();
    assert_ne!(l4, l3);
}

/// Without faults, the workload's history passes every checker.
#[test]
fn a_quiet_workload_loses_nothing_and_keeps_order() {
    use ledgermq_jepsen::checker::{order, total_queue};
    use ledgermq_jepsen::history::OpType;
    use ledgermq_jepsen::procs::{client_addr, CLIENT_HOST, NODES};
    use ledgermq_jepsen::workload::{in_namespace, run, Recorder, SendingEnd, WorkloadOptions};

    let dir = tempfile::tempdir().unwrap();
    let net = Network::create(&format!("lmqw{}-", std::process::id()), HOSTS).unwrap();
    let c = Cluster::start(&net, dir.path(), "sync", Access::plain()).unwrap();
    wait_leader(&c, &net, None, 0);
    for args in [
        &["updateTopic", "-t", "JNormal", "-q", "4"][..],
        &["updateTopic", "-t", "JFifo", "-q", "4", "--fifo"],
        &["updateSubGroup", "-g", "JGroup"],
        &["updateSubGroup", "-g", "JFifoGroup", "--fifo"],
    ] {
        c.admin(&net, args).unwrap();
    }
    let opts = WorkloadOptions {
        nodes: (0..NODES).map(client_addr).collect(),
        topic: "JNormal".into(),
        fifo_topic: "JFifo".into(),
        group: "JGroup".into(),
        fifo_group: "JFifoGroup".into(),
        producers: 2,
        pinned_producers: 3,
        fifo_producers: 2,
        consumers: 2,
        sending_end: SendingEnd::new(4_000),
        drain: Duration::from_secs(20),
        quiet: Duration::from_secs(3),
        settle: Duration::from_secs(1),
        call_timeout: Duration::from_secs(5),
        send_interval: Duration::from_millis(0),
        fifo_send_interval: Duration::from_millis(0),
        stop: Default::default(),
        access: Access::plain(),
    };
    let history = in_namespace(&net.host_ns(CLIENT_HOST), move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(run(opts, Recorder::new()))
    })
    .unwrap()
    .unwrap();
    let (history, drain) = history;
    // Every queue was consumed to its end before the drain ended.
    let drain = drain.expect("the nodes answered for the consumer groups' progress");
    assert!(drain.reached, "{drain:?}");
    // Each pinned producer sent through its one node only, and was answered.
    for node in 0..NODES {
        let sends = |t: OpType| {
            history
                .iter()
                .filter(|o| o.pinned_to == Some(node) && o.op_type == t)
                .inspect(|o| assert_eq!(o.node, Some(node), "{o:?}"))
                .count()
        };
        assert!(sends(OpType::Ok) > 0, "node {node}: no pinned send acked");
    }
    let tq = total_queue(&history);
    assert!(tq.acknowledged > 50, "{tq:?}");
    assert!(tq.valid, "{tq:?}");
    let o = order(&history);
    assert!(o.valid, "{o:?}");
}
