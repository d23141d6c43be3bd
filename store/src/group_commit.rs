//! Group commit: one background thread fsyncs the CommitLog for every waiter at once.
//!
//! Writers append (which only writes to the mapping) and then ask to be told when
//! their end offset is durable. The thread takes all pending requests, runs one
//! `msync(MS_SYNC)` over everything written so far, and answers every request that
//! fsync covered. Requests that arrive during an fsync are served by the next one,
//! so under load one fsync covers many appends.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::commit_log::CommitLog;
use crate::error::{Result, StoreError};

/// Called once the requested offset is durable (with the flushed offset), or with the
/// error that prevented it. Runs on the group-commit thread: keep it short (send on a
/// channel, wake a task).
pub type DurableCallback = Box<dyn FnOnce(Result<u64>) + Send>;

struct Waiter {
    upto: u64,
    done: DurableCallback,
}

#[derive(Default)]
struct Queue {
    waiters: Vec<Waiter>,
    stop: bool,
}

/// The group-commit thread and its request queue.
pub struct GroupCommit {
    log: Arc<CommitLog>,
    shared: Arc<(Mutex<Queue>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl GroupCommit {
    /// Starts the thread for `log`.
    pub fn start(log: Arc<CommitLog>) -> Self {
        let shared = Arc::new((Mutex::new(Queue::default()), Condvar::new()));
        let s = shared.clone();
        let l = log.clone();
        let thread = std::thread::Builder::new()
            .name("ledgermq-group-commit".into())
            .spawn(move || run(&l, &s))
            .expect("spawning the group-commit thread");
        Self {
            log,
            shared,
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Calls `done` once physical offset `upto` is durable.
    pub fn when_durable(&self, upto: u64, done: DurableCallback) {
        let flushed = self.log.flushed_offset();
        if upto <= flushed {
            // Already covered by an earlier fsync.
            done(Ok(flushed));
            return;
        }
        let (lock, cv) = &*self.shared;
        let mut q = lock.lock().unwrap();
        if q.stop {
            drop(q);
            done(Err(StoreError::NotWritable(
                "the store is shutting down".into(),
            )));
            return;
        }
        q.waiters.push(Waiter { upto, done });
        cv.notify_one();
    }

    /// Blocks until physical offset `upto` is durable.
    pub fn wait_durable(&self, upto: u64) -> Result<u64> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.when_durable(
            upto,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.recv()
            .unwrap_or_else(|_| Err(StoreError::NotWritable("group commit stopped".into())))
    }

    /// Serves the requests already queued, then stops the thread.
    pub fn stop(&self) {
        {
            let (lock, cv) = &*self.shared;
            lock.lock().unwrap().stop = true;
            cv.notify_one();
        }
        if let Some(t) = self.thread.lock().unwrap().take() {
            let _ = t.join();
        }
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(log: &CommitLog, shared: &(Mutex<Queue>, Condvar)) {
    let (lock, cv) = shared;
    loop {
        let (batch, stop) = {
            let mut q = lock.lock().unwrap();
            while q.waiters.is_empty() && !q.stop {
                q = cv.wait(q).unwrap();
            }
            (std::mem::take(&mut q.waiters), q.stop)
        };
        if !batch.is_empty() {
            let result = log.flush();
            for w in batch {
                let r = match &result {
                    Ok(flushed) if *flushed >= w.upto => Ok(*flushed),
                    Ok(flushed) => Err(StoreError::NotWritable(format!(
                        "offset {} was truncated before it became durable (flushed {flushed})",
                        w.upto
                    ))),
                    Err(e) => Err(StoreError::NotWritable(format!("fsync failed: {e}"))),
                };
                (w.done)(r);
            }
        }
        if stop && lock.lock().unwrap().waiters.is_empty() {
            return;
        }
    }
}
