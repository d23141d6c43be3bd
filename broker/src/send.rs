//! Sending in the broker's terms: the queue a message goes to, its topic's
//! checks, and one Raft entry per send answered once committed. `grpc::send`
//! adapts it to SendMessage.

use ledgermq_meta::{TopicConfig, TopicMessageType};

use crate::broker::Broker;
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::message::Incoming;
use crate::timers::{check_delivery_time, into_timer};
use crate::transactions::{into_half, transaction_id};

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

/// Checks a message against its topic's type (its `message.type` attribute): a
/// topic takes messages of its own type, a MIXED topic every type, as the
/// reference proxy checks them. Error: MESSAGE_PROPERTY_CONFLICT_WITH_TYPE (e.g.
/// a message group on a NORMAL topic, none on a FIFO topic, any message on a
/// DELAY topic that is not a delay message).
pub fn check_type(topic: &TopicConfig, m: &Incoming) -> Result<(), BrokerError> {
    let kind = m.message_type();
    if topic.message_type.accepts(kind) {
        return Ok(());
    }
    let hint = match (topic.message_type, kind) {
        (TopicMessageType::Fifo, TopicMessageType::Normal) => {
            ": FIFO messages need a message group"
        }
        (TopicMessageType::Normal, TopicMessageType::Fifo) => {
            ": a message group needs a FIFO or MIXED topic"
        }
        _ => "",
    };
    Err(refuse(
        ErrorKind::MessagePropertyConflictWithType,
        format!(
            "topic {} has message.type={}: a {} message cannot be sent to it{hint}",
            topic.name,
            topic.message_type.attribute_value(),
            kind.attribute_value(),
        ),
    ))
}

/// The `message_type` label of RocketMQ's metrics for a message of `kind`.
fn metric_type(kind: TopicMessageType) -> &'static str {
    match kind {
        TopicMessageType::Normal | TopicMessageType::Mixed => "normal",
        TopicMessageType::Fifo => "fifo",
        TopicMessageType::Delay => "delay",
        TopicMessageType::Transaction => "transaction",
    }
}

/// Checks the number of messages in one send. Errors: BAD_REQUEST (none),
/// PAYLOAD_TOO_LARGE (more than `max_messages_per_send`).
pub fn check_send_count(n: usize, max_messages_per_send: usize) -> Result<(), BrokerError> {
    if n == 0 {
        return Err(refuse(ErrorKind::BadRequest, "no messages to send"));
    }
    if n > max_messages_per_send {
        return Err(refuse(
            ErrorKind::PayloadTooLarge,
            format!("{n} messages in one send; at most {max_messages_per_send} are allowed"),
        ));
    }
    Ok(())
}

impl Broker {
    /// Stores the messages of one send in one Raft entry and answers once it is
    /// committed, with each message's queue offset, in order. `messages` are the
    /// protocol's messages as they are converted, in order (a conversion is an
    /// `Err` when the message is refused); the id of each converted message is
    /// pushed to `ids` as it is converted, so a failed send can still name the
    /// messages it took in. Errors: `check_send_count`'s, then the first refusal
    /// (conversion, all messages
    /// of one send on one topic, TOPIC_NOT_FOUND, FORBIDDEN when the topic is not
    /// writable, the message against its topic's type, ILLEGAL_DELIVERY_TIME for
    /// a delay message due too far ahead), then the write's (an
    /// unknown outcome when it may still commit). Nothing is stored unless every
    /// message passes. A delay message due later is stored as a timer
    /// ([`crate::timers`]); its queue offset is then its timer queue's. A
    /// transactional message is stored as a half message
    /// ([`crate::transactions`]); its queue offset is then its half queue's, and
    /// its answer carries its transaction id.
    pub async fn send<I>(
        &self,
        messages: I,
        ids: &mut Vec<String>,
    ) -> Result<Vec<Placed>, BrokerError>
    where
        I: IntoIterator<Item = Result<Incoming, BrokerError>>,
        I::IntoIter: ExactSizeIterator,
    {
        self.send_checked(messages, ids, true).await
    }

