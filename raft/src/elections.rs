//! When this node starts an election: the holds that keep openraft's election
//! timer off, and the retry of a campaign that ended without a leader.
//!
//! openraft 0.9 draws a node's election timeout once, when the node starts
//! (`EngineConfig::new`), and reuses it for every campaign; elections fire on a
//! tick of 1.5 heartbeat intervals that also starts with the node. Two survivors
//! of a killed leader whose draws round to the same number of ticks, on ticks in
//! phase, campaign at the same instant every round: each votes for itself and
//! refuses the other (same term, another candidate), and the group has a quorum
//! and no leader for as long as the timing holds (`raft/tests/elections.rs`).
//! openraft fixed it in 0.10 (databendlabs/openraft#1838, a fresh draw per
//! campaign). Here [`RetryTimer`] does the same from outside: once this node
//! campaigns, openraft's timer is held off, and if no leader is known a fresh
//! random delay later, this node campaigns again (`Trigger::elect`), which
//! starts the next round and the next draw.
//!
//! The draw is uniform in `[election_timeout_min, election_timeout_min +
//! election_timeout_max)`, Raft's `[T, 2T)` widened by the configured spread, so
//! that two candidates campaign together again only when their draws fall within
//! one message transit of each other, even under a narrow configured range. A
//! candidate that a voter with a longer log refused puts its retry off by two
//! maximum election timeouts, as openraft's own timer does
//! (`smaller_log_timeout`): the voter with the longer log can win, this node
//! cannot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::ServerState;
use rand::Rng;
use tokio::time::Instant;

use crate::types::Raft;

/// Why openraft's election timer is held off on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// This leader hands leadership to another node (`RaftNode::transfer_leadership`).
    Transfer = 1,
    /// This node lost entries it had acknowledged and stays out of elections
    /// until a leader gives them back (`CommitLog::lost_acknowledged`).
    LostEntries = 2,
    /// This node campaigned and [`RetryTimer`] times the next campaign.
    Retry = 4,
}

/// The holds on openraft's election timer (`RuntimeConfig::elect`): elections run
/// only while none is set. One per node, shared by whatever sets holds.
pub struct ElectionGate {
    raft: Raft,
    holds: Mutex<u8>,
}

impl ElectionGate {
    /// A gate with no hold on `raft`.
    pub fn new(raft: Raft) -> Arc<Self> {
        Arc::new(Self {
            raft,
            holds: Mutex::new(0),
        })
    }

    /// Sets `hold`: openraft's election timer stays off until every hold is released.
    pub fn hold(&self, hold: Hold) {
        let mut holds = self.holds.lock().unwrap();
        *holds |= hold as u8;
        self.raft.runtime_config().elect(false);
    }

    /// Releases `hold`; with no hold left, openraft's election timer runs again.
    pub fn release(&self, hold: Hold) {
        let mut holds = self.holds.lock().unwrap();
        *holds &= !(hold as u8);
        self.raft.runtime_config().elect(*holds == 0);
    }

    /// True if a hold other than `hold` is set.
    pub fn held_except(&self, hold: Hold) -> bool {
        *self.holds.lock().unwrap() & !(hold as u8) != 0
    }
}

/// Whether a voter that just answered a vote request campaigns at once: it
/// refused (`granted` false) a candidate whose last log id is below its own, so
/// that candidate cannot have this node's vote and this node can win; it is a
/// follower whose vote is still the one it gave the leader it followed
/// (`follows_a_leader`: not a candidate, not a leader, and it has not voted for
/// a candidate of a newer term, whose campaign it would break up); it has heard
/// from no leader for an election timeout (`leader_heard_lately` false: that
/// leader is gone for it too, so its campaign disturbs no live leader); and no
/// hold but a pending retry keeps it out of elections (`held`: a leadership
/// transfer, lost entries). No I/O.
///
/// Raft leaves such a voter to its own timer, which in openraft 0.9 can fire two
/// election timeouts late: it adds `smaller_log_timeout` while a
/// `seen_greater_log` flag is set, a flag set by an earlier campaign of this
/// node's that a longer log refused and cleared only by its next campaign
/// (jepsen `isolate-leader`: 3 s without a leader, against 1 s). In a group
/// where the candidate can win without this vote (a third voter whose log is no
/// longer than the candidate's grants it), this campaign costs that leader its
/// term: one more election, which the longest log wins.
pub fn campaign_after_refusing(
    granted: bool,
    candidate_last: Option<crate::types::LogId>,
    own_last: Option<crate::types::LogId>,
    follows_a_leader: bool,
    leader_heard_lately: bool,
    held: bool,
) -> bool {
    !granted && own_last > candidate_last && follows_a_leader && !leader_heard_lately && !held
}

