//! Counters and latency histograms shared by the producer and consumer tasks of a
//! run, whatever the system under test.
//!
//! Latencies are recorded in microseconds. Measured counters and histograms are
//! cleared at the end of a warm-up ([`Stats::reset`]); the `*_all` counters are
//! not, and decide when consumers have drained everything acknowledged.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::payload::{now_micros, read_header};

/// A histogram of microseconds from 1 µs to one hour, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

fn record(h: &Mutex<Histogram<u64>>, us: u64) {
    h.lock().unwrap().saturating_record(us.max(1));
}

/// Everything one run counts.
pub struct Stats {
    run_id: u64,
    /// Sends started (measured).
    pub sent: AtomicU64,
    /// Sends acknowledged as stored (measured).
    pub acked: AtomicU64,
    /// Messages of this run received (measured).
    pub received: AtomicU64,
    /// Body bytes of those messages (measured).
    pub received_bytes: AtomicU64,
    /// Sends acknowledged over the whole run, warm-up included.
    pub acked_all: AtomicU64,
    /// Messages of this run received over the whole run, warm-up included.
    pub received_all: AtomicU64,
    /// Sends started and not completed yet.
    pub in_flight: AtomicU64,
    /// Messages received that an earlier run sent (acked, not counted).
    pub stale: AtomicU64,
    send_hist: Mutex<Histogram<u64>>,
    e2e_hist: Mutex<Histogram<u64>>,
    tick_hist: Mutex<Histogram<u64>>,
    errors: Mutex<BTreeMap<String, u64>>,
    last_receive: Mutex<Instant>,
}

/// Counters at one moment, for progress lines.
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    /// Sends started.
    pub sent: u64,
    /// Sends acknowledged.
    pub acked: u64,
    /// Messages received.
    pub received: u64,
    /// Errors of every kind.
    pub errors: u64,
}

impl Stats {
    /// Empty statistics of the run `run_id` (see [`crate::payload`]).
    pub fn new(run_id: u64) -> Self {
        Self {
            run_id,
            sent: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            received: AtomicU64::new(0),
            received_bytes: AtomicU64::new(0),
            acked_all: AtomicU64::new(0),
            received_all: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            stale: AtomicU64::new(0),
            send_hist: Mutex::new(new_histogram()),
            e2e_hist: Mutex::new(new_histogram()),
            tick_hist: Mutex::new(new_histogram()),
            errors: Mutex::new(BTreeMap::new()),
            last_receive: Mutex::new(Instant::now()),
        }
    }

    /// The run's id, stamped in every body it sends.
    pub fn run_id(&self) -> u64 {
        self.run_id
    }

    /// A send was started.
    pub fn on_send(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// A send completed (acknowledged or failed).
    fn on_send_done(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// A send was acknowledged after `latency`.
    pub fn on_ack(&self, latency: Duration) {
        let us = latency.as_micros() as u64;
        self.on_send_done();
        self.acked.fetch_add(1, Ordering::Relaxed);
        self.acked_all.fetch_add(1, Ordering::Relaxed);
        record(&self.send_hist, us);
        record(&self.tick_hist, us);
    }

    /// A send failed; `kind` names how (e.g. `send: status PROXY_TIMEOUT`).
    pub fn on_send_error(&self, kind: &str) {
        self.on_send_done();
        self.on_error(kind);
    }

    /// Something failed; `kind` names what (e.g. `receive: grpc Unavailable`).
    pub fn on_error(&self, kind: &str) {
        let mut e = self.errors.lock().unwrap();
        match e.get_mut(kind) {
            Some(n) => *n += 1,
            None => {
                e.insert(kind.to_owned(), 1);
            }
        }
    }

    /// A message with this body was received. Returns false if an earlier run sent
    /// it (still to be acked, but not counted).
    pub fn on_receive(&self, body: &[u8]) -> bool {
        *self.last_receive.lock().unwrap() = Instant::now();
        match read_header(body) {
            Some((ts, run)) if run == self.run_id => {
                self.received.fetch_add(1, Ordering::Relaxed);
                self.received_all.fetch_add(1, Ordering::Relaxed);
                self.received_bytes
                    .fetch_add(body.len() as u64, Ordering::Relaxed);
                record(&self.e2e_hist, now_micros().saturating_sub(ts));
                true
            }
            _ => {
                self.stale.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Time since the last message was received.
    pub fn since_last_receive(&self) -> Duration {
        self.last_receive.lock().unwrap().elapsed()
    }

    /// Clears the measured counters, histograms and errors (end of warm-up). Sends
    /// in flight count as started in the measured window (their acks land in it).
    pub fn reset(&self) {
        for c in [&self.acked, &self.received, &self.received_bytes] {
            c.store(0, Ordering::Relaxed);
        }
        self.sent
            .store(self.in_flight.load(Ordering::Relaxed), Ordering::Relaxed);
        for h in [&self.send_hist, &self.e2e_hist, &self.tick_hist] {
            h.lock().unwrap().reset();
        }
        self.errors.lock().unwrap().clear();
    }

    /// The measured counters now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            sent: self.sent.load(Ordering::Relaxed),
            acked: self.acked.load(Ordering::Relaxed),
            received: self.received.load(Ordering::Relaxed),
            errors: self.errors.lock().unwrap().values().sum(),
        }
    }

    /// Send latency p50 and p99 (ms) since the last call, and clears that window.
    pub fn take_tick_percentiles(&self) -> (f64, f64) {
        let mut h = self.tick_hist.lock().unwrap();
        let r = (ms(h.value_at_quantile(0.5)), ms(h.value_at_quantile(0.99)));
        h.reset();
        r
    }

    /// A copy of the send latency histogram (µs).
    pub fn send_histogram(&self) -> Histogram<u64> {
        self.send_hist.lock().unwrap().clone()
    }

    /// A copy of the end-to-end latency histogram (µs).
    pub fn e2e_histogram(&self) -> Histogram<u64> {
        self.e2e_hist.lock().unwrap().clone()
    }

    /// Errors by kind.
    pub fn errors(&self) -> BTreeMap<String, u64> {
        self.errors.lock().unwrap().clone()
    }
}

/// Microseconds to milliseconds.
pub fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::make_body;

    #[test]
    fn counts_only_this_runs_messages_and_resets_measured_ones() {
        let s = Stats::new(7);
        s.on_send();
        s.on_ack(Duration::from_millis(2));
        assert!(s.on_receive(&make_body(64, 7)));
        assert!(!s.on_receive(&make_body(64, 8)));
        s.on_error("send: status X");
        s.on_error("send: status X");
        assert_eq!(s.errors()["send: status X"], 2);
        let snap = s.snapshot();
        assert_eq!(
            (snap.sent, snap.acked, snap.received, snap.errors),
            (1, 1, 1, 2)
        );
        assert_eq!(s.stale.load(Ordering::Relaxed), 1);
        s.reset();
        let snap = s.snapshot();
        assert_eq!(
            (snap.sent, snap.acked, snap.received, snap.errors),
            (0, 0, 0, 0)
        );
        assert_eq!(s.acked_all.load(Ordering::Relaxed), 1);
        assert_eq!(s.received_all.load(Ordering::Relaxed), 1);
    }
}
