//! SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320):
//! the header (`SendMessageRequestHeader`, or V2's one-letter names) and body
//! become [`Incoming`] messages for [`Broker::send_checked`], written through
//! Raft from any node and answered SUCCESS once committed, with the offset
//! message id (this node's remoting address and the message's CommitLog
//! offset, the same on every replica that holds the whole log).
//!
//! Properties are stored as the client sent them, except the broker's own
//! (timer and half-message bookkeeping, `message::RESERVED` from
//! `REAL_TOPIC` on), which a client cannot set. Delay: a `DELAY` level
//! 1..=18 (levels above 18 count as 18, as RocketMQ clamps them) over
//! [`DELAY_LEVELS_MS`], or 5.x's `TIMER_DELIVER_MS`, `TIMER_DELAY_SEC`,
//! `TIMER_DELAY_MS`, becomes a timer. A transactional message (`TRAN_MSG`)
//! is stored as a half message of its producer group (`PGROUP`), checked back
//! after `CHECK_IMMUNITY_TIME_IN_SECONDS`; the answer carries its
//! transaction id. A zlib-compressed body (sysflag
//! COMPRESSED) is stored as sent and marked `__BODY_ENCODING=GZIP` for 5.x
//! consumers. 4.x clients know no topic message type
//! (`../shared/docs/rocketmq-remoting.md` §4), so the type check is the gRPC
//! path's only.

use std::collections::BTreeMap;

use ledgermq_remoting::codes::{request, response};
use ledgermq_remoting::conn::Conn;
use ledgermq_remoting::message::{
    decode_batch, offset_message_id, BatchItem, SYSFLAG_BORNHOST_V6, SYSFLAG_COMPRESSED,
    SYSFLAG_STOREHOST_V6, SYSFLAG_TRANSACTION_MASK,
};
use ledgermq_remoting::RemotingCommand;
use ledgermq_store::record::PROPERTY_UNIQ_KEY;
use ledgermq_store::MessageRecord;

use super::fields::{opt, opt_num, req_num, req_str};
use super::Remoting;
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::message::{
    check_body, check_message_id, check_topic, Incoming, PROPERTY_BODY_ENCODING, RESERVED,
};

/// RocketMQ's delay levels 1..=18 (`messageDelayLevel`: "1s 5s 10s 30s 1m 2m
/// 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"), in ms.
pub const DELAY_LEVELS_MS: [i64; 18] = [
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000,
    480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
];

/// The delay-level property (`MessageConst.PROPERTY_DELAY_TIME_LEVEL`).
pub const PROPERTY_DELAY: &str = "DELAY";
/// 5.x timer properties a remoting client sets (`MessageConst`).
const PROPERTY_TIMER_DELAY_SEC: &str = "TIMER_DELAY_SEC";
const PROPERTY_TIMER_DELAY_MS: &str = "TIMER_DELAY_MS";
const PROPERTY_TIMER_DELIVER_MS: &str = "TIMER_DELIVER_MS";
use super::clients::RETRY_PREFIX;
/// A transactional message's property (`MessageConst.PROPERTY_TRANSACTION_PREPARED`).
const PROPERTY_TRAN_MSG: &str = "TRAN_MSG";
use ledgermq_store::half_index::{
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, PROPERTY_PRODUCER_GROUP,
};

/// True if a 4.x sysflag says the body is zlib-compressed
/// (`MessageSysFlag.COMPRESSED_FLAG` with compression type bits 8-10 ZLIB, 0x300,
/// or unset, as clients before 4.9.x write it; LZ4 and ZSTD bodies are kept
/// as they are, unmarked).
pub fn zlib_compressed(sys_flag: i32) -> bool {
    sys_flag & SYSFLAG_COMPRESSED != 0 && matches!(sys_flag & 0x700, 0 | 0x300)
}

/// When a message with these properties is due, ms since the Unix epoch, if
/// it is a delay message. `DELAY` levels below 1 mean none. Error:
/// BAD_REQUEST for a value that is not a number.
pub fn deliver_at_ms(
    props: &BTreeMap<String, String>,
    now_ms: i64,
) -> Result<Option<i64>, BrokerError> {
    let num = |k: &str| -> Result<Option<i64>, BrokerError> {
        props
            .get(k)
            .map(|v| {
                v.trim().parse::<i64>().map_err(|_| {
                    refuse(
                        ErrorKind::BadRequest,
                        format!("property {k}={v:?} is not a number"),
                    )
                })
            })
            .transpose()
    };
    if let Some(at) = num(PROPERTY_TIMER_DELIVER_MS)? {
        return Ok(Some(at));
    }
    if let Some(s) = num(PROPERTY_TIMER_DELAY_SEC)? {
        return Ok(Some(now_ms.saturating_add(s.saturating_mul(1000))));
    }
    if let Some(ms) = num(PROPERTY_TIMER_DELAY_MS)? {
        return Ok(Some(now_ms.saturating_add(ms)));
    }
    match num(PROPERTY_DELAY)? {
        Some(level) if level >= 1 => {
            let i = (level.min(DELAY_LEVELS_MS.len() as i64) - 1) as usize;
            Ok(Some(now_ms + DELAY_LEVELS_MS[i]))
        }
        _ => Ok(None),
    }
}

