//! The peer gRPC service of one node: openraft's RPCs, write forwarding from
//! followers, TimeoutNow for leadership transfer, and ReadEntry for a peer
//! repairing a damaged entry (`crate::repair`).

use std::sync::Arc;

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, VoteRequest, VoteResponse,
};
use tonic::{Request, Response, Status};

use crate::error::{ForwardRefusal, RaftNodeError};
use crate::network::pb::raft_peer_server::RaftPeer;
use crate::network::pb::Payload;
use crate::network::{decode, encode, forward_budget, ForwardBudget, NetworkFilter, FROM_HEADER};
use crate::types::Response as WriteResponse;
use crate::types::{NodeId, Raft, TypeConfig};
use crate::writer::Writer;

/// The local Raft and its writer, once started.
pub struct Core {
    /// The local Raft.
    pub raft: Raft,
    /// Leader-local writes (for forwarded requests).
    pub writer: Arc<Writer>,
    /// The holds on this node's elections (a voter campaigns on refusing a
    /// shorter log only while none but a retry is set).
    pub elections: Arc<crate::elections::ElectionGate>,
}

/// The service; cheap to clone. It serves from before openraft starts (which reads
/// the log, and may need a peer's `ReadEntry` to repair it, `crate::repair`):
/// until `core` is set every call but `ReadEntry` answers UNAVAILABLE, as a node
/// not listening yet would be seen.
#[derive(Clone)]
pub struct PeerService {
    /// This node.
    pub node_id: NodeId,
    /// Set once openraft and the writer run.
    pub core: Arc<std::sync::OnceLock<Core>>,
    /// Fault injection.
    pub filter: NetworkFilter,
    /// The store (whether it lost entries it had acknowledged).
    pub store: Arc<ledgermq_store::MessageStore>,
    /// Records each peer heard from.
    pub contacts: crate::contact::Contacts,
    /// AppendEntries answered by Raft since start, by transport.
    pub appends: Arc<AppendCounts>,
    /// The node, once started (membership changes a follower passes on are made
    /// by the node, which may hand leadership over first).
    pub node: Arc<std::sync::OnceLock<std::sync::Weak<crate::RaftNode>>>,
}

/// AppendEntries a node answered (Raft handled them and the answer went out),
/// by the transport they came over.
#[derive(Debug, Default)]
pub struct AppendCounts {
    /// Over the framed transport (`crate::framed`).
    pub framed: std::sync::atomic::AtomicU64,
    /// Over gRPC.
    pub grpc: std::sync::atomic::AtomicU64,
}

impl PeerService {
    fn core(&self) -> Result<&Core, Status> {
        self.core
            .get()
            .ok_or_else(|| Status::unavailable("starting: Raft is not running yet"))
    }

    /// Hands `rpc` to `core`'s Raft and notes a leader heard from; shared by the
    /// gRPC service and the framed transport (`crate::framed`).
    pub(crate) async fn append_entries_on(
        &self,
        core: &Core,
        rpc: AppendEntriesRequest<TypeConfig>,
    ) -> Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        let res = core.raft.append_entries(rpc).await;
        // Only a leader of the current term counts as heard: a deposed one is
        // answered HigherVote (or an error) and must not keep this node trusting it.
        if matches!(&res, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
            self.contacts.heard_from_leader();
        }
        res
    }

    fn admit(&self, req: &Request<Payload>) -> Result<(), Status> {
        match sender(req) {
            Some(f) if self.filter.is_blocked(f, self.node_id) => {
                Err(Status::unavailable("dropped by the network filter"))
            }
            Some(f) => {
                self.contacts.heard_from(f);
                Ok(())
            }
            None => Ok(()),
        }
    }
}

/// The member a peer request names as its sender, if it names one.
fn sender(req: &Request<Payload>) -> Option<NodeId> {
    req.metadata()
        .get(FROM_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<NodeId>().ok())
}

/// Whether node `me`, whose current leader is `leader` and whose vote in its
/// term went to `voted_for`, campaigns when `from` asks it to take over
/// (TimeoutNow): when it follows `from`, or follows no one and voted for no
/// one else (it campaigned on an earlier ask, which a voter still under the old
/// leader's lease refused: the hand-over asks again until the lease ends); not
/// when it follows another leader elected meanwhile, or voted for another
/// candidate whose first AppendEntries has not come yet, whose term a campaign
/// would end. One that already leads says yes (openraft ignores the election
/// trigger on a leader). A sender that names no one (an earlier release) is
/// obeyed as before. No I/O.
pub fn takes_over_from(
    me: NodeId,
    leader: Option<NodeId>,
    voted_for: Option<NodeId>,
    from: Option<NodeId>,
) -> bool {
    from.is_none()
        || leader == from
        || leader == Some(me)
        || (leader.is_none() && (voted_for.is_none() || voted_for == Some(me) || voted_for == from))
}

