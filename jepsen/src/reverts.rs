//! The follower-revert check over the nodes' logs. A leader logs "follower log is
//! reverted" (openraft, allowed by the `loosen-follower-log-revert` feature) when a
//! follower no longer holds entries it had acknowledged. Under SYNC_FLUSH a
//! follower acknowledges only what it fsynced, so that happens only when stored
//! bytes were damaged: after a fault that damages a tail or the metadata store
//! it is expected, after anything else (a power loss included, which takes only
//! unflushed bytes) it means a promised fsync was not done.

use crate::nemesis::FaultKind;

/// What the leader's log line says, after openraft's replication module.
pub const REVERT_MARKER: &str = "follower log is reverted from";

/// The times (ms since the Unix epoch) of the revert lines in one node's log;
/// `None` for a line whose time cannot be read (no fault can explain it). Lines
/// are tracing's: an RFC 3339 timestamp first, possibly wrapped in ANSI colour
/// codes.
pub fn revert_times(log: &str) -> Vec<Option<i64>> {
    log.lines()
        .filter(|l| l.contains(REVERT_MARKER))
        .map(line_time_ms)
        .collect()
}

/// The time of one tracing log line (its leading RFC 3339 timestamp, possibly
/// wrapped in ANSI colour codes), ms since the Unix epoch; None if it has none.
pub fn line_time_ms(line: &str) -> Option<i64> {
    let plain = strip_ansi(line);
    let stamp = plain.split_whitespace().next()?;
    chrono::DateTime::parse_from_rfc3339(stamp)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// `s` without ANSI escape sequences (`ESC [ ... letter`).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether a fault kind damages bytes a node had fsynced so that its log may
/// go back: a damaged tail is cut, and a node whose damaged metadata store its
/// log cannot replay sets the log aside and starts empty (`ledgermq_raft`'s
/// `node/storage.rs`; such a fault explains reverts only if its node logged
/// that, see [`explaining_faults`]).
pub fn damages_stored_bytes(kind: FaultKind) -> bool {
    matches!(
        kind,
        FaultKind::CorruptTail
            | FaultKind::QuickRestart
            | FaultKind::QuickRestartLagging
            | FaultKind::CorruptMetadata
    )
}

/// The times (ms since the Unix epoch) at which one node's log says it set its
/// messages aside ([`ledgermq_proto::log_lines::SET_ASIDE_MESSAGES`]); lines whose
/// time cannot be read are left out.
pub fn set_aside_times(log: &str) -> Vec<i64> {
    log.lines()
        .filter(|l| l.contains(ledgermq_proto::log_lines::SET_ASIDE_MESSAGES))
        .filter_map(line_time_ms)
        .collect()
}

/// The faults, (kind, began ms, healed ms), that may explain a revert, of
/// `faults` (kind, began ms, healed ms, node hit): every one but a
/// `corrupt-metadata` fault whose node did not set its messages aside between
/// the fault's start and [`REJOIN_MS`] after its heal (`set_asides`: node, ms
/// since the run started); without that, the node's log was whole and no revert
/// follows from the fault.
pub fn explaining_faults(
    faults: &[(FaultKind, u64, u64, Option<usize>)],
    set_asides: &[(usize, i64)],
) -> Vec<(FaultKind, u64, u64)> {
    faults
        .iter()
        .filter(|&&(k, began, healed, node)| {
            k != FaultKind::CorruptMetadata
                || set_asides.iter().any(|&(n, t)| {
                    Some(n) == node && began as i64 <= t && t <= (healed + REJOIN_MS) as i64
                })
        })
        .map(|&(k, b, h, _)| (k, b, h))
        .collect()
}

/// How long after a damaging fault's heal its node may still rejoin and be seen
/// reverted (restart, recovery, the leader's next AppendEntries).
pub const REJOIN_MS: u64 = 10_000;

/// The reverts (node, ms since the run started, or `None` if unreadable) that no
/// fault damaging stored bytes explains: one explains a revert from its start to
/// [`REJOIN_MS`] after its heal. `faults` are (kind, began ms, healed ms). One
/// line each.
pub fn unexplained(
    reverts: &[(usize, Option<i64>)],
    faults: &[(FaultKind, u64, u64)],
) -> Vec<String> {
    reverts
        .iter()
        .filter_map(|&(node, t)| {
            let Some(t) = t else {
                return Some(format!(
                    "node {node}'s log: a follower's log reverted (time unreadable)"
                ));
            };
            let explained = faults.iter().any(|&(k, began, healed)| {
                damages_stored_bytes(k) && began as i64 <= t && t <= (healed + REJOIN_MS) as i64
            });
            if explained {
                return None;
            }
            let last = faults.iter().rev().find(|f| (f.1 as i64) <= t);
            Some(match last {
                Some((k, began, _)) => format!(
                    "node {node}'s log: a follower's log reverted at {t} ms, after {} (began {began} ms), which damages no stored byte",
                    k.name()
                ),
                None => format!(
                    "node {node}'s log: a follower's log reverted at {t} ms, before any fault"
                ),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reverts_are_read_from_tracing_lines_and_laid_to_the_last_fault() {
        let log = "\u{1b}[2m2026-12-01T13:55:21.879203Z\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m openraft::replication: follower log is reverted from 16-12469 to 15-6239; with 'loosen-follower-log-revert' enabled, this is allowed\n\
                   2026-12-01T13:55:21.875522Z  WARN openraft::progress::entry: conflict 12469 < last matching 16-12469: follower log is reverted; with 'loosen-follower-log-revert' enabled, this is allowed.\n\
                   2026-12-01T13:55:22.000000Z  INFO something else\n";
        let t = revert_times(log);
        assert_eq!(t.len(), 1, "only the replication line counts: {t:?}");
        assert!(t[0].is_some());
        let faults = [
            (FaultKind::PowerLoss, 20_000, 28_000),
            (FaultKind::CorruptTail, 61_000, 69_000),
            (FaultKind::KillLeader, 75_000, 83_000),
            (FaultKind::KillLeader, 95_000, 103_000),
        ];
        let rel = |ms: i64| vec![(1, Some(ms))];
        // During a damaged tail or within REJOIN_MS after its heal (even once the
        // next fault began): explained.
        assert!(unexplained(&rel(70_000), &faults).is_empty());
        assert!(unexplained(&rel(77_000), &faults).is_empty());
        // After a power loss, or a kill: a missing fsync.
        let found = unexplained(&rel(30_000), &faults);
        assert_eq!(found.len(), 1);
        assert!(found[0].contains("power-loss"), "{found:?}");
        assert_eq!(unexplained(&rel(96_000), &faults).len(), 1);
        assert_eq!(unexplained(&rel(5_000), &faults).len(), 1);
        // A line whose time cannot be read is not explained away.
        let odd = "garbled follower log is reverted from 1-2 to 1-1\n";
        assert_eq!(revert_times(odd), vec![None]);
        assert_eq!(unexplained(&[(2, None)], &faults).len(), 1);
        // A damaged metadata store: the node may set its log aside and start
        // empty; only a node that logged doing so explains a revert.
        let damaged = [(FaultKind::CorruptMetadata, 10_000, 15_000, Some(2))];
        let set_aside_line = format!(
            "2026-12-01T13:55:21.879203Z ERROR ledgermq_raft::node::storage: {}",
            ledgermq_proto::log_lines::SET_ASIDE_MESSAGES
        );
        let at = set_aside_times(&set_aside_line);
        assert_eq!(at.len(), 1);
        let base = at[0] - 12_000;
        let explaining = explaining_faults(&damaged, &[(2, at[0] - base)]);
        assert!(unexplained(&rel(16_000), &explaining).is_empty());
        assert_eq!(unexplained(&rel(30_000), &explaining).len(), 1);
        // Another node set its messages aside, or none did: not explained.
        for set_asides in [vec![(1, 12_000)], vec![]] {
            let explaining = explaining_faults(&damaged, &set_asides);
            assert_eq!(unexplained(&rel(16_000), &explaining).len(), 1);
        }
    }
}
