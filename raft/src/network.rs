//! The peer transport: a tonic gRPC service per node (`proto/raft_peer.proto`) and
//! openraft's `RaftNetwork` client over it. Every call carries openraft's deadline
//! (`RPCOption::hard_ttl`); channels connect lazily and reconnect by themselves, so a
//! dead peer costs a failed call, never a stalled group.
//!
//! A [`NetworkFilter`] can drop traffic between chosen pairs of nodes, in either
//! direction, or give a link latency and a bandwidth, for fault injection in tests.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::Backoff;
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use crate::types::{NodeId, TypeConfig};

/// Generated gRPC code for `ledgermq.raft`.
pub mod pb {
    // Generated: documented in the .proto file.
    #![allow(missing_docs)]
    tonic::include_proto!("ledgermq.raft");
}

use pb::raft_peer_client::RaftPeerClient;

/// HTTP/2 flow-control windows for peer traffic. h2's 64 KiB default makes a large
/// AppendEntries wait for window updates mid-message; replication wants megabytes in
/// flight.
pub const HTTP2_STREAM_WINDOW_BYTES: u32 = 8 << 20;
/// See [`HTTP2_STREAM_WINDOW_BYTES`].
pub const HTTP2_CONNECTION_WINDOW_BYTES: u32 = 32 << 20;

/// gRPC metadata key naming the sending node.
pub const FROM_HEADER: &str = "x-ledgermq-from";
/// Header of a forwarded write: the time its forwarding node has left for it, ms,
/// measured on that node's monotonic clock when it sends the request (as gRPC's own
/// `grpc-timeout`). The leader adds it to its own monotonic clock on arrival and
/// does not propose the write after that deadline ([`forward_budget`]): a request
/// held up in the network (e.g. by TCP retransmission across a healed partition)
/// must not commit after writes its producer made since. Wall clocks play no part,
/// so nodes whose clocks disagree (issue 14) still forward. The time in transit is
/// not counted: the leader may still propose a write up to one network transit
/// after its follower gave up. (The follower also cancels the call when it gives
/// up; that cancellation travels behind the request on the same connection, and a
/// leader that has not proposed the write when it arrives drops it.)
pub const TIMEOUT_HEADER: &str = "x-ledgermq-timeout-ms";
/// Header of a forwarded write from the previous release: the wall-clock time (ms
/// since the Unix epoch) after which the forwarding node gives up on it. Still sent
/// beside [`TIMEOUT_HEADER`] for a leader of the previous release, which reads only
/// this one; read only when [`TIMEOUT_HEADER`] is absent or malformed (a follower of the
/// previous release, during a rolling upgrade), and then it assumes the two nodes'
/// wall clocks agree to well within a write timeout.
pub const DEADLINE_HEADER: &str = "x-ledgermq-deadline-ms";

/// The time left until the wall-clock deadline `deadline_ms` (ms since the Unix
/// epoch) as of the wall-clock time `now_ms`, if any is left.
pub fn time_left(deadline_ms: i64, now_ms: i64) -> Option<Duration> {
    let left = deadline_ms.saturating_sub(now_ms);
    (left > 0).then(|| Duration::from_millis(left as u64))
}

/// Until when the leader may propose a forwarded write, from its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardBudget {
    /// No deadline given (a sender that sets neither header): the write is dropped
    /// only if its caller goes away.
    Unbounded,
    /// Not to be proposed at or after this instant of the receiver's monotonic clock.
    Until(tokio::time::Instant),
    /// The sender had no time left: not to be proposed at all.
    Expired,
}

