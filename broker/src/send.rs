//! SendMessage, QueryRoute and QueryAssignment.

use ledgermq_raft::{TopicConfig, TopicMessageType};

use crate::broker::Broker;
use crate::error::{refuse, BrokerError};
use crate::message::{check_group, check_topic, incoming, Incoming};
use crate::pb::{self, Code};
use crate::route::{group_queues, message_queues, EndpointStyle};

/// The queue a message goes to: a FIFO message's queue follows from its message
/// group (CRC32 of the group modulo the queue count), so a group's messages stay in
/// one queue whatever queue the client picked; other messages go to the queue the
/// client picked, or round robin when it picked none valid.
pub fn choose_queue(
    queue_count: u32,
    message_group: Option<&str>,
    client_queue_id: Option<i32>,
    rr: usize,
) -> i32 {
    debug_assert!(queue_count > 0);
    if let Some(g) = message_group {
        return (crc32fast::hash(g.as_bytes()) % queue_count) as i32;
    }
    match client_queue_id {
        Some(q) if q >= 0 && (q as u32) < queue_count => q,
        _ => (rr % queue_count as usize) as i32,
    }
}

/// Checks a message against its topic's type. Error:
/// MESSAGE_PROPERTY_CONFLICT_WITH_TYPE (a message group on a normal topic, or none on
/// a FIFO topic).
pub fn check_type(topic: &TopicConfig, m: &Incoming) -> Result<(), BrokerError> {
    match (topic.message_type, m.message_group.is_some()) {
        (TopicMessageType::Fifo, true) | (TopicMessageType::Normal, false) => Ok(()),
        (TopicMessageType::Fifo, false) => Err(refuse(
            Code::MessagePropertyConflictWithType,
            format!(
                "topic {} is a FIFO topic: messages need a message group",
                topic.name
            ),
        )),
        (TopicMessageType::Normal, true) => Err(refuse(
            Code::MessagePropertyConflictWithType,
            format!(
                "topic {} is a normal topic: a message group needs a FIFO topic",
                topic.name
            ),
        )),
        _ => Err(refuse(
            Code::Unsupported,
            format!("topic {}'s message type is not supported yet", topic.name),
        )),
    }
}

impl Broker {
    /// SendMessage: checks every message, stores them all in one Raft entry and
    /// answers once it is committed. One result entry per message. More than
    /// `max_messages_per_send` messages: PAYLOAD_TOO_LARGE, nothing stored.
    pub async fn send(&self, req: pb::SendMessageRequest) -> pb::SendMessageResponse {
        let n = req.messages.len();
        if n == 0 {
            return pb::SendMessageResponse {
                status: Some(refuse(Code::BadRequest, "no messages to send").to_status()),
                entries: vec![],
            };
        }
        let mut ids = Vec::with_capacity(n);
        let result = if n > self.settings.max_messages_per_send {
            ids.extend(req.messages.iter().map(|m| {
                m.system_properties
                    .as_ref()
                    .map(|p| p.message_id.clone())
                    .unwrap_or_default()
            }));
            Err(refuse(
                Code::PayloadTooLarge,
                format!(
                    "{n} messages in one send; at most {} are allowed",
                    self.settings.max_messages_per_send
                ),
            ))
        } else {
            self.send_checked(req, &mut ids).await
        };
        let entries = match &result {
            Ok(placed) => ids
                .iter()
                .zip(placed)
                .map(|(id, offset)| pb::SendResultEntry {
                    status: Some(pb::Status::ok()),
                    message_id: id.clone(),
                    transaction_id: String::new(),
                    offset: *offset as i64,
                })
                .collect(),
            Err(e) => (0..n)
                .map(|i| pb::SendResultEntry {
                    status: Some(e.to_status()),
                    message_id: ids.get(i).cloned().unwrap_or_default(),
                    transaction_id: String::new(),
                    offset: 0,
                })
                .collect(),
        };
        if let Err(e) = &result {
            tracing::debug!(error = %e, "send refused");
        }
        pb::SendMessageResponse {
            status: Some(match &result {
                Ok(_) => pb::Status::ok(),
                Err(e) => e.to_status(),
            }),
            entries,
        }
    }

