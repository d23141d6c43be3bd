//! `consumerProgress` and `topicStatus`: each queue's offsets as a broker
//! group's leader has applied them (the ConsumerProgress admin call; another
//! member if the leader does not answer); `raftStatus`: every member's own view
//! of its Raft group (the RaftStatus admin call).

use std::collections::BTreeMap;

use anyhow::Result;
use ledgermq_broker::admin_pb::{
    ConsumerProgressRequest, ConsumerProgressResponse, RaftStatusRequest, RaftStatusResponse,
};

/// An admin client of the node at `addr` (connecting within 3 s, each call
/// within 10 s: these calls answer from the node's memory).
pub(crate) async fn admin_client(
    addr: &str,
) -> Result<crate::cluster::AdminClient, tonic::transport::Error> {
    let channel = crate::cluster::channel(addr, Some(std::time::Duration::from_secs(10))).await?;
    Ok(crate::cluster::admin_client(channel))
}

/// The answer to `req` from the first of `members` (client addresses, the
/// leader first) that answers, or why none did.
async fn ask(
    members: &[String],
    req: &ConsumerProgressRequest,
) -> Result<ConsumerProgressResponse, String> {
    for addr in members {
        let Ok(mut c) = admin_client(addr).await else {
            continue;
        };
        if let Ok(r) = c.consumer_progress(req.clone()).await {
            let r = r.into_inner();
            return if r.error.is_empty() {
                Ok(r)
            } else {
                Err(r.error)
            };
        }
    }
    Err("no member answered".into())
}

/// `consumerProgress`: per queue of `group` (over `topic`, or every topic it
/// committed in) in each of `groups`, the queue's end, the group's offset and
/// the difference, then their total.
pub async fn consumer_progress(
    groups: BTreeMap<String, Vec<String>>,
    group: &str,
    topic: Option<String>,
) {
    let req = ConsumerProgressRequest {
        group: group.to_owned(),
        topic: topic.unwrap_or_default(),
    };
    println!(
        "{:<24} {:<12} {:>4} {:>14} {:>16} {:>10}",
        "#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Diff"
    );
    let mut total = 0u64;
    for (broker_group, members) in groups {
        let r = match ask(&members, &req).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("broker group {broker_group}: {e}");
                continue;
            }
        };
        for q in r.queues {
            let consumed = q.consumer_offset.unwrap_or(q.min_offset);
            let diff = q.broker_offset.saturating_sub(consumed);
            total += diff;
            println!(
                "{:<24} {:<12} {:>4} {:>14} {:>16} {:>10}",
                q.topic, broker_group, q.queue_id, q.broker_offset, consumed, diff
            );
        }
    }
    println!("Diff Total: {total}");
}

/// `topicStatus`: per queue of `topic` in each of `groups` (those serving
/// it), its min and max offsets (RocketMQ's columns; max is the next queue
/// offset), then the messages held in all. Error: a group that did not
/// answer.
pub async fn topic_status(groups: BTreeMap<String, Vec<String>>, topic: &str) -> Result<()> {
    let req = ConsumerProgressRequest {
        group: String::new(),
        topic: topic.to_owned(),
    };
    println!(
        "{:<24} {:>4} {:>20} {:>20}",
        "#Broker Name", "#QID", "#Min Offset", "#Max Offset"
    );
    let (mut held, mut failed) = (0u64, 0);
    for (broker_group, members) in groups {
        match ask(&members, &req).await {
            Ok(r) => {
                for q in r.queues {
                    held += q.broker_offset.saturating_sub(q.min_offset);
                    println!(
                        "{:<24} {:>4} {:>20} {:>20}",
                        broker_group, q.queue_id, q.min_offset, q.broker_offset
                    );
                }
            }
            Err(e) => {
                eprintln!("broker group {broker_group}: {e}");
                failed += 1;
            }
        }
    }
    println!("Messages held: {held}");
    if failed > 0 {
        anyhow::bail!("{failed} broker group(s) did not answer");
    }
    Ok(())
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// `raftStatus`: one line per node of each of `groups` (name → node id and
/// client address of each node the name servers know) as it sees itself (role,
/// term, leader, last log and applied index), then each leader's view of its
/// membership and followers (match index, lag in entries). Error: a member
/// that did not answer (its line says so; the others are still printed). A
/// node that does not answer and that no answering node counts as a member
/// (removed, still listed by the name servers) is said so, not an error.
pub async fn raft_status(groups: BTreeMap<String, Vec<(u64, String)>>) -> Result<()> {
    println!(
        "{:<12} {:<5} {:<22} {:<10} {:>6} {:>7} {:>12} {:>12}",
        "#Group", "#Node", "#Address", "#Role", "#Term", "#Leader", "#Last Log", "#Applied"
    );
    let mut leaders: Vec<(String, RaftStatusResponse)> = Vec::new();
    let mut failed = 0;
    for (group, nodes) in groups {
        let mut members = std::collections::BTreeSet::new();
        let mut silent = Vec::new();
        for (id, addr) in nodes {
            let answer = match admin_client(&addr).await {
                Ok(mut c) => c
                    .raft_status(RaftStatusRequest {})
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match answer {
                Ok(r) => {
                    let r = r.into_inner();
                    println!(
                        "{:<12} {:<5} {:<22} {:<10} {:>6} {:>7} {:>12} {:>12}",
                        group,
                        r.node_id,
                        addr,
                        r.role,
                        r.term,
                        opt(r.leader_id),
                        opt(r.last_log_index),
                        opt(r.applied_index)
                    );
                    members.extend(r.voters.iter().chain(&r.learners).copied());
                    if r.role == "leader" {
                        leaders.push((group.clone(), r));
                    }
                }
                Err(e) => silent.push((id, addr, e)),
            }
        }
        for (id, addr, e) in silent {
            if members.is_empty() || members.contains(&id) {
                failed += 1;
                println!("{group:<12} {id:<5} {addr:<22} no answer: {e}");
            } else {
                println!("{group:<12} {id:<5} {addr:<22} no answer, and not a member (removed)");
            }
        }
    }
    for (group, l) in leaders {
        println!(
            "\n{group}: leader {} (term {}), voters {:?}, learners {:?}, followers:",
            l.node_id, l.term, l.voters, l.learners
        );
        for f in l.followers {
            let learner = if l.learners.contains(&f.node_id) {
                "  (learner)"
            } else {
                ""
            };
            println!(
                "  node {:<5} match {:>12}  lag {:>10} entries{learner}",
                f.node_id,
                opt(f.match_index),
                opt(f.lag_entries)
            );
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} member(s) did not answer");
    }
    Ok(())
}