/// Reads a forwarded write's deadline from its `headers`, as received at `now` on
/// this node's monotonic clock and `now_ms` on its wall clock (ms since the Unix
/// epoch): [`TIMEOUT_HEADER`] if present and valid, else the previous release's
/// [`DEADLINE_HEADER`], else none. No I/O.
pub fn forward_budget(
    headers: &tonic::metadata::MetadataMap,
    now: tokio::time::Instant,
    now_ms: i64,
) -> ForwardBudget {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let left = match header(TIMEOUT_HEADER).and_then(|v| v.parse::<u64>().ok()) {
        Some(ms) => (ms > 0).then(|| Duration::from_millis(ms)),
        None => match header(DEADLINE_HEADER).and_then(|v| v.parse::<i64>().ok()) {
            Some(deadline_ms) => time_left(deadline_ms, now_ms),
            None => return ForwardBudget::Unbounded,
        },
    };
    match left {
        // A budget past the clock's range (never sent: a sender has at most its
        // write timeout) bounds nothing, rather than panicking.
        Some(left) => now
            .checked_add(left)
            .map_or(ForwardBudget::Unbounded, ForwardBudget::Until),
        None => ForwardBudget::Expired,
    }
}

/// Sets a forwarded write's deadline headers on `request`: [`TIMEOUT_HEADER`] with
/// the `left` the sender has (whole ms, rounded down), and [`DEADLINE_HEADER`] with
/// the sender's wall-clock time `now_ms` plus `left`, for a leader of the previous
/// release.
pub fn set_forward_budget<T>(request: &mut tonic::Request<T>, left: Duration, now_ms: i64) {
    let left_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
    let deadline_ms = now_ms.saturating_add(i64::try_from(left_ms).unwrap_or(i64::MAX));
    let headers = request.metadata_mut();
    for (name, value) in [
        (TIMEOUT_HEADER, left_ms.to_string()),
        (DEADLINE_HEADER, deadline_ms.to_string()),
    ] {
        headers.insert(name, value.parse().expect("a number is a valid header"));
    }
}

/// Pairs `(from, to)` whose traffic is dropped, and links with a latency and a
/// bandwidth. Shared by every node of an in-process test cluster; empty in
/// production.
#[derive(Clone, Default, Debug)]
pub struct NetworkFilter {
    blocked: Arc<RwLock<HashSet<(NodeId, NodeId)>>>,
    links: Arc<Mutex<HashMap<(NodeId, NodeId), Link>>>,
}

/// A one-way link's shape: every message waits `latency_ms` and its bytes cross
/// at `bytes_per_sec`, one message after another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkShape {
    /// One-way latency in ms.
    pub latency_ms: u64,
    /// Bandwidth in bytes per second (must be above 0).
    pub bytes_per_sec: u64,
}

#[derive(Clone, Copy, Debug)]
struct Link {
    shape: LinkShape,
    /// When the link has finished sending what it was given so far.
    busy_until: tokio::time::Instant,
}

impl NetworkFilter {
    /// Drops traffic from `from` to `to` (one way).
    pub fn block(&self, from: NodeId, to: NodeId) {
        self.blocked.write().unwrap().insert((from, to));
    }

    /// Cuts `node` off from every node in `others`, both ways.
    pub fn isolate(&self, node: NodeId, others: impl IntoIterator<Item = NodeId>) {
        for o in others {
            self.block(node, o);
            self.block(o, node);
        }
    }

    /// Restores all traffic (drops and link shapes).
    pub fn heal(&self) {
        self.blocked.write().unwrap().clear();
        self.links.lock().unwrap().clear();
    }

    /// Gives the link from `from` to `to` (one way) latency and bandwidth.
    pub fn shape(&self, from: NodeId, to: NodeId, shape: LinkShape) {
        assert!(shape.bytes_per_sec > 0, "a link needs some bandwidth");
        self.links.lock().unwrap().insert(
            (from, to),
            Link {
                shape,
                busy_until: tokio::time::Instant::now(),
            },
        );
    }

    /// How long a message of `bytes` sent now from `from` to `to` takes to arrive
    /// (zero on an unshaped link); it occupies the link's bandwidth meanwhile.
    pub fn transfer_delay(&self, from: NodeId, to: NodeId, bytes: usize) -> Duration {
        let mut links = self.links.lock().unwrap();
        let Some(link) = links.get_mut(&(from, to)) else {
            return Duration::ZERO;
        };
        let now = tokio::time::Instant::now();
        let send = Duration::from_secs_f64(bytes as f64 / link.shape.bytes_per_sec as f64);
        link.busy_until = link.busy_until.max(now) + send;
        link.busy_until + Duration::from_millis(link.shape.latency_ms) - now
    }