/// The highest term in which a voter with a longer log refused this node's
/// campaign, seen in vote responses (`network::PeerClient::vote`); shared by the
/// node's peer clients and its [`retry_campaigns`].
#[derive(Debug, Clone, Default)]
pub struct LongerLogSeen(Arc<AtomicU64>);

impl LongerLogSeen {
    /// Notes a refusal in `term` by a voter whose last log id is greater than
    /// the one this node campaigned with.
    pub fn note(&self, term: u64) {
        self.0.fetch_max(term, Ordering::Relaxed);
    }

    /// True if a voter with a longer log refused this node in `term` or later.
    pub fn since(&self, term: u64) -> bool {
        self.0.load(Ordering::Relaxed) >= term.max(1)
    }
}

/// What the node looks like to the retry timer: a slice of openraft's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElectionView {
    /// This node is a candidate.
    pub candidate: bool,
    /// Its current term.
    pub term: u64,
    /// It knows a leader of its term (itself included).
    pub leader_known: bool,
}

impl ElectionView {
    /// The view of `m`, openraft's server metrics (the term is that of the vote
    /// as saved).
    pub fn of(
        m: &openraft::metrics::RaftServerMetrics<crate::types::NodeId, openraft::BasicNode>,
    ) -> Self {
        Self {
            candidate: m.state == ServerState::Candidate,
            term: m.vote.leader_id().get_term(),
            leader_known: m.current_leader.is_some(),
        }
    }
}

/// What to do after [`RetryTimer::observe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryStep {
    /// Nothing changes.
    Wait,
    /// A campaign began: hold openraft's timer; campaign again at this instant
    /// unless a leader is known by then.
    HoldUntil(Instant),
    /// A leader is known: release the hold.
    Release,
}

/// Times the retry of this node's campaigns; no I/O (the caller reads metrics and
/// acts on the steps). Once this node campaigns and until a leader is known, a
/// retry is always pending: a campaign of its own, or a higher term it learns
/// from another candidate (a vote it granted), sets a fresh one, as a Raft
/// follower resets its timer.
#[derive(Debug, Default)]
pub struct RetryTimer {
    /// The term of the last view.
    term: Option<u64>,
    /// When to campaign again, while this node times its campaigns.
    retry_at: Option<Instant>,
    /// The term whose retry was put off for a refusal by a longer log.
    postponed_in: Option<u64>,
}

impl RetryTimer {
    /// Takes a new view at `now`; `delay` is a fresh draw ([`retry_delay`]).
    pub fn observe(&mut self, view: ElectionView, now: Instant, delay: Duration) -> RetryStep {
        let new_term = self.term != Some(view.term);
        self.term = Some(view.term);
        if view.leader_known {
            return match self.retry_at.take() {
                Some(_) => RetryStep::Release,
                None => RetryStep::Wait,
            };
        }
        if new_term && (view.candidate || self.retry_at.is_some()) {
            let at = now + delay;
            self.retry_at = Some(at);
            return RetryStep::HoldUntil(at);
        }
        RetryStep::Wait
    }

    /// When to campaign again, if this node times its campaigns.
    pub fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// The retry instant passed with no leader known: the caller campaigns, and
    /// the campaign, once seen, sets the next retry; should none be seen, this
    /// node campaigns again after `delay` from `now`.
    pub fn fire(&mut self, now: Instant, delay: Duration) {
        self.retry_at = Some(now + delay);
    }

