//! Converting between the protocol's `Message` (apache.rocketmq.v2, definition.proto)
//! and the store's [`MessageRecord`], with the checks the reference proxy makes on
//! the way in. No I/O.
//!
//! Property names follow RocketMQ's `MessageConst`: `TAGS`, `KEYS` (space-separated),
//! `UNIQ_KEY` (the client-made message id), `__SHARDINGKEY` (the message group).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use ledgermq_store::record::{PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY};
use ledgermq_store::{MessageRecord, RecordView};

use crate::error::{refuse, BrokerError};
use crate::pb::{self, Code};

/// Property holding the message group (RocketMQ `MessageConst.PROPERTY_SHARDING_KEY`).
pub const PROPERTY_MESSAGE_GROUP: &str = "__SHARDINGKEY";
/// Property holding the body encoding when it is not IDENTITY (`GZIP`).
pub const PROPERTY_BODY_ENCODING: &str = "__BODY_ENCODING";
/// Property holding the client's trace context.
pub const PROPERTY_TRACE_CONTEXT: &str = "__TRACE_CONTEXT";
/// Property of a dead-lettered message: the topic it came from.
pub const PROPERTY_ORIGIN_TOPIC: &str = "__DLQ_ORIGIN_TOPIC";

/// Property names users may not set: the broker owns them.
const RESERVED: [&str; 7] = [
    PROPERTY_TAGS,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    PROPERTY_MESSAGE_GROUP,
    PROPERTY_BODY_ENCODING,
    PROPERTY_TRACE_CONTEXT,
    PROPERTY_ORIGIN_TOPIC,
];

/// Most characters of a consumer group name (RocketMQ: 255).
pub const MAX_GROUP_CHARS: usize = 255;
/// Most characters of a message group (RocketMQ proxy: 64).
pub const MAX_MESSAGE_GROUP_CHARS: usize = 64;
/// Most bytes of a tag or a key.
pub const MAX_TAG_OR_KEY_BYTES: usize = 1024;

/// Checks a topic name (`^[%|a-zA-Z0-9_-]+$`, at most 127 characters).
/// Error: `ILLEGAL_TOPIC`.
pub fn check_topic(topic: &str) -> Result<(), BrokerError> {
    ledgermq_store::consume_queue::validate_topic(topic)
        .map_err(|e| refuse(Code::IllegalTopic, e.to_string()))
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
            Code::IllegalConsumerGroup,
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
}

