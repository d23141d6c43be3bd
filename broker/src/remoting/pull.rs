//! PULL_MESSAGE (11) and the offsets by queue (29-32), from this node's own
//! ConsumeQueues: they hold committed messages only, so any member answers.
//!
//! Bodies a 5.x producer compressed are made readable for 4.x consumers
//! ([`for_4x_consumers`]).
//!
//! A pull answers as RocketMQ's `PullMessageProcessor` maps its store's
//! statuses (`../shared/docs/rocketmq-remoting.md` §1.3):
//! - messages found: SUCCESS, the body the stored messages in RocketMQ's
//!   layout ([`ledgermq_remoting::message::encode_message`]), at most
//!   [`MAX_PULL_MESSAGES`], ending with the message that takes it past
//!   [`MAX_PULL_BYTES`], from at most [`MAX_PULL_SCAN`] ConsumeQueue entries;
//! - some scanned but none passed the tag filter: PULL_RETRY_IMMEDIATELY with
//!   the offset after them;
//! - an offset below the queue's minimum (retention removed it):
//!   PULL_OFFSET_MOVED to the minimum;
//! - nothing at or past the offset: held up to `suspendTimeoutMillis` (at
//!   most the node's `max_long_polling_ms`) when the SUSPEND flag is set,
//!   woken by every applied entry, then PULL_NOT_FOUND. An offset past the
//!   queue's end is kept, not corrected: a new leader may not have applied
//!   every committed entry yet, and moving a consumer back would redeliver.
//!
//! Every answer names the member to pull from next (`suggestWhichBrokerId`,
//! which 4.x clients follow: [`suggested_broker_id`]): followers, so that a
//! consumer keeps reading when the leader dies instead of waiting for its
//! 30 s route refresh, and the leader serves fewer pulls.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ledgermq_remoting::codes::{request, response};
use ledgermq_remoting::message::{encode_message, WireMessage, SYSFLAG_COMPRESSED};
use ledgermq_remoting::RemotingCommand;
use ledgermq_store::record::PROPERTY_TAGS;
use ledgermq_store::StoredMessage;

use super::fields::{opt, opt_num, req_num, req_str};
use super::Remoting;
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::filter::{FilterExpr, TagFilter};
use crate::message::{check_group, PROPERTY_BODY_ENCODING};

/// How far behind the leader's log (entries) a follower may be and still be
/// given the leader's consumers.
pub const CAUGHT_UP_ENTRIES: u64 = 1024;

/// How long a follower keeps its consumers without hearing from a leader:
/// longer than an election, shorter than a consumer's route refresh.
pub const LEADER_GRACE: Duration = Duration::from_secs(5);

