//! ReceiveMessage (long polling), AckMessage, ChangeInvisibleDuration and
//! ForwardMessageToDeadLetterQueue, run on the group's leader (a follower passes
//! them on: see [`crate::broker`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ledgermq_raft::{Command, TopicConfig, TopicMessageType, TopicPerm};
use ledgermq_store::store::now_ms;
use ledgermq_store::MessageRecord;

use crate::broker::Broker;
use crate::consumers::{DeadLetter, PopRequest};
use crate::error::{refuse, BrokerError};
use crate::filter::TagFilter;
use crate::message::{check_group, check_topic, duration_ms, timestamp, PROPERTY_ORIGIN_TOPIC};
use crate::pb::{self, Code};
use crate::receipt::ReceiptHandle;

/// Shortest and longest invisible duration a receive may ask for, ms (RocketMQ
/// proxy: 12 h at most).
pub const INVISIBLE_RANGE_MS: (u64, u64) = (1_000, 12 * 3600 * 1000);

/// How long a receive may wait for messages: the client's long-polling timeout
/// (its gRPC deadline is no longer than that) less a margin of a fifth, at least
/// 500 ms, so the answer arrives in time; capped at `max_ms`.
pub fn long_poll_wait_ms(requested_ms: Option<u64>, max_ms: u64) -> u64 {
    let lp = requested_ms.unwrap_or(max_ms).min(max_ms);
    lp.saturating_sub((lp / 5).max(500))
}

/// The dead-letter topic of a consumer group (RocketMQ: `%DLQ%` + group).
pub fn dlq_topic(group: &str) -> String {
    format!("%DLQ%{group}")
}

/// Most bytes of a client id used as a broadcasting consumer's offset key.
pub const MAX_CLIENT_ID_BYTES: usize = 255;

/// The client ids consuming from each broadcasting group, with when each was last
/// seen. At most `max` ids per group seen within `idle` are kept; an id unseen for
/// longer frees its place (RocketMQ's `broadcastOffsetExpireSecond` idea). No I/O.
#[derive(Debug, Default)]
pub struct BroadcastClients {
    groups: HashMap<String, HashMap<String, Instant>>,
}

impl BroadcastClients {
    /// Notes `client` consuming from `group` at `now`; false (nothing noted) if it
    /// is new and `max` other ids were seen within `idle`.
    pub fn admit(
        &mut self,
        group: &str,
        client: &str,
        now: Instant,
        max: usize,
        idle: Duration,
    ) -> bool {
        let ids = self.groups.entry(group.to_owned()).or_default();
        if let Some(seen) = ids.get_mut(client) {
            *seen = now;
            return true;
        }
        if ids.len() >= max {
            ids.retain(|_, seen| now.saturating_duration_since(*seen) < idle);
            if ids.len() >= max {
                return false;
            }
        }
        ids.insert(client.to_owned(), now);
        true
    }
}

/// Who is consuming: the group and the key its offsets are kept under.
pub struct Consumer {
    /// Consumer group.
    pub group: String,
    /// `group`, or `group@client-id` for a broadcasting group.
    pub key: String,
    /// FIFO group.
    pub fifo: bool,
    /// Deliveries before dead-lettering.
    pub max_delivery_attempts: u32,
}

impl Broker {
    /// The consumer for a call: checks the group name, creates the group when
    /// allowed. Errors: ILLEGAL_CONSUMER_GROUP, CONSUMER_GROUP_NOT_FOUND,
    /// CLIENT_ID_REQUIRED (a broadcasting group needs the client id), BAD_REQUEST
    /// (a client id over [`MAX_CLIENT_ID_BYTES`] for a broadcasting group),
    /// TOO_MANY_REQUESTS (the broadcasting group has its most client ids).
    pub async fn consumer(
        &self,
        group: Option<&pb::Resource>,
        client_id: Option<&str>,
    ) -> Result<Consumer, BrokerError> {
        let group = group.map(|g| g.name.clone()).unwrap_or_default();
        check_group(&group)?;
        let cfg = self.group_or_create(&group).await?;
        let key = if cfg.broadcast {
            let id = client_id.filter(|c| !c.is_empty()).ok_or_else(|| {
                refuse(
                    Code::ClientIdRequired,
                    "a broadcasting group needs the x-mq-client-id header",
                )
            })?;
            if id.len() > MAX_CLIENT_ID_BYTES {
                return Err(refuse(
                    Code::BadRequest,
                    format!("client id is over {MAX_CLIENT_ID_BYTES} bytes"),
                ));
            }
            self.admit_broadcast_client(&group, id)?;
            format!("{group}@{id}")
        } else {
            group.clone()
        };
        Ok(Consumer {
            group,
            key,
            fifo: cfg.fifo,
            max_delivery_attempts: cfg.max_delivery_attempts.max(1),
        })
    }

