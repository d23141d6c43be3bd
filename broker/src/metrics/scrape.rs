//! What a scrape reads from the node: Raft state, the group's metadata, the
//! store's disk use; and the task that counts term and leader changes as
//! they happen.

use std::collections::BTreeMap;
use std::sync::Arc;

use ledgermq_raft::RaftNode;

use super::{dir_bytes, BrokerMetrics};
use crate::broker::Broker;

/// How often the store directory's size is measured again (a walk of every
/// file under the store root).
const STORAGE_SIZE_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// The metrics text of `broker`'s node now: the gauges are read, then every
/// metric is encoded. Blocking (it reads the disk): call it off the async
/// runtime's workers. Scrapes take turns, so one never encodes gauges another
/// has just reset.
pub fn render(broker: &Broker) -> String {
    let m = &broker.metrics;
    let mut last_size = m.scrape_lock.lock().unwrap_or_else(|e| e.into_inner());
    let node = &broker.node;
    let raft = node.raft().metrics().borrow().clone();
    let status = crate::grpc::raft_status::raft_status(node.id(), &raft);
    m.raft_role.reset();
    m.raft_role
        .with_label_values(&[status.role.as_str()])
        .set(1);
    m.raft_term.set(status.term as i64);
    let last = status.last_log_index.unwrap_or(0);
    let applied = status.applied_index.unwrap_or(0);
    m.raft_last_log_index.set(last as i64);
    m.raft_applied_index.set(applied as i64);
    m.raft_apply_lag.set(last.saturating_sub(applied) as i64);
    m.follower_match_index.reset();
    m.follower_lag.reset();
    for f in &status.followers {
        let id = f.node_id.to_string();
        if let Some(i) = f.match_index {
            m.follower_match_index
                .with_label_values(&[&id])
                .set(i as i64);
        }
        if let Some(l) = f.lag_entries {
            m.follower_lag.with_label_values(&[&id]).set(l as i64);
        }
    }

    let store = node.store();
    m.consumer_lag.reset();
    {
        let meta = node.shared_meta().read().unwrap();
        m.topic_number.set(meta.topics.len() as i64);
        m.group_number.set(meta.groups.len() as i64);
        if status.role == "leader" {
            let mut lag: BTreeMap<(&str, &str), u64> = BTreeMap::new();
            for ((group, topic, queue_id), offset) in &meta.offsets {
                let (_, end) = store.queue_offsets(topic, *queue_id);
                *lag.entry((topic.as_str(), group.as_str())).or_default() +=
                    end.saturating_sub(*offset);
            }
            for ((topic, group), n) in lag {
                m.consumer_lag
                    .with_label_values(&[topic, group])
                    .set(n as i64);
            }
        }
    }
    if last_size.is_none_or(|at| at.elapsed() >= STORAGE_SIZE_EVERY) {
        m.storage_size.set(dir_bytes(&store.config().root) as i64);
        *last_size = Some(std::time::Instant::now());
    }
    if let Ok(r) = store.disk_used_ratio() {
        m.disk_used_ratio.set(r);
    }
    m.encode()
}

/// Counts term and leader changes of `node` into `metrics` until the node's
/// metrics channel closes (the Raft core stopped).
pub fn spawn_raft_watch(
    node: Arc<RaftNode>,
    metrics: Arc<BrokerMetrics>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut rx = node.raft().metrics();
        let (mut term, mut leader) = {
            let m = rx.borrow();
            (m.current_term, m.current_leader)
        };
        while rx.changed().await.is_ok() {
            let m = rx.borrow();
            if m.current_term != term {
                metrics.term_changes.inc();
                term = m.current_term;
            }
            if m.current_leader != leader && m.current_leader.is_some() {
                metrics.leader_changes.inc();
            }
            leader = m.current_leader;
        }
    })
}
