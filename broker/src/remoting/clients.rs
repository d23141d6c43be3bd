//! 4.x clients on this node: consumer group membership from HEART_BEAT (34)
//! and UNREGISTER_CLIENT (35), the consumer list (38) and the notification of
//! its change (40), the orderly consumers' queue locks (41, 42), and consumer
//! offsets (14, 15).
//!
//! Membership and locks are this node's own (every 4.x consumer heartbeats to
//! every member of the route, so each node knows the group's consumers; a
//! consumer not heard for [`CLIENT_EXPIRY`] is dropped). Locks are not
//! replicated: after a leader change an orderly consumer keeps its lock on the
//! nodes it locked it on, and a queue locked on the old leader only may be
//! locked by another consumer on the new one until the first renews (every
//! 20 s in the clients); a lock expires [`LOCK_EXPIRY`] after it was last
//! taken, as RocketMQ's `REBALANCE_LOCK_MAX_LIVE_TIME`.
//!
//! Offsets a consumer commits (UPDATE_CONSUMER_OFFSET, or piggybacked on a
//! pull from broker id 0; clients pulling by a member id, as pull answers
//! suggest, the leader's too, send only the former, every 5 s to broker id
//! 0) are kept here and committed through Raft in `Command::CommitOffsets`
//! entries of up to [`MAX_OFFSETS_PER_ENTRY`] every flush interval
//! ([`super::OFFSET_FLUSH_INTERVAL`]), pending (and seen by queries) until
//! this node has applied them; a query answers the newer of the pending and
//! the committed offset. Offsets only move forward (the rule of
//! `CommitOffsets`); an offset pending on a node that dies before its flush is
//! lost, and the queue is consumed again from the committed one (at least
//! once).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ledgermq_meta::{Command, OffsetCommit};
use ledgermq_remoting::codes::{request, response};
use ledgermq_remoting::conn::Conn;
use ledgermq_remoting::RemotingCommand;
use serde::{Deserialize, Serialize};

use super::fields::{opt, req_num, req_str};
use super::Remoting;
use crate::auth::Principal;
use crate::error::{refuse, BrokerError, ErrorKind};
use crate::message::check_group;

/// A consumer not heard from for this long is dropped (RocketMQ's
/// `channelExpiredTimeout`).
pub const CLIENT_EXPIRY: Duration = Duration::from_secs(120);
/// A queue lock not renewed for this long is free.
pub const LOCK_EXPIRY: Duration = Duration::from_secs(60);
/// Most consumers one group may have on one node, and most groups.
const MAX_CLIENTS_PER_GROUP: usize = 4096;
const MAX_GROUPS: usize = 4096;
/// Most offsets one `CommitOffsets` entry carries.
pub const MAX_OFFSETS_PER_ENTRY: usize = 1024;
/// Most offsets pending on one node (a commit of a queue not yet pending is
/// dropped past it, with a warning; the consumer commits it again).
const MAX_PENDING_OFFSETS: usize = 65_536;
/// Longest client id, group, or topic a heartbeat or lock body may name.
const MAX_NAME_BYTES: usize = 255;
/// Most queue locks one node holds (a lock on a queue past it is refused).
const MAX_LOCKS: usize = 65_536;

/// The prefix of a consumer group's retry topic (`MixAll.RETRY_GROUP_TOPIC_PREFIX`).
pub const RETRY_PREFIX: &str = "%RETRY%";

/// The retry topic of a consumer group (`MixAll.getRetryTopic`).
pub fn retry_topic(group: &str) -> String {
    format!("{RETRY_PREFIX}{group}")
}

struct Member {
    conn: Conn,
    last_seen: Instant,
}

type QueueKey = (String, String, i32);

#[derive(Default)]
struct Inner {
    /// group → client id → member.
    groups: HashMap<String, HashMap<String, Member>>,
    /// (group, topic, queue) → (client id, taken at).
    locks: HashMap<QueueKey, (String, Instant)>,
    /// Offsets taken, not yet committed.
    pending: BTreeMap<QueueKey, u64>,
}