    async fn send_checked(
        &self,
        req: pb::SendMessageRequest,
        ids: &mut Vec<String>,
    ) -> Result<Vec<u64>, BrokerError> {
        let mut records = Vec::with_capacity(req.messages.len());
        let mut topic_cfg: Option<TopicConfig> = None;
        for m in req.messages {
            let inc = incoming(m, self.settings.max_body_bytes)?;
            ids.push(inc.message_id.clone());
            let topic = match &topic_cfg {
                Some(t) if t.name == inc.record.topic => t.clone(),
                Some(_) => {
                    return Err(refuse(
                        Code::BadRequest,
                        "all messages of one send must have the same topic",
                    ))
                }
                None => {
                    let t = self.topic_or_create(&inc.record.topic).await?;
                    topic_cfg = Some(t.clone());
                    t
                }
            };
            if !topic.perm.writable() {
                return Err(refuse(
                    Code::Forbidden,
                    format!("topic {} is not writable", topic.name),
                ));
            }
            check_type(&topic, &inc)?;
            let mut rec = inc.record;
            rec.queue_id = choose_queue(
                topic.queue_count,
                inc.message_group.as_deref(),
                inc.client_queue_id,
                self.next_rr(),
            );
            records.push(rec);
        }
        // RaftNode waits for a leader (up to its write timeout) without copying the
        // messages; a write that reached a leader is never sent again here.
        let placed = self.node.write_messages(records).await?;
        Ok(placed.into_iter().map(|p| p.queue_offset).collect())
    }

    /// QueryRoute: the topic's queues on every broker group, from the name servers;
    /// this group's own view when the name servers do not know the topic yet (just
    /// created). Error: TOPIC_NOT_FOUND.
    pub async fn query_route(
        &self,
        req: pb::QueryRouteRequest,
        style: EndpointStyle,
    ) -> pb::QueryRouteResponse {
        match self
            .route_queues(req.topic.map(|t| t.name).unwrap_or_default(), style)
            .await
        {
            Ok(q) => pb::QueryRouteResponse {
                status: Some(pb::Status::ok()),
                message_queues: q,
            },
            Err(e) => pb::QueryRouteResponse {
                status: Some(e.to_status()),
                message_queues: vec![],
            },
        }
    }

    async fn route_queues(
        &self,
        topic: String,
        style: EndpointStyle,
    ) -> Result<Vec<pb::MessageQueue>, BrokerError> {
        check_topic(&topic)?;
        let from_namesrv = match self.namesrv.route(&topic).await {
            Ok(r) => r
                .map(|r| message_queues(&topic, &r, style, self.settings.stale_member_ms))
                .unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %e, "name servers unreachable; answering this group's view");
                vec![]
            }
        };
        if !from_namesrv.is_empty() {
            return Ok(from_namesrv);
        }
        let t = self.topic_or_create(&topic).await?;
        let mut addrs = Vec::new();
        if let Some((leader, _)) = self.node.leader() {
            if let Some(a) = self.members().configured().get(&leader) {
                addrs.push(a.clone());
            }
        }
        for a in self.members().configured().values() {
            if !addrs.contains(a) {
                addrs.push(a.clone());
            }
        }
        let q = group_queues(
            &topic,
            &self.group,
            &addrs,
            t.queue_count,
            t.perm,
            t.message_type,
            style,
        );
        if q.is_empty() {
            return Err(refuse(
                Code::TopicNotFound,
                format!("topic {topic} has no queues"),
            ));
        }
        Ok(q)
    }

    /// QueryAssignment: one assignment per readable broker group and endpoint, queue
    /// id -1 (any queue of that group: the leader spreads receives over them).
    pub async fn query_assignment(
        &self,
        req: pb::QueryAssignmentRequest,
        style: EndpointStyle,
    ) -> pb::QueryAssignmentResponse {
        let result = async {
            check_group(&req.group.map(|g| g.name).unwrap_or_default())?;
            let queues = self
                .route_queues(req.topic.map(|t| t.name).unwrap_or_default(), style)
                .await?;
            let mut seen = std::collections::BTreeSet::new();
            let mut out = Vec::new();
            for mut q in queues {
                let readable = matches!(
                    pb::Permission::try_from(q.permission),
                    Ok(pb::Permission::Read | pb::Permission::ReadWrite)
                );
                // One per group and endpoint: with spread endpoints, a push
                // consumer polls through every member and rides out a dead one.
                let key = q
                    .broker
                    .as_ref()
                    .map(|b| (b.name.clone(), format!("{:?}", b.endpoints)));
                if readable && seen.insert(key) {
                    q.id = -1;
                    out.push(pb::Assignment {
                        message_queue: Some(q),
                    });
                }
            }
            Ok::<_, BrokerError>(out)
        }
        .await;
        match result {
            Ok(assignments) => pb::QueryAssignmentResponse {
                status: Some(pb::Status::ok()),
                assignments,
            },
            Err(e) => pb::QueryAssignmentResponse {
                status: Some(e.to_status()),
                assignments: vec![],
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_messages_follow_their_group_and_others_the_client() {
        let q = choose_queue(8, Some("order-17"), Some(3), 0);
        for rr in 0..5 {
            assert_eq!(choose_queue(8, Some("order-17"), Some(rr as i32), rr), q);
        }
        assert_eq!(choose_queue(8, None, Some(5), 0), 5);
        assert_eq!(choose_queue(8, None, Some(8), 3), 3);
        assert_eq!(choose_queue(8, None, Some(-1), 9), 1);
    }
}
