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
    /// Offered load in messages per second over all producers, finite and above 0
    /// (`None`: as fast as the window allows). Each producer starts its sends on a
    /// fixed schedule, `producers / rate` seconds apart (the producers' schedules
    /// staggered evenly), and a send's latency counts from its scheduled start,
    /// so a stalled system is not flattered by sends that could not start (no
    /// coordinated omission). Slots still unstarted when sending ends are dropped.
    pub rate_per_sec: Option<f64>,
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
    /// The run id stamped in every body, and the one consumers count (`None`:
    /// random, so messages of earlier runs are told apart). A consumer-only
    /// run given another run's id measures what that run sends.
    pub run_id: Option<u64>,
}

#[cfg(test)]
impl LoadSpec {
    /// `count` sends of 64 bytes from two producers, window 8, no consumer, no
    /// progress lines: a quick check that a driver and a server talk.
    pub(crate) fn sends_only(label: &str, count: u64) -> Self {
        Self {
            label: label.into(),
            producers: 2,
            consumers: 0,
            window: 8,
            rate_per_sec: None,
            body_bytes: 64,
            duration: Duration::from_secs(60),
            count: Some(count),
            warmup: Duration::ZERO,
            drain: Duration::from_secs(1),
            progress: false,
            run_id: None,
        }
    }
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
    /// Producers started so far (staggers their schedules under a rate).
    producers_started: AtomicU64,
}

