//! Unit tests of the timer wheel.
use super::*;

fn timer(deliver_ms: i64, q: u64) -> PendingTimer {
    PendingTimer {
        deliver_ms,
        timer_queue_offset: q,
        physical_offset: 1_000 + q * 100,
        size_bytes: 90,
    }
}

fn qs(ts: &[PendingTimer]) -> Vec<u64> {
    ts.iter().map(|t| t.timer_queue_offset).collect()
}

#[test]
fn due_timers_come_by_second_only_once_due_and_not_after_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = TimerWheel::open(dir.path(), 4, 0).unwrap();
    // Queue offsets 0..6, three seconds, out of time order.
    for t in [
        timer(3_500, 0),
        timer(1_900, 1),
        timer(2_000, 2),
        timer(1_100, 3),
        timer(1_500, 4),
        timer(2_999, 5),
    ] {
        w.insert(t).unwrap();
    }
    w.insert(timer(2_000, 2)).unwrap();
    assert_eq!(w.pending(), 6);
    assert_eq!(w.due(1_099, 10).unwrap(), vec![]);
    assert_eq!(qs(&w.due(1_500, 10).unwrap()), vec![3, 4]);
    assert_eq!(qs(&w.due(2_000, 10).unwrap()), vec![1, 3, 4, 2]);
    assert_eq!(qs(&w.due(i64::MAX, 3).unwrap()), vec![1, 3, 4]);
    assert_eq!(w.next_deliver_ms().unwrap(), Some(1_100));
    assert!(w.remove(1_900, 1));
    assert!(!w.remove(1_900, 1));
    assert!(!w.remove(1_234, 3), "another delivery time");
    assert!(w.remove(1_100, 3));
    assert!(w.remove(1_500, 4));
    // Second 1 is gone; inserting a delivered one again changes nothing.
    w.insert(timer(1_100, 3)).unwrap();
    assert_eq!(w.pending(), 3);
    assert_eq!(qs(&w.due(i64::MAX, 10).unwrap()), vec![2, 5, 0]);
    assert_eq!(w.next_deliver_ms().unwrap(), Some(2_000));
    assert_eq!(w.oldest_physical_offset(0), Some(1_000));
    assert_eq!(w.oldest_physical_offset(1_001), Some(1_200));
    assert_eq!(w.oldest_physical_offset(1_501), None);
}

#[test]
fn a_reopen_relinks_the_chains_wipes_entries_past_the_end_and_drops_done_files() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut w = TimerWheel::open(dir.path(), 4, 0).unwrap();
        for q in 0..10 {
            w.insert(timer(5_000 + (q as i64 % 2) * 1_000, q)).unwrap();
        }
        for q in 0..4 {
            assert!(w.remove(5_000 + (q as i64 % 2) * 1_000, q));
        }
        w.flush().unwrap();
        assert_eq!(
            w.segment_files(),
            2,
            "the first file's timers are all delivered"
        );
    }
    // The timer queue ended at 8 after recovery: 8 and 9 are wiped.
    let mut w = TimerWheel::open(dir.path(), 4, 8).unwrap();
    assert_eq!(w.pending(), 4);
    assert_eq!(qs(&w.due(5_999, 10).unwrap()), vec![4, 6]);
    assert_eq!(qs(&w.due(6_000, 10).unwrap()), vec![4, 6, 5, 7]);
    // Dispatch repeated from further back changes nothing below the
    // first file left (its timers were all delivered).
    w.insert(timer(5_000, 0)).unwrap();
    assert_eq!((w.pending(), w.segment_files()), (4, 1));
    // Dispatch writes 8 and 9 again, maybe with other times.
    w.insert(timer(5_500, 8)).unwrap();
    w.insert(timer(9_000, 9)).unwrap();
    assert_eq!(qs(&w.due(6_000, 10).unwrap()), vec![4, 6, 8, 5, 7]);
    assert_eq!(w.pending(), 6);
    w.clear().unwrap();
    assert_eq!((w.pending(), w.segment_files()), (0, 0));
    assert_eq!(w.due(i64::MAX, 10).unwrap(), vec![]);
    drop(w);
    let w = TimerWheel::open(dir.path(), 4, 10).unwrap();
    assert_eq!(w.pending(), 0);
}

#[test]
fn an_insert_below_the_tail_is_spliced_into_queue_offset_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = TimerWheel::open(dir.path(), 4, 0).unwrap();
    for q in [5, 9, 7, 1, 8] {
        w.insert(timer(3_000 + q as i64, q)).unwrap();
    }
    assert_eq!(qs(&w.due(3_999, 10).unwrap()), vec![1, 5, 7, 8, 9]);
    assert!(w.remove(3_007, 7));
    w.insert(timer(3_006, 6)).unwrap();
    assert_eq!(qs(&w.due(3_999, 10).unwrap()), vec![1, 5, 6, 8, 9]);
    w.flush().unwrap();
    drop(w);
    let mut w = TimerWheel::open(dir.path(), 4, 10).unwrap();
    assert_eq!(qs(&w.due(3_999, 10).unwrap()), vec![1, 5, 6, 8, 9]);
}

#[test]
fn delivered_heads_are_skipped_once_and_chains_survive_removal_in_any_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = TimerWheel::open(dir.path(), 8, 0).unwrap();
    for q in 0..20 {
        w.insert(timer(7_000 + q as i64, q)).unwrap();
    }
    for q in [0, 1, 2, 5, 19, 10] {
        assert!(w.remove(7_000 + q as i64, q));
    }
    assert_eq!(w.slots[&7].head, 0);
    let due = qs(&w.due(7_999, 100).unwrap());
    assert_eq!(due, vec![3, 4, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17, 18]);
    assert_eq!(
        w.slots[&7].head, 3,
        "the head moved past the delivered 0..3"
    );
    w.flush().unwrap();
    drop(w);
    let mut w = TimerWheel::open(dir.path(), 8, 20).unwrap();
    assert_eq!(qs(&w.due(7_999, 100).unwrap()), due);
}

#[test]
fn removing_a_pending_timer_whose_slot_is_missing_logs_instead_of_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = TimerWheel::open(dir.path(), 4, 0).unwrap();
    w.insert(timer(1_000, 0)).unwrap();
    w.slots.clear();
    assert!(w.remove(1_000, 0));
    assert_eq!(w.pending(), 0);
}

#[test]
fn the_oldest_pending_record_is_found_from_each_files_first_pending_entry() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = TimerWheel::open(dir.path(), 8, 0).unwrap();
    for q in 0..12 {
        w.insert(timer(9_000, q)).unwrap();
    }
    assert_eq!(w.oldest_physical_offset(0), Some(1_000));
    for q in 0..5 {
        assert!(w.remove(9_000, q));
    }
    assert_eq!(w.oldest_physical_offset(0), Some(1_500));
    assert_eq!(w.log.segments[&0].first_pending, 5);
    // Records below `from` are gone: they bound nothing.
    assert_eq!(w.oldest_physical_offset(1_601), Some(1_700));
    for q in 5..8 {
        assert!(w.remove(9_000, q));
    }
    assert_eq!(w.oldest_physical_offset(0), Some(1_800), "the next file");
    // Dispatch repeated after a restart may index a timer below the hint again.
    w.log.segments.get_mut(&0).unwrap().first_pending = 8;
    let mut e = w.log.get(6).unwrap();
    e.state = 0;
    w.log.put(6, &e);
    w.insert(timer(9_000, 6)).unwrap();
    assert_eq!(w.oldest_physical_offset(0), Some(1_600));
}
