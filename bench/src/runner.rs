//! Runs one load against one system: producer tasks with a bounded window of
//! un-acknowledged sends each, consumer tasks, a progress line every second, a
//! warm-up, a drain after the producers stop, and the [`Summary`] at the end.
//!
//! The system is a [`Driver`]: it only knows how to send one message and how to
//! consume; the runner does the timing and counting, so every system is measured
//! the same way.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};

use crate::payload::make_body;
use crate::stats::{Snapshot, Stats};
use crate::summary::Summary;

/// What load to offer.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Label of the system in progress lines and the summary.
    pub label: String,
    /// Producer tasks (each with its own connection where the system has them).
    pub producers: usize,
    /// Consumer tasks.
    pub consumers: usize,
    /// Un-acknowledged sends in flight per producer.
    pub window: usize,
    /// Body size in bytes (at least 16: the header of [`crate::payload`]).
    pub body_bytes: usize,
    /// How long to send after the warm-up (ignored when `count` is set).
    pub duration: Duration,
    /// Send exactly this many messages in all instead (no warm-up).
    pub count: Option<u64>,
    /// Sending before measuring starts.
    pub warmup: Duration,
    /// Longest wait after the producers stop for consumers to receive everything
    /// acknowledged (ends early after 3 s with nothing received).
    pub drain: Duration,
    /// Print a progress line every second.
    pub progress: bool,
}

/// A system under test: how producers send and how consumers consume.
pub trait Driver: Send + Sync + 'static {
    /// Producer task `idx`: typically `crate::runner::produce(ctx, |body| ...)`.
    fn producer(self: Arc<Self>, idx: usize, ctx: Arc<Ctx>) -> BoxFuture<'static, ()>;
    /// Consumer task `idx`: receives until [`Ctx::recv_stopped`], calling
    /// [`Stats::on_receive`] for each message, acknowledging everything.
    fn consumer(self: Arc<Self>, idx: usize, ctx: Arc<Ctx>) -> BoxFuture<'static, ()>;
}

/// State shared by the tasks of one run.
pub struct Ctx {
    /// The load.
    pub spec: LoadSpec,
    /// Counters and histograms.
    pub stats: Stats,
    stop_send: AtomicBool,
    stop_recv: AtomicBool,
    tickets: AtomicU64,
}

impl Ctx {
    fn new(spec: LoadSpec) -> Self {
        let tickets = spec.count.unwrap_or(u64::MAX);
        Self {
            spec,
            stats: Stats::new(rand::random()),
            stop_send: AtomicBool::new(false),
            stop_recv: AtomicBool::new(false),
            tickets: AtomicU64::new(tickets),
        }
    }

    /// True once producers should stop starting sends.
    pub fn send_stopped(&self) -> bool {
        self.stop_send.load(Ordering::Relaxed)
    }

    /// True once consumers should stop.
    pub fn recv_stopped(&self) -> bool {
        self.stop_recv.load(Ordering::Relaxed)
    }

    /// Takes the right to start one more send; false when sending is over.
    pub fn take_ticket(&self) -> bool {
        !self.send_stopped()
            && self
                .tickets
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| t.checked_sub(1))
                .is_ok()
    }

    /// A new body stamped with the current time and this run's id.
    pub fn body(&self) -> Vec<u8> {
        make_body(self.spec.body_bytes, self.stats.run_id())
    }
}