    /// [`Self::send`], with the check of each message against its topic's
    /// type only when `check_types` (the 4.x protocol's clients know no topic
    /// types: `remoting::send`).
    pub async fn send_checked<I>(
        &self,
        messages: I,
        ids: &mut Vec<String>,
        check_types: bool,
    ) -> Result<Vec<Placed>, BrokerError>
    where
        I: IntoIterator<Item = Result<Incoming, BrokerError>>,
        I::IntoIter: ExactSizeIterator,
    {
        let messages = messages.into_iter();
        check_send_count(messages.len(), self.settings.max_messages_per_send)?;
        let mut records = Vec::with_capacity(messages.len());
        let mut topic_cfg: Option<TopicConfig> = None;
        let mut transactional = Vec::with_capacity(messages.len());
        // (message type, body bytes) of each message, for the metrics.
        let mut counted = Vec::with_capacity(messages.len());
        for inc in messages {
            let inc = inc?;
            counted.push((metric_type(inc.message_type()), inc.record.body.len()));
            ids.push(inc.message_id.clone());
            let topic = match &topic_cfg {
                Some(t) if t.name == inc.record.topic => t.clone(),
                Some(_) => {
                    return Err(refuse(
                        ErrorKind::BadRequest,
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
                    ErrorKind::Forbidden,
                    format!("topic {} is not writable", topic.name),
                ));
            }
            if check_types {
                check_type(&topic, &inc)?;
            }
            let mut rec = inc.record;
            rec.queue_id = choose_queue(
                topic.queue_count,
                inc.message_group.as_deref(),
                inc.client_queue_id,
                self.next_rr(),
            );
            let transaction = inc.transaction;
            if transaction {
                let immunity_ms = inc
                    .check_immunity_ms
                    .unwrap_or(self.settings.transaction_timeout_ms);
                rec = into_half(rec, immunity_ms.div_ceil(1000));
            } else if let Some(at) = inc.deliver_at_ms {
                let now = ledgermq_store::store::now_ms();
                check_delivery_time(at, now, self.settings.max_delay_ms)?;
                // Due already: stored as a normal message, as RocketMQ does.
                if at > now {
                    rec = into_timer(rec, at);
                }
            }
            records.push(rec);
            transactional.push(transaction);
        }
        // RaftNode waits for a leader (up to its write timeout) without copying the
        // messages; a write that reached a leader is never sent again here.
        let sent = records.len();
        let placed = self.node.write_messages(records).await?;
        // One queue offset per message, in order: the answer pairs them up.
        assert_eq!(
            placed.len(),
            sent,
            "a send answered with another number of placements"
        );
        if let Some(topic) = &topic_cfg {
            // Usually one type per send: one call per run of the same type.
            for run in counted.chunk_by(|a, b| a.0 == b.0) {
                let bytes = run.iter().map(|(_, b)| *b);
                self.metrics.messages_in(&topic.name, run[0].0, bytes);
            }
        }
        Ok(placed
            .into_iter()
            .zip(transactional)
            .map(|(p, t)| Placed {
                queue_id: p.queue_id,
                queue_offset: p.queue_offset,
                physical_offset: p.physical_offset,
                transaction_id: t.then(|| transaction_id(p.queue_offset)),
            })
            .collect())
    }
}

/// Where one message of a send was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// Its queue id (a timer's or a half message's internal queue's: 0).
    pub queue_id: i32,
    /// Its queue offset (a timer's or a half message's in their internal queue).
    pub queue_offset: u64,
    /// Its CommitLog offset on the node that applied it (the same on every
    /// replica that holds the whole log).
    pub physical_offset: u64,
    /// A transactional message's transaction id.
    pub transaction_id: Option<String>,
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

    fn incoming(group: Option<&str>) -> Incoming {
        Incoming {
            record: ledgermq_store::MessageRecord::message("T", -1, b"x".to_vec(), 0),
            message_id: "id".into(),
            message_group: group.map(str::to_owned),
            client_queue_id: None,
            deliver_at_ms: None,
            transaction: false,
            check_immunity_ms: None,
        }
    }

    #[test]
    fn a_topic_takes_messages_of_its_type_and_a_mixed_topic_every_type() {
        use TopicMessageType::*;
        let topic = |t| TopicConfig {
            name: "T".into(),
            queue_count: 4,
            perm: ledgermq_meta::TopicPerm::READ_WRITE,
            message_type: t,
        };
        let (normal, fifo) = (incoming(None), incoming(Some("g")));
        assert!(check_type(&topic(Normal), &normal).is_ok());
        assert!(check_type(&topic(Fifo), &fifo).is_ok());
        assert!(check_type(&topic(Mixed), &normal).is_ok());
        assert!(check_type(&topic(Mixed), &fifo).is_ok());
        for (t, m) in [
            (Normal, &fifo),
            (Fifo, &normal),
            (Delay, &normal),
            (Delay, &fifo),
            (Transaction, &normal),
        ] {
            let e = check_type(&topic(t), m).unwrap_err();
            assert_eq!(
                e.kind(),
                ErrorKind::MessagePropertyConflictWithType,
                "{t:?} topic, {:?} message",
                m.message_type()
            );
        }
    }
}