impl Remoting {
    /// Converts one message of a send of `producer_group`.
    #[allow(clippy::too_many_arguments)]
    fn incoming(
        &self,
        topic: &str,
        queue_id: Option<i32>,
        sys_flag: i32,
        born_timestamp_ms: i64,
        conn: &Conn,
        reconsume_times: i32,
        producer_group: &str,
        item: BatchItem,
    ) -> Result<Incoming, BrokerError> {
        check_body(item.body.len(), self.broker.settings.max_body_bytes)?;
        let mut props = item.properties;
        let transaction = props.get(PROPERTY_TRAN_MSG).map(String::as_str) == Some("true");
        // The first check back after this many seconds (the client's
        // `CHECK_IMMUNITY_TIME_IN_SECONDS`), else the broker's timeout.
        // At most an hour, as the gRPC path allows: a half never checked back
        // would hold retention back.
        let check_immunity_ms = props
            .get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(|s| {
                s.saturating_mul(1000)
                    .min(crate::grpc::message::MAX_RECOVERY_MS)
            });
        let deliver_at = deliver_at_ms(&props, ledgermq_store::store::now_ms())?;
        // RocketMQ delivers a delay-level message without its level.
        props.remove(PROPERTY_DELAY);
        for k in &RESERVED[7..] {
            props.remove(*k);
        }
        props.remove(PROPERTY_TIMER_DELAY_SEC);
        props.remove(PROPERTY_TIMER_DELAY_MS);
        props.remove(PROPERTY_BODY_ENCODING);
        if zlib_compressed(sys_flag) {
            // What a 5.x consumer is told (as RocketMQ's proxy tells it); a 4.x
            // consumer inflates by the sysflag, stored as sent.
            props.insert(PROPERTY_BODY_ENCODING.into(), "GZIP".into());
        }
        let message_id = match props.get(PROPERTY_UNIQ_KEY) {
            Some(id) => id.clone(),
            None => {
                let id = crate::remoting::clients::new_message_id(self.advertised);
                props.insert(PROPERTY_UNIQ_KEY.into(), id.clone());
                id
            }
        };
        check_message_id(&message_id)?;
        if transaction {
            // A check back goes to a producer of this group (RocketMQ's PGROUP).
            crate::message::check_group(producer_group).map_err(|_| {
                refuse(
                    ErrorKind::BadRequest,
                    format!(
                        "a transactional message needs a producer group of 1 to 255 \
                         characters of [%|a-zA-Z0-9_-], not {producer_group:?}"
                    ),
                )
            })?;
            props.insert(PROPERTY_PRODUCER_GROUP.into(), producer_group.to_owned());
        }
        let mut record = MessageRecord::message(topic, -1, item.body, 0);
        record.flag = item.flag;
        // The host bits are the store's; a transaction is told by TRAN_MSG.
        record.sys_flag =
            sys_flag & !(SYSFLAG_TRANSACTION_MASK | SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6);
        record.born_timestamp_ms = born_timestamp_ms;
        record.born_host = conn.peer;
        record.reconsume_times = reconsume_times;
        record.properties = props;
        Ok(Incoming {
            record,
            message_id,
            message_group: None,
            client_queue_id: queue_id,
            deliver_at_ms: if transaction { None } else { deliver_at },
            transaction,
            check_immunity_ms,
        })
    }

