use std::sync::Mutex;

use ledgermq_raft::{NodeRole, NodeStatus};

use super::*;

#[test]
fn services_start_on_readiness_and_end_with_their_term() {
    let t = |end_running, start| Transition { end_running, start };
    assert_eq!(transition(None, None, None), t(false, None));
    assert_eq!(transition(None, None, Some(3)), t(false, Some(3)));
    assert_eq!(transition(Some(3), Some(3), Some(3)), t(false, None));
    assert_eq!(transition(Some(3), Some(3), None), t(true, None));
    // A later term without a readiness gap between (re-elected at once).
    assert_eq!(transition(Some(3), Some(3), Some(4)), t(true, Some(4)));
    assert_eq!(transition(None, Some(3), Some(4)), t(false, Some(4)));
    // Terms never go back, nor start twice: an older or the same term ends the
    // running one and starts nothing, now or later.
    assert_eq!(transition(Some(4), Some(4), Some(3)), t(true, None));
    assert_eq!(transition(None, Some(4), Some(3)), t(false, None));
    assert_eq!(transition(None, Some(4), Some(4)), t(false, None));
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Started(u64),
    Ended(u64),
}

/// Records its starts and ends; after its term ends it finishes only once
/// `release` says so (work under way), unless `release` is None.
struct Recorder {
    events: Mutex<Vec<Event>>,
    changed: tokio::sync::Notify,
    release: Option<Arc<tokio::sync::Semaphore>>,
}

impl Recorder {
    fn new(release: Option<Arc<tokio::sync::Semaphore>>) -> Arc<Self> {
        Arc::new(Self {
            events: Mutex::new(Vec::new()),
            changed: tokio::sync::Notify::new(),
            release,
        })
    }

    fn record(&self, e: Event) {
        self.events.lock().unwrap().push(e);
        self.changed.notify_waiters();
    }

    async fn wait_for(&self, n: usize) -> Vec<Event> {
        self.wait_until(|e| e.len() >= n).await
    }

    async fn wait_until(&self, done: impl Fn(&[Event]) -> bool) -> Vec<Event> {
        loop {
            let notified = self.changed.notified();
            {
                let events = self.events.lock().unwrap();
                if done(&events) {
                    return events.clone();
                }
            }
            tokio::time::timeout(Duration::from_secs(5), notified)
                .await
                .expect("the supervisor did not act within 5 s");
        }
    }
}

impl TermService for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }

    fn start(self: Arc<Self>, term: u64, mut end: TermEnd) -> JoinHandle<()> {
        tokio::spawn(async move {
            self.record(Event::Started(term));
            end.ended().await;
            assert!(end.is_over());
            if let Some(release) = &self.release {
                // Each permit lets one service finish (kept, not handed back).
                release.acquire().await.unwrap().forget();
            }
            self.record(Event::Ended(term));
        })
    }
}

fn status(ready_term: Option<u64>, term: u64) -> NodeStatus {
    NodeStatus {
        role: if ready_term.is_some() {
            NodeRole::Leader
        } else {
            NodeRole::Follower
        },
        term,
        leader: None,
        ready_term,
    }
}

#[tokio::test]
async fn one_epoch_per_led_term_ended_on_step_down_a_new_term_and_stop() {
    let (tx, rx) = watch::channel(status(None, 1));
    let rec = Recorder::new(None);
    let terms = LeaderTerms::start(rx, vec![rec.clone() as Arc<dyn TermService>]);
    let mut running = terms.watch_services_term();
    tx.send_replace(status(None, 2)); // a leader not yet ready: nothing
    tx.send_replace(status(Some(2), 2));
    assert_eq!(rec.wait_for(1).await, vec![Event::Started(2)]);
    running.wait_for(|t| *t == Some(2)).await.unwrap();
    tx.send_replace(status(None, 3)); // stepped down
    assert_eq!(rec.wait_for(2).await[1], Event::Ended(2));
    running.wait_for(|t| t.is_none()).await.unwrap();
    tx.send_replace(status(Some(5), 5));
    tx.send_replace(status(Some(6), 6)); // re-elected in a later term
    running.wait_for(|t| *t == Some(6)).await.unwrap();
    let events = rec
        .wait_until(|e| {
            e.contains(&Event::Started(6))
                && (!e.contains(&Event::Started(5)) || e.contains(&Event::Ended(5)))
        })
        .await;
    // Watches coalesce: term 5 may never have been seen ready; if it was, its
    // services ended.
    let mut later = events[2..].to_vec();
    later.sort_by_key(|e| format!("{e:?}"));
    assert!(
        later == [Event::Ended(5), Event::Started(5), Event::Started(6)]
            || later == [Event::Started(6)],
        "{events:?}"
    );
    assert_eq!(terms.services_term(), Some(6));
    terms.stop(Duration::from_secs(5)).await;
    let events = rec.events.lock().unwrap().clone();
    assert_eq!(events.last(), Some(&Event::Ended(6)), "{events:?}");
}

#[tokio::test]
async fn work_under_way_at_a_term_end_finishes_and_stop_aborts_it_after_the_drain() {
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let (tx, rx) = watch::channel(status(Some(4), 4));
    let rec = Recorder::new(Some(release.clone()));
    let terms = LeaderTerms::start(rx, vec![rec.clone() as Arc<dyn TermService>]);
    rec.wait_for(1).await;
    tx.send_replace(status(None, 5));
    // Told, not aborted: the service finishes once its work is done.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(rec.events.lock().unwrap().len(), 1);
    release.add_permits(1);
    assert_eq!(rec.wait_for(2).await[1], Event::Ended(4));
    // A service still busy when the supervisor stops is aborted after the drain.
    tx.send_replace(status(Some(7), 7));
    rec.wait_for(3).await;
    terms.stop(Duration::from_millis(100)).await;
    release.add_permits(1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        rec.events.lock().unwrap().last(),
        Some(&Event::Started(7)),
        "an aborted service records no end"
    );
}

#[tokio::test]
async fn the_services_end_when_the_node_status_closes() {
    let (tx, rx) = watch::channel(status(Some(2), 2));
    let rec = Recorder::new(None);
    let terms = LeaderTerms::start(rx, vec![rec.clone() as Arc<dyn TermService>]);
    rec.wait_for(1).await;
    drop(tx);
    assert_eq!(rec.wait_for(2).await[1], Event::Ended(2));
    let mut running = terms.watch_services_term();
    running.wait_for(|t| t.is_none()).await.unwrap();
    terms.stop(Duration::from_secs(1)).await;
}
