//! Converting between the 5.x protocol's `Message` (apache.rocketmq.v2,
//! definition.proto) and the broker's [`Incoming`] and [`Delivery`], with the checks
//! of [`crate::message`] on the way in, in the reference proxy's order. No I/O.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use ledgermq_store::half_index::PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET;
use ledgermq_store::record::{PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY};
use ledgermq_store::{timer_index, MessageRecord};

use crate::error::{refuse, BrokerError, ErrorKind};
use crate::message::{
    check_body, check_key, check_message_group, check_message_id, check_tag, check_topic,
    check_user_property, has_separator, Delivery, DeliveryFields, Incoming, PROPERTY_BODY_ENCODING,
    PROPERTY_MESSAGE_GROUP, PROPERTY_TRACE_CONTEXT, RESERVED,
};
use crate::pb;

/// Checks one sent message and maps it to a record. Errors (status codes of the
/// protocol): `ILLEGAL_TOPIC`, `ILLEGAL_MESSAGE_ID`, `ILLEGAL_MESSAGE_TAG`,
/// `ILLEGAL_MESSAGE_KEY`, `ILLEGAL_MESSAGE_GROUP`, `ILLEGAL_MESSAGE_PROPERTY_KEY`,
/// `BAD_REQUEST` (empty body, missing fields), `MESSAGE_BODY_TOO_LARGE` (over
/// `max_body_bytes`), `ILLEGAL_DELIVERY_TIME` (a DELAY message without a delivery
/// timestamp), `MESSAGE_PROPERTY_CONFLICT_WITH_TYPE` (a delivery timestamp and a
/// message group together; a transactional message with either), `UNSUPPORTED`
/// (a message type the protocol does not define); BAD_REQUEST also for a
/// transactional message's recovery duration over [`MAX_RECOVERY_MS`]. A message with a delivery
/// timestamp is a delay message whatever type it says, as the reference proxy
/// reads the type from the properties; how far ahead it may be is checked when
/// it is sent (`crate::send`).
pub fn incoming(m: pb::Message, max_body_bytes: usize) -> Result<Incoming, BrokerError> {
    let topic = m
        .topic
        .map(|t| t.name)
        .ok_or_else(|| refuse(ErrorKind::IllegalTopic, "message without a topic"))?;
    check_topic(&topic)?;
    let sp = m
        .system_properties
        .ok_or_else(|| refuse(ErrorKind::BadRequest, "message without system properties"))?;
    let message_id = sp.message_id;
    check_message_id(&message_id)?;
    // A type this protocol revision does not define (a newer client's, or garbage)
    // is refused rather than stored as a normal message. The reference proxy reads
    // the type from the properties instead and would answer OK.
    let mtype = pb::MessageType::try_from(sp.message_type).map_err(|_| {
        refuse(
            ErrorKind::Unsupported,
            format!(
                "message type {} is not one this broker knows (NORMAL = 1, FIFO = 2, \
                 DELAY = 3, TRANSACTION = 4)",
                sp.message_type
            ),
        )
    })?;
    let transaction = mtype == pb::MessageType::Transaction;
    let deliver_at_ms = sp.delivery_timestamp.as_ref().map(timestamp_ms);
    if transaction
        && (deliver_at_ms.is_some() || sp.message_group.as_ref().is_some_and(|g| !g.is_empty()))
    {
        return Err(refuse(
            ErrorKind::MessagePropertyConflictWithType,
            "a transactional message can have neither a delivery timestamp nor a message group",
        ));
    }
    let check_immunity_ms = match sp.orphaned_transaction_recovery_duration.as_ref() {
        Some(d) if transaction => {
            let ms = duration_ms(d);
            if ms > MAX_RECOVERY_MS {
                return Err(refuse(
                    ErrorKind::BadRequest,
                    format!(
                        "an orphaned transaction recovery duration of {ms} ms; at most \
                         {MAX_RECOVERY_MS} ms is allowed"
                    ),
                ));
            }
            Some(ms)
        }
        _ => None,
    };
    if mtype == pb::MessageType::Delay && deliver_at_ms.is_none() {
        return Err(refuse(
            ErrorKind::IllegalDeliveryTime,
            "a DELAY message needs a delivery timestamp",
        ));
    }
    check_body(m.body.len(), max_body_bytes)?;
    let mut props: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in m.user_properties {
        check_user_property(&k, &v)?;
        props.insert(k, v);
    }
    if let Some(tag) = sp.tag.filter(|t| !t.is_empty()) {
        check_tag(&tag)?;
        props.insert(PROPERTY_TAGS.into(), tag);
    }
    if !sp.keys.is_empty() {
        for k in &sp.keys {
            check_key(k)?;
        }
        props.insert(PROPERTY_KEYS.into(), sp.keys.join(" "));
    }
    let message_group = sp.message_group.filter(|g| !g.is_empty());
    if deliver_at_ms.is_some() && message_group.is_some() {
        return Err(refuse(
            ErrorKind::MessagePropertyConflictWithType,
            "a delay message (delivery timestamp) cannot have a message group",
        ));
    }
    if let Some(g) = &message_group {
        check_message_group(g)?;
        props.insert(PROPERTY_MESSAGE_GROUP.into(), g.clone());
    } else if mtype == pb::MessageType::Fifo {
        return Err(refuse(
            ErrorKind::IllegalMessageGroup,
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
        deliver_at_ms,
        transaction,
        check_immunity_ms,
    })
}

/// Longest orphaned transaction recovery duration a client may ask for, ms: a
/// longer one is refused with BAD_REQUEST (the reference proxy's
/// `maxTransactionRecoverySecond`, 1 hour, and its check).
pub const MAX_RECOVERY_MS: u64 = 3_600_000;

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

/// The protocol message for a delivery `d` of stored record `rec` (at
/// `physical_offset`). The body digest is a CRC32 of the body
/// as 8 uppercase hex digits (the Python client verifies it).
pub fn outgoing(rec: MessageRecord, physical_offset: u64, d: &DeliveryFields) -> pb::Message {
    let (body, props) = (rec.body, rec.properties);
    let mut user = BTreeMap::new();
    for (k, v) in &props {
        if !RESERVED.contains(&k.as_str()) {
            user.insert(k.clone(), v.clone());
        }
    }
    let message_group = props.get(PROPERTY_MESSAGE_GROUP).cloned();
    // A delivered delay message says when it was due, as the reference proxy does.
    let delivery_timestamp = props
        .get(timer_index::PROPERTY_TIMER_DELIVER_MS)
        .and_then(|v| v.parse::<i64>().ok());
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
            .unwrap_or_else(|| format!("{physical_offset:032X}")),
        body_digest: Some(pb::Digest {
            r#type: pb::DigestType::Crc32 as i32,
            checksum: format!("{:08X}", crc32fast::hash(&body)),
        }),
        body_encoding: if props.get(PROPERTY_BODY_ENCODING).map(String::as_str) == Some("GZIP") {
            pb::Encoding::Gzip as i32
        } else {
            pb::Encoding::Identity as i32
        },
        message_type: if props.contains_key(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET) {
            pb::MessageType::Transaction as i32
        } else if delivery_timestamp.is_some() {
            pb::MessageType::Delay as i32
        } else if message_group.is_some() {
            pb::MessageType::Fifo as i32
        } else {
            pb::MessageType::Normal as i32
        },
        born_timestamp: Some(timestamp(rec.born_timestamp_ms)),
        born_host: rec.born_host.ip().to_string(),
        store_timestamp: Some(timestamp(rec.store_timestamp_ms)),
        store_host: rec.store_host.to_string(),
        delivery_timestamp: delivery_timestamp.map(timestamp),
        receipt_handle: Some(d.receipt_handle.clone()),
        queue_id: rec.queue_id,
        queue_offset: Some(d.queue_offset as i64),
        invisible_duration: Some(duration(d.invisible_ms)),
        delivery_attempt: Some(d.delivery_attempt as i32),
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

/// The protocol message of a delivery.
pub fn delivered(d: Delivery) -> pb::Message {
    outgoing(d.record, d.physical_offset, &d.fields)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ledgermq_store::RecordView;

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

    fn code(r: Result<Incoming, BrokerError>) -> ErrorKind {
        r.unwrap_err().kind()
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
        let out = outgoing(view.to_record(), view.physical_offset(), &d);
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
    fn a_delivery_timestamp_makes_a_delay_message_whatever_type_it_says() {
        for t in [pb::MessageType::Delay, pb::MessageType::Normal] {
            let mut m = msg("T", b"x");
            let sp = m.system_properties.as_mut().unwrap();
            sp.message_type = t as i32;
            // Seconds, as the official clients send it.
            sp.delivery_timestamp = Some(prost_types::Timestamp {
                seconds: 1_700_000_010,
                nanos: 0,
            });
            let inc = incoming(m, 10).unwrap();
            assert_eq!(inc.deliver_at_ms, Some(1_700_000_010_000));
            assert_eq!(inc.message_type(), ledgermq_meta::TopicMessageType::Delay);
        }
    }

    #[test]
    fn bad_input_gets_the_matching_code() {
        assert_eq!(
            code(incoming(msg("bad topic", b"x"), 10)),
            ErrorKind::IllegalTopic
        );
        assert_eq!(code(incoming(msg("T", b""), 10)), ErrorKind::BadRequest);
        assert_eq!(
            code(incoming(msg("T", &[0; 11]), 10)),
            ErrorKind::MessageBodyTooLarge
        );
        let mut m = msg("T", b"x");
        m.system_properties.as_mut().unwrap().tag = Some("a||b".into());
        assert_eq!(code(incoming(m, 10)), ErrorKind::IllegalMessageTag);
        let mut m = msg("T", b"x");
        m.system_properties.as_mut().unwrap().keys = vec!["a b".into()];
        assert_eq!(code(incoming(m, 10)), ErrorKind::IllegalMessageKey);
        let mut m = msg("T", b"x");
        m.user_properties.insert("TAGS".into(), "x".into());
        assert_eq!(code(incoming(m, 10)), ErrorKind::IllegalMessagePropertyKey);
        let mut m = msg("T", b"x");
        m.user_properties.insert("k".into(), "a\u{1}b".into());
        assert_eq!(code(incoming(m, 10)), ErrorKind::IllegalMessagePropertyKey);
        let mut m = msg("T", b"x");
        m.system_properties.as_mut().unwrap().message_id.clear();
        assert_eq!(code(incoming(m, 10)), ErrorKind::IllegalMessageId);
        let mut m = msg("T", b"x");
        m.system_properties.as_mut().unwrap().message_type = pb::MessageType::Delay as i32;
        assert_eq!(code(incoming(m, 10)), ErrorKind::IllegalDeliveryTime);
        let transactional = || {
            let mut m = msg("T", b"x");
            m.system_properties.as_mut().unwrap().message_type =
                pb::MessageType::Transaction as i32;
            m
        };
        let mut m = transactional();
        m.system_properties.as_mut().unwrap().message_group = Some("g".into());
        assert_eq!(
            code(incoming(m, 10)),
            ErrorKind::MessagePropertyConflictWithType
        );
        let mut m = transactional();
        m.system_properties.as_mut().unwrap().delivery_timestamp = Some(timestamp(5_000));
        assert_eq!(
            code(incoming(m, 10)),
            ErrorKind::MessagePropertyConflictWithType
        );
        let mut m = transactional();
        m.system_properties
            .as_mut()
            .unwrap()
            .orphaned_transaction_recovery_duration = Some(duration(MAX_RECOVERY_MS + 1_000));
        assert_eq!(code(incoming(m, 10)), ErrorKind::BadRequest);
        let mut m = transactional();
        m.system_properties
            .as_mut()
            .unwrap()
            .orphaned_transaction_recovery_duration = Some(duration(20_000));
        let inc = incoming(m, 10).unwrap();
        assert!(inc.transaction);
        assert_eq!(inc.check_immunity_ms, Some(20_000));
        assert_eq!(
            inc.message_type(),
            ledgermq_meta::TopicMessageType::Transaction
        );
        let mut m = msg("T", b"x");
        let sp = m.system_properties.as_mut().unwrap();
        sp.delivery_timestamp = Some(timestamp(5_000));
        sp.message_group = Some("g".into());
        assert_eq!(
            code(incoming(m, 10)),
            ErrorKind::MessagePropertyConflictWithType
        );
        for reserved in [
            "TIMER_DELIVER_MS",
            "TIMER_QUEUE_OFFSET",
            "REAL_TOPIC",
            "REAL_QID",
            "TRAN_MSG",
            "PGROUP",
            "CHECK_IMMUNITY_TIME_IN_SECONDS",
            "TRAN_PREPARED_QUEUE_OFFSET",
            "TRAN_END",
        ] {
            let mut m = msg("T", b"x");
            m.user_properties.insert(reserved.into(), "1".into());
            assert_eq!(code(incoming(m, 10)), ErrorKind::IllegalMessagePropertyKey);
        }
        for system in ["rmq_sys_wheel_timer", "RMQ_SYS_TRANS_HALF_TOPIC"] {
            assert_eq!(
                code(incoming(msg(system, b"x"), 10)),
                ErrorKind::IllegalTopic
            );
        }
        let mut m = msg("T", b"x");
        m.system_properties.as_mut().unwrap().message_type = pb::MessageType::Fifo as i32;
        assert_eq!(code(incoming(m, 10)), ErrorKind::IllegalMessageGroup);
        let mut m = msg("T", b"x");
        m.system_properties.as_mut().unwrap().message_group = Some("g".repeat(65));
        assert_eq!(code(incoming(m, 10)), ErrorKind::IllegalMessageGroup);
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
