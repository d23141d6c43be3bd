//! How long the CommitLog's fsyncs take, told to an observer (the broker's
//! `ledgermq_store_flush_latency_ms` histogram) without the store knowing of
//! metrics.

use std::time::Duration;

use super::CommitLog;

/// Called with the duration of each fsync (`msync(MS_SYNC)` over the written
/// range) of the CommitLog, on the flushing thread: keep it cheap.
pub type FlushObserver = Box<dyn Fn(Duration) + Send + Sync>;

impl CommitLog {
    /// Sets the observer every later fsync is timed to; only the first call
    /// takes effect (a second observer is dropped and `false` returned).
    pub fn set_flush_observer(&self, observer: FlushObserver) -> bool {
        self.flush_observer.set(observer).is_ok()
    }

    pub(super) fn observe_flush(&self, took: Duration) {
        if let Some(o) = self.flush_observer.get() {
            o(took);
        }
    }
}
