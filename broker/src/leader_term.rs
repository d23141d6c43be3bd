//! The services that run only while this node leads a term, started and ended in
//! one place.
//!
//! A [`LeaderTerms`] supervisor follows the Raft node's status
//! ([`NodeStatus::ready_term`]): when the node becomes ready in a term it starts every
//! [`TermService`] for that term (a leader epoch); when that term ends (the node
//! steps down, a later term begins, the node stops) it tells each of them the
//! term is over: the consumer-offset committer
//! ([`crate::consumers::OffsetCommitter`]) and the delivery of due delay messages
//! ([`crate::timers::TimerDelivery`]); the transaction check-back is to run here
//! too.
//!
//! A service is told, not aborted: a Raft write it has under way when the term
//! ends finishes (a clustering group's offset commit it proposed is passed on to
//! the next leader rather than dropped half way); it must take no new work for a
//! term that ended.

use std::sync::Arc;
use std::time::Duration;

use ledgermq_raft::NodeStatus;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// A service that belongs to one leader term.
pub trait TermService: Send + Sync + 'static {
    /// Its name in logs.
    fn name(&self) -> &'static str;

    /// Starts the service for `term`. It runs until `end` says the term is over,
    /// then returns once the work it has under way is done.
    fn start(self: Arc<Self>, term: u64, end: TermEnd) -> JoinHandle<()>;
}

/// Tells a [`TermService`] that its term is over.
#[derive(Debug, Clone)]
pub struct TermEnd(watch::Receiver<()>);

impl TermEnd {
    /// Resolves once the term is over (at once if it already is).
    pub async fn ended(&mut self) {
        while self.0.changed().await.is_ok() {}
    }

    /// True once the term is over (tests).
    #[cfg(test)]
    pub fn is_over(&self) -> bool {
        self.0.has_changed().is_err()
    }

    /// Ticks every `interval` while the term lasts (a late tick delays the next
    /// rather than bunching up): the loop of every periodic [`TermService`],
    /// `while ticks.next().await { .. }`, whose work under way when the term ends
    /// is finished first.
    pub fn ticks(self, interval: Duration) -> TermTicks {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        TermTicks { end: self, tick }
    }

    /// A term end and the switch that ends it (dropping the switch ends the term).
    pub(crate) fn pair() -> (watch::Sender<()>, TermEnd) {
        let (tx, rx) = watch::channel(());
        (tx, TermEnd(rx))
    }
}

/// The ticks of a periodic [`TermService`] ([`TermEnd::ticks`]).
pub struct TermTicks {
    end: TermEnd,
    tick: tokio::time::Interval,
}

impl TermTicks {
    /// Waits for the next tick: true, or false once the term is over.
    pub async fn next(&mut self) -> bool {
        tokio::select! {
            biased;
            _ = self.end.ended() => false,
            _ = self.tick.tick() => true,
        }
    }
}

/// What the supervisor does when the node's status changes (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// End the services of the running term.
    pub end_running: bool,
    /// Start the services for this term.
    pub start: Option<u64>,
}

/// The transition from services running for `running` (the last term started
/// is `last_started`) to a node ready in `ready`. Terms only grow: a term not
/// above the last one started is never started (again); it cannot come from one
/// Raft node's status, and is refused rather than trusted.
pub fn transition(
    running: Option<u64>,
    last_started: Option<u64>,
    ready: Option<u64>,
) -> Transition {
    if running == ready {
        return Transition {
            end_running: false,
            start: None,
        };
    }
    Transition {
        end_running: running.is_some(),
        start: ready.filter(|&r| last_started.is_none_or(|l| r > l)),
    }
}

/// The services of one term: ending it (drop) tells them all.
struct LeaderEpoch {
    term: u64,
    end: watch::Sender<()>,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

impl LeaderEpoch {
    fn start(term: u64, services: &[Arc<dyn TermService>]) -> Self {
        let (end, rx) = TermEnd::pair();
        let tasks = services
            .iter()
            .map(|s| (s.name(), s.clone().start(term, rx.clone())))
            .collect();
        tracing::info!(
            term,
            services = services.len(),
            "leader term services started"
        );
        Self { term, end, tasks }
    }