/// How long a granted vote counts as hearing from a leader
/// ([`crate::contact::Contacts::granted_vote`]): a few heartbeats, enough for the
/// winner's first AppendEntries to arrive.
pub const VOTE_GRANT_COUNTS_FOR: std::time::Duration = std::time::Duration::from_millis(300);

/// Whether a node that lost acknowledged entries may vote for a candidate whose
/// last log id is `candidate_last`: only if it is at least the node's acknowledged
/// mark (by term, then index), Raft's up-to-date check against the log as it was
/// before the damage. No I/O.
pub fn may_vote(
    acked: Option<ledgermq_store::ack_mark::AckedId>,
    candidate_last: Option<crate::types::LogId>,
) -> bool {
    let candidate = candidate_last.map(|l| ledgermq_store::ack_mark::AckedId {
        term: l.leader_id.term,
        index: l.index,
    });
    candidate >= acked
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn append_entries(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let core = self.core()?;
        self.admit(&req)?;
        let rpc: AppendEntriesRequest<TypeConfig> = decode(req.get_ref())?;
        let res = self.append_entries_on(core, rpc).await;
        self.appends
            .grpc
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut response = Response::new(encode(&res)?);
        // The log command set this node decodes (`crate::peer_formats`).
        response.metadata_mut().insert(
            crate::format::LOG_COMMANDS_HEADER,
            tonic::metadata::MetadataValue::from(u32::from(crate::format::LOG_COMMANDS)),
        );
        Ok(response)
    }

    async fn vote(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let core = self.core()?;
        self.admit(&req)?;
        let rpc: VoteRequest<NodeId> = decode(req.get_ref())?;
        let log = self.store.commit_log();
        // The lost-entries-vote canary (debug builds, tests only) votes as if
        // nothing was lost.
        let canary = crate::canary::enabled(crate::canary::Canary::LostEntriesVote);
        if !canary && log.lost_acknowledged() && !may_vote(log.acked_log_id(), rpc.last_log_id) {
            // This node lost entries it had acknowledged: its own log cannot show
            // whether the candidate has them, so it votes only for a candidate whose
            // log reaches at least as far as what it had acknowledged.
            let refused = VoteResponse {
                vote: rpc.vote,
                vote_granted: false,
                last_log_id: log
                    .last_entry()
                    .ok()
                    .flatten()
                    .map(|l| crate::codec::log_id(l.term, l.log_index)),
            };
            let res: Result<_, RaftError<NodeId>> = Ok(refused);
            return Ok(Response::new(encode(&res)?));
        }
        let candidate_last = rpc.last_log_id;
        let res: Result<_, RaftError<NodeId>> = core.raft.vote(rpc).await;
        if let Ok(r) = &res {
            let held = core.elections.held_except(crate::elections::Hold::Retry);
            let follows_a_leader = {
                let m = core.raft.metrics();
                let m = m.borrow();
                m.state == openraft::ServerState::Follower && m.vote.is_committed()
            };
            if crate::elections::campaign_after_refusing(
                r.vote_granted,
                candidate_last,
                r.last_log_id,
                follows_a_leader,
                self.contacts.leader_heard_lately(),
                held,
            ) {
                tracing::info!(
                    node = self.node_id,
                    ?candidate_last,
                    own_last = ?r.last_log_id,
                    "refused a candidate with a shorter log and no leader is heard from: campaigning"
                );
                // Not awaited here: the answer goes back first.
                let raft = core.raft.clone();
                tokio::spawn(async move {
                    let _ = raft.trigger().elect().await;
                });
            }
        }
        // A candidate this node voted for counts as a leader heard from, for a
        // moment: openraft shows it as leader here as soon as its first
        // AppendEntries is handled, before `append_entries` above marks it heard,
        // and a deposed leader (which heard from no leader while it led) would
        // refuse writes as cut off from it in between.
        if matches!(&res, Ok(r) if r.vote_granted) {
            self.contacts.granted_vote(VOTE_GRANT_COUNTS_FOR);
        }
        Ok(Response::new(encode(&res)?))
    }

    async fn install_snapshot(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let core = self.core()?;
        self.admit(&req)?;
        let rpc: InstallSnapshotRequest<TypeConfig> = decode(req.get_ref())?;
        let res: Result<_, RaftError<NodeId, InstallSnapshotError>> =
            core.raft.install_snapshot(rpc).await;
        Ok(Response::new(encode(&res)?))
    }

    async fn forward(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let core = self.core()?;
        self.admit(&req)?;
        let deadline = match forward_budget(
            req.metadata(),
            tokio::time::Instant::now(),
            ledgermq_store::store::now_ms(),
        ) {
            ForwardBudget::Unbounded => None,
            ForwardBudget::Until(deadline) => Some(deadline),
            ForwardBudget::Expired => {
                let res: Result<WriteResponse, ForwardRefusal> = Err(RaftNodeError::Expired.into());
                return Ok(Response::new(encode(&res)?));
            }
        };
        let request = decode(req.get_ref())?;
        let res = core
            .writer
            .write_local_until(request, deadline)
            .await
            .map_err(ForwardRefusal::from);
        Ok(Response::new(encode(&res)?))
    }

    async fn change_membership(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let _core = self.core()?;
        self.admit(&req)?;
        let asked: crate::node::ForwardedChange = decode(req.get_ref())?;
        let node = self
            .node
            .get()
            .and_then(|n| n.upgrade())
            .ok_or_else(|| Status::unavailable("starting: the node is not running yet"))?;
        let res = if node.is_leader() {
            let budget = std::time::Duration::from_millis(asked.timeout_ms)
                .min(crate::node::MAX_CHANGE_TIME);
            node.change_here(asked.change, tokio::time::Instant::now() + budget)
                .await
                .map_err(crate::node::MembershipRefusal::from)
        } else {
            Err(crate::node::MembershipRefusal::NotLeader)
        };
        Ok(Response::new(encode(&res)?))
    }

    async fn ping(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let _core = self.core()?;
        self.admit(&req)?;
        Ok(Response::new(encode(&())?))
    }

    async fn read_entry(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        self.admit(&req)?;
        let wanted: crate::repair::EntryWanted = decode(req.get_ref())?;
        let store = self.store.clone();
        // Reads and checks a whole entry (up to a segment): off the runtime's threads.
        let res = tokio::task::spawn_blocking(move || crate::repair::read_intact(&store, wanted))
            .await
            .map_err(|e| Status::internal(format!("reading an entry failed: {e}")))?;
        Ok(Response::new(encode(&res)?))
    }

    async fn timeout_now(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let core = self.core()?;
        self.admit(&req)?;
        if self.store.commit_log().lost_acknowledged()
            && !crate::canary::enabled(crate::canary::Canary::LostEntriesVote)
        {
            let res: Result<(), String> =
                Err("this node lost entries it had acknowledged; it does not campaign".into());
            return Ok(Response::new(encode(&res)?));
        }
        let from = sender(&req);
        let (leader, voted_for) = {
            let m = core.raft.metrics();
            let m = m.borrow();
            (m.current_leader, m.vote.leader_id().voted_for())
        };
        if !takes_over_from(self.node_id, leader, voted_for, from) {
            tracing::info!(
                node = self.node_id,
                ?from,
                ?leader,
                "asked to take over leadership by a node it does not follow: not campaigning"
            );
            let res: Result<(), String> = Err(format!(
                "node {} does not follow {from:?} (leader {leader:?})",
                self.node_id
            ));
            return Ok(Response::new(encode(&res)?));
        }
        tracing::info!(
            node = self.node_id,
            "asked to take over leadership: starting an election"
        );
        let res = core.raft.trigger().elect().await.map_err(|e| e.to_string());
        Ok(Response::new(encode(&res)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ledgermq_store::ack_mark::AckedId;

    #[test]
    fn only_the_followed_leader_makes_a_node_take_over() {
        // Node 0 asked by leader 1.
        assert!(takes_over_from(0, Some(1), Some(1), Some(1)));
        assert!(
            takes_over_from(0, None, Some(0), Some(1)),
            "a candidate refused under the lease"
        );
        assert!(
            !takes_over_from(0, Some(2), Some(2), Some(1)),
            "another leader now"
        );
        assert!(
            !takes_over_from(0, None, Some(2), Some(1)),
            "voted for another candidate, not heard from it yet"
        );
        assert!(
            takes_over_from(0, Some(2), Some(2), None),
            "an earlier release's request"
        );
        assert!(
            takes_over_from(0, Some(0), Some(0), Some(1)),
            "it won already"
        );
    }

    #[test]
    fn a_node_that_lost_entries_votes_only_for_logs_that_reach_its_mark() {
        let mark = Some(AckedId { term: 3, index: 50 });
        let id = |t, i| Some(crate::codec::log_id(t, i));
        assert!(!may_vote(mark, id(3, 21)), "a lagging candidate");
        assert!(!may_vote(mark, None));
        assert!(
            may_vote(mark, id(3, 50)),
            "one that holds every acknowledged entry"
        );
        assert!(
            may_vote(mark, id(4, 10)),
            "a later term's log is more up to date"
        );
        assert!(
            !may_vote(mark, id(2, 90)),
            "an older term's longer log is not"
        );
        assert!(may_vote(None, None));
    }
}
