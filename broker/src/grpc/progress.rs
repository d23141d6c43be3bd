//! Consumer progress, as RocketMQ's `mqadmin consumerProgress` shows it: per
//! message queue of a consumer group, the queue's end ("broker offset") and the
//! group's committed consumer offset, read from this node's applied metadata and
//! ConsumeQueues (the ConsumerProgress admin call; never passed on to the leader).

use ledgermq_raft::state_machine::GroupMeta;

use crate::admin_pb::{ConsumerProgressRequest, ConsumerProgressResponse, QueueProgress};

/// The progress of `req.group` over `req.topic` (every queue of the topic's
/// config), or over every topic the group has a committed offset in when
/// `req.topic` is empty; with no group, every queue of `req.topic` without
/// consumer offsets (`mqadmin topicStatus`). `queue_offsets(topic, queue_id)`
/// gives a queue's `[min, max)` queue offsets. Errors (in `error`): neither a
/// group nor a topic, or a topic that is not configured.
pub fn consumer_progress(
    meta: &GroupMeta,
    node_id: u64,
    req: &ConsumerProgressRequest,
    queue_offsets: impl Fn(&str, i32) -> (u64, u64),
) -> ConsumerProgressResponse {
    let mut r = ConsumerProgressResponse {
        node_id,
        applied_index: meta.applied_index,
        ..Default::default()
    };
    if req.group.is_empty() && req.topic.is_empty() {
        r.error = "a consumer group or a topic is required".into();
        return r;
    }
    // (topic, queue id) pairs to list, in order.
    let mut queues: Vec<(String, i32)> = Vec::new();
    if req.topic.is_empty() {
        for (g, t, q) in meta.offsets.keys() {
            if *g == req.group {
                queues.push((t.clone(), *q));
            }
        }
    } else {
        match meta.topics.get(&req.topic) {
            Some(t) => queues.extend((0..t.queue_count as i32).map(|q| (req.topic.clone(), q))),
            None => {
                r.error = format!("topic {:?} does not exist", req.topic);
                return r;
            }
        }
    }
    for (topic, queue_id) in queues {
        let (min_offset, broker_offset) = queue_offsets(&topic, queue_id);
        let consumer_offset = meta
            .offsets
            .get(&(req.group.clone(), topic.clone(), queue_id))
            .copied();
        r.queues.push(QueueProgress {
            topic,
            queue_id,
            min_offset,
            broker_offset,
            consumer_offset,
        });
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use ledgermq_meta::{TopicConfig, TopicMessageType, TopicPerm};

    #[test]
    fn progress_lists_every_queue_of_a_topic_or_every_queue_the_group_committed() {
        let mut meta = GroupMeta::default();
        meta.topics.insert(
            "T".into(),
            TopicConfig {
                name: "T".into(),
                queue_count: 2,
                perm: TopicPerm::READ_WRITE,
                message_type: TopicMessageType::Normal,
            },
        );
        meta.offsets.insert(("G".into(), "T".into(), 1), 7);
        meta.offsets.insert(("G".into(), "U".into(), 0), 3);
        meta.offsets.insert(("H".into(), "T".into(), 0), 9);
        meta.applied_index = Some(42);
        let ends = |t: &str, q: i32| if t == "T" { (0, 10 + q as u64) } else { (2, 5) };
        let req = |group: &str, topic: &str| ConsumerProgressRequest {
            group: group.into(),
            topic: topic.into(),
        };
        let r = consumer_progress(&meta, 1, &req("G", "T"), ends);
        assert_eq!((r.error.as_str(), r.applied_index), ("", Some(42)));
        let rows: Vec<_> = r
            .queues
            .iter()
            .map(|q| {
                (
                    q.topic.as_str(),
                    q.queue_id,
                    q.broker_offset,
                    q.consumer_offset,
                )
            })
            .collect();
        assert_eq!(rows, vec![("T", 0, 10, None), ("T", 1, 11, Some(7))]);
        let r = consumer_progress(&meta, 1, &req("G", ""), ends);
        let rows: Vec<_> = r
            .queues
            .iter()
            .map(|q| (q.topic.as_str(), q.min_offset, q.consumer_offset))
            .collect();
        assert_eq!(rows, vec![("T", 0, Some(7)), ("U", 2, Some(3))]);
        assert!(!consumer_progress(&meta, 1, &req("G", "Nope"), ends)
            .error
            .is_empty());
        // No group, a topic: each queue's offsets (mqadmin topicStatus).
        let r = consumer_progress(&meta, 1, &req("", "T"), ends);
        let rows: Vec<_> = r
            .queues
            .iter()
            .map(|q| (q.queue_id, q.min_offset, q.broker_offset, q.consumer_offset))
            .collect();
        assert_eq!(
            (r.error.as_str(), rows),
            ("", vec![(0, 0, 10, None), (1, 0, 11, None)])
        );
        assert!(!consumer_progress(&meta, 1, &req("", ""), ends)
            .error
            .is_empty());
    }
}