/// The broker id a 4.x consumer should pull queue `queue_id` of `topic` from
/// next (`suggestWhichBrokerId`), in the name server's numbering (the leader
/// 0; every member, the leader too, its node id + 1, its *member id*;
/// `namesrv/src/remoting.rs`), from this node's `view` of its group:
/// - a member other than the leader names itself while it follows (hears
///   from a majority, and from a leader within [`LEADER_GRACE`], so through an
///   election too) and has applied up to the consumer's offset (`behind`
///   false; a member that follows waits out the long poll for its apply to
///   get there first); else 0;
/// - the leader spreads a topic's queues evenly over the followers that keep
///   up (`view.caught_up`), starting at a follower chosen by a hash of the
///   topic; itself if there are none.
///
/// Members are named by member id, which every route a consumer may hold
/// lists: its route is refreshed only every 30 s, and one from before an
/// election lists the dead leader as 0. 0 is named only by a member that does
/// not follow (or is still behind after a long poll). No I/O.
pub fn suggested_broker_id(
    self_id: u64,
    view: &ledgermq_raft::ReplicaView,
    behind: bool,
    topic: &str,
    queue_id: i32,
) -> u64 {
    use std::hash::{Hash, Hasher};
    let member_id = |node_id: u64| node_id.saturating_add(1);
    if !view.leads {
        return if view.follows && !behind {
            member_id(self_id)
        } else {
            0
        };
    }
    let n = view.caught_up.len() as u64;
    if n == 0 {
        return member_id(self_id);
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    topic.hash(&mut h);
    let at = h.finish().wrapping_add(u64::from(queue_id.unsigned_abs())) % n;
    member_id(view.caught_up[at as usize])
}

/// Most messages one pull answers with (RocketMQ's
/// `maxTransferCountOnMessageInMemory`).
pub const MAX_PULL_MESSAGES: usize = 32;
/// Most bytes of messages one pull answers with, past the first message
/// (RocketMQ's `maxTransferBytesOnMessageInMemory`).
pub const MAX_PULL_BYTES: usize = 256 << 10;

/// Most ConsumeQueue entries one pull looks at (a tag filter that takes few
/// messages costs a bounded read; the consumer goes on from where it stopped).
pub const MAX_PULL_SCAN: usize = 4096;

/// PullSysFlag bits.
const FLAG_COMMIT_OFFSET: i32 = 1;
const FLAG_SUSPEND: i32 = 2;

/// Most bytes of messages a pull answer's frame may hold: a client refuses a
/// frame over 16 MiB, headers included.
const MAX_ANSWER_BYTES: usize = ledgermq_remoting::DEFAULT_MAX_FRAME_BYTES - (64 << 10);

/// The sysflag a 4.x consumer gets for `rec`, whose body it may change: a
/// body a 5.x producer sent compressed (`__BODY_ENCODING=GZIP`, no COMPRESSED
/// flag) is flagged COMPRESSED when it is zlib (what 4.x clients inflate), and
/// inflated when it is gzip (which they cannot), up to `max_inflated_bytes`
/// (the broker's largest body; a larger one is passed on as stored).
pub fn for_4x_consumers(rec: &mut ledgermq_store::MessageRecord, max_inflated_bytes: usize) -> i32 {
    use std::io::Read;
    let gzip = rec
        .properties
        .get(PROPERTY_BODY_ENCODING)
        .map(String::as_str)
        == Some("GZIP");
    if !gzip || rec.sys_flag & SYSFLAG_COMPRESSED != 0 {
        return rec.sys_flag;
    }
    match rec.body.get(..2) {
        Some([0x1f, 0x8b]) => {
            let mut out = Vec::new();
            let limit = max_inflated_bytes as u64;
            let mut d = flate2::read::MultiGzDecoder::new(&rec.body[..]).take(limit + 1);
            if d.read_to_end(&mut out).is_ok() && out.len() as u64 <= limit {
                rec.body = out;
                rec.properties.remove(PROPERTY_BODY_ENCODING);
            }
            rec.sys_flag
        }
        Some([0x78, _]) => rec.sys_flag | SYSFLAG_COMPRESSED,
        _ => rec.sys_flag,
    }
}

/// Checks that `queue_id` is one of `topic`'s queues. Error: BAD_REQUEST.
pub fn check_queue(topic: &ledgermq_meta::TopicConfig, queue_id: i32) -> Result<(), BrokerError> {
    if queue_id < 0 || queue_id as u32 >= topic.queue_count {
        return Err(refuse(
            ErrorKind::BadRequest,
            format!(
                "queue {queue_id} of topic {} does not exist ({} queues)",
                topic.name, topic.queue_count
            ),
        ));
    }
    Ok(())
}

/// Appends `rec` in RocketMQ's stored layout with `sys_flag`, its queue
/// offset and physical offset, and `store_host`. Error: the layout's
/// (`ledgermq_remoting::message::encode_message`).
fn encode_record(
    out: &mut Vec<u8>,
    rec: &ledgermq_store::MessageRecord,
    sys_flag: i32,
    queue_offset: u64,
    physical_offset: u64,
    store_host: SocketAddr,
) -> Result<(), ledgermq_remoting::RemotingError> {
    let props = ledgermq_store::record::encode_properties(&rec.properties);
    let wire = WireMessage {
        queue_id: rec.queue_id,
        flag: rec.flag,
        queue_offset: queue_offset as i64,
        physical_offset: physical_offset as i64,
        sys_flag,
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
    encode_message(out, &wire)
}

/// `rec` alone in RocketMQ's stored layout (a check back's body); empty if it
/// cannot be encoded (a stored record always can).
pub fn wire_bytes(
    rec: &ledgermq_store::MessageRecord,
    queue_offset: u64,
    physical_offset: u64,
    store_host: SocketAddr,
) -> Vec<u8> {
    let mut out = Vec::new();
    if encode_record(
        &mut out,
        rec,
        rec.sys_flag,
        queue_offset,
        physical_offset,
        store_host,
    )
    .is_err()
    {
        out.clear();
    }
    out
}

/// Encodes stored messages as a pull answer's body, each with `store_host`,
/// bodies inflated up to `max_inflated_bytes` ([`for_4x_consumers`]). Stops
/// after the message that takes the body past [`MAX_PULL_BYTES`], and before
/// one that would take it past the largest frame. Returns the body and how
/// many of `found` it used: encoded, or skipped because it cannot be encoded
/// (a stored record always can: its topic and properties fit the store's
/// narrower limits), so the next offset is `found[used]`'s.
pub fn pull_body(
    found: &[StoredMessage],
    store_host: SocketAddr,
    max_inflated_bytes: usize,
) -> (Vec<u8>, usize) {
    let mut body = Vec::new();
    let mut used = 0;
    for m in found {
        if used > 0 && body.len() >= MAX_PULL_BYTES {
            break;
        }
        let mut rec = m.view().to_record();
        let sys_flag = for_4x_consumers(&mut rec, max_inflated_bytes);
        // Encoded in place (one copy of the message's bytes; an encoding that
        // fails writes nothing), taken back if it passes the frame's limit.
        let before = body.len();
        let queue_offset = m.queue_offset.unwrap_or(0);
        let encoded = encode_record(
            &mut body,
            &rec,
            sys_flag,
            queue_offset,
            m.physical_offset,
            store_host,
        );
        if encoded.is_ok() && used > 0 && body.len() > MAX_ANSWER_BYTES {
            body.truncate(before);
            break;
        }
        used += 1;
    }
    (body, used)
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
        check_queue(&topic, queue_id)?;
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
        let node = &self.broker.node;
        loop {
            let view = node.replica_view(CAUGHT_UP_ENTRIES, LEADER_GRACE);
            let (min, max_offset) = store.queue_offsets(&topic.name, queue_id);
            let answer = |code: i32, next: u64| {
                let mut r = RemotingCommand::response_to(req, code, None);
                r.ext_fields
                    .insert("nextBeginOffset".into(), next.to_string());
                r.ext_fields.insert("minOffset".into(), min.to_string());
                r.ext_fields
                    .insert("maxOffset".into(), max_offset.to_string());
                let behind = offset > max_offset;
                let suggest = suggested_broker_id(node.id(), &view, behind, &topic.name, queue_id);
                r.ext_fields
                    .insert("suggestWhichBrokerId".into(), suggest.to_string());
                r
            };
            if offset < min {
                return Ok(answer(response::PULL_OFFSET_MOVED, min));
            }
            if offset < max_offset {
                // A few messages at a time, stopping once past 256 KiB: at
                // most 32 messages from MAX_PULL_SCAN entries (up to 8 more
                // than answered are read when they are large).
                let (mut found, mut next, mut bytes) = (Vec::new(), offset, 0usize);
                while found.len() < max
                    && bytes < MAX_PULL_BYTES
                    && next < max_offset
                    && next - offset < MAX_PULL_SCAN as u64
                {
                    let scan = MAX_PULL_SCAN - (next - offset) as usize;
                    let want = (max - found.len()).min(8);
                    let (batch, after) = store.get_messages_scanning(
                        &topic.name,
                        queue_id,
                        next,
                        want,
                        scan,
                        |h| filter.accepts_hash(h),
                    )?;
                    for m in batch {
                        if filter.accepts_tag(m.view().property(PROPERTY_TAGS)) {
                            bytes += m.bytes.len();
                            found.push(m);
                        }
                    }
                    if after == next {
                        break;
                    }
                    next = after;
                }
                if found.is_empty() {
                    return Ok(answer(response::PULL_RETRY_IMMEDIATELY, next));
                }
                let (body, n) =
                    pull_body(&found, self.advertised, self.broker.settings.max_body_bytes);
                let next = if n < found.len() {
                    found[n].queue_offset.expect("read through a queue")
                } else {
                    next
                };
                let body_bytes: usize = found[..n].iter().map(|m| m.view().body().len()).sum();
                self.broker
                    .metrics
                    .messages_out(topic_name, &group, n as u64, body_bytes as u64);
                let mut r = answer(response::SUCCESS, next);
                r.body = body;
                return Ok(r);
            }
            let now = Instant::now();
            // A member that does not follow a leader sends the consumer
            // elsewhere at once, not after a long poll. One that follows but
            // has not applied up to the consumer's offset (which a member
            // that applied first gave it) waits for its apply: sent to 0, a
            // consumer whose route is from before an election would pull from
            // the dead leader until its route refresh.
            let elsewhere = !view.leads && !view.follows;
            if now >= deadline || elsewhere {
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

#[cfg(test)]
mod tests {

    #[test]
    fn consumers_are_sent_to_followers_that_keep_up() {
        use ledgermq_raft::ReplicaView;
        let follower = |follows| ReplicaView {
            leads: false,
            caught_up: vec![],
            follows,
        };
        let leader = |caught_up: &[u64]| ReplicaView {
            leads: true,
            caught_up: caught_up.to_vec(),
            follows: false,
        };
        // A follower keeps its consumers, unless it does not follow a leader
        // (cut off, or no leader heard for LEADER_GRACE) or is still behind
        // when its long poll ends.
        assert_eq!(suggested_broker_id(2, &follower(true), false, "T", 3), 3);
        assert_eq!(suggested_broker_id(2, &follower(false), false, "T", 3), 0);
        assert_eq!(suggested_broker_id(2, &follower(true), true, "T", 3), 0);
        // The leader spreads a topic's queues evenly over the followers that
        // keep up, the same queue always to the same one.
        for topic in ["T", "U", "%RETRY%G"] {
            let named: Vec<u64> = (0..4)
                .map(|q| suggested_broker_id(1, &leader(&[0, 2]), false, topic, q))
                .collect();
            assert_eq!(named.iter().filter(|&&id| id == 1).count(), 2, "{named:?}");
            assert_eq!(named.iter().filter(|&&id| id == 3).count(), 2, "{named:?}");
            assert_eq!(
                named[0],
                suggested_broker_id(1, &leader(&[0, 2]), false, topic, 0)
            );
        }
        assert_eq!(suggested_broker_id(1, &leader(&[2]), false, "T", 7), 3);
        // A leader without a follower that keeps up: itself, by its member id.
        assert_eq!(suggested_broker_id(1, &leader(&[]), false, "T", 0), 2);
    }

    /// Broker id → node id, as a consumer's route maps them.
    type Route = std::collections::BTreeMap<u64, u64>;

    /// The node the C++ core pulls from when told `id`
    /// (`MQClientFactory::findBrokerAddressInSubscribe`): that id, else the
    /// lowest id listed.
    fn cpp_pulls_from(route: &Route, id: u64) -> u64 {
        *route.get(&id).or(route.values().next()).unwrap()
    }

    /// The node the Java client pulls from when told `id`
    /// (`MQClientInstance.findBrokerAddressInSubscribe`): that id, else id + 1
    /// (for an id other than 0), else its HashMap's first entry (the lowest
    /// id for these small keys).
    fn java_pulls_from(route: &Route, id: u64) -> u64 {
        *route
            .get(&id)
            .or_else(|| (id != 0).then(|| route.get(&(id + 1))).flatten())
            .or(route.values().next())
            .unwrap()
    }

    /// Node 0 led and died; node 1 leads now, node 2 follows. Whichever route
    /// a consumer holds (from before the election, or after it, with or
    /// without the dead member still listed), each answer sends it to a live
    /// member, the one meant, with either client.
    #[test]
    fn a_suggestion_reaches_a_live_member_in_routes_from_before_and_after_an_election() {
        use ledgermq_raft::ReplicaView;
        let routes: [(&str, Route); 3] = [
            ("before", Route::from([(0, 0), (1, 0), (2, 1), (3, 2)])),
            (
                "after, dead listed",
                Route::from([(0, 1), (1, 0), (2, 1), (3, 2)]),
            ),
            ("after", Route::from([(0, 1), (2, 1), (3, 2)])),
        ];
        let leader = |caught_up: &[u64]| ReplicaView {
            leads: true,
            caught_up: caught_up.to_vec(),
            follows: false,
        };
        let follower = ReplicaView {
            leads: false,
            caught_up: vec![],
            follows: true,
        };
        let answers = [
            ("leader, follower keeps up", 1, leader(&[2]), 2),
            ("leader alone", 1, leader(&[]), 1),
            ("follower", 2, follower, 2),
        ];
        for (what, self_id, view, meant) in &answers {
            for q in 0..4 {
                let id = suggested_broker_id(*self_id, view, false, "T", q);
                for (when, route) in &routes {
                    assert_eq!(
                        cpp_pulls_from(route, id),
                        *meant,
                        "{what}, C++, route {when}"
                    );
                    assert_eq!(
                        java_pulls_from(route, id),
                        *meant,
                        "{what}, Java, route {when}"
                    );
                }
            }
        }
    }

    use super::*;
    use std::io::Write;

    fn rec(body: Vec<u8>, gzip: bool) -> ledgermq_store::MessageRecord {
        let r = ledgermq_store::MessageRecord::message("T", 0, body, 0);
        if gzip {
            r.with_property(PROPERTY_BODY_ENCODING, "GZIP")
        } else {
            r
        }
    }

    #[test]
    fn compressed_5x_bodies_become_readable_for_4x_consumers() {
        let plain = b"hello hello hello".to_vec();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&plain).unwrap();
        let mut r = rec(gz.finish().unwrap(), true);
        assert_eq!(for_4x_consumers(&mut r, 1 << 20), 0);
        assert_eq!(r.body, plain);
        assert!(!r.properties.contains_key(PROPERTY_BODY_ENCODING));
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(&plain).unwrap();
        let zlib = z.finish().unwrap();
        let mut r = rec(zlib.clone(), true);
        assert_eq!(for_4x_consumers(&mut r, 1 << 20), SYSFLAG_COMPRESSED);
        assert_eq!(r.body, zlib);
        let mut r = rec(plain.clone(), false);
        assert_eq!(for_4x_consumers(&mut r, 1 << 20), 0);
        // A damaged gzip body, or one that inflates past the limit, is passed
        // on as stored.
        let mut r = rec(vec![0x1f, 0x8b, 0, 0], true);
        assert_eq!(for_4x_consumers(&mut r, 1 << 20), 0);
        assert_eq!(r.body, vec![0x1f, 0x8b, 0, 0]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&plain).unwrap();
        let gz = gz.finish().unwrap();
        let mut r = rec(gz.clone(), true);
        for_4x_consumers(&mut r, plain.len() - 1);
        assert_eq!(r.body, gz);
    }
}