/// The producer loop: keeps up to `spec.window` sends in flight, each made by
/// `send(body)`, which resolves once the system acknowledged the message or
/// failed (`Err(kind)` names the error kind). Ends when sending is over and every
/// send in flight has completed.
pub async fn produce<F, Fut>(ctx: Arc<Ctx>, mut send: F)
where
    F: FnMut(Vec<u8>) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let window = ctx.spec.window.max(1);
    let mut inflight = FuturesUnordered::new();
    loop {
        while inflight.len() < window && ctx.take_ticket() {
            let fut = send(ctx.body());
            ctx.stats.on_send();
            let t0 = Instant::now();
            inflight.push(async move {
                let r = fut.await;
                (r, t0.elapsed())
            });
        }
        match inflight.next().await {
            None => return,
            Some((Ok(()), latency)) => ctx.stats.on_ack(latency),
            Some((Err(kind), _)) => {
                ctx.stats.on_send_error(&kind);
                // Do not spin on a system that refuses everything.
                if !ctx.send_stopped() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

fn progress_line(label: &str, secs: u64, d: Snapshot, (p50, p99): (f64, f64), per: f64) {
    println!(
        "[{label}] {secs:>4}s  sent/s {:>7.0}  acked/s {:>7.0}  recv/s {:>7.0}  send p50 {p50:>7.2} ms  p99 {p99:>7.2} ms  errors {}",
        d.sent as f64 / per,
        d.acked as f64 / per,
        d.received as f64 / per,
        d.errors,
    );
}

fn delta(now: Snapshot, before: Snapshot) -> Snapshot {
    Snapshot {
        sent: now.sent.saturating_sub(before.sent),
        acked: now.acked.saturating_sub(before.acked),
        received: now.received.saturating_sub(before.received),
        errors: now.errors.saturating_sub(before.errors),
    }
}

/// Runs `spec` against `driver` and returns the summary.
pub async fn run(driver: Arc<dyn Driver>, spec: LoadSpec) -> Summary {
    let ctx = Arc::new(Ctx::new(spec.clone()));
    let consumers: Vec<_> = (0..spec.consumers)
        .map(|i| tokio::spawn(driver.clone().consumer(i, ctx.clone())))
        .collect();
    let producers: Vec<_> = (0..spec.producers)
        .map(|i| tokio::spawn(driver.clone().producer(i, ctx.clone())))
        .collect();
    let start = Instant::now();
    let warmup = if spec.count.is_some() {
        Duration::ZERO
    } else {
        spec.warmup
    };
    let mut measure_start = start;
    let mut measuring = warmup.is_zero();
    let mut deadline = start + if measuring { spec.duration } else { warmup };
    let mut last = Snapshot::default();
    let mut tick = tokio::time::interval_at(
        (start + Duration::from_secs(1)).into(),
        Duration::from_secs(1),
    );
    let mut last_tick = start;
    let has_producers = !producers.is_empty();
    let mut producers_done = futures::future::join_all(producers);
    let mut producers_finished = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = Instant::now();
                let snap = ctx.stats.snapshot();
                let pct = ctx.stats.take_tick_percentiles();
                if spec.progress {
                    let per = now.duration_since(last_tick).as_secs_f64().max(1e-3);
                    let secs = now.duration_since(start).as_secs_f64().round() as u64;
                    progress_line(&spec.label, secs, delta(snap, last), pct, per);
                }
                last = snap;
                last_tick = now;
            }
            _ = tokio::time::sleep_until(deadline.into()), if spec.count.is_none() => {
                if measuring {
                    break;
                }
                ctx.stats.reset();
                last = Snapshot::default();
                measure_start = Instant::now();
                deadline = measure_start + spec.duration;
                measuring = true;
                if spec.progress {
                    println!("[{}] warm-up over, measuring", spec.label);
                }
            }
            _ = &mut producers_done, if has_producers => {
                producers_finished = true;
                break;
            }
        }
    }
    ctx.stop_send.store(true, Ordering::Relaxed);
    if !producers_finished {
        producers_done.await;
    }
    let send_secs = measure_start.elapsed().as_secs_f64();
    let received_in_window = ctx.stats.received.load(Ordering::Relaxed);
    let recv_bytes_in_window = ctx.stats.received_bytes.load(Ordering::Relaxed);
    let drain_start = Instant::now();
    if spec.consumers > 0 {
        loop {
            let acked = ctx.stats.acked_all.load(Ordering::Relaxed);
            let got = ctx.stats.received_all.load(Ordering::Relaxed);
            if got >= acked
                || drain_start.elapsed() >= spec.drain
                || ctx.stats.since_last_receive() > Duration::from_secs(3)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    ctx.stop_recv.store(true, Ordering::Relaxed);
    for c in consumers {
        // A consumer may sit in a long poll: give it a moment, then cut it off.
        let abort = c.abort_handle();
        if tokio::time::timeout(Duration::from_secs(3), c)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
    Summary::build(
        &ctx.spec,
        &ctx.stats,
        send_secs,
        received_in_window,
        recv_bytes_in_window,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tokio::sync::{mpsc, Mutex};

    /// An in-memory system: a send is acknowledged after 1 ms and queued for the
    /// consumers; it records the most sends ever in flight at once.
    struct Fake {
        tx: mpsc::UnboundedSender<Vec<u8>>,
        rx: Mutex<mpsc::UnboundedReceiver<Vec<u8>>>,
        in_flight: AtomicUsize,
        max_in_flight: AtomicUsize,
    }

    impl Driver for Fake {
        fn producer(self: Arc<Self>, _idx: usize, ctx: Arc<Ctx>) -> BoxFuture<'static, ()> {
            Box::pin(produce(ctx, move |body| {
                let me = self.clone();
                async move {
                    let n = me.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    me.max_in_flight.fetch_max(n, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    me.in_flight.fetch_sub(1, Ordering::SeqCst);
                    me.tx.send(body).map_err(|_| "send: closed".to_owned())
                }
            }))
        }

        fn consumer(self: Arc<Self>, _idx: usize, ctx: Arc<Ctx>) -> BoxFuture<'static, ()> {
            Box::pin(async move {
                while !ctx.recv_stopped() {
                    let next = tokio::time::timeout(Duration::from_millis(50), async {
                        self.rx.lock().await.recv().await
                    });
                    if let Ok(Some(body)) = next.await {
                        ctx.stats.on_receive(&body);
                    }
                }
            })
        }
    }

    #[tokio::test]
    async fn count_mode_sends_everything_within_the_window_and_drains() {
        let (tx, rx) = mpsc::unbounded_channel();
        let fake = Arc::new(Fake {
            tx,
            rx: Mutex::new(rx),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
        });
        let spec = LoadSpec {
            label: "fake".into(),
            producers: 2,
            consumers: 2,
            window: 4,
            body_bytes: 100,
            duration: Duration::from_secs(60),
            count: Some(500),
            warmup: Duration::from_secs(5),
            drain: Duration::from_secs(5),
            progress: false,
        };
        let s = run(fake.clone(), spec).await;
        assert_eq!((s.sent, s.acked, s.received_total), (500, 500, 500));
        assert_eq!(s.not_received, 0);
        assert!(s.errors.is_empty());
        assert!(fake.max_in_flight.load(Ordering::SeqCst) <= 8);
        assert!(fake.max_in_flight.load(Ordering::SeqCst) > 1);
        assert_eq!(s.send_latency_ms.count, 500);
        assert!(s.send_latency_ms.p50 >= 1.0);
    }
}