    fn readable_topic(&self, topic: Option<&pb::Resource>) -> Result<TopicConfig, BrokerError> {
        let name = topic.map(|t| t.name.clone()).unwrap_or_default();
        check_topic(&name)?;
        let t = self.topic(&name).ok_or_else(|| {
            refuse(
                Code::TopicNotFound,
                format!("topic {name} does not exist in broker group {}", self.group),
            )
        })?;
        if !t.perm.readable() {
            return Err(refuse(
                Code::Forbidden,
                format!("topic {name} is not readable"),
            ));
        }
        Ok(t)
    }

    /// ReceiveMessage on the leader: waits up to the long-polling time for messages.
    /// Returns the stream's items: a status (OK, or MESSAGE_NOT_FOUND when nothing
    /// came), the messages, then the delivery timestamp.
    pub async fn receive_local(
        &self,
        req: &pb::ReceiveMessageRequest,
        client_id: Option<&str>,
        started: Instant,
    ) -> Vec<pb::ReceiveMessageResponse> {
        match self.receive_checked(req, client_id, started).await {
            Ok(messages) if messages.is_empty() => vec![status_item(
                refuse(Code::MessageNotFound, "no new message").to_status(),
            )],
            Ok(messages) => {
                let mut out = Vec::with_capacity(messages.len() + 2);
                out.push(status_item(pb::Status::ok()));
                out.extend(messages.into_iter().map(|m| pb::ReceiveMessageResponse {
                    content: Some(pb::receive_message_response::Content::Message(m)),
                }));
                out.push(pb::ReceiveMessageResponse {
                    content: Some(pb::receive_message_response::Content::DeliveryTimestamp(
                        timestamp(now_ms()),
                    )),
                });
                out
            }
            Err(e) => vec![status_item(e.to_status())],
        }
    }

    async fn receive_checked(
        &self,
        req: &pb::ReceiveMessageRequest,
        client_id: Option<&str>,
        started: Instant,
    ) -> Result<Vec<pb::Message>, BrokerError> {
        let wait = long_poll_wait_ms(
            req.long_polling_timeout.as_ref().map(duration_ms),
            self.settings.max_long_polling_ms,
        );
        let deadline = started + Duration::from_millis(wait);
        let topic =
            self.readable_topic(req.message_queue.as_ref().and_then(|q| q.topic.as_ref()))?;
        let consumer = self.consumer(req.group.as_ref(), client_id).await?;
        let filter = TagFilter::parse(req.filter_expression.as_ref())?;
        let invisible_ms = match &req.invisible_duration {
            Some(d) => duration_ms(d),
            None => self.settings.default_invisible_ms,
        };
        if !(INVISIBLE_RANGE_MS.0..=INVISIBLE_RANGE_MS.1).contains(&invisible_ms) {
            return Err(refuse(
                Code::IllegalInvisibleTime,
                format!(
                    "invisible duration {invisible_ms} ms is outside [{}, {}] ms",
                    INVISIBLE_RANGE_MS.0, INVISIBLE_RANGE_MS.1
                ),
            ));
        }
        let batch = if req.batch_size <= 0 {
            self.settings.max_receive_batch
        } else {
            (req.batch_size as usize).min(self.settings.max_receive_batch)
        };
        let start = self.next_rr();
        let n = topic.queue_count as usize;
        let pop = PopRequest {
            group: consumer.group.clone(),
            consumer: consumer.key.clone(),
            topic: topic.name.clone(),
            queue_ids: (0..n).map(|i| ((start + i) % n.max(1)) as i32).collect(),
            max_messages: batch,
            invisible_ms,
            fifo: consumer.fifo,
            filter,
            max_delivery_attempts: consumer.max_delivery_attempts,
        };
        let mut metrics = self.node.raft().metrics();
        loop {
            let got = self.consumers.pop(&pop).await?;
            for dead in got.dead {
                if let Err(e) = self.dead_letter(&consumer, dead).await {
                    tracing::warn!(error = %e, "dead-lettering failed; the message will be delivered again");
                }
            }
            if !got.messages.is_empty() {
                return Ok(got.messages);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(vec![]);
            }
            // New messages arrive with applied entries (a metrics change); acks and
            // expiries are picked up by the periodic re-check.
            let tick = Duration::from_millis(100).min(deadline - now);
            if let Ok(Err(_)) = tokio::time::timeout(tick, metrics.changed()).await {
                // The node is shutting down: no more changes will come.
                tokio::time::sleep(tick).await;
            }
        }
    }