    /// True if traffic from `from` to `to` is dropped.
    pub fn is_blocked(&self, from: NodeId, to: NodeId) -> bool {
        self.blocked.read().unwrap().contains(&(from, to))
    }
}

/// Encodes a value for a [`pb::Payload`].
pub fn encode<T: Serialize>(v: &T) -> Result<pb::Payload, tonic::Status> {
    postcard::to_stdvec(v)
        .map(|data| pb::Payload { data })
        .map_err(|e| tonic::Status::internal(format!("encode: {e}")))
}

/// Decodes a value from a [`pb::Payload`].
pub fn decode<T: DeserializeOwned>(p: &pb::Payload) -> Result<T, tonic::Status> {
    postcard::from_bytes(&p.data)
        .map_err(|e| tonic::Status::invalid_argument(format!("decode: {e}")))
}

/// A peer request carrying `value`, with its deadline and the sender's id.
pub fn peer_request<T: Serialize>(
    from: NodeId,
    value: &T,
    timeout: Duration,
) -> Result<tonic::Request<pb::Payload>, tonic::Status> {
    let mut req = tonic::Request::new(encode(value)?);
    req.set_timeout(timeout);
    req.metadata_mut().insert(
        FROM_HEADER,
        from.to_string()
            .parse()
            .expect("a number is a valid header"),
    );
    Ok(req)
}

/// TLS on the peer port: mutual, each member presenting its node certificate
/// and accepting only peers whose certificate chains to the group's CA
/// (`ledgermq_tls`), on the framed transport and on gRPC alike.
#[derive(Clone)]
pub struct PeerTls {
    /// The server side, asking for a member's certificate.
    pub acceptor: ledgermq_tls::TlsAcceptor,
    /// The client side of the framed transport.
    pub connector: ledgermq_tls::TlsConnector,
    /// The client side of gRPC channels.
    pub tonic: tonic::transport::ClientTlsConfig,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTls(mutual)")
    }
}

impl PeerTls {
    /// Both sides from a node's `material`. Error: a PEM input or a key rustls
    /// refuses.
    pub fn new(material: &ledgermq_tls::TlsMaterial) -> Result<Self, ledgermq_tls::TlsError> {
        Ok(Self {
            acceptor: material.acceptor(true)?,
            connector: material.connector(true)?,
            tonic: material.tonic_client(true),
        })
    }
}

/// A lazily connected channel to the peer port at `addr` (`host:port`): over
/// mutual TLS with `tls`, plain HTTP/2 without.
pub fn lazy_channel(
    addr: &str,
    connect_timeout: Duration,
    tls: Option<&PeerTls>,
) -> Result<Channel, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let e = Endpoint::from_shared(format!("{scheme}://{addr}")).map_err(|e| e.to_string())?;
    let e = match tls {
        Some(tls) => e.tls_config(tls.tonic.clone()).map_err(|e| e.to_string())?,
        None => e,
    };
    Ok(e.connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(HTTP2_STREAM_WINDOW_BYTES))
        .initial_connection_window_size(Some(HTTP2_CONNECTION_WINDOW_BYTES))
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect_lazy())
}

/// Builds one [`PeerClient`] per target.
#[derive(Clone)]
pub struct PeerNetworkFactory {
    /// This node.
    pub from: NodeId,
    /// Fault injection.
    pub filter: NetworkFilter,
    /// Records each peer that answers.
    pub contacts: crate::contact::Contacts,
    /// How long openraft waits after an unreachable (timed out or unconnectable)
    /// call before the next one to that peer: the heartbeat interval, not
    /// openraft's default 500 ms, which stalled every commit when the one
    /// remaining follower had a slow moment.
    pub backoff: Duration,
    /// Where vote refusals by a voter with a longer log are noted.
    pub longer_log: crate::elections::LongerLogSeen,
    /// Where each peer's log command set (its AppendEntries answers' header) is
    /// recorded.
    pub formats: crate::peer_formats::PeerFormats,
    /// Mutual TLS to the peers, when the group has it.
    pub tls: Option<PeerTls>,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        PeerClient {
            from: self.from,
            target,
            channel: lazy_channel(&node.addr, Duration::from_millis(500), self.tls.as_ref()),
            framed: crate::framed::Link::new(
                node.addr.clone(),
                self.from,
                self.tls.as_ref().map(|t| t.connector.clone()),
            ),
            filter: self.filter.clone(),
            contacts: self.contacts.clone(),
            backoff: self.backoff,
            longer_log: self.longer_log.clone(),
            formats: self.formats.clone(),
        }
    }
}

