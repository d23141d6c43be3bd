//! A node whose own disk fills up (issue 14). Every 100 ms it measures the disk:
//! below the metadata floor the disk reserve is given up, so the metadata database
//! keeps room (`ledgermq_store::room`, which says what the floor does not cover); and a leader whose disk has been full
//! (new messages refused, `MessageStore::check_room_for_writes`) for half a second
//! hands its leadership to a caught-up follower, so the group goes on taking
//! writes instead of refusing every one of them for as long as the disk is full. A
//! follower whose disk is full stays up and falls behind (its appends wait for
//! space, see `crate::log_store`), and catches up by itself once space is freed.

use std::time::{Duration, Instant};

use ledgermq_store::StoreError;

use super::RaftNode;

/// How long a leader's disk must have been full before it hands over: one
/// measurement that crosses the limit for an instant moves nothing.
pub const FULL_FOR_BEFORE_HANDOVER: Duration = Duration::from_millis(500);

/// The least time between two handovers of one node for a full disk: when every
/// node's disk is full, leadership moves at this pace, not at every measurement.
pub const MIN_HANDOVER_INTERVAL: Duration = Duration::from_secs(30);

/// How soon a leader whose handover failed (no follower caught up in time) tries
/// again: a failed handover moved nothing, so the 30 s pace does not apply.
pub const RETRY_AFTER_FAILED_HANDOVER: Duration = Duration::from_secs(2);

/// Whether a node hands its leadership over now: it leads, its disk has been full
/// for `full_for` (`None`: not full) and its last handover for a full disk was
/// `since_last` ago (`None`: never). No I/O.
pub fn should_hand_over(
    leading: bool,
    full_for: Option<Duration>,
    since_last: Option<Duration>,
) -> bool {
    leading
        && full_for.is_some_and(|d| d >= FULL_FOR_BEFORE_HANDOVER)
        && since_last.is_none_or(|d| d >= MIN_HANDOVER_INTERVAL)
}

/// The watch described in the module docs, every `every`, until the node is gone.
pub(super) async fn watch_disk(node: std::sync::Weak<RaftNode>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut full_since: Option<Instant> = None;
    let mut last_handover: Option<Instant> = None;
    loop {
        tick.tick().await;
        let Some(node) = node.upgrade() else { return };
        if node.store.is_closed() {
            return;
        }
        let store = node.store.clone();
        let full = tokio::task::spawn_blocking(move || {
            crate::log_store::keep_room_for_metadata(&store);
            matches!(
                store.check_room_for_writes(),
                Err(StoreError::DiskFull { .. })
            )
        })
        .await
        .unwrap_or(false);
        let now = Instant::now();
        full_since = if full { full_since.or(Some(now)) } else { None };
        let hand_over = should_hand_over(
            node.is_leader(),
            full_since.map(|t| now - t),
            last_handover.map(|t| now - t),
        );
        if !hand_over {
            continue;
        }
        last_handover = Some(now);
        tracing::warn!("the disk is full: handing leadership to a follower");
        match node.transfer_leadership(None, Duration::from_secs(5)).await {
            Ok(to) => tracing::warn!(to, "the disk is full: leadership handed over"),
            Err(e) => {
                tracing::warn!(error = %e, "the disk is full: handing leadership over failed");
                // Counted as a handover made MIN_HANDOVER_INTERVAL - RETRY ago, so
                // the next try comes RETRY_AFTER_FAILED_HANDOVER from now.
                last_handover =
                    now.checked_sub(MIN_HANDOVER_INTERVAL - RETRY_AFTER_FAILED_HANDOVER);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_hands_over_once_its_disk_stays_full() {
        let s = Duration::from_secs;
        let full = Some(FULL_FOR_BEFORE_HANDOVER);
        assert!(should_hand_over(true, full, None));
        assert!(
            !should_hand_over(false, full, None),
            "a follower has nothing to hand over"
        );
        assert!(!should_hand_over(true, None, None), "room left");
        assert!(!should_hand_over(
            true,
            Some(Duration::from_millis(100)),
            None
        ));
        assert!(
            !should_hand_over(true, full, Some(s(5))),
            "handed over lately"
        );
        assert!(should_hand_over(true, full, Some(MIN_HANDOVER_INTERVAL)));
    }
}