    /// Answers a send (see the module doc). `body` is the request's body,
    /// taken out of it, so a single message's bytes are moved, not copied.
    pub(super) async fn send(
        &self,
        req: &RemotingCommand,
        body: Vec<u8>,
        conn: &Conn,
    ) -> Result<RemotingCommand, BrokerError> {
        let v2 = req.code != request::SEND_MESSAGE;
        let short = |s: &'static str| v2.then_some(s);
        let mut topic = req_str(req, "topic", short("b"))?.to_owned();
        check_topic(&topic)?;
        let mut queue_id: Option<i32> = opt_num(req, "queueId", short("e"))?;
        let sys_flag: i32 = opt_num(req, "sysFlag", short("f"))?.unwrap_or(0);
        let born: i64 = opt_num(req, "bornTimestamp", short("g"))?.unwrap_or(0);
        let producer_group = opt(req, "producerGroup", short("a"))
            .unwrap_or("")
            .to_owned();
        let reconsume: i32 = opt_num(req, "reconsumeTimes", short("j"))?.unwrap_or(0);
        // A client's own retry (its send back failed) past the group's most
        // reconsumes goes to the dead-letter queue, as RocketMQ's
        // SendMessageProcessor.handleRetryTopic sends it.
        let mut dead_letter = false;
        if let Some(group) = topic.strip_prefix(RETRY_PREFIX) {
            let max: i32 = opt_num(req, "maxReconsumeTimes", short("l"))?
                .unwrap_or(super::retry::DEFAULT_MAX_RECONSUME_TIMES);
            if reconsume >= max {
                let dlq = crate::consume::dlq_topic(group);
                self.existing_group_topic(group, &dlq).await?;
                topic = dlq;
                queue_id = Some(0);
                dead_letter = true;
            }
        }
        let batch = req.code == request::SEND_BATCH_MESSAGE
            // Java writes booleans as "true", the C++ core as "1".
            || matches!(opt(req, "batch", short("m")), Some("true" | "1"));
        let items = if batch {
            let items =
                decode_batch(&body).map_err(|e| refuse(ErrorKind::BadRequest, e.to_string()))?;
            if items
                .iter()
                .any(|m| m.properties.get(PROPERTY_TRAN_MSG).map(String::as_str) == Some("true"))
            {
                return Err(refuse(
                    ErrorKind::BadRequest,
                    "a batch cannot hold transactional messages",
                ));
            }
            items
        } else {
            let flag: i32 = req_num(req, "flag", short("h"))?;
            let props = opt(req, "properties", short("i")).unwrap_or("");
            vec![BatchItem {
                flag,
                body,
                properties: ledgermq_remoting::message::decode_properties(props),
            }]
        };
        let converted: Vec<Result<Incoming, BrokerError>> = items
            .into_iter()
            .map(|it| {
                let mut inc = self.incoming(
                    &topic,
                    queue_id,
                    sys_flag,
                    born,
                    conn,
                    reconsume,
                    &producer_group,
                    it,
                )?;
                if dead_letter {
                    // RocketMQ dead-letters at once (delay level 0).
                    inc.deliver_at_ms = None;
                }
                Ok(inc)
            })
            .collect();
        let mut ids = Vec::new();
        let placed = self.broker.send_checked(converted, &mut ids, false).await?;
        let mut r = RemotingCommand::response_to(req, response::SUCCESS, None);
        let first = placed.first().expect("a send places at least one message");
        let msg_ids: Vec<String> = placed
            .iter()
            .map(|p| offset_message_id(self.advertised, p.physical_offset))
            .collect();
        r.ext_fields.insert("msgId".into(), msg_ids.join(","));
        // A delay message is placed in the timer queue: answer the queue it
        // goes to (the client's, when it is one of the topic's), as RocketMQ
        // answers the request's queue id.
        let queue_count = self.broker.topic(&topic).map_or(0, |t| t.queue_count);
        let queue_id = queue_id
            .filter(|&q| q >= 0 && (q as u32) < queue_count)
            .unwrap_or(first.queue_id);
        r.ext_fields.insert("queueId".into(), queue_id.to_string());
        r.ext_fields
            .insert("queueOffset".into(), first.queue_offset.to_string());
        if let Some(id) = &first.transaction_id {
            r.ext_fields.insert("transactionId".into(), id.clone());
        }
        r.ext_fields
            .insert("MSG_REGION".into(), "DefaultRegion".into());
        r.ext_fields.insert("TRACE_ON".into(), "false".into());
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn zlib_bodies_are_told_from_other_compressions() {
        assert!(!zlib_compressed(0));
        assert!(zlib_compressed(0x1));
        assert!(zlib_compressed(0x301));
        assert!(!zlib_compressed(0x101), "LZ4");
        assert!(!zlib_compressed(0x201), "ZSTD");
        assert!(!zlib_compressed(0x300), "type bits without the flag");
    }

    #[test]
    fn delay_levels_and_timer_properties_give_the_delivery_time() {
        assert_eq!(deliver_at_ms(&props(&[]), 1000).unwrap(), None);
        assert_eq!(
            deliver_at_ms(&props(&[("DELAY", "0")]), 1000).unwrap(),
            None
        );
        assert_eq!(
            deliver_at_ms(&props(&[("DELAY", "1")]), 1000).unwrap(),
            Some(2000)
        );
        assert_eq!(
            deliver_at_ms(&props(&[("DELAY", "3")]), 0).unwrap(),
            Some(10_000)
        );
        assert_eq!(
            deliver_at_ms(&props(&[("DELAY", "18")]), 0).unwrap(),
            Some(7_200_000)
        );
        assert_eq!(
            deliver_at_ms(&props(&[("DELAY", "40")]), 0).unwrap(),
            Some(7_200_000)
        );
        assert_eq!(
            deliver_at_ms(&props(&[("TIMER_DELAY_SEC", "5"), ("DELAY", "1")]), 0).unwrap(),
            Some(5000)
        );
        assert_eq!(
            deliver_at_ms(&props(&[("TIMER_DELIVER_MS", "77")]), 0).unwrap(),
            Some(77)
        );
        assert_eq!(
            deliver_at_ms(&props(&[("TIMER_DELAY_MS", "5")]), 1).unwrap(),
            Some(6)
        );
        let e = deliver_at_ms(&props(&[("DELAY", "x")]), 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BadRequest);
    }
}