    /// Copies a message to its group's dead-letter queue (creating that topic, one
    /// queue, readable and writable), then acks the delivery. Errors: the copy's
    /// failure; once the copy is written, an ack failure is `PROXY_TIMEOUT` (the
    /// call took effect in part: the message may be delivered, and copied, again),
    /// never a failure that says nothing was done.
    async fn dead_letter(&self, consumer: &Consumer, dead: DeadLetter) -> Result<(), BrokerError> {
        let topic = dlq_topic(&consumer.group);
        if self.topic(&topic).is_none() {
            self.node
                .write_command(Command::EnsureTopic(TopicConfig {
                    name: topic.clone(),
                    queue_count: 1,
                    perm: TopicPerm::READ_WRITE,
                    message_type: TopicMessageType::Normal,
                }))
                .await?;
        }
        let mut rec: MessageRecord = dead.record;
        rec.properties
            .insert(PROPERTY_ORIGIN_TOPIC.into(), rec.topic.clone());
        rec.topic = topic;
        rec.queue_id = 0;
        // FIFO messages keep their group property; the DLQ is a normal topic.
        rec.properties
            .remove(crate::message::PROPERTY_MESSAGE_GROUP);
        self.node.write_messages(vec![rec]).await?;
        self.consumers
            .ack(&consumer.key, &dead.handle, consumer.fifo)
            .await
            .map_err(|e| {
                refuse(
                    Code::ProxyTimeout,
                    format!(
                        "the message was copied to the dead-letter queue, but its ack failed: {e}"
                    ),
                )
            })
    }

    /// AckMessage on the leader: one result per entry.
    pub async fn ack_local(
        &self,
        req: &pb::AckMessageRequest,
        client_id: Option<&str>,
    ) -> pb::AckMessageResponse {
        let consumer = match self.consumer(req.group.as_ref(), client_id).await {
            Ok(c) => c,
            Err(e) => return ack_error(req, e),
        };
        let topic = req
            .topic
            .as_ref()
            .map(|t| t.name.clone())
            .unwrap_or_default();
        let mut entries = Vec::with_capacity(req.entries.len());
        for entry in &req.entries {
            let r = async {
                let h = ReceiptHandle::decode(&entry.receipt_handle)?;
                if h.topic != topic {
                    return Err(refuse(
                        Code::InvalidReceiptHandle,
                        "the receipt handle is for another topic",
                    ));
                }
                self.consumers.ack(&consumer.key, &h, consumer.fifo).await
            }
            .await;
            entries.push(pb::AckMessageResultEntry {
                message_id: entry.message_id.clone(),
                receipt_handle: entry.receipt_handle.clone(),
                status: Some(r.map_or_else(|e| e.to_status(), |_| pb::Status::ok())),
            });
        }
        pb::AckMessageResponse {
            status: Some(overall(entries.iter().filter_map(|e| e.status.as_ref()))),
            entries,
        }
    }

    /// ChangeInvisibleDuration on the leader.
    pub async fn change_invisible_local(
        &self,
        req: &pb::ChangeInvisibleDurationRequest,
        client_id: Option<&str>,
    ) -> pb::ChangeInvisibleDurationResponse {
        let r = async {
            let consumer = self.consumer(req.group.as_ref(), client_id).await?;
            let h = ReceiptHandle::decode(&req.receipt_handle)?;
            let ms = req
                .invisible_duration
                .as_ref()
                .map(duration_ms)
                .unwrap_or(0);
            if ms > INVISIBLE_RANGE_MS.1 {
                return Err(refuse(
                    Code::IllegalInvisibleTime,
                    "invisible duration over 12 h",
                ));
            }
            self.consumers
                .change_invisible(&consumer.key, &h, ms, consumer.fifo)
                .await
        }
        .await;
        match r {
            Ok(h) => pb::ChangeInvisibleDurationResponse {
                status: Some(pb::Status::ok()),
                receipt_handle: h.encode(),
            },
            Err(e) => pb::ChangeInvisibleDurationResponse {
                status: Some(e.to_status()),
                receipt_handle: String::new(),
            },
        }
    }