    /// The retry instant of the campaign in `term` passed, and a voter with a
    /// longer log refused that campaign: the retry moves to `until`, once per
    /// term, as openraft's own timer waits `smaller_log_timeout` (the voter with
    /// the longer log can win, this node cannot, and a campaign of this node's in
    /// a higher term would only make that voter's campaign lose). Returns true if
    /// it moved the retry.
    pub fn postpone_once(&mut self, term: u64, until: Instant) -> bool {
        if self.postponed_in == Some(term) || self.retry_at.is_none() {
            return false;
        }
        self.postponed_in = Some(term);
        self.retry_at = Some(until);
        true
    }
}

/// The fresh delay before a campaign is retried: uniform in
/// `[min_ms, min_ms + max_ms)`.
pub fn retry_delay(min_ms: u64, max_ms: u64, rng: &mut impl Rng) -> Duration {
    Duration::from_millis(min_ms + rng.gen_range(0..max_ms.max(1)))
}

/// Runs [`RetryTimer`] on `raft`'s server metrics until the node shuts down. They
/// change only with the vote, the role and the known leader (openraft sends them
/// only when they differ), so this task does not wake on every append or apply.
pub async fn retry_campaigns(
    raft: Raft,
    gate: Arc<ElectionGate>,
    longer_log: LongerLogSeen,
    min_ms: u64,
    max_ms: u64,
) {
    let mut rx = raft.server_metrics();
    let mut timer = RetryTimer::default();
    loop {
        let view = ElectionView::of(&rx.borrow_and_update());
        let delay = retry_delay(min_ms, max_ms, &mut rand::thread_rng());
        match timer.observe(view, Instant::now(), delay) {
            RetryStep::Wait => {}
            RetryStep::HoldUntil(at) => {
                tracing::debug!(
                    term = view.term,
                    in_ms = (at - Instant::now()).as_millis() as u64,
                    "campaign began; next one timed here"
                );
                gate.hold(Hold::Retry);
            }
            RetryStep::Release => gate.release(Hold::Retry),
        }
        let changed = async {
            match timer.retry_at() {
                Some(at) => tokio::time::timeout_at(at, rx.changed()).await.ok(),
                None => Some(rx.changed().await),
            }
        };
        match changed.await {
            Some(Ok(())) => continue,
            // openraft shut down.
            Some(Err(_)) => return,
            // The retry instant passed with no leader known.
            None => {}
        }
        let latest = ElectionView::of(&rx.borrow());
        if gate.held_except(Hold::Retry) {
            // Out of elections for another reason: that hold decides.
            timer = RetryTimer::default();
            gate.release(Hold::Retry);
        } else if latest.term != view.term || latest.leader_known {
            // The metrics changed as the instant passed (a vote this node just
            // granted, a leader): the next round looks at them, as openraft's own
            // timer looks at when the vote last changed.
        } else {
            // Refused by a longer log: the retry moves, once per term.
            let put_off = Instant::now() + Duration::from_millis(2 * max_ms);
            if longer_log.since(view.term) && timer.postpone_once(view.term, put_off) {
                continue;
            }
            timer.fire(Instant::now(), delay);
            tracing::info!(
                term = view.term,
                "no leader after a campaign: campaigning again"
            );
            if let Err(e) = raft.trigger().elect().await {
                // openraft shut down.
                tracing::debug!(error = %e, "campaign not started");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn only_a_refusing_voter_with_a_longer_log_and_no_leader_campaigns() {
        let id = |term, index| Some(crate::codec::log_id(term, index));
        let (short, long) = (id(3, 10), id(3, 12));
        let rule = |granted, cand, own, follows, heard, held| {
            campaign_after_refusing(granted, cand, own, follows, heard, held)
        };
        assert!(rule(false, short, long, true, false, false));
        assert!(rule(false, None, long, true, false, false));
        // Granted, or the candidate's log is as long: the candidate can win.
        assert!(!rule(true, short, long, true, false, false));
        assert!(!rule(false, long, long, true, false, false));
        assert!(!rule(false, long, short, true, false, false));
        // A higher term at the same index is the longer log.
        assert!(rule(false, id(2, 20), id(3, 1), true, false, false));
        // A candidate, a leader, or a voter for a newer candidate: stay out.
        assert!(!rule(false, short, long, false, false, false));
        // A leader heard from lately, or a hold: stay out.
        assert!(!rule(false, short, long, true, true, false));
        assert!(!rule(false, short, long, true, false, true));
    }

    fn view(candidate: bool, term: u64, leader_known: bool) -> ElectionView {
        ElectionView {
            candidate,
            term,
            leader_known,
        }
    }

    const D: Duration = Duration::from_millis(700);

    #[test]
    fn a_campaign_is_retried_after_a_fresh_delay_until_a_leader_is_known() {
        let t0 = Instant::now();
        let mut timer = RetryTimer::default();
        // A follower of a known leader: openraft's own timer runs.
        assert_eq!(timer.observe(view(false, 3, true), t0, D), RetryStep::Wait);
        // The leader is gone, not yet noticed: nothing to time.
        assert_eq!(timer.observe(view(false, 3, false), t0, D), RetryStep::Wait);
        // This node campaigns in term 4: the next campaign is timed here.
        assert_eq!(
            timer.observe(view(true, 4, false), t0, D),
            RetryStep::HoldUntil(t0 + D)
        );
        // The same campaign seen again (another metric changed): same instant.
        let later = t0 + Duration::from_millis(10);
        assert_eq!(
            timer.observe(view(true, 4, false), later, D),
            RetryStep::Wait
        );
        assert_eq!(timer.retry_at(), Some(t0 + D));
        // No leader by then: the caller campaigns; a fallback stays pending.
        timer.fire(t0 + D, D);
        assert_eq!(timer.retry_at(), Some(t0 + D + D));
        // The new campaign sets a fresh instant.
        let t5 = t0 + D + Duration::from_millis(1);
        let d5 = Duration::from_millis(650);
        assert_eq!(
            timer.observe(view(true, 5, false), t5, d5),
            RetryStep::HoldUntil(t5 + d5)
        );
        // Another candidate's higher term, whose request this node granted: the
        // retry restarts, as a follower's timer does.
        let t6 = t5 + Duration::from_millis(100);
        assert_eq!(
            timer.observe(view(false, 6, false), t6, D),
            RetryStep::HoldUntil(t6 + D)
        );
        // That candidate won: openraft's own timer takes over again.
        assert_eq!(
            timer.observe(view(false, 6, true), t6, D),
            RetryStep::Release
        );
        assert_eq!(timer.retry_at(), None);
        assert_eq!(timer.observe(view(false, 6, true), t6, D), RetryStep::Wait);
        // A later term with no campaign of this node's: not its to time.
        assert_eq!(timer.observe(view(false, 7, false), t6, D), RetryStep::Wait);
    }

    #[test]
    fn retry_delays_spread_over_the_maximum_election_timeout_even_for_a_narrow_range() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let draws: Vec<u64> = (0..2000)
            .map(|_| retry_delay(500, 501, &mut rng).as_millis() as u64)
            .collect();
        assert!(draws.iter().all(|&d| (500..1001).contains(&d)));
        let (lo, hi) = (draws.iter().min().unwrap(), draws.iter().max().unwrap());
        assert!(*lo < 550 && *hi > 950, "draws span {lo}..={hi}");
    }

    #[test]
    fn a_retry_refused_by_a_longer_log_is_put_off_once_per_term() {
        let t0 = Instant::now();
        let mut timer = RetryTimer::default();
        // Nothing pending: nothing to put off.
        assert!(!timer.postpone_once(4, t0 + D));
        timer.observe(view(true, 4, false), t0, D);
        let later = t0 + Duration::from_secs(1);
        assert!(timer.postpone_once(4, later));
        assert_eq!(timer.retry_at(), Some(later));
        // Once per term: the next time it passes, the node campaigns.
        assert!(!timer.postpone_once(4, later + D));
        timer.fire(later, D);
        timer.observe(view(true, 5, false), later, D);
        assert!(timer.postpone_once(5, later + D + D));
    }
}
