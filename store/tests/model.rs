//! Property test: any sequence of append / truncate / dispatch / purge / reopen (clean
//! or after a crash) reads back exactly the entries a simple model says exist.

mod common;

use std::collections::BTreeMap;

use common::small_config;
use ledgermq_store::{MessageRecord, MessageStore, StoreConfig, StoreError};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Append(Vec<usize>),
    NewTerm,
    Truncate(u64),
    Dispatch,
    Purge(u64),
    Reopen {
        clean: bool,
    },
    Checkpoint,
    /// Drop the whole log and continue `gap` indexes later (snapshot installed).
    Reset(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop::collection::vec(0usize..900, 1..4).prop_map(Op::Append),
        1 => Just(Op::NewTerm),
        2 => (0u64..6).prop_map(Op::Truncate),
        2 => Just(Op::Dispatch),
        1 => (0u64..100).prop_map(Op::Purge),
        1 => any::<bool>().prop_map(|clean| Op::Reopen { clean }),
        1 => Just(Op::Checkpoint),
        1 => (0u64..5).prop_map(Op::Reset),
    ]
}

struct Model {
    term: u64,
    entries: BTreeMap<u64, (u64, Vec<Vec<u8>>)>,
    next: u64,
    dispatched: u64,
    checkpointed_dispatch: u64,
    queue_len: u64,
    /// Queue length and log index at the last reset (queue offsets survive a reset).
    reset_queue_len: u64,
    reset_at: u64,
}

impl Model {
    /// Messages dispatched to the queue from entries before `idx`.
    fn messages_before(&self, idx: u64) -> u64 {
        self.reset_queue_len
            + self
                .entries
                .range(self.reset_at..idx)
                .map(|(_, (_, b))| b.len() as u64)
                .sum::<u64>()
    }
}

fn record(body: Vec<u8>) -> MessageRecord {
    MessageRecord::message("TopicM", 0, body, 1_700_000_000_000)
}

fn body(idx: u64, k: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (idx as usize * 7 + k * 13 + i) as u8)
        .collect()
}

fn check(store: &MessageStore, m: &Model) -> Result<(), TestCaseError> {
    let log = store.commit_log();
    prop_assert_eq!(log.next_log_index(), m.next);
    let first = log.first_log_index();
    for (&idx, (term, bodies)) in m.entries.range(first..) {
        let e = store
            .read_entry(idx)
            .map_err(|e| TestCaseError::fail(format!("entry {idx}: {e}")))?;
        prop_assert_eq!(e.location.term, *term);
        let got: Vec<Vec<u8>> = e.records().map(|r| r.unwrap().body().to_vec()).collect();
        prop_assert_eq!(&got, bodies);
    }
    let past_end = matches!(store.read_entry(m.next), Err(StoreError::OutOfRange { .. }));
    prop_assert!(past_end, "entry {} past the end is readable", m.next);
    if first > 0 {
        prop_assert!(store.read_entry(first - 1).is_err());
    }
    prop_assert_eq!(store.queue_offsets("TopicM", 0).1, m.queue_len);
    Ok(())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg: StoreConfig = small_config(dir.path(), 4 * 1024);
    cfg.flush_interval_ms = 3_600_000;
    let mut store = Some(MessageStore::open(cfg.clone()).unwrap());
    let mut m = Model {
        term: 1,
        entries: BTreeMap::new(),
        next: 0,
        dispatched: 0,
        checkpointed_dispatch: 0,
        queue_len: 0,
        reset_queue_len: 0,
        reset_at: 0,
    };
    for op in ops {
        let s = store.as_ref().unwrap();
        match op {
            Op::Append(lens) => {
                let bodies: Vec<Vec<u8>> = lens
                    .iter()
                    .enumerate()
                    .map(|(k, &l)| body(m.next, k, l))
                    .collect();
                let records: Vec<_> = bodies.iter().cloned().map(record).collect();
                s.append_entry(m.term, m.next, &records).unwrap();
                m.entries.insert(m.next, (m.term, bodies));
                m.next += 1;
            }
            Op::NewTerm => m.term += 1,
            Op::Truncate(back) => {
                let from = m.next.saturating_sub(back).max(m.dispatched);
                s.truncate_from(from).unwrap();
                m.entries.split_off(&from);
                m.next = from;
                prop_assert_eq!(m.queue_len, m.messages_before(m.dispatched));
            }
            Op::Dispatch => {
                if m.next > m.dispatched {
                    let placed = s.dispatch_through(m.next - 1).unwrap();
                    let n: usize = m
                        .entries
                        .range(m.dispatched..)
                        .map(|(_, (_, b))| b.len())
                        .sum();
                    prop_assert_eq!(placed.len(), n);
                    for (i, p) in placed.iter().enumerate() {
                        prop_assert_eq!(p.queue_offset, m.queue_len + i as u64);
                    }
                    m.queue_len += n as u64;
                    m.dispatched = m.next;
                }
            }
            Op::Purge(pct) => {
                if m.dispatched > 0 {
                    let through = (m.dispatched - 1) * pct / 100;
                    s.commit_log().flush().unwrap();
                    let first_before = s.commit_log().first_log_index();
                    let r = s.purge_through(through).unwrap();
                    prop_assert!(r.first_log_index <= (through + 1).max(first_before));
                    prop_assert!(r.first_log_index >= first_before);
                    let (lo, hi) = s.queue_offsets("TopicM", 0);
                    prop_assert!(lo <= hi);
                    if lo < hi {
                        s.get_message("TopicM", 0, lo).unwrap();
                    }
                }
            }
            Op::Reset(gap) => {
                let next = m.next + gap;
                s.reset(next, m.term).unwrap();
                m.entries.clear();
                m.next = next;
                m.dispatched = next;
                m.checkpointed_dispatch = next;
                m.reset_queue_len = m.queue_len;
                m.reset_at = next;
            }
            Op::Checkpoint => {
                s.checkpoint().unwrap();
                m.checkpointed_dispatch = m.dispatched;
            }
            Op::Reopen { clean } => {
                let s = store.take().unwrap();
                if clean {
                    s.shutdown().unwrap();
                }
                // Wait until background threads let go, so none creates a segment
                // after the reopened store listed its directory.
                common::crash(s);
                let reopened = MessageStore::open(cfg.clone()).unwrap();
                prop_assert_eq!(reopened.recovery_report().clean, clean);
                let d = reopened.dispatched_next_log_index();
                // A crash forgets dispatches after the last checkpoint; they are redone.
                let lowest = if clean {
                    m.dispatched
                } else {
                    m.checkpointed_dispatch
                };
                prop_assert!(
                    (lowest..=m.dispatched).contains(&d),
                    "dispatched {d} not in [{lowest}, {}]",
                    m.dispatched
                );
                m.dispatched = d;
                m.checkpointed_dispatch = if clean {
                    d
                } else {
                    m.checkpointed_dispatch.min(d)
                };
                m.queue_len = m.messages_before(d);
                store = Some(reopened);
            }
        }
        check(store.as_ref().unwrap(), &m)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn store_matches_model(ops in prop::collection::vec(op(), 1..60)) {
        run(ops)?;
    }
}
