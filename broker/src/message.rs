//! The broker's message rules, whatever the protocol: stored property names, the
//! checks a sent message passes (the reference proxy's), what a producer asks to
//! store ([`Incoming`]) and what a consumer is handed ([`Delivery`]). No I/O, no
//! protocol types: each protocol adapter converts its messages and calls these
//! checks (`grpc::message` for the 5.x protocol).
//!
//! Property names follow RocketMQ's `MessageConst`: `TAGS`, `KEYS` (space-separated),
//! `UNIQ_KEY` (the client-made message id), `__SHARDINGKEY` (the message group).

use ledgermq_meta::TopicMessageType;
use ledgermq_store::record::{PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY};
use ledgermq_store::MessageRecord;
use ledgermq_store::{half_index, timer_index};

use crate::error::{refuse, BrokerError, ErrorKind};

/// Property holding the message group (RocketMQ `MessageConst.PROPERTY_SHARDING_KEY`).
pub const PROPERTY_MESSAGE_GROUP: &str = "__SHARDINGKEY";
/// Property holding the body encoding when it is not IDENTITY (`GZIP`).
pub const PROPERTY_BODY_ENCODING: &str = "__BODY_ENCODING";
/// Property holding the client's trace context.
pub const PROPERTY_TRACE_CONTEXT: &str = "__TRACE_CONTEXT";
/// Property of a dead-lettered message: the topic it came from.
pub const PROPERTY_ORIGIN_TOPIC: &str = "__DLQ_ORIGIN_TOPIC";

/// Property names users may not set: the broker owns them (a user property
/// naming a timer or a half message could otherwise cancel, redirect or end one).
pub const RESERVED: [&str; 16] = [
    PROPERTY_TAGS,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    PROPERTY_MESSAGE_GROUP,
    PROPERTY_BODY_ENCODING,
    PROPERTY_TRACE_CONTEXT,
    PROPERTY_ORIGIN_TOPIC,
    timer_index::PROPERTY_REAL_TOPIC,
    timer_index::PROPERTY_REAL_QID,
    timer_index::PROPERTY_TIMER_DELIVER_MS,
    timer_index::PROPERTY_TIMER_QUEUE_OFFSET,
    half_index::PROPERTY_TRANSACTION_PREPARED,
    half_index::PROPERTY_PRODUCER_GROUP,
    half_index::PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    half_index::PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    half_index::PROPERTY_TRANSACTION_END,
];

/// Topics whose names begin so are the broker's own (RocketMQ's
/// `TopicValidator.SYSTEM_TOPIC_PREFIX`): clients neither send to nor receive
/// from them, and admins do not make them.
pub const SYSTEM_TOPIC_PREFIX: &str = "rmq_sys_";
/// The other prefix of RocketMQ's system topics (`RMQ_SYS_TRANS_HALF_TOPIC`,
/// `RMQ_SYS_TRANS_OP_HALF_TOPIC`, `RMQ_SYS_TRACE_TOPIC`: `TopicValidator`'s
/// system topic set): the same rule.
pub const SYSTEM_TOPIC_PREFIX_UPPER: &str = "RMQ_SYS_";

/// Most characters of a consumer group name (RocketMQ: 255).
pub const MAX_GROUP_CHARS: usize = 255;
/// Most characters of a message group (RocketMQ proxy: 64).
pub const MAX_MESSAGE_GROUP_CHARS: usize = 64;
/// Most bytes of a tag or a key.
pub const MAX_TAG_OR_KEY_BYTES: usize = 1024;

/// Checks a topic name (`^[%|a-zA-Z0-9_-]+$`, at most 127 characters, not a
/// system topic: the `rmq_sys_` / `RMQ_SYS_` prefixes, or RocketMQ's default
/// topic [`crate::announce::DEFAULT_TOPIC`], which only names where new
/// topics are created). Error: `ILLEGAL_TOPIC`.
pub fn check_topic(topic: &str) -> Result<(), BrokerError> {
    ledgermq_store::consume_queue::validate_topic(topic)
        .map_err(|e| refuse(ErrorKind::IllegalTopic, e.to_string()))?;
    if topic == crate::announce::DEFAULT_TOPIC {
        return Err(refuse(
            ErrorKind::IllegalTopic,
            format!(
                "topic {topic} is RocketMQ's default topic, which names where new topics are \
                 created: it holds no messages"
            ),
        ));
    }
    if topic.starts_with(SYSTEM_TOPIC_PREFIX) || topic.starts_with(SYSTEM_TOPIC_PREFIX_UPPER) {
        return Err(refuse(
            ErrorKind::IllegalTopic,
            format!(
                "topic {topic} is a system topic ({SYSTEM_TOPIC_PREFIX}* or \
                 {SYSTEM_TOPIC_PREFIX_UPPER}*), the broker's own"
            ),
        ));
    }
    Ok(())
}