/// openraft's client for one peer.
pub struct PeerClient {
    from: NodeId,
    target: NodeId,
    channel: Result<Channel, String>,
    /// AppendEntries go here unless the peer speaks only gRPC.
    framed: crate::framed::Link,
    filter: NetworkFilter,
    contacts: crate::contact::Contacts,
    backoff: Duration,
    longer_log: crate::elections::LongerLogSeen,
    formats: crate::peer_formats::PeerFormats,
}

type RpcErr<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

impl PeerClient {
    async fn call<Req, Resp, E>(
        &mut self,
        method: Method,
        req: &Req,
        ttl: Duration,
    ) -> Result<Resp, RpcErr<E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        if self.filter.is_blocked(self.from, self.target) {
            return Err(RPCError::Unreachable(Unreachable::new(&TransportError(
                "blocked by the network filter".into(),
            ))));
        }
        let channel = match &self.channel {
            Ok(c) => c.clone(),
            Err(e) => {
                return Err(RPCError::Unreachable(Unreachable::new(&TransportError(
                    e.clone(),
                ))))
            }
        };
        let request = peer_request(self.from, req, ttl)
            .map_err(|s| RPCError::Network(NetworkError::new(&s)))?;
        let mut client = RaftPeerClient::new(channel);
        let (filter, from, target) = (&self.filter, self.from, self.target);
        let request_bytes = request.get_ref().data.len();
        // The deadline is also enforced here: the grpc-timeout header alone does not
        // stop a server that hangs.
        let call = async {
            tokio::time::sleep(filter.transfer_delay(from, target, request_bytes)).await;
            let reply = match method {
                Method::AppendEntries { .. } => client.append_entries(request).await,
                Method::Vote => client.vote(request).await,
                Method::InstallSnapshot => client.install_snapshot(request).await,
            };
            if let Ok(r) = &reply {
                let back = filter.transfer_delay(target, from, r.get_ref().data.len());
                tokio::time::sleep(back).await;
            }
            reply
        };
        let reply = tokio::time::timeout(ttl, call)
            .await
            .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("peer call timed out")));
        let reply = reply.map_err(|s| failed_call(&s))?;
        self.contacts.heard_from(self.target);
        if let Method::AppendEntries { term } = method {
            let header = reply
                .metadata()
                .get(crate::format::LOG_COMMANDS_HEADER)
                .and_then(|v| v.to_str().ok());
            let set = crate::peer_formats::set_of_header(header);
            self.formats.record(self.target, set, term);
        }
        let result: Result<Resp, RaftError<NodeId, E>> =
            decode(reply.get_ref()).map_err(|s| RPCError::Network(NetworkError::new(&s)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    /// AppendEntries over the framed transport (`crate::framed`): `None` if the
    /// peer speaks only gRPC, which the caller then uses. Filter, link shape,
    /// deadline, contacts and log command set as [`PeerClient::call`].
    async fn append_entries_framed(
        &mut self,
        rpc: &AppendEntriesRequest<TypeConfig>,
        ttl: Duration,
    ) -> Option<Result<AppendEntriesResponse<NodeId>, RpcErr>> {
        use crate::framed::{LinkError, STATUS_OK, STATUS_UNAVAILABLE};
        if self.filter.is_blocked(self.from, self.target) {
            return Some(Err(RPCError::Unreachable(Unreachable::new(
                &TransportError("blocked by the network filter".into()),
            ))));
        }
        let frame = match crate::framed::request_frame(rpc) {
            Ok(f) => f,
            Err(e) => return Some(Err(RPCError::Network(NetworkError::new(&e)))),
        };
        let (filter, from, target) = (self.filter.clone(), self.from, self.target);
        let link = &mut self.framed;
        let call = async {
            tokio::time::sleep(filter.transfer_delay(from, target, frame.len())).await;
            let answer = link.exchange(&frame).await?;
            let back = filter.transfer_delay(target, from, answer.payload.len());
            tokio::time::sleep(back).await;
            Ok::<_, LinkError>(answer)
        };
        let answer = match tokio::time::timeout(ttl, call).await {
            Ok(Ok(a)) => a,
            Ok(Err(LinkError::Unsupported | LinkError::Closed)) => return None,
            Ok(Err(LinkError::Io(e))) => {
                return Some(Err(RPCError::Unreachable(Unreachable::new(&e))))
            }
            Err(_) => {
                let e = TransportError("peer call timed out".into());
                return Some(Err(RPCError::Unreachable(Unreachable::new(&e))));
            }
        };
        let reason = || TransportError(String::from_utf8_lossy(&answer.payload).into_owned());
        match answer.status {
            STATUS_OK => {}
            STATUS_UNAVAILABLE => {
                return Some(Err(RPCError::Unreachable(Unreachable::new(&reason()))))
            }
            _ => return Some(Err(RPCError::Network(NetworkError::new(&reason())))),
        }
        self.contacts.heard_from(self.target);
        let term = rpc.vote.leader_id().term;
        self.formats.record(self.target, answer.log_commands, term);
        let result: Result<_, RaftError<NodeId>> = match postcard::from_bytes(&answer.payload) {
            Ok(r) => r,
            Err(e) => return Some(Err(RPCError::Network(NetworkError::new(&e)))),
        };
        Some(result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))))
    }
}