/// The node's 4.x client table (see the module doc).
#[derive(Default)]
pub(crate) struct Clients {
    inner: Mutex<Inner>,
}

impl Clients {
    /// Forgets the members whose connection `conn_id` closed, and tells their
    /// groups.
    pub(crate) fn connection_closed(&self, conn_id: u64) {
        let mut inner = self.inner.lock().unwrap();
        let mut changed = Vec::new();
        for (g, members) in inner.groups.iter_mut() {
            let before = members.len();
            members.retain(|_, m| m.conn.id != conn_id);
            if members.len() != before {
                changed.push(g.clone());
            }
        }
        inner.groups.retain(|_, m| !m.is_empty());
        for g in changed {
            notify(&inner, &g);
        }
    }

    /// Takes a consumer's offset commit, to be flushed (the caller checked
    /// the group, the topic and the queue id).
    pub(crate) fn take_offset(&self, group: &str, topic: &str, queue_id: i32, offset: u64) {
        let mut inner = self.inner.lock().unwrap();
        let key = (group.to_owned(), topic.to_owned(), queue_id);
        if !inner.pending.contains_key(&key) && inner.pending.len() >= MAX_PENDING_OFFSETS {
            tracing::warn!(
                group,
                topic,
                queue_id,
                "too many offsets pending; dropped one"
            );
            return;
        }
        let e = inner.pending.entry(key).or_insert(offset);
        *e = (*e).max(offset);
    }
}