/// Checks a consumer group name (same characters as topics, at most 255).
/// Error: `ILLEGAL_CONSUMER_GROUP`.
pub fn check_group(group: &str) -> Result<(), BrokerError> {
    let bad = group.is_empty()
        || group.len() > MAX_GROUP_CHARS
        || !group
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '%' | '|' | '_' | '-'));
    if bad {
        return Err(refuse(
            ErrorKind::IllegalConsumerGroup,
            format!(
                "consumer group {group:?} is illegal: 1 to {MAX_GROUP_CHARS} characters of [%|a-zA-Z0-9_-]"
            ),
        ));
    }
    Ok(())
}

/// What a producer asked to store, checked and mapped to a record (its queue id and
/// store fields are set later).
#[derive(Debug, Clone)]
pub struct Incoming {
    /// The record to propose (queue id -1 until a queue is chosen).
    pub record: MessageRecord,
    /// The client-made message id.
    pub message_id: String,
    /// The message group of a FIFO message.
    pub message_group: Option<String>,
    /// The queue the client picked, if it named one.
    pub client_queue_id: Option<i32>,
    /// A delay message's delivery time, ms since the Unix epoch.
    pub deliver_at_ms: Option<i64>,
    /// A transactional message: stored as a half message until it is ended.
    pub transaction: bool,
    /// How long after it is stored a transactional message is first checked
    /// back, ms, if the client said (its orphaned transaction recovery
    /// duration); else the broker's `transaction_timeout_ms`.
    pub check_immunity_ms: Option<u64>,
}

impl Incoming {
    /// The message's type: TRANSACTION for a transactional message, DELAY when
    /// it has a delivery time, FIFO when it has a message group (never two of
    /// them: `grpc::message::incoming` refuses that), else NORMAL.
    pub fn message_type(&self) -> TopicMessageType {
        if self.transaction {
            TopicMessageType::Transaction
        } else if self.deliver_at_ms.is_some() {
            TopicMessageType::Delay
        } else if self.message_group.is_some() {
            TopicMessageType::Fifo
        } else {
            TopicMessageType::Normal
        }
    }
}

/// Longest message id, bytes.
pub const MAX_MESSAGE_ID_BYTES: usize = 128;

/// The property-encoding separators (0x01, 0x02) and other control characters
/// would corrupt the stored properties.
pub fn has_separator(s: &str) -> bool {
    s.chars().any(char::is_control)
}

/// Checks a client-made message id. Error: `IllegalMessageId`.
pub fn check_message_id(id: &str) -> Result<(), BrokerError> {
    if id.is_empty() || id.len() > MAX_MESSAGE_ID_BYTES || has_separator(id) {
        return Err(refuse(
            ErrorKind::IllegalMessageId,
            "message id is empty, longer than 128 bytes or holds a control character",
        ));
    }
    Ok(())
}

/// Checks a body's size against `max_body_bytes`. Errors: `BadRequest` (empty),
/// `MessageBodyTooLarge`.
pub fn check_body(len_bytes: usize, max_body_bytes: usize) -> Result<(), BrokerError> {
    if len_bytes == 0 {
        return Err(refuse(ErrorKind::BadRequest, "message body is empty"));
    }
    if len_bytes > max_body_bytes {
        return Err(refuse(
            ErrorKind::MessageBodyTooLarge,
            format!("message body is {len_bytes} bytes; at most {max_body_bytes} are allowed"),
        ));
    }
    Ok(())
}

