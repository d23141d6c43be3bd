//! `ResetOffset` of the admin service (`mqadmin resetOffsetByTime`): rewinds a
//! consumer group on a topic to a time. Any member takes it; the leader finds
//! each queue's offset for the time in its ConsumeQueue and CommitLog
//! (`MessageStore::offset_by_time`) and makes the reset
//! ([`crate::consumers::Consumers::reset_offsets`]).

use std::time::{Duration, Instant};

use tonic::metadata::MetadataMap;

use crate::admin_pb::broker_admin_client::BrokerAdminClient;
use crate::admin_pb::{QueueOffsetReset, ResetOffsetRequest, ResetOffsetResponse};
use crate::broker::{Broker, Target};
use crate::consumers::QueueReset;
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::grpc::service::{forwarded, onward};
use crate::message::{check_group, check_topic};

/// How long a reset waits for a reachable leader.
const LEADER_WAIT: Duration = Duration::from_secs(5);
/// How long a reset passed on to the leader may take there: the consumption
/// gate (behind writes of up to a write timeout each), its own write, and the
/// wait for an unknown outcome to settle.
const LEADER_ANSWER_WAIT: Duration = Duration::from_secs(30);

/// Serves a reset here when this node is the ready leader, else passes it on to
/// the leader once (a reset is not repeated after an attempt that got no answer:
/// the answer then says its outcome is unknown).
pub async fn reset_offset(
    b: &Broker,
    md: &MetadataMap,
    r: ResetOffsetRequest,
) -> ResetOffsetResponse {
    let failed = |error: String| ResetOffsetResponse {
        error,
        node_id: b.node.id(),
        queues: Vec::new(),
    };
    match b.target(forwarded(md), Instant::now() + LEADER_WAIT).await {
        Ok(Target::Local) => match reset_local(b, &r).await {
            Ok(done) => ResetOffsetResponse {
                error: String::new(),
                node_id: b.node.id(),
                queues: done
                    .into_iter()
                    .map(|q| QueueOffsetReset {
                        queue_id: q.queue_id,
                        previous_offset: q.previous_offset,
                        offset: q.offset,
                    })
                    .collect(),
            },
            Err(e) => failed(e.to_string()),
        },
        Ok(Target::Leader(ch)) => {
            let req = onward(b, r, None, LEADER_ANSWER_WAIT);
            match BrokerAdminClient::new(ch).reset_offset(req).await {
                Ok(answer) => answer.into_inner(),
                Err(s) => failed(format!(
                    "passed on to the leader, which did not answer (the reset may or may not \
                     have been made; look with consumerProgress): {}",
                    s.message()
                )),
            }
        }
        Err(e) => failed(e.to_string()),
    }
}

/// The reset on the ready leader. Errors: ILLEGAL_TOPIC / ILLEGAL_CONSUMER_GROUP
/// for bad names, TOPIC_NOT_FOUND, CONSUMER_GROUP_NOT_FOUND, BAD_REQUEST for a
/// broadcasting group; a store read's; the reset's
/// ([`crate::consumers::Consumers::reset_offsets`]).
async fn reset_local(b: &Broker, r: &ResetOffsetRequest) -> Result<Vec<QueueReset>, BrokerError> {
    check_topic(&r.topic)?;
    check_group(&r.group)?;
    let topic = b.topic(&r.topic).ok_or_else(|| {
        refuse(
            ErrorKind::TopicNotFound,
            format!("topic {} does not exist", r.topic),
        )
    })?;
    let group = b.group_config(&r.group).ok_or_else(|| {
        refuse(
            ErrorKind::ConsumerGroupNotFound,
            format!("consumer group {} does not exist", r.group),
        )
    })?;
    if group.broadcast {
        return Err(refuse(
            ErrorKind::BadRequest,
            format!(
                "consumer group {} is broadcasting: each of its consumers keeps its own \
                 offsets, which a reset of the group does not name",
                r.group
            ),
        ));
    }
    // Each within the queue's [min, max] offsets (a binary search over them).
    let store = b.node.store();
    let offsets = (0..topic.queue_count as i32)
        .map(|queue_id| {
            Ok((
                queue_id,
                store.offset_by_time(&r.topic, queue_id, r.timestamp_ms)?,
            ))
        })
        .collect::<Result<Vec<_>, BrokerError>>()?;
    b.consumers
        .reset_offsets(&r.group, &r.topic, &offsets, group.fifo)
        .await
}