/// Checks one sent message and maps it to a record. Errors (status codes of the
/// protocol): `ILLEGAL_TOPIC`, `ILLEGAL_MESSAGE_ID`, `ILLEGAL_MESSAGE_TAG`,
/// `ILLEGAL_MESSAGE_KEY`, `ILLEGAL_MESSAGE_GROUP`, `ILLEGAL_MESSAGE_PROPERTY_KEY`,
/// `BAD_REQUEST` (empty body, missing fields), `MESSAGE_BODY_TOO_LARGE` (over
/// `max_body_bytes`), `UNSUPPORTED` (delay and transactional messages: not built yet;
/// a message type the protocol does not define).
pub fn incoming(m: pb::Message, max_body_bytes: usize) -> Result<Incoming, BrokerError> {
    let topic = m
        .topic
        .map(|t| t.name)
        .ok_or_else(|| refuse(Code::IllegalTopic, "message without a topic"))?;
    check_topic(&topic)?;
    let sp = m
        .system_properties
        .ok_or_else(|| refuse(Code::BadRequest, "message without system properties"))?;
    let message_id = sp.message_id;
    if message_id.is_empty() || message_id.len() > 128 || has_separator(&message_id) {
        return Err(refuse(
            Code::IllegalMessageId,
            "message id is empty, longer than 128 bytes or holds a control character",
        ));
    }
    // A type this protocol revision does not define (a newer client's, or garbage)
    // is refused rather than stored as a normal message. The reference proxy reads
    // the type from the properties instead and would answer OK.
    let mtype = pb::MessageType::try_from(sp.message_type).map_err(|_| {
        refuse(
            Code::Unsupported,
            format!(
                "message type {} is not one this broker knows (NORMAL = 1, FIFO = 2)",
                sp.message_type
            ),
        )
    })?;
    if matches!(mtype, pb::MessageType::Delay | pb::MessageType::Transaction)
        || sp.delivery_timestamp.is_some()
    {
        return Err(refuse(
            Code::Unsupported,
            "delay and transactional messages are not supported by this broker yet",
        ));
    }
    if m.body.is_empty() {
        return Err(refuse(Code::BadRequest, "message body is empty"));
    }
    if m.body.len() > max_body_bytes {
        return Err(refuse(
            Code::MessageBodyTooLarge,
            format!(
                "message body is {} bytes; at most {max_body_bytes} are allowed",
                m.body.len()
            ),
        ));
    }
    let mut props: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in m.user_properties {
        if k.is_empty() || RESERVED.contains(&k.as_str()) || has_separator(&k) || has_separator(&v)
        {
            return Err(refuse(
                Code::IllegalMessagePropertyKey,
                format!("user property {k:?} is reserved, empty or holds a control character"),
            ));
        }
        props.insert(k, v);
    }
    if let Some(tag) = sp.tag.filter(|t| !t.is_empty()) {
        if tag.len() > MAX_TAG_OR_KEY_BYTES
            || tag.contains('|')
            || tag.chars().any(char::is_whitespace)
            || has_separator(&tag)
        {
            return Err(refuse(
                Code::IllegalMessageTag,
                format!("tag {tag:?} is illegal: no '|', whitespace or control characters"),
            ));
        }
        props.insert(PROPERTY_TAGS.into(), tag);
    }
    if !sp.keys.is_empty() {
        for k in &sp.keys {
            if k.is_empty()
                || k.len() > MAX_TAG_OR_KEY_BYTES
                || k.chars().any(char::is_whitespace)
                || has_separator(k)
            {
                return Err(refuse(
                    Code::IllegalMessageKey,
                    format!("key {k:?} is illegal: non-empty, no whitespace or control characters"),
                ));
            }
        }
        props.insert(PROPERTY_KEYS.into(), sp.keys.join(" "));
    }
    let message_group = sp.message_group.filter(|g| !g.is_empty());
    if let Some(g) = &message_group {
        if g.chars().count() > MAX_MESSAGE_GROUP_CHARS || has_separator(g) {
            return Err(refuse(
                Code::IllegalMessageGroup,
                format!("message group is longer than {MAX_MESSAGE_GROUP_CHARS} characters or holds a control character"),
            ));
        }
        props.insert(PROPERTY_MESSAGE_GROUP.into(), g.clone());
    } else if mtype == pb::MessageType::Fifo {
        return Err(refuse(
            Code::IllegalMessageGroup,
            "a FIFO message needs a message group",
        ));
    }
    if sp.body_encoding == pb::Encoding::Gzip as i32 {
        props.insert(PROPERTY_BODY_ENCODING.into(), "GZIP".into());
    }
    if let Some(t) = sp
        .trace_context
        .filter(|t| !t.is_empty() && !has_separator(t))
    {
        props.insert(PROPERTY_TRACE_CONTEXT.into(), t);
    }
    props.insert(PROPERTY_UNIQ_KEY.into(), message_id.clone());
    let born_ms = sp.born_timestamp.map_or(0, |t| timestamp_ms(&t));
    let mut record = MessageRecord::message(&topic, -1, m.body, born_ms);
    record.born_host = SocketAddr::new(
        sp.born_host
            .parse::<IpAddr>()
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        0,
    );
    record.properties = props;
    Ok(Incoming {
        record,
        message_id,
        message_group,
        client_queue_id: Some(sp.queue_id),
    })
}

/// The property-encoding separators (0x01, 0x02) and other control characters
/// would corrupt the stored properties.
fn has_separator(s: &str) -> bool {
    s.chars().any(char::is_control)
}

/// Milliseconds since the Unix epoch of a protobuf timestamp.
pub fn timestamp_ms(t: &prost_types::Timestamp) -> i64 {
    t.seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(t.nanos) / 1_000_000)
}

/// A protobuf timestamp of `ms` since the Unix epoch.
pub fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