    /// Tells every service the term is over; returns their tasks to wait for.
    fn end(self) -> Vec<(&'static str, JoinHandle<()>)> {
        tracing::info!(term = self.term, "leader term services told the term ended");
        drop(self.end);
        self.tasks
    }
}

/// How long services get to finish the work they have under way when the Raft
/// node stops by itself (its status watch closes); `LeaderTerms::stop` names its own.
const END_WAIT_ON_NODE_STOP: Duration = Duration::from_secs(5);

/// The supervisor of [`TermService`]s (see the module doc).
#[must_use = "the services stop only through LeaderTerms::stop"]
pub struct LeaderTerms {
    task: JoinHandle<()>,
    stop: oneshot::Sender<Duration>,
    running: watch::Receiver<Option<u64>>,
}

impl LeaderTerms {
    /// Follows `status` and runs `services` in every term this node leads.
    pub fn start(
        mut status: watch::Receiver<NodeStatus>,
        services: Vec<Arc<dyn TermService>>,
    ) -> Self {
        let (stop, mut stopped) = oneshot::channel::<Duration>();
        let (running_tx, running) = watch::channel(None);
        let task = tokio::spawn(async move {
            let mut epoch: Option<LeaderEpoch> = None;
            let mut last_started: Option<u64> = None;
            let mut ending: Vec<(&'static str, JoinHandle<()>)> = Vec::new();
            let drain = loop {
                let ready = status.borrow_and_update().ready_term;
                let t = transition(epoch.as_ref().map(|e| e.term), last_started, ready);
                if t.end_running {
                    if let Some(e) = epoch.take() {
                        ending.extend(e.end());
                    }
                }
                if let Some(term) = t.start {
                    epoch = Some(LeaderEpoch::start(term, &services));
                    last_started = Some(term);
                }
                let now = epoch.as_ref().map(|e| e.term);
                running_tx.send_if_modified(|cur| std::mem::replace(cur, now) != now);
                ending.retain(|(name, h)| {
                    if h.is_finished() {
                        tracing::debug!(service = name, "leader term service ended");
                    }
                    !h.is_finished()
                });
                if let Some(e) = &epoch {
                    for (name, h) in &e.tasks {
                        if h.is_finished() {
                            tracing::error!(
                                service = name,
                                term = e.term,
                                "leader term service ended before its term (panicked?)"
                            );
                        }
                    }
                }
                tokio::select! {
                    changed = status.changed() => if changed.is_err() { break END_WAIT_ON_NODE_STOP },
                    drain = &mut stopped => break drain.unwrap_or(END_WAIT_ON_NODE_STOP),
                }
            };
            if let Some(e) = epoch.take() {
                ending.extend(e.end());
            }
            running_tx.send_replace(None);
            let deadline = tokio::time::Instant::now() + drain;
            for (name, mut h) in ending {
                match tokio::time::timeout_at(deadline, &mut h).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        if e.is_panic() {
                            tracing::error!(service = name, "leader term service panicked");
                        }
                    }
                    Err(_) => {
                        tracing::warn!(
                            service = name,
                            "leader term service still busy at stop; aborted"
                        );
                        h.abort();
                    }
                }
            }
        });
        Self {
            task,
            stop,
            running,
        }
    }

    /// The term whose services run now, if any.
    pub fn services_term(&self) -> Option<u64> {
        *self.running.borrow()
    }

    /// A watch of [`Self::services_term`] (tests).
    #[cfg(test)]
    pub fn watch_services_term(&self) -> watch::Receiver<Option<u64>> {
        self.running.clone()
    }

    /// Ends the running term's services and waits up to `drain` for the work they
    /// have under way; services still running after it are aborted. If the Raft
    /// node stopped first (its status watch closed), the supervisor ended the
    /// services then and gives them up to 5 s (`END_WAIT_ON_NODE_STOP`), which
    /// this waits out instead.
    pub async fn stop(self, drain: Duration) {
        let _ = self.stop.send(drain);
        let _ = self.task.await;
    }
}

#[cfg(test)]
mod tests;