/// Checks a user property. Error: `IllegalMessagePropertyKey` (empty or reserved
/// name, a control character in name or value).
pub fn check_user_property(k: &str, v: &str) -> Result<(), BrokerError> {
    if k.is_empty() || RESERVED.contains(&k) || has_separator(k) || has_separator(v) {
        return Err(refuse(
            ErrorKind::IllegalMessagePropertyKey,
            format!("user property {k:?} is reserved, empty or holds a control character"),
        ));
    }
    Ok(())
}

/// Checks a (non-empty) tag. Error: `IllegalMessageTag`.
pub fn check_tag(tag: &str) -> Result<(), BrokerError> {
    if tag.len() > MAX_TAG_OR_KEY_BYTES
        || tag.contains('|')
        || tag.chars().any(char::is_whitespace)
        || has_separator(tag)
    {
        return Err(refuse(
            ErrorKind::IllegalMessageTag,
            format!("tag {tag:?} is illegal: no '|', whitespace or control characters"),
        ));
    }
    Ok(())
}

/// Checks one key. Error: `IllegalMessageKey`.
pub fn check_key(k: &str) -> Result<(), BrokerError> {
    if k.is_empty()
        || k.len() > MAX_TAG_OR_KEY_BYTES
        || k.chars().any(char::is_whitespace)
        || has_separator(k)
    {
        return Err(refuse(
            ErrorKind::IllegalMessageKey,
            format!("key {k:?} is illegal: non-empty, no whitespace or control characters"),
        ));
    }
    Ok(())
}

/// Checks a (non-empty) message group. Error: `IllegalMessageGroup`.
pub fn check_message_group(g: &str) -> Result<(), BrokerError> {
    if g.chars().count() > MAX_MESSAGE_GROUP_CHARS || has_separator(g) {
        return Err(refuse(
            ErrorKind::IllegalMessageGroup,
            format!("message group is longer than {MAX_MESSAGE_GROUP_CHARS} characters or holds a control character"),
        ));
    }
    Ok(())
}

/// How a stored message is delivered: the delivery's own fields.
#[derive(Debug, Clone)]
pub struct DeliveryFields {
    /// The receipt handle to ack with.
    pub receipt_handle: String,
    /// Queue offset of the message.
    pub queue_offset: u64,
    /// Invisible duration of this delivery, ms.
    pub invisible_ms: u64,
    /// Delivery attempt, from 1.
    pub delivery_attempt: u32,
}

/// A stored message handed to a consumer: the record as stored, where it is in
/// the CommitLog, and the delivery's own fields.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The record (topic, queue, properties, body, timestamps, hosts).
    pub record: MessageRecord,
    /// Its physical offset in the CommitLog (the message id of a message stored
    /// without one).
    pub physical_offset: u64,
    /// This delivery's fields.
    pub fields: DeliveryFields,
}

