//! The group's retention point, decided without I/O.
//!
//! Retention is a decision of the group, not of one member: a member that deleted
//! on its own what the others still serve would lose those messages at a failover
//! to it (the jepsen `disk-full` runs found it). So a member's retention run only
//! proposes a point ([`crate::Command::PurgeThrough`]); every member purges its log
//! through the committed point. Segments expire alike on every member (they hold
//! the same messages), so any member may propose them; forced cleaning (a member's
//! disk past `disk_force_clean_ratio`, RocketMQ's `diskSpaceCleanForciblyRatio`)
//! takes unexpired segments, and only what every consumer group has consumed.

/// What one member's retention run sees, as Raft log indexes (inclusive: "through").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionView {
    /// The last entry of the segments that expired, stopping before the record of
    /// any pending delay message (None: none did).
    pub expired_through: Option<u64>,
    /// The last entry of the segments forced cleaning would take (None: none, or
    /// the disk is not past the forcing ratio).
    pub forced_through: Option<u64>,
    /// The last entry wholly before the oldest message some consumer group has not
    /// consumed and before any pending delay message's record (None: no entry is).
    pub consumed_through: Option<u64>,
    /// The last entry this member applied.
    pub applied: Option<u64>,
    /// The group's committed retention point.
    pub current: Option<u64>,
}

/// The retention point to propose, if it moves the group's point forward: the
/// expired segments, or the forced ones as far as they are consumed, never past
/// what this member applied.
pub fn to_propose(v: RetentionView) -> Option<u64> {
    let forced = v
        .forced_through
        .zip(v.consumed_through)
        .map(|(f, c)| f.min(c));
    let want = v.expired_through.max(forced);
    let want = want.zip(v.applied).map(|(w, a)| w.min(a))?;
    (v.current.is_none_or(|c| c < want)).then_some(want)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> RetentionView {
        RetentionView {
            applied: Some(1000),
            ..Default::default()
        }
    }

    #[test]
    fn expired_segments_go_whether_consumed_or_not() {
        let v = RetentionView {
            expired_through: Some(300),
            consumed_through: Some(100),
            ..view()
        };
        assert_eq!(to_propose(v), Some(300));
    }

    #[test]
    fn forced_cleaning_takes_only_what_every_group_consumed() {
        let v = RetentionView {
            forced_through: Some(600),
            consumed_through: Some(250),
            ..view()
        };
        assert_eq!(to_propose(v), Some(250));
        let nothing_consumed = RetentionView {
            consumed_through: None,
            ..v
        };
        assert_eq!(to_propose(nothing_consumed), None);
        let expired_too = RetentionView {
            expired_through: Some(400),
            ..v
        };
        assert_eq!(to_propose(expired_too), Some(400));
    }

    #[test]
    fn never_past_what_was_applied_nor_back() {
        let v = RetentionView {
            expired_through: Some(2000),
            ..view()
        };
        assert_eq!(to_propose(v), Some(1000));
        assert_eq!(
            to_propose(RetentionView {
                current: Some(1000),
                ..v
            }),
            None
        );
        assert_eq!(
            to_propose(RetentionView {
                current: Some(999),
                ..v
            }),
            Some(1000)
        );
        assert_eq!(to_propose(RetentionView { applied: None, ..v }), None);
    }
}
