//! Receiving (long polling), acking, changing a delivery's invisible time and
//! dead-lettering, in the broker's terms, run on the group's leader (a follower
//! passes the calls on: see [`crate::broker`]); `grpc::consume` adapts them to
//! the 5.x calls.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ledgermq_meta::TopicConfig;

use crate::broker::Broker;
use crate::consumers::{DeadLetter, PopRequest};
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::filter::{FilterExpr, TagFilter};
use crate::message::{check_group, check_topic, Delivery};
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

/// One ReceiveMessage call in the broker's terms.
#[derive(Debug, Clone)]
pub struct ReceiveRequest {
    /// The topic to receive from (every queue of it this group holds).
    pub topic: String,
    /// The consumer group.
    pub group: String,
    /// The subscription's filter; `None` takes every message.
    pub filter: Option<FilterExpr>,
    /// How long each message stays invisible, ms; `None` for the broker's
    /// default. Must be within [`INVISIBLE_RANGE_MS`].
    pub invisible_ms: Option<u64>,
    /// Most messages wanted; 0 or less for the broker's most.
    pub batch_size: i32,
    /// The client's long-polling timeout, ms; `None` for the broker's longest.
    pub long_polling_ms: Option<u64>,
}

impl Broker {
    /// The consumer for a call: checks the group name, creates the group when
    /// allowed. Errors: ILLEGAL_CONSUMER_GROUP, CONSUMER_GROUP_NOT_FOUND,
    /// CLIENT_ID_REQUIRED (a broadcasting group needs the client id), BAD_REQUEST
    /// (a client id over `MAX_CLIENT_ID_BYTES` for a broadcasting group),
    /// TOO_MANY_REQUESTS (the broadcasting group has its most client ids).
    pub async fn consumer(
        &self,
        group: &str,
        client_id: Option<&str>,
    ) -> Result<Consumer, BrokerError> {
        check_group(group)?;
        let cfg = self.group_or_create(group).await?;
        let key = if cfg.broadcast {
            let id = client_id.filter(|c| !c.is_empty()).ok_or_else(|| {
                refuse(
                    ErrorKind::ClientIdRequired,
                    "a broadcasting group needs the x-mq-client-id header",
                )
            })?;
            if id.len() > MAX_CLIENT_ID_BYTES {
                return Err(refuse(
                    ErrorKind::BadRequest,
                    format!("client id is over {MAX_CLIENT_ID_BYTES} bytes"),
                ));
            }
            self.admit_broadcast_client(group, id)?;
            format!("{group}@{id}")
        } else {
            group.to_owned()
        };
        Ok(Consumer {
            group: group.to_owned(),
            key,
            fifo: cfg.fifo,
            max_delivery_attempts: cfg.max_delivery_attempts.max(1),
        })
    }

    pub(crate) fn readable_topic(&self, name: &str) -> Result<TopicConfig, BrokerError> {
        check_topic(name)?;
        let t = self.topic(name).ok_or_else(|| {
            refuse(
                ErrorKind::TopicNotFound,
                format!("topic {name} does not exist in broker group {}", self.group),
            )
        })?;
        if !t.perm.readable() {
            return Err(refuse(
                ErrorKind::Forbidden,
                format!("topic {name} is not readable"),
            ));
        }
        Ok(t)
    }