/// Sends NOTIFY_CONSUMER_IDS_CHANGED to every member of `group`.
fn notify(inner: &Inner, group: &str) {
    let Some(members) = inner.groups.get(group) else {
        return;
    };
    for m in members.values() {
        m.conn.send_oneway(RemotingCommand::request(
            request::NOTIFY_CONSUMER_IDS_CHANGED,
            [("consumerGroup", group)],
        ));
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HeartbeatData {
    #[serde(rename = "clientID", default)]
    client_id: String,
    #[serde(default)]
    consumer_data_set: Vec<ConsumerData>,
    #[serde(default)]
    producer_data_set: Vec<ProducerData>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProducerData {
    #[serde(default)]
    group_name: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConsumerData {
    #[serde(default)]
    group_name: String,
    /// "CLUSTERING" or "BROADCASTING" (Java), or 1 and 0 (the C++ core).
    #[serde(default)]
    message_model: serde_json::Value,
}

impl ConsumerData {
    fn broadcasting(&self) -> bool {
        match &self.message_model {
            serde_json::Value::String(s) => s == "BROADCASTING",
            serde_json::Value::Number(n) => n.as_i64() == Some(0),
            _ => false,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
struct MessageQueue {
    topic: String,
    broker_name: String,
    queue_id: i32,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LockBody {
    consumer_group: String,
    client_id: String,
    #[serde(default)]
    mq_set: Vec<MessageQueue>,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A unique message id for a message sent without one, in the layout of
/// RocketMQ's `MessageClientIDSetter` (address 4, pid 2, a per-process value 4,
/// time 4, counter 2; uppercase hex).
pub(crate) fn new_message_id(host: SocketAddr) -> String {
    let mut b = Vec::with_capacity(16);
    match host.ip() {
        std::net::IpAddr::V4(ip) => b.extend_from_slice(&ip.octets()),
        std::net::IpAddr::V6(ip) => b.extend_from_slice(&ip.octets()[12..]),
    }
    b.extend_from_slice(&(std::process::id() as u16).to_be_bytes());
    b.extend_from_slice(&(host.port() as u32).to_be_bytes());
    b.extend_from_slice(&(ledgermq_store::store::now_ms() as u32).to_be_bytes());
    b.extend_from_slice(&(COUNTER.fetch_add(1, Ordering::Relaxed) as u16).to_be_bytes());
    b.iter().map(|x| format!("{x:02X}")).collect()
}

/// A lock body's names are bounded. Error: BAD_REQUEST.
fn check_lock_body(b: &LockBody) -> Result<(), BrokerError> {
    let too_long = |s: &str| s.is_empty() || s.len() > MAX_NAME_BYTES;
    if too_long(&b.consumer_group)
        || too_long(&b.client_id)
        || b.mq_set
            .iter()
            .any(|q| too_long(&q.topic) || q.broker_name.len() > MAX_NAME_BYTES)
    {
        return Err(refuse(
            ErrorKind::BadRequest,
            format!(
                "a lock body's group, client id and topics must be 1 to {MAX_NAME_BYTES} bytes"
            ),
        ));
    }
    Ok(())
}

fn bad_json(what: &str, e: serde_json::Error) -> BrokerError {
    refuse(ErrorKind::BadRequest, format!("{what} body: {e}"))
}

impl Remoting {
    /// HEART_BEAT: records the client's producer groups with `principal`,
    /// who signed it (transaction check-backs go only to a producer that may
    /// publish to the half's topic), and its consumer groups (telling a group
    /// when a member joins), and creates the retry topic of each clustering
    /// group, as RocketMQ's broker does.
    pub(super) async fn heartbeat(
        &self,
        req: &RemotingCommand,
        conn: &Conn,
        principal: &Principal,
    ) -> Result<RemotingCommand, BrokerError> {
        let hb: HeartbeatData = serde_json::from_slice(&req.body).map_err(|e| {
            tracing::debug!(peer = %conn.peer, error = %e, "heartbeat body does not parse");
            bad_json("heartbeat", e)
        })?;
        let mut clustering = Vec::new();
        {
            let mut inner = self.clients.inner.lock().unwrap();
            let now = Instant::now();
            if hb.client_id.is_empty() || hb.client_id.len() > MAX_NAME_BYTES {
                return Err(refuse(
                    ErrorKind::BadRequest,
                    format!("a heartbeat's clientID must be 1 to {MAX_NAME_BYTES} bytes"),
                ));
            }
            for p in &hb.producer_data_set {
                if check_group(&p.group_name).is_ok() {
                    self.broker.remoting_producers.register(
                        &p.group_name,
                        &hb.client_id,
                        conn,
                        principal.clone(),
                    );
                }
            }
            for c in &hb.consumer_data_set {
                if check_group(&c.group_name).is_err() {
                    continue;
                }
                if !inner.groups.contains_key(&c.group_name) && inner.groups.len() >= MAX_GROUPS {
                    continue;
                }
                let members = inner.groups.entry(c.group_name.clone()).or_default();
                let joined = !members.contains_key(&hb.client_id);
                if joined && members.len() >= MAX_CLIENTS_PER_GROUP {
                    continue;
                }
                members.insert(
                    hb.client_id.clone(),
                    Member {
                        conn: conn.clone(),
                        last_seen: now,
                    },
                );
                self.broker.consumer_clients.seen(
                    &c.group_name,
                    &hb.client_id,
                    crate::consumer_clients::ClientInfo {
                        protocol: "remoting 4.x",
                        language: req.language.name().to_owned(),
                        version: req.version.to_string(),
                        addr: conn.peer.to_string(),
                        conn_id: Some(conn.id),
                    },
                );
                if joined {
                    notify(&inner, &c.group_name);
                }
                if !c.broadcasting() {
                    clustering.push(c.group_name.clone());
                }
            }
        }
        // The group and its retry topic, as RocketMQ's broker makes them at a
        // heartbeat (under the auto-creation setting and the group limit).
        for g in clustering {
            let made = match self.broker.group_or_create(&g).await {
                Ok(_) => self.broker.ensure_topic(&retry_topic(&g)).await,
                Err(e) => Err(e),
            };
            if let Err(e) = made {
                tracing::debug!(group = %g, error = %e, "no retry topic for the group");
            }
        }
        Ok(RemotingCommand::response_to(req, response::SUCCESS, None))
    }

    /// UNREGISTER_CLIENT: forgets the client in its producer group and its
    /// consumer group, where `conn` registered it (a request naming another
    /// connection's client changes nothing).
    pub(super) fn unregister(
        &self,
        req: &RemotingCommand,
        conn: &Conn,
    ) -> Result<RemotingCommand, BrokerError> {
        let client = req_str(req, "clientID", None)?;
        if let Some(group) = opt(req, "producerGroup", None) {
            self.broker
                .remoting_producers
                .remove(group, client, conn.id);
        }
        if let Some(group) = opt(req, "consumerGroup", None) {
            let mut inner = self.clients.inner.lock().unwrap();
            let gone = match inner.groups.get_mut(group) {
                Some(m) if m.get(client).is_some_and(|x| x.conn.id == conn.id) => {
                    m.remove(client);
                    true
                }
                _ => false,
            };
            if gone {
                self.broker.consumer_clients.gone(group, client);
                notify(&inner, group);
            }
            inner.groups.retain(|_, m| !m.is_empty());
        }
        Ok(RemotingCommand::response_to(req, response::SUCCESS, None))
    }

    /// GET_CONSUMER_LIST_BY_GROUP: `{"consumerIdList":[...]}` of the live
    /// members, sorted; SYSTEM_ERROR when there are none (as RocketMQ).
    pub(super) fn consumer_list(
        &self,
        req: &RemotingCommand,
    ) -> Result<RemotingCommand, BrokerError> {
        let group = req_str(req, "consumerGroup", None)?;
        let mut inner = self.clients.inner.lock().unwrap();
        let ids: BTreeSet<String> = match inner.groups.get_mut(group) {
            Some(m) => {
                m.retain(|_, x| x.last_seen.elapsed() < CLIENT_EXPIRY && !x.conn.is_closed());
                m.keys().cloned().collect()
            }
            None => BTreeSet::new(),
        };
        if ids.is_empty() {
            return Ok(RemotingCommand::response_to(
                req,
                response::SYSTEM_ERROR,
                Some(format!("no consumer for this group, {group}")),
            ));
        }
        let mut r = RemotingCommand::response_to(req, response::SUCCESS, None);
        r.body = serde_json::to_vec(&serde_json::json!({ "consumerIdList": ids })).expect("JSON");
        Ok(r)
    }

    /// QUERY_CONSUMER_OFFSET: the newer of the pending and the committed
    /// offset; QUERY_NOT_FOUND when neither exists.
    pub(super) fn query_offset(
        &self,
        req: &RemotingCommand,
    ) -> Result<RemotingCommand, BrokerError> {
        let key = (
            req_str(req, "consumerGroup", None)?.to_owned(),
            req_str(req, "topic", None)?.to_owned(),
            req_num::<i32>(req, "queueId", None)?,
        );
        let pending = self
            .clients
            .inner
            .lock()
            .unwrap()
            .pending
            .get(&key)
            .copied();
        let committed = self
            .broker
            .node
            .shared_meta()
            .read()
            .unwrap()
            .offsets
            .get(&key)
            .copied();
        match pending.max(committed) {
            Some(o) => {
                let mut r = RemotingCommand::response_to(req, response::SUCCESS, None);
                r.ext_fields.insert("offset".into(), o.to_string());
                Ok(r)
            }
            None => Ok(RemotingCommand::response_to(
                req,
                response::QUERY_NOT_FOUND,
                Some("Not found, maybe this group consumer boot first".into()),
            )),
        }
    }

    /// UPDATE_CONSUMER_OFFSET: takes the offset (committed with the next flush).
    pub(super) fn update_offset(
        &self,
        req: &RemotingCommand,
    ) -> Result<RemotingCommand, BrokerError> {
        let group = req_str(req, "consumerGroup", None)?;
        check_group(group)?;
        let topic = self.broker.readable_topic(req_str(req, "topic", None)?)?;
        let queue_id: i32 = req_num(req, "queueId", None)?;
        super::pull::check_queue(&topic, queue_id)?;
        let offset: i64 = req_num(req, "commitOffset", None)?;
        if offset >= 0 {
            self.clients
                .take_offset(group, &topic.name, queue_id, offset as u64);
        }
        Ok(RemotingCommand::response_to(req, response::SUCCESS, None))
    }

    /// Commits the pending offsets through Raft, up to
    /// [`MAX_OFFSETS_PER_ENTRY`] in an entry. An offset stays pending (and
    /// queries see it) until this node has applied a commit of it or a later
    /// one; a failed write is tried again at the next flush.
    pub(super) async fn flush_offsets(&self) {
        let pending: Vec<(QueueKey, u64)> = self
            .clients
            .inner
            .lock()
            .unwrap()
            .pending
            .iter()
            .map(|(k, &o)| (k.clone(), o))
            .collect();
        for chunk in pending.chunks(MAX_OFFSETS_PER_ENTRY) {
            let commits = chunk
                .iter()
                .map(|((group, topic, queue_id), offset)| OffsetCommit {
                    group: group.clone(),
                    topic: topic.clone(),
                    queue_id: *queue_id,
                    offset: *offset,
                })
                .collect();
            if let Err(e) = self
                .broker
                .node
                .write_command(Command::CommitOffsets(commits))
                .await
            {
                tracing::debug!(error = %e, "committing remoting offsets failed; retrying");
                return;
            }
        }
        // Drop what this node has applied (a follower's apply may lag the
        // leader's: the rest stays for the next flush).
        let meta = self.broker.node.shared_meta().read().unwrap();
        let mut inner = self.clients.inner.lock().unwrap();
        inner
            .pending
            .retain(|k, o| meta.offsets.get(k).is_none_or(|&c| c < *o));
    }

    /// LOCK_BATCH_MQ: locks each queue asked for that is free, expired or the
    /// client's already; answers `{"lockOKMQSet":[...]}` with those.
    pub(super) fn lock(&self, req: &RemotingCommand) -> Result<RemotingCommand, BrokerError> {
        let body: LockBody = serde_json::from_slice(&req.body).map_err(|e| bad_json("lock", e))?;
        check_lock_body(&body)?;
        let mut inner = self.clients.inner.lock().unwrap();
        let now = Instant::now();
        if inner.locks.len() >= MAX_LOCKS {
            inner.locks.retain(|_, (_, at)| at.elapsed() < LOCK_EXPIRY);
        }
        let mut ok = Vec::new();
        for mq in body.mq_set {
            let key = (body.consumer_group.clone(), mq.topic.clone(), mq.queue_id);
            let free = match inner.locks.get(&key) {
                None => inner.locks.len() < MAX_LOCKS,
                Some((holder, at)) => *holder == body.client_id || at.elapsed() >= LOCK_EXPIRY,
            };
            if free {
                inner.locks.insert(key, (body.client_id.clone(), now));
                ok.push(mq);
            }
        }
        let mut r = RemotingCommand::response_to(req, response::SUCCESS, None);
        r.body = serde_json::to_vec(&serde_json::json!({ "lockOKMQSet": ok })).expect("JSON");
        Ok(r)
    }

    /// UNLOCK_BATCH_MQ: releases the client's locks on the queues named.
    pub(super) fn unlock(&self, req: &RemotingCommand) -> Result<RemotingCommand, BrokerError> {
        let body: LockBody =
            serde_json::from_slice(&req.body).map_err(|e| bad_json("unlock", e))?;
        check_lock_body(&body)?;
        let mut inner = self.clients.inner.lock().unwrap();
        for mq in body.mq_set {
            let key = (body.consumer_group.clone(), mq.topic, mq.queue_id);
            if inner
                .locks
                .get(&key)
                .is_some_and(|(h, _)| *h == body.client_id)
            {
                inner.locks.remove(&key);
            }
        }
        Ok(RemotingCommand::response_to(req, response::SUCCESS, None))
    }
}
