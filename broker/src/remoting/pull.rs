//! PULL_MESSAGE (11) and the offsets by queue (29-32), from this node's own
//! ConsumeQueues: they hold committed messages only, so any member answers.
//!
//! A pull answers as RocketMQ's `PullMessageProcessor` maps its store's
//! statuses (`../shared/docs/rocketmq-remoting.md` §1.3):
//! - messages found: SUCCESS, the body the stored messages in RocketMQ's
//!   layout ([`ledgermq_remoting::message::encode_message`]), at most
//!   [`MAX_PULL_MESSAGES`] and, past the first, [`MAX_PULL_BYTES`];
//! - some scanned but none passed the tag filter: PULL_RETRY_IMMEDIATELY with
//!   the offset after them;
//! - an offset below the queue's minimum (retention removed it):
//!   PULL_OFFSET_MOVED to the minimum;
//! - nothing at or past the offset: held up to `suspendTimeoutMillis` (at
//!   most the node's `max_long_polling_ms`) when the SUSPEND flag is set,
//!   woken by every applied entry, then PULL_NOT_FOUND. An offset past the
//!   queue's end is kept, not corrected: a new leader may not have applied
//!   every committed entry yet, and moving a consumer back would redeliver.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ledgermq_remoting::codes::{request, response};
use ledgermq_remoting::message::{encode_message, WireMessage};
use ledgermq_remoting::RemotingCommand;
use ledgermq_store::queries::StoredMessage;

use super::fields::{opt, opt_num, req_num, req_str};
use super::Remoting;
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::filter::{FilterExpr, TagFilter};
use crate::message::check_group;

/// Most messages one pull answers with (RocketMQ's
/// `maxTransferCountOnMessageInMemory`).
pub const MAX_PULL_MESSAGES: usize = 32;
/// Most bytes of messages one pull answers with, past the first message
/// (RocketMQ's `maxTransferBytesOnMessageInMemory`).
pub const MAX_PULL_BYTES: usize = 256 << 10;

/// PullSysFlag bits.
const FLAG_COMMIT_OFFSET: i32 = 1;
const FLAG_SUSPEND: i32 = 2;

/// Encodes stored messages as a pull answer's body, each with `store_host`.
/// Stops after the message that takes the body past [`MAX_PULL_BYTES`];
/// returns the body and how many messages it holds.
pub fn pull_body(found: &[StoredMessage], store_host: SocketAddr) -> (Vec<u8>, usize) {
    let mut body = Vec::new();
    let mut n = 0;
    for m in found {
        if n > 0 && body.len() >= MAX_PULL_BYTES {
            break;
        }
        let rec = m.view().to_record();
        let props = ledgermq_store::record::encode_properties(&rec.properties);
        let wire = WireMessage {
            queue_id: rec.queue_id,
            flag: rec.flag,
            queue_offset: m.queue_offset.unwrap_or(0) as i64,
            physical_offset: m.physical_offset as i64,
            sys_flag: rec.sys_flag,
            born_timestamp_ms: rec.born_timestamp_ms,
            born_host: rec.born_host,
            store_timestamp_ms: rec.store_timestamp_ms,
            store_host,
            reconsume_times: rec.reconsume_times,
            prepared_transaction_offset: rec.prepared_transaction_offset,
            body: &rec.body,
            topic: &rec.topic,
            properties: &props,
        };
        if encode_message(&mut body, &wire).is_err() {
            // Cannot happen for a stored record (its topic and properties fit
            // the store's narrower limits); skip rather than fail the pull.
            continue;
        }
        n += 1;
    }
    (body, n)
}