impl Ctx {
    fn new(spec: LoadSpec) -> Self {
        let tickets = spec.count.unwrap_or(u64::MAX);
        let stats = Stats::new(spec.run_id.unwrap_or_else(rand::random));
        Self {
            spec,
            stats,
            stop_send: AtomicBool::new(false),
            stop_recv: AtomicBool::new(false),
            tickets: AtomicU64::new(tickets),
            producers_started: AtomicU64::new(0),
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

    /// True once no more sends will start (stopped, or every ticket taken).
    pub fn sending_over(&self) -> bool {
        self.send_stopped() || self.tickets.load(Ordering::Relaxed) == 0
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
    let mut pacer = ctx.spec.rate_per_sec.map(|rate| {
        let producers = ctx.spec.producers.max(1) as f64;
        // Producer k starts k / rate seconds late: the schedules interleave.
        let k = ctx.producers_started.fetch_add(1, Ordering::Relaxed) as f64 % producers;
        let offset = Duration::try_from_secs_f64(k / rate).unwrap_or_default();
        Pacer::new(rate / producers, Instant::now() + offset)
    });
    let mut inflight = FuturesUnordered::new();
    loop {
        // With a rate, the next slot when it is not due yet: the loop then waits for
        // it or for a send to complete, whichever comes first.
        let mut next_slot = None;
        while inflight.len() < window && !ctx.sending_over() {
            let slot = match &mut pacer {
                None => None,
                Some(p) => match p.take_due(Instant::now()) {
                    Some(slot) => Some(slot),
                    None => {
                        next_slot = Some(p.next_slot());
                        break;
                    }
                },
            };
            if !ctx.take_ticket() {
                break;
            }
            let fut = send(ctx.body());
            ctx.stats.on_send();
            // Latency counts from the slot, or from now.
            let t0 = slot.unwrap_or_else(Instant::now);
            inflight.push(async move {
                let r = fut.await;
                (r, t0.elapsed())
            });
        }
        if inflight.is_empty() && next_slot.is_none() {
            return;
        }
        // Never sleep long: a stop must be noticed while waiting for a far slot.
        let wake = next_slot.map(|t| t.min(Instant::now() + STOP_CHECK));
        let done = tokio::select! {
            d = inflight.next(), if !inflight.is_empty() => d,
            _ = sleep_until_opt(wake) => continue,
        };
        match done {
            None => continue,
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

/// Longest a paced producer sleeps before looking at the stop flag again.
const STOP_CHECK: Duration = Duration::from_millis(50);

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// A fixed schedule of send starts, `1 / rate` seconds apart (pure: the caller
/// passes the clock). Slot `n` is at `start + n / rate` seconds.
#[derive(Debug, Clone)]
pub struct Pacer {
    start: Instant,
    rate_per_sec: f64,
    taken: u64,
}

impl Pacer {
    /// A schedule of `rate_per_sec` sends per second from `start`. The rate must be
    /// finite and above 0 ([`parse_rate`] checks one from the command line); for
    /// any other the schedule never comes due.
    pub fn new(rate_per_sec: f64, start: Instant) -> Self {
        debug_assert!(rate_per_sec.is_finite() && rate_per_sec > 0.0);
        Self {
            start,
            rate_per_sec,
            taken: 0,
        }
    }

    /// The time of the next slot not yet taken.
    pub fn next_slot(&self) -> Instant {
        Duration::try_from_secs_f64(self.taken as f64 / self.rate_per_sec)
            .ok()
            .and_then(|d| self.start.checked_add(d))
            // No valid schedule: a slot a year away.
            .unwrap_or_else(|| self.start + Duration::from_secs(365 * 86_400))
    }

    /// Takes the next slot if it is due at `now` and returns its time; `None`
    /// while it lies in the future.
    pub fn take_due(&mut self, now: Instant) -> Option<Instant> {
        let slot = self.next_slot();
        if slot > now {
            return None;
        }
        self.taken += 1;
        Some(slot)
    }
}

/// Parses an offered rate (msgs/s) for the command line: a finite number above 0
/// and at most 10^9. Error: the text, for clap to print.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 && r <= 1e9 => Ok(r),
        Ok(_) => Err(format!(
            "{s}: the rate must be above 0 and at most 1e9 msgs/s"
        )),
        Err(e) => Err(format!("{s}: {e}")),
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

    /// An in-memory system: a send is acknowledged after 1 ms (the first one after
    /// `first_send_ms`, when set) and queued for the consumers; it records the most
    /// sends ever in flight at once.
    struct Fake {
        tx: mpsc::UnboundedSender<Vec<u8>>,
        rx: Mutex<mpsc::UnboundedReceiver<Vec<u8>>>,
        in_flight: AtomicUsize,
        max_in_flight: AtomicUsize,
        first_send_ms: AtomicU64,
    }

    impl Fake {
        fn new() -> Arc<Self> {
            let (tx, rx) = mpsc::unbounded_channel();
            Arc::new(Fake {
                tx,
                rx: Mutex::new(rx),
                in_flight: AtomicUsize::new(0),
                max_in_flight: AtomicUsize::new(0),
                first_send_ms: AtomicU64::new(0),
            })
        }
    }

    impl Driver for Fake {
        fn producer(self: Arc<Self>, _idx: usize, ctx: Arc<Ctx>) -> BoxFuture<'static, ()> {
            Box::pin(produce(ctx, move |body| {
                let me = self.clone();
                async move {
                    let n = me.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    me.max_in_flight.fetch_max(n, Ordering::SeqCst);
                    let stall = me.first_send_ms.swap(0, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(stall.max(1))).await;
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
        let fake = Fake::new();
        let spec = LoadSpec {
            label: "fake".into(),
            producers: 2,
            consumers: 2,
            window: 4,
            rate_per_sec: None,
            body_bytes: 100,
            duration: Duration::from_secs(60),
            count: Some(500),
            warmup: Duration::from_secs(5),
            drain: Duration::from_secs(5),
            progress: false,
            run_id: None,
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

    #[test]
    fn pacer_hands_out_slots_on_schedule_and_catches_up_after_a_stall() {
        let t = Instant::now();
        let mut p = Pacer::new(100.0, t);
        assert_eq!(p.take_due(t), Some(t));
        assert_eq!(p.take_due(t + Duration::from_millis(5)), None);
        assert_eq!(p.next_slot(), t + Duration::from_millis(10));
        // After a 35 ms stall the three missed slots are all due, each keeping
        // its own scheduled time (latency counts from there).
        let late = t + Duration::from_millis(35);
        let slots: Vec<_> = std::iter::from_fn(|| p.take_due(late)).collect();
        assert_eq!(
            slots,
            vec![
                t + Duration::from_millis(10),
                t + Duration::from_millis(20),
                t + Duration::from_millis(30)
            ]
        );
        assert_eq!(p.next_slot(), t + Duration::from_millis(40));
    }

    #[test]
    fn only_finite_positive_rates_are_accepted() {
        assert_eq!(parse_rate("7500"), Ok(7500.0));
        assert_eq!(parse_rate("0.5"), Ok(0.5));
        for bad in ["0", "-3", "NaN", "inf", "1e20", "fast"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    fn paced(producers: usize, window: usize, rate: f64, count: u64) -> LoadSpec {
        LoadSpec {
            label: "fake".into(),
            producers,
            consumers: 1,
            window,
            rate_per_sec: Some(rate),
            body_bytes: 100,
            duration: Duration::from_secs(60),
            count: Some(count),
            warmup: Duration::ZERO,
            drain: Duration::from_secs(5),
            progress: false,
            run_id: None,
        }
    }

    #[tokio::test]
    async fn a_rate_paces_sends_over_all_producers() {
        let fake = Fake::new();
        let t0 = Instant::now();
        let s = run(fake.clone(), paced(2, 64, 200.0, 100)).await;
        // 100 sends at 200/s over two producers take about half a second; without
        // pacing the window of 64 would finish them in a few ms.
        assert!(
            t0.elapsed() >= Duration::from_millis(450),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!((s.sent, s.acked, s.received_total), (100, 100, 100));
        // Unpaced, the two windows of 64 would hold all 100 sends at once; paced,
        // only slots missed during a stall of the runtime start together.
        assert!(fake.max_in_flight.load(Ordering::SeqCst) < 64);
    }

    #[tokio::test]
    async fn under_a_rate_latency_counts_from_the_scheduled_start() {
        // The first send stalls 200 ms with a window of 1: the ~20 slots that fall
        // due meanwhile start late, and their latency includes that wait.
        let fake = Fake::new();
        fake.first_send_ms.store(200, Ordering::SeqCst);
        let s = run(fake.clone(), paced(1, 1, 100.0, 30)).await;
        assert_eq!(s.acked, 30);
        // Counted from the actual start, 29 of the 30 sends would take ~1 ms.
        assert!(s.send_latency_ms.p50 >= 20.0, "{:?}", s.send_latency_ms);
    }

    #[tokio::test]
    async fn a_duration_run_at_a_low_rate_ends_on_time() {
        let fake = Fake::new();
        let mut spec = paced(1, 8, 0.05, 0);
        spec.count = None;
        spec.duration = Duration::from_millis(300);
        let t0 = Instant::now();
        let s = run(fake.clone(), spec).await;
        // One send at once, the next slot 20 s away: the stop must not wait for it.
        assert_eq!(s.sent, 1);
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    }
}