/// A protobuf duration of `ms`.
pub fn duration(ms: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// Milliseconds of a protobuf duration (negative durations count as 0).
pub fn duration_ms(d: &prost_types::Duration) -> u64 {
    (d.seconds.max(0) as u64)
        .saturating_mul(1000)
        .saturating_add((d.nanos.max(0) as u64) / 1_000_000)
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

/// The protocol message for a stored record. The body digest is a CRC32 of the body
/// as 8 uppercase hex digits (the Python client verifies it).
pub fn outgoing(view: &RecordView<'_>, d: Option<&DeliveryFields>) -> pb::Message {
    let rec = view.to_record();
    let (body, props) = (rec.body, rec.properties);
    let mut user = BTreeMap::new();
    for (k, v) in &props {
        if !RESERVED.contains(&k.as_str()) {
            user.insert(k.clone(), v.clone());
        }
    }
    let message_group = props.get(PROPERTY_MESSAGE_GROUP).cloned();
    let sp = pb::SystemProperties {
        tag: props.get(PROPERTY_TAGS).cloned(),
        keys: props
            .get(PROPERTY_KEYS)
            .map(|k| {
                k.split(' ')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default(),
        message_id: props
            .get(PROPERTY_UNIQ_KEY)
            .cloned()
            .unwrap_or_else(|| format!("{:032X}", view.physical_offset())),
        body_digest: Some(pb::Digest {
            r#type: pb::DigestType::Crc32 as i32,
            checksum: format!("{:08X}", crc32fast::hash(&body)),
        }),
        body_encoding: if props.get(PROPERTY_BODY_ENCODING).map(String::as_str) == Some("GZIP") {
            pb::Encoding::Gzip as i32
        } else {
            pb::Encoding::Identity as i32
        },
        message_type: if message_group.is_some() {
            pb::MessageType::Fifo as i32
        } else {
            pb::MessageType::Normal as i32
        },
        born_timestamp: Some(timestamp(rec.born_timestamp_ms)),
        born_host: rec.born_host.ip().to_string(),
        store_timestamp: Some(timestamp(rec.store_timestamp_ms)),
        store_host: rec.store_host.to_string(),
        delivery_timestamp: None,
        receipt_handle: d.map(|d| d.receipt_handle.clone()),
        queue_id: rec.queue_id,
        queue_offset: d.map(|d| d.queue_offset as i64),
        invisible_duration: d.map(|d| duration(d.invisible_ms)),
        delivery_attempt: d.map(|d| d.delivery_attempt as i32),
        message_group,
        trace_context: props.get(PROPERTY_TRACE_CONTEXT).cloned(),
        orphaned_transaction_recovery_duration: None,
        dead_letter_queue: None,
    };
    pb::Message {
        topic: Some(pb::Resource {
            resource_namespace: String::new(),
            name: rec.topic,
        }),
        user_properties: user.into_iter().collect(),
        system_properties: Some(sp),
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(topic: &str, body: &[u8]) -> pb::Message {
        pb::Message {
            topic: Some(pb::Resource {
                resource_namespace: String::new(),
                name: topic.into(),
            }),
            user_properties: [("color".to_string(), "red".to_string())].into(),
            system_properties: Some(pb::SystemProperties {
                tag: Some("TagA".into()),
                keys: vec!["k1".into(), "k2".into()],
                message_id: "01ABC".into(),
                message_type: pb::MessageType::Normal as i32,
                born_host: "10.0.0.7".into(),
                born_timestamp: Some(timestamp(1_700_000_000_123)),
                ..Default::default()
            }),
            body: body.to_vec(),
        }
    }

    fn code(r: Result<Incoming, BrokerError>) -> Code {
        r.unwrap_err().code()
    }

    #[test]
    fn a_message_round_trips_through_a_record() {
        let inc = incoming(msg("T1", b"hello"), 1024).unwrap();
        assert_eq!(inc.message_id, "01ABC");
        let mut rec = inc.record;
        rec.queue_id = 2;
        rec.store_timestamp_ms = 1_700_000_000_999;
        let props = ledgermq_store::record::encode_properties(&rec.properties);
        let len = ledgermq_store::record::encoded_len(&rec, &props).unwrap();
        let mut bytes = Vec::new();
        let at = ledgermq_store::record::Placement {
            term: 1,
            log_index: 1,
            entry_remaining: 0,
            physical_offset: 0,
        };
        ledgermq_store::record::encode_into(&mut bytes, &rec, &props, len, at);
        let view = RecordView::parse(&bytes).unwrap();
        let d = DeliveryFields {
            receipt_handle: "h".into(),
            queue_offset: 9,
            invisible_ms: 1500,
            delivery_attempt: 2,
        };
        let out = outgoing(&view, Some(&d));
        let sp = out.system_properties.unwrap();
        assert_eq!(out.body, b"hello");
        assert_eq!(out.topic.unwrap().name, "T1");
        assert_eq!(out.user_properties.get("color").unwrap(), "red");
        assert_eq!(out.user_properties.len(), 1);
        assert_eq!(sp.tag.as_deref(), Some("TagA"));
        assert_eq!(sp.keys, vec!["k1", "k2"]);
        assert_eq!(sp.message_id, "01ABC");
        assert_eq!(sp.queue_id, 2);
        assert_eq!(sp.queue_offset, Some(9));
        assert_eq!(sp.delivery_attempt, Some(2));
        assert_eq!(sp.receipt_handle.as_deref(), Some("h"));
        assert_eq!(sp.born_host, "10.0.0.7");
        assert_eq!(timestamp_ms(&sp.born_timestamp.unwrap()), 1_700_000_000_123);
        assert_eq!(duration_ms(&sp.invisible_duration.unwrap()), 1500);
        assert_eq!(
            sp.body_digest.unwrap().checksum,
            format!("{:08X}", crc32fast::hash(b"hello"))
        );
        assert_eq!(sp.message_type, pb::MessageType::Normal as i32);
    }

    #[test]
    fn bad_input_gets_the_matching_code() {
        assert_eq!(
            code(incoming(msg("bad topic", b"x"), 10)),
            Code::IllegalTopic
        );
        assert_eq!(code(incoming(msg("T", b""), 10)), Code::BadRequest);
        assert_eq!(
            code(incoming(msg("T", &[0; 11]), 10)),
            Code::MessageBodyTooLarge
        );
        let mut m = msg("T", b"x");
        m.system_properties.as_mut().unwrap().tag = Some("a||b".into());
        assert_eq!(code(incoming(m, 10)), Code::IllegalMessageTag);
        let mut m = msg("T", b"x");
        m.system_properties.as_mut().unwrap().keys = vec!["a b".into()];
        assert_eq!(code(incoming(m, 10)), Code::IllegalMessageKey);
        let mut m = msg("T", b"x");
        m.user_properties.insert("TAGS".into(), "x".into());
        assert_eq!(code(incoming(m, 10)), Code::IllegalMessagePropertyKey);
        let mut m = msg("T", b"x");
        m.user_properties.insert("k".into(), "a\u{1}b".into());
        assert_eq!(code(incoming(m, 10)), Code::IllegalMessagePropertyKey);
        let mut m = msg("T", b"x");
        m.system_properties.as_mut().unwrap().message_id.clear();
        assert_eq!(code(incoming(m, 10)), Code::IllegalMessageId);
        let mut m = msg("T", b"x");
        m.system_properties.as_mut().unwrap().message_type = pb::MessageType::Delay as i32;
        assert_eq!(code(incoming(m, 10)), Code::Unsupported);
        let mut m = msg("T", b"x");
        m.system_properties.as_mut().unwrap().delivery_timestamp = Some(timestamp(5));
        assert_eq!(code(incoming(m, 10)), Code::Unsupported);
        let mut m = msg("T", b"x");
        m.system_properties.as_mut().unwrap().message_type = pb::MessageType::Fifo as i32;
        assert_eq!(code(incoming(m, 10)), Code::IllegalMessageGroup);
        let mut m = msg("T", b"x");
        m.system_properties.as_mut().unwrap().message_group = Some("g".repeat(65));
        assert_eq!(code(incoming(m, 10)), Code::IllegalMessageGroup);
        assert!(check_group("GID_ok-1").is_ok());
        assert_eq!(
            check_group("a.b").unwrap_err().code(),
            Code::IllegalConsumerGroup
        );
        assert_eq!(
            check_group("").unwrap_err().code(),
            Code::IllegalConsumerGroup
        );
    }

    #[test]
    fn time_conversions_round_trip() {
        for ms in [0i64, 1, 999, 1000, 1_700_000_000_123, -1] {
            assert_eq!(timestamp_ms(&timestamp(ms)), ms);
        }
        assert_eq!(duration_ms(&duration(12_345)), 12_345);
        // Client-sent extremes saturate instead of overflowing.
        let huge = prost_types::Duration {
            seconds: i64::MAX,
            nanos: 999_999_999,
        };
        assert_eq!(duration_ms(&huge), u64::MAX);
        let t = prost_types::Timestamp {
            seconds: i64::MIN,
            nanos: 0,
        };
        assert_eq!(timestamp_ms(&t), i64::MIN);
    }
}
