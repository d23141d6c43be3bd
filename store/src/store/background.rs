//! The store's background threads: periodic checkpoint (also ASYNC_FLUSH's flush)
//! and the warm-up thread that prepares the CommitLog ahead of the writer.

use std::sync::{Arc, Weak};

use super::MessageStore;

/// How far ahead of the written end the warm-up thread keeps the CommitLog's pages
/// faulted in (and the next segment created).
pub const WARM_AHEAD_BYTES: u64 = 16 << 20;

/// Most bytes the warm-up thread faults in at a time (small steps keep it from
/// competing with the writer in bursts).
const WARM_STEP_BYTES: u64 = 1 << 20;

impl MessageStore {
    pub(super) fn start_ticker(self: &Arc<Self>) {
        let weak: Weak<Self> = Arc::downgrade(self);
        let stop = self.ticker_stop.clone();
        let period = std::time::Duration::from_millis(self.cfg.flush_interval_ms.max(1));
        let handle = std::thread::Builder::new()
            .name("ledgermq-checkpoint".into())
            .spawn(move || loop {
                {
                    let (lock, cv) = &*stop;
                    let stopped = cv
                        .wait_timeout_while(lock.lock().unwrap(), period, |s| !*s)
                        .unwrap()
                        .0;
                    if *stopped {
                        return;
                    }
                }
                let Some(store) = weak.upgrade() else { return };
                if let Err(e) = store.checkpoint() {
                    tracing::error!(error = %e, "periodic flush and checkpoint failed");
                }
            })
            .expect("spawning the checkpoint thread");
        *self.ticker.lock().unwrap() = Some(handle);
    }

    /// Keeps the next [`WARM_AHEAD_BYTES`] of the CommitLog created and faulted in.
    pub(super) fn start_warmer(self: &Arc<Self>) {
        let weak: Weak<Self> = Arc::downgrade(self);
        let stop = self.ticker_stop.clone();
        let ahead = WARM_AHEAD_BYTES.min(self.cfg.commit_log.segment_bytes);
        let handle = std::thread::Builder::new()
            .name("ledgermq-warmer".into())
            .spawn(move || {
                let mut warmed = 0u64;
                loop {
                    {
                        let (lock, cv) = &*stop;
                        let stopped = cv
                            .wait_timeout_while(lock.lock().unwrap(), std::time::Duration::from_millis(2), |s| !*s)
                            .unwrap()
                            .0;
                        if *stopped {
                            return;
                        }
                    }
                    let Some(store) = weak.upgrade() else { return };
                    let log = &store.log;
                    if warmed > log.wrote_offset() + 2 * ahead {
                        warmed = 0; // the log was truncated or reset
                    }
                    if warmed >= log.wrote_offset() + ahead / 2 {
                        continue;
                    }
                                        let step_to = (warmed.max(log.wrote_offset()) + WARM_STEP_BYTES) - log.wrote_offset();
                    match log.warm_ahead(warmed, step_to.min(ahead)) {
                        Ok(w) => warmed = w,
                        // A full disk: the append that needs the segment reports it.
                        Err(e) if e.is_no_space() => {}
                        Err(e) => tracing::warn!(error = %e, "preparing the CommitLog ahead of the writer failed"),
                    }
                }
            })
            .expect("spawning the warm-up thread");
        *self.warmer.lock().unwrap() = Some(handle);
    }
}