impl Remoting {
    /// Answers PULL_MESSAGE (see the module doc).
    pub(super) async fn pull(&self, req: &RemotingCommand) -> Result<RemotingCommand, BrokerError> {
        let group = req_str(req, "consumerGroup", None)?.to_owned();
        check_group(&group)?;
        let topic_name = req_str(req, "topic", None)?;
        let queue_id: i32 = req_num(req, "queueId", None)?;
        let offset: i64 = req_num(req, "queueOffset", None)?;
        let max_msgs: i32 = req_num(req, "maxMsgNums", None)?;
        let sys_flag: i32 = opt_num(req, "sysFlag", None)?.unwrap_or(0);
        let commit_offset: i64 = opt_num(req, "commitOffset", None)?.unwrap_or(-1);
        let suspend_ms: u64 = opt_num(req, "suspendTimeoutMillis", None)?.unwrap_or(0);
        let topic = self.broker.readable_topic(topic_name)?;
        if queue_id < 0 || queue_id as u32 >= topic.queue_count {
            return Err(refuse(
                ErrorKind::BadRequest,
                format!(
                    "queue {queue_id} of topic {} does not exist ({} queues)",
                    topic.name, topic.queue_count
                ),
            ));
        }
        let filter = match opt(req, "expressionType", None) {
            Some(t) if t.eq_ignore_ascii_case("SQL92") => {
                return Err(refuse(
                    ErrorKind::Unsupported,
                    "SQL92 filters are not supported",
                ))
            }
            _ => TagFilter::parse(
                opt(req, "subscription", None)
                    .map(|s| FilterExpr::Tag(s.to_owned()))
                    .as_ref(),
            )?,
        };
        if sys_flag & FLAG_COMMIT_OFFSET != 0 && commit_offset >= 0 {
            self.clients
                .take_offset(&group, &topic.name, queue_id, commit_offset as u64);
        }
        let offset = offset.max(0) as u64;
        let max = (max_msgs.max(1) as usize).min(MAX_PULL_MESSAGES);
        let wait_ms = if sys_flag & FLAG_SUSPEND != 0 {
            suspend_ms.min(self.broker.settings.max_long_polling_ms)
        } else {
            0
        };
        let deadline = Instant::now() + Duration::from_millis(wait_ms);
        let store = self.broker.node.store().clone();
        let mut metrics = self.broker.node.raft().metrics();
        loop {
            let (min, max_offset) = store.queue_offsets(&topic.name, queue_id);
            let answer = |code: i32, next: u64| {
                let mut r = RemotingCommand::response_to(req, code, None);
                r.ext_fields
                    .insert("nextBeginOffset".into(), next.to_string());
                r.ext_fields.insert("minOffset".into(), min.to_string());
                r.ext_fields
                    .insert("maxOffset".into(), max_offset.to_string());
                r.ext_fields
                    .insert("suggestWhichBrokerId".into(), "0".into());
                r
            };
            if offset < min {
                return Ok(answer(response::PULL_OFFSET_MOVED, min));
            }
            if offset < max_offset {
                let (found, next) =
                    store.get_messages(&topic.name, queue_id, offset, max, |h| {
                        filter.accepts_hash(h)
                    })?;
                let found: Vec<StoredMessage> = found
                    .into_iter()
                    .filter(|m| filter.accepts_tag(m.view().to_record().tag()))
                    .collect();
                if found.is_empty() {
                    return Ok(answer(response::PULL_RETRY_IMMEDIATELY, next));
                }
                let (body, n) = pull_body(&found, self.advertised);
                let next = if n < found.len() {
                    found[n].queue_offset.expect("read through a queue")
                } else {
                    next
                };
                let mut r = answer(response::SUCCESS, next);
                r.body = body;
                return Ok(r);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(answer(response::PULL_NOT_FOUND, offset));
            }
            let tick = Duration::from_millis(100).min(deadline - now);
            if let Ok(Err(_)) = tokio::time::timeout(tick, metrics.changed()).await {
                tokio::time::sleep(tick).await;
            }
        }
    }

    /// Answers GET_MAX_OFFSET, GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP and
    /// GET_EARLIEST_MSG_STORETIME with `offset` (or `timestamp`).
    pub(super) fn queue_offsets(
        &self,
        req: &RemotingCommand,
    ) -> Result<RemotingCommand, BrokerError> {
        let topic_name = req_str(req, "topic", None)?;
        let queue_id: i32 = req_num(req, "queueId", None)?;
        let topic = self.broker.readable_topic(topic_name)?;
        let store = self.broker.node.store();
        let (min, max) = store.queue_offsets(&topic.name, queue_id);
        let mut r = RemotingCommand::response_to(req, response::SUCCESS, None);
        match req.code {
            request::GET_MAX_OFFSET => {
                r.ext_fields.insert("offset".into(), max.to_string());
            }
            request::GET_MIN_OFFSET => {
                r.ext_fields.insert("offset".into(), min.to_string());
            }
            request::SEARCH_OFFSET_BY_TIMESTAMP => {
                let at: i64 = req_num(req, "timestamp", None)?;
                let o = store.offset_by_time(&topic.name, queue_id, at)?;
                r.ext_fields.insert("offset".into(), o.to_string());
            }
            _ => {
                let ts = if min < max {
                    store
                        .get_message(&topic.name, queue_id, min)?
                        .view()
                        .store_timestamp_ms()
                } else {
                    -1
                };
                r.ext_fields.insert("timestamp".into(), ts.to_string());
            }
        }
        Ok(r)
    }
}