    /// ForwardMessageToDeadLetterQueue on the leader.
    pub async fn forward_to_dlq_local(
        &self,
        req: &pb::ForwardMessageToDeadLetterQueueRequest,
        client_id: Option<&str>,
    ) -> pb::ForwardMessageToDeadLetterQueueResponse {
        let r = async {
            let consumer = self.consumer(req.group.as_ref(), client_id).await?;
            let h = ReceiptHandle::decode(&req.receipt_handle)?;
            // Only the current delivery, once: a repeated or stale request must not
            // copy the message again.
            if !self.consumers.is_current(&consumer.key, &h, consumer.fifo).await? {
                return Err(refuse(
                    Code::InvalidReceiptHandle,
                    "the receipt handle is not the message's current delivery (acked or delivered again)",
                ));
            }
            let stored = self
                .node
                .store()
                .get_message(&h.topic, h.queue_id, h.queue_offset)
                .map_err(|_| {
                    refuse(
                        Code::InvalidReceiptHandle,
                        "the receipt handle names no stored message",
                    )
                })?;
            let record = stored.view().to_record();
            self.dead_letter(&consumer, DeadLetter { handle: h, record })
                .await
        }
        .await;
        pb::ForwardMessageToDeadLetterQueueResponse {
            status: Some(r.map_or_else(|e| e.to_status(), |_| pb::Status::ok())),
        }
    }
}

fn status_item(s: pb::Status) -> pb::ReceiveMessageResponse {
    pb::ReceiveMessageResponse {
        content: Some(pb::receive_message_response::Content::Status(s)),
    }
}

fn ack_error(req: &pb::AckMessageRequest, e: BrokerError) -> pb::AckMessageResponse {
    let s = e.to_status();
    pb::AckMessageResponse {
        status: Some(s.clone()),
        entries: req
            .entries
            .iter()
            .map(|x| pb::AckMessageResultEntry {
                message_id: x.message_id.clone(),
                receipt_handle: x.receipt_handle.clone(),
                status: Some(s.clone()),
            })
            .collect(),
    }
}

/// One status for many results: theirs if they agree, MULTIPLE_RESULTS otherwise.
pub fn overall<'a>(mut statuses: impl Iterator<Item = &'a pb::Status>) -> pb::Status {
    let Some(first) = statuses.next() else {
        return refuse(Code::BadRequest, "no entries").to_status();
    };
    if statuses.all(|s| s.code == first.code) {
        first.clone()
    } else {
        pb::Status {
            code: Code::MultipleResults as i32,
            message: "entries have different results".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_polls_end_before_the_clients_deadline() {
        assert_eq!(long_poll_wait_ms(Some(20_000), 20_000), 16_000);
        assert_eq!(long_poll_wait_ms(Some(40_000), 20_000), 16_000);
        assert_eq!(long_poll_wait_ms(Some(1_000), 20_000), 500);
        assert_eq!(long_poll_wait_ms(Some(300), 20_000), 0);
        assert_eq!(long_poll_wait_ms(None, 20_000), 16_000);
    }

    #[test]
    fn a_broadcasting_group_admits_at_most_max_live_client_ids() {
        let mut t = BroadcastClients::default();
        let t0 = Instant::now();
        let idle = Duration::from_secs(120);
        assert!(t.admit("G", "c1", t0, 2, idle));
        assert!(t.admit("G", "c2", t0, 2, idle));
        assert!(t.admit("G", "c1", t0 + Duration::from_secs(100), 2, idle));
        assert!(!t.admit("G", "c3", t0 + Duration::from_secs(100), 2, idle));
        // Other groups have their own places.
        assert!(t.admit("H", "c3", t0, 2, idle));
        // c2 unseen for 120 s frees its place; c1 (seen at 100 s) keeps its own.
        assert!(t.admit("G", "c3", t0 + Duration::from_secs(120), 2, idle));
        assert!(!t.admit("G", "c2", t0 + Duration::from_secs(121), 2, idle));
    }

    #[test]
    fn overall_status_agrees_or_says_multiple() {
        let ok = pb::Status::ok();
        let bad = refuse(Code::InvalidReceiptHandle, "x").to_status();
        assert_eq!(overall([&ok, &ok].into_iter()).code, Code::Ok as i32);
        assert_eq!(
            overall([&ok, &bad].into_iter()).code,
            Code::MultipleResults as i32
        );
        assert_eq!(overall([].into_iter()).code, Code::BadRequest as i32);
    }
}