/// The copy of `rec` stored in the dead-letter topic `dlq_topic` (queue 0): it
/// names the topic it came from ([`PROPERTY_ORIGIN_TOPIC`]) and is a normal
/// message: no message group (the dead-letter queue is not FIFO), and none of
/// a delivered delay message's timer properties (a consumer of the dead-letter
/// queue would be told it is a delay message, and its dispatch would take it
/// for a timer's delivered copy), and no `TRAN_PREPARED_QUEUE_OFFSET` of a
/// committed transactional message (its dispatch would take it for a later end
/// of that half, a losing commit copy, and place it in no queue).
pub fn dead_letter_copy(mut rec: MessageRecord, dlq_topic: String) -> MessageRecord {
    rec.properties
        .insert(PROPERTY_ORIGIN_TOPIC.into(), rec.topic.clone());
    rec.topic = dlq_topic;
    rec.queue_id = 0;
    for p in [
        PROPERTY_MESSAGE_GROUP,
        timer_index::PROPERTY_REAL_TOPIC,
        timer_index::PROPERTY_REAL_QID,
        timer_index::PROPERTY_TIMER_DELIVER_MS,
        timer_index::PROPERTY_TIMER_QUEUE_OFFSET,
        half_index::PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    ] {
        rec.properties.remove(p);
    }
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_topics_and_rocketmqs_default_topic_are_refused() {
        assert!(check_topic("Orders").is_ok());
        for t in ["TBW102", "rmq_sys_x", "RMQ_SYS_X", "bad topic"] {
            assert!(check_topic(t).is_err(), "{t}");
        }
    }

    #[test]
    fn a_dead_letter_copy_is_a_normal_message_of_the_dead_letter_queue() {
        // A delivered delay message of a FIFO topic, as a consumer got it.
        let delivered = MessageRecord::message("Orders", 3, b"late".to_vec(), 1_000)
            .with_property(PROPERTY_MESSAGE_GROUP, "g1")
            .with_property(PROPERTY_TAGS, "TagA")
            .with_property(timer_index::PROPERTY_TIMER_DELIVER_MS, "5000")
            .with_property(timer_index::PROPERTY_TIMER_QUEUE_OFFSET, "17");
        let copy = dead_letter_copy(delivered, "%DLQ%G".into());
        assert_eq!((copy.topic.as_str(), copy.queue_id), ("%DLQ%G", 0));
        let p = &copy.properties;
        assert_eq!(
            p.get(PROPERTY_ORIGIN_TOPIC).map(String::as_str),
            Some("Orders")
        );
        assert_eq!(p.get(PROPERTY_TAGS).map(String::as_str), Some("TagA"));
        // Not FIFO, not a delay message again: a consumer of the dead-letter
        // queue sees a normal message, and its dispatch does not touch the timer
        // index.
        for gone in [
            PROPERTY_MESSAGE_GROUP,
            timer_index::PROPERTY_TIMER_DELIVER_MS,
            timer_index::PROPERTY_TIMER_QUEUE_OFFSET,
        ] {
            assert!(!p.contains_key(gone), "{gone} kept: {p:?}");
        }
    }

    #[test]
    fn a_dead_letter_copy_of_a_committed_transactional_message_ends_no_half() {
        // A committed transactional message, as a consumer got it: its
        // TRAN_PREPARED_QUEUE_OFFSET names the half it ended. A copy still
        // carrying it would be taken for a later end of that half, a losing
        // commit copy, and placed in no queue.
        let delivered = MessageRecord::message("Orders", 1, b"paid".to_vec(), 1_000)
            .with_property(half_index::PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, "41")
            .with_property(half_index::PROPERTY_PRODUCER_GROUP, "Orders");
        let copy = dead_letter_copy(delivered, "%DLQ%G".into());
        assert!(
            !copy
                .properties
                .contains_key(half_index::PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET),
            "{:?}",
            copy.properties
        );
    }

    #[test]
    fn group_names_are_checked() {
        assert!(check_group("GID_ok-1%|_").is_ok());
        assert_eq!(
            check_group("a.b").unwrap_err().kind(),
            ErrorKind::IllegalConsumerGroup
        );
        assert_eq!(
            check_group("").unwrap_err().kind(),
            ErrorKind::IllegalConsumerGroup
        );
        assert_eq!(
            check_group(&"g".repeat(MAX_GROUP_CHARS + 1))
                .unwrap_err()
                .kind(),
            ErrorKind::IllegalConsumerGroup
        );
    }

    #[test]
    fn message_fields_are_checked() {
        assert!(check_message_id("01ABC").is_ok());
        assert!(check_message_id("").is_err());
        assert!(check_message_id(&"x".repeat(MAX_MESSAGE_ID_BYTES + 1)).is_err());
        assert_eq!(check_body(0, 10).unwrap_err().kind(), ErrorKind::BadRequest);
        assert_eq!(
            check_body(11, 10).unwrap_err().kind(),
            ErrorKind::MessageBodyTooLarge
        );
        assert!(check_body(10, 10).is_ok());
        assert!(check_user_property("color", "red").is_ok());
        assert!(check_user_property(PROPERTY_TAGS, "x").is_err());
        assert!(check_user_property("k", "a\u{1}b").is_err());
        assert!(check_tag("TagA").is_ok());
        assert!(check_tag("a|b").is_err());
        assert!(check_tag("a b").is_err());
        assert!(check_key("k1").is_ok());
        assert!(check_key("").is_err());
        assert!(check_message_group(&"g".repeat(MAX_MESSAGE_GROUP_CHARS)).is_ok());
        assert!(check_message_group(&"g".repeat(MAX_MESSAGE_GROUP_CHARS + 1)).is_err());
    }
}