    /// ReceiveMessage on the leader: waits until `started` plus the long-polling
    /// wait (`long_poll_wait_ms`) for messages; an empty list when none came.
    /// Errors: ILLEGAL_TOPIC, TOPIC_NOT_FOUND, FORBIDDEN (not readable), the
    /// consumer's ([`Self::consumer`]), ILLEGAL_FILTER_EXPRESSION, UNSUPPORTED
    /// (SQL92), ILLEGAL_INVISIBLE_TIME, and the pop's (this node does not lead,
    /// a lease write failed).
    pub async fn receive(
        &self,
        req: &ReceiveRequest,
        client_id: Option<&str>,
        started: Instant,
    ) -> Result<Vec<Delivery>, BrokerError> {
        let wait = long_poll_wait_ms(req.long_polling_ms, self.settings.max_long_polling_ms);
        let deadline = started + Duration::from_millis(wait);
        let topic = self.readable_topic(&req.topic)?;
        let consumer = self.consumer(&req.group, client_id).await?;
        let filter = TagFilter::parse(req.filter.as_ref())?;
        let invisible_ms = req
            .invisible_ms
            .unwrap_or(self.settings.default_invisible_ms);
        if !(INVISIBLE_RANGE_MS.0..=INVISIBLE_RANGE_MS.1).contains(&invisible_ms) {
            return Err(refuse(
                ErrorKind::IllegalInvisibleTime,
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
            record_attempts: self.settings.exact_delivery_attempts,
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
    /// failure; once the copy is written, an ack failure is `OutcomeUnknown` (the
    /// call took effect in part: the message may be delivered, and copied, again),
    /// never a failure that says nothing was done.
    async fn dead_letter(&self, consumer: &Consumer, dead: DeadLetter) -> Result<(), BrokerError> {
        let topic = dlq_topic(&consumer.group);
        self.ensure_topic(&topic).await?;
        let rec = crate::message::dead_letter_copy(dead.record, topic);
        self.node.write_messages(vec![rec]).await?;
        self.consumers
            .ack(&consumer.key, &dead.handle, consumer.fifo)
            .await
            .map_err(|e| {
                refuse(
                    ErrorKind::OutcomeUnknown,
                    format!(
                        "the message was copied to the dead-letter queue, but its ack failed: {e}"
                    ),
                )
            })
    }

    /// AckMessage on the leader: acks each receipt handle of `topic`; one result
    /// per handle, in order. Error (for the whole call): the consumer's
    /// ([`Self::consumer`]). Per handle: INVALID_RECEIPT_HANDLE (undecodable, for
    /// another topic, or not a delivery in flight), and the ack's write failures.
    pub async fn ack(
        &self,
        group: &str,
        topic: &str,
        receipt_handles: &[&str],
        client_id: Option<&str>,
    ) -> Result<Vec<Result<(), BrokerError>>, BrokerError> {
        let consumer = self.consumer(group, client_id).await?;
        let decoded: Vec<Result<ReceiptHandle, BrokerError>> = receipt_handles
            .iter()
            .map(|&handle| {
                let h = ReceiptHandle::decode(handle)?;
                if h.topic != topic {
                    return Err(refuse(
                        ErrorKind::InvalidReceiptHandle,
                        "the receipt handle is for another topic",
                    ));
                }
                Ok(h)
            })
            .collect();
        let valid: Vec<ReceiptHandle> = decoded.iter().flatten().cloned().collect();
        // A FIFO group's offset commits go through Raft in one write.
        let mut acked = self
            .consumers
            .ack_many(&consumer.key, &valid, consumer.fifo)
            .await
            .into_iter();
        Ok(decoded
            .into_iter()
            .map(|d| match d {
                Ok(_) => acked.next().unwrap_or_else(|| {
                    Err(refuse(ErrorKind::Internal, "an ack result is missing"))
                }),
                Err(e) => Err(e),
            })
            .collect())
    }

    /// ChangeInvisibleDuration on the leader: the delivery of `receipt_handle`
    /// becomes visible again `invisible_ms` from now; returns its new receipt
    /// handle. Errors: the consumer's, INVALID_RECEIPT_HANDLE,
    /// ILLEGAL_INVISIBLE_TIME (over 12 h), and the write's.
    pub async fn change_invisible(
        &self,
        group: &str,
        receipt_handle: &str,
        invisible_ms: u64,
        client_id: Option<&str>,
    ) -> Result<ReceiptHandle, BrokerError> {
        let consumer = self.consumer(group, client_id).await?;
        let h = ReceiptHandle::decode(receipt_handle)?;
        if invisible_ms > INVISIBLE_RANGE_MS.1 {
            return Err(refuse(
                ErrorKind::IllegalInvisibleTime,
                "invisible duration over 12 h",
            ));
        }
        self.consumers
            .change_invisible(&consumer.key, &h, invisible_ms, consumer.fifo)
            .await
    }

    /// ForwardMessageToDeadLetterQueue on the leader: copies the message of the
    /// current delivery `receipt_handle` to the group's dead-letter queue and acks
    /// it. Errors: the consumer's, INVALID_RECEIPT_HANDLE (not the current
    /// delivery, or no stored message), and the copy's and ack's.
    pub async fn forward_to_dlq(
        &self,
        group: &str,
        receipt_handle: &str,
        client_id: Option<&str>,
    ) -> Result<(), BrokerError> {
        let consumer = self.consumer(group, client_id).await?;
        let h = ReceiptHandle::decode(receipt_handle)?;
        // Only the current delivery, once: a repeated or stale request must not
        // copy the message again.
        if !self
            .consumers
            .is_current(&consumer.key, &h, consumer.fifo)
            .await?
        {
            return Err(refuse(
                ErrorKind::InvalidReceiptHandle,
                "the receipt handle is not the message's current delivery (acked or delivered again)",
            ));
        }
        let stored = self
            .node
            .store()
            .get_message(&h.topic, h.queue_id, h.queue_offset)
            .map_err(|_| {
                refuse(
                    ErrorKind::InvalidReceiptHandle,
                    "the receipt handle names no stored message",
                )
            })?;
        let record = stored.view().to_record();
        self.dead_letter(&consumer, DeadLetter { handle: h, record })
            .await
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
}