#[derive(Clone, Copy)]
enum Method {
    /// Sent by the leader of `term`.
    AppendEntries {
        term: u64,
    },
    Vote,
    InstallSnapshot,
}

/// openraft's error for a peer call that failed with `status`: one that ran out
/// of time or could not connect is `Unreachable` (openraft then waits
/// [`PeerClient`]'s backoff before the next call to that peer), anything else a
/// `Network` error. A timeout is not openraft's `Timeout`, which it retries at
/// once: the retry resends the entries the slow peer is still writing (tried:
/// a jepsen run's fault-free throughput fell from about 260 to 184 acks/s).
fn failed_call<E: std::error::Error>(status: &tonic::Status) -> RpcErr<E> {
    match status.code() {
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
            RPCError::Unreachable(Unreachable::new(status))
        }
        _ => RPCError::Network(NetworkError::new(status)),
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(self.backoff))
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr> {
        if self.framed.usable() {
            if let Some(res) = self.append_entries_framed(&rpc, option.hard_ttl()).await {
                return res;
            }
        }
        let term = rpc.vote.leader_id().term;
        self.call(Method::AppendEntries { term }, &rpc, option.hard_ttl())
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        self.call(Method::InstallSnapshot, &rpc, option.hard_ttl())
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr> {
        let resp: VoteResponse<NodeId> = self.call(Method::Vote, &rpc, option.hard_ttl()).await?;
        if !resp.vote_granted && resp.last_log_id > rpc.last_log_id {
            self.longer_log.note(rpc.vote.leader_id().term);
        }
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> tonic::metadata::MetadataMap {
        let mut m = tonic::metadata::MetadataMap::new();
        for (k, v) in pairs {
            m.insert(*k, v.parse().unwrap());
        }
        m
    }

    /// Wall-clock now on the leader, ms since the Unix epoch.
    const WALL: i64 = 1_700_000_000_000;

    #[test]
    fn a_forwarded_writes_budget_is_counted_on_the_leaders_monotonic_clock() {
        let now = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        // The follower's wall clock 10 s behind the leader's: its absolute deadline
        // has long passed here, yet the write has the 2.5 s its follower had left.
        let behind = headers(&[
            (TIMEOUT_HEADER, "2500"),
            (DEADLINE_HEADER, &(WALL - 7_500).to_string()),
        ]);
        assert_eq!(
            forward_budget(&behind, now, WALL),
            ForwardBudget::Until(now + ms(2500))
        );
        // 10 s ahead: not 12.5 s, still 2.5 s after the write arrived.
        let ahead = headers(&[
            (TIMEOUT_HEADER, "2500"),
            (DEADLINE_HEADER, &(WALL + 12_500).to_string()),
        ]);
        assert_eq!(
            forward_budget(&ahead, now, WALL),
            ForwardBudget::Until(now + ms(2500))
        );
        let spent = headers(&[(TIMEOUT_HEADER, "0")]);
        assert_eq!(forward_budget(&spent, now, WALL), ForwardBudget::Expired);
        let huge = headers(&[(TIMEOUT_HEADER, &u64::MAX.to_string())]);
        // A budget beyond reason neither panics nor refuses the write.
        assert_ne!(forward_budget(&huge, now, WALL), ForwardBudget::Expired);
    }

    #[test]
    fn a_follower_of_the_previous_release_is_read_by_its_wall_clock_deadline() {
        let now = tokio::time::Instant::now();
        let old = headers(&[(DEADLINE_HEADER, &(WALL + 2_000).to_string())]);
        assert_eq!(
            forward_budget(&old, now, WALL),
            ForwardBudget::Until(now + Duration::from_millis(2000))
        );
        let late = headers(&[(DEADLINE_HEADER, &(WALL - 1).to_string())]);
        assert_eq!(forward_budget(&late, now, WALL), ForwardBudget::Expired);
        // A malformed new header falls back to the old one.
        let bad = headers(&[
            (TIMEOUT_HEADER, "soon"),
            (DEADLINE_HEADER, &(WALL - 1).to_string()),
        ]);
        assert_eq!(forward_budget(&bad, now, WALL), ForwardBudget::Expired);
        assert_eq!(
            forward_budget(&headers(&[]), now, WALL),
            ForwardBudget::Unbounded
        );
    }

    #[test]
    fn a_forward_carries_its_budget_and_the_previous_releases_deadline() {
        let mut req = tonic::Request::new(());
        set_forward_budget(&mut req, Duration::from_micros(1_234_999), WALL);
        let get = |k| req.metadata().get(k).unwrap().to_str().unwrap().to_owned();
        assert_eq!(get(TIMEOUT_HEADER), "1234");
        assert_eq!(get(DEADLINE_HEADER), (WALL + 1234).to_string());
        // Read back by a leader of this release, whatever its wall clock says.
        let now = tokio::time::Instant::now();
        assert_eq!(
            forward_budget(req.metadata(), now, WALL + 60_000),
            ForwardBudget::Until(now + Duration::from_millis(1234))
        );
        // And by one of the previous release, as it did (clocks agreeing).
        let deadline_ms: i64 = get(DEADLINE_HEADER).parse().unwrap();
        assert_eq!(
            time_left(deadline_ms, WALL),
            Some(Duration::from_millis(1234))
        );
    }

    #[test]
    fn an_unreachable_peer_is_retried_after_a_heartbeat_interval_not_half_a_second() {
        let e: RpcErr = failed_call(&tonic::Status::deadline_exceeded("peer call timed out"));
        assert!(matches!(e, RPCError::Unreachable(_)));
        let e: RpcErr = failed_call(&tonic::Status::internal("bad frame"));
        assert!(matches!(e, RPCError::Network(_)));
        let client = PeerClient {
            from: 0,
            target: 1,
            channel: Err("not connected".into()),
            framed: crate::framed::Link::new("127.0.0.1:1".into(), 0, None),
            filter: NetworkFilter::default(),
            contacts: crate::contact::Contacts::new(0, vec![0, 1], Duration::from_secs(1)),
            backoff: Duration::from_millis(100),
            longer_log: Default::default(),
            formats: Default::default(),
        };
        let delays: Vec<Duration> = client.backoff().take(3).collect();
        assert_eq!(delays, vec![Duration::from_millis(100); 3]);
    }
}
