//! The workload: producers sending unique values (normal, and FIFO in message
//! groups) and consumers receiving and acking, through any node, over the RocketMQ
//! 5 gRPC protocol; every call recorded in the history. It runs on a thread that
//! has entered the clients' network namespace, so its traffic stays in the test
//! network.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ledgermq_proto::pb::{
    receive_message_response::Content, AckMessageEntry, AckMessageRequest, Code, FilterExpression,
    FilterType, Message, MessageQueue, MessageType, ReceiveMessageRequest, Resource,
    SendMessageRequest, SystemProperties,
};

use crate::access::{Access, Messaging};
use crate::drain::DrainOutcome;
use crate::history::{Delivered, Op, OpFn, OpType, Sent};
use crate::JepsenError;

/// Attempts per message: a send refused by one node is tried on the next, as
/// the official clients do (their retry policy's `maxAttempts`: 3).
pub const SEND_ATTEMPTS: u64 = 3;

/// Pause before a pinned producer tries its one node again after a refusal, ms
/// (the official clients back off between attempts).
pub const PINNED_RETRY_BACKOFF_MS: u64 = 100;

/// The invisible duration the consumers ask for, s (the FIFO checker's bound).
pub const INVISIBLE_S: i64 = 10;

/// When the producers stop sending, ms after the run's start. The nemesis holds it
/// open while it injects a fault and sets it again at the heal, so a fault that
/// overran the plan (the retention fault waits for a purge) is never measured
/// after sending stopped.
#[derive(Debug, Clone)]
pub struct SendingEnd(Arc<AtomicU64>);

impl SendingEnd {
    /// Sending ends `ms` after the start.
    pub fn new(ms: u64) -> Self {
        Self(Arc::new(AtomicU64::new(ms)))
    }

    /// Sending goes on until [`Self::end_at`] is called.
    pub fn hold(&self) {
        self.0.store(u64::MAX, Ordering::Relaxed);
    }

    /// Sending ends `ms` after the start.
    pub fn end_at(&self, ms: u64) {
        self.0.store(ms, Ordering::Relaxed);
    }

    /// The instant sending ends, for a run that started at `start` (far in the
    /// future while held).
    pub fn instant(&self, start: Instant) -> Instant {
        let ms = self.0.load(Ordering::Relaxed).min(365 * 24 * 3_600_000);
        start + Duration::from_millis(ms)
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct WorkloadOptions {
    /// Client addresses of the nodes (`host:port`); calls rotate over them.
    pub nodes: Vec<String>,
    /// Normal topic.
    pub topic: String,
    /// FIFO topic.
    pub fifo_topic: String,
    /// Consumer group for the normal topic (clustering).
    pub group: String,
    /// FIFO consumer group.
    pub fifo_group: String,
    /// Producer processes sending normal messages through every node in turn (as
    /// the Rust client, given every endpoint, does): a send refused by one node is
    /// tried at once on the next.
    pub producers: usize,
    /// Producer processes sending normal messages to one node each (producer `k`
    /// to node `k % nodes`, as a Python client given one access endpoint): a
    /// refused send is tried again on the same node after
    /// [`PINNED_RETRY_BACKOFF_MS`].
    pub pinned_producers: usize,
    /// Producer processes sending FIFO messages, one message group each.
    pub fifo_producers: usize,
    /// Consumer processes per topic.
    pub consumers: usize,
    /// When producers stop sending ([`SendingEnd`]).
    pub sending_end: SendingEnd,
    /// Longest the consumers keep draining after producers stop. The drain ends
    /// earlier once every acknowledged send was received, every queue's committed
    /// consumer offset reached the queue's end ([`crate::drain`]) and nothing new
    /// arrived for `settle`, or once nothing at all arrived for `quiet`.
    pub drain: Duration,
    /// See `drain`.
    pub settle: Duration,
    /// Drain ends after this long without a new delivery.
    pub quiet: Duration,
    /// Deadline of one call.
    pub call_timeout: Duration,
    /// Pause between one producer's sends (paces the load so consumers keep up).
    pub send_interval: Duration,
    /// The same for FIFO producers (a FIFO queue holds back everything behind a
    /// batch in flight, so its consumers are slower).
    pub fifo_send_interval: Duration,
    /// Set to stop every producer and consumer early (an interrupted run).
    pub stop: Arc<AtomicBool>,
    /// How the clients reach the nodes (plain, or TLS with signed calls).
    pub access: Access,
}

/// The history being recorded, with the run's clock, and which acknowledged sends
/// no consumer has received yet (so the final drain knows when it is done).
#[derive(Clone)]
pub struct Recorder {
    start: Instant,
    start_unix_ms: i64,
    ops: Arc<Mutex<Vec<Op>>>,
    progress: Arc<Mutex<Progress>>,
}

#[derive(Default)]
struct Progress {
    received: std::collections::HashSet<String>,
    acked_unreceived: std::collections::HashSet<String>,
}

impl Recorder {
    /// A recorder whose clock starts now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            start_unix_ms: chrono::Utc::now().timestamp_millis(),
            ops: Arc::default(),
            progress: Arc::default(),
        }
    }

    /// The wall-clock time of the start, ms since the Unix epoch (to place the
    /// nodes' log lines on the run's clock).
    pub fn start_unix_ms(&self) -> i64 {
        self.start_unix_ms
    }

    /// Milliseconds since the start.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn push(&self, mut op: Op) {
        op.time_ms = self.now_ms();
        if op.op_type == OpType::Ok {
            let mut p = self.progress.lock().unwrap();
            match (&op.sent, op.f) {
                (Some(sent), OpFn::Send) if !p.received.contains(&sent.id) => {
                    p.acked_unreceived.insert(sent.id.clone());
                }
                (_, OpFn::Receive) => {
                    for d in &op.delivered {
                        p.acked_unreceived.remove(&d.id);
                        p.received.insert(d.id.clone());
                    }
                }
                _ => {}
            }
        }
        self.ops.lock().unwrap().push(op);
    }

    /// Acknowledged sends no consumer has received yet.
    pub fn outstanding(&self) -> usize {
        self.progress.lock().unwrap().acked_unreceived.len()
    }

    /// The ops recorded so far.
    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs `f` on a new thread inside the network namespace `ns` (a name under
/// `/var/run/netns`), with its own tokio runtime. Error: `Host` if the namespace
/// cannot be entered.
pub fn in_namespace<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, JepsenError> {
    let path = format!("/var/run/netns/{ns}");
    let file = std::fs::File::open(&path).map_err(|e| JepsenError::Host(format!("{path}: {e}")))?;
    std::thread::spawn(move || {
        // SAFETY: setns on a valid namespace fd changes only this thread's network
        // namespace (CLONE_NEWNET is per thread).
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            return Err(JepsenError::Host(format!(
                "setns {path}: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(f())
    })
    .join()
    .map_err(|_| JepsenError::Host("the namespace thread panicked".into()))?
}

/// A client of node `addr` that connects on its first call.
fn client(access: &Access, addr: &str, timeout: Duration) -> Result<Messaging, JepsenError> {
    let channel = access
        .endpoint(addr)?
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_lazy();
    Ok(access.messaging(channel))
}

fn res(name: &str) -> Option<Resource> {
    Some(Resource {
        resource_namespace: String::new(),
        name: name.into(),
    })
}

/// Runs the workload (call from inside the clients' namespace, e.g. through
/// [`in_namespace`]); returns the history and the consumer progress the drain
/// saw last (None if no node answered for it).
pub async fn run(
    opts: WorkloadOptions,
    rec: Recorder,
) -> Result<(Vec<Op>, Option<DrainOutcome>), JepsenError> {
    let chans: Vec<Messaging> = opts
        .nodes
        .iter()
        .map(|a| client(&opts.access, a, opts.call_timeout))
        .collect::<Result<_, _>>()?;
    let (end, start) = (opts.sending_end.clone(), rec.start);
    let stop_sending = move || end.instant(start);
    let mut tasks = Vec::new();
    let mut process = 0u64;
    // Process ids: spread producers, FIFO producers (their message groups are
    // named after them), then pinned producers.
    let all_producers = opts.producers + opts.fifo_producers + opts.pinned_producers;
    for p in 0..all_producers {
        let fifo = (opts.producers..opts.producers + opts.fifo_producers).contains(&p);
        let pinned_to = (p >= opts.producers + opts.fifo_producers)
            .then(|| (p - opts.producers - opts.fifo_producers) % chans.len());
        let (chans, rec, opts) = (chans.clone(), rec.clone(), opts.clone());
        let stop_sending = stop_sending.clone();
        process += 1;
        let pid = process;
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < stop_sending() && !opts.stop.load(Ordering::Relaxed) {
                let group = fifo.then(|| format!("g{pid}"));
                let sent = Sent {
                    id: format!("p{pid}-{n}"),
                    group: group.clone(),
                    seq: fifo.then_some(n),
                };
                let topic = if fifo { &opts.fifo_topic } else { &opts.topic };
                // A send the node refused (surely not written) goes at once to the
                // next node, as the official 5.x clients retry on the next queue
                // (Java `ProducerImpl.send0`, up to `maxAttempts` = 3); an
                // indeterminate one is not retried, so no message is stored twice.
                // A pinned producer has one node to try.
                for attempt in 0..SEND_ATTEMPTS {
                    let node = pinned_to.unwrap_or((pid + n + attempt) as usize % chans.len());
                    let mut c = chans[node].clone();
                    let to = Target { node, pinned_to };
                    if send_one(&mut c, &rec, pid, to, topic, sent.clone()).await != OpType::Fail {
                        break;
                    }
                    if pinned_to.is_some() && attempt + 1 < SEND_ATTEMPTS {
                        tokio::time::sleep(Duration::from_millis(PINNED_RETRY_BACKOFF_MS)).await;
                    }
                }
                n += 1;
                tokio::time::sleep(if fifo {
                    opts.fifo_send_interval
                } else {
                    opts.send_interval
                })
                .await;
            }
        }));
    }
    let last_delivery = Arc::new(Mutex::new(Instant::now()));
    // Whether every queue's consumer offset is at its end (read once sending is over).
    let (offsets_at_end, consumers_done) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let watcher = {
        let pairs = vec![
            (opts.group.clone(), opts.topic.clone()),
            (opts.fifo_group.clone(), opts.fifo_topic.clone()),
        ];
        let (access, nodes, at_end, done) = (
            opts.access.clone(),
            opts.nodes.clone(),
            offsets_at_end.clone(),
            consumers_done.clone(),
        );
        let stop_sending = stop_sending.clone();
        tokio::spawn(async move {
            while Instant::now() < stop_sending() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            crate::drain::watch(access, nodes, pairs, at_end, done).await
        })
    };
    let mut consumer_tasks = Vec::new();
    for (topic, group) in [
        (&opts.topic, &opts.group),
        (&opts.fifo_topic, &opts.fifo_group),
    ] {
        for _ in 0..opts.consumers {
            process += 1;
            let pid = process;
            let (chans, rec, topic, group, last, stop, at_end) = (
                chans.clone(),
                rec.clone(),
                topic.clone(),
                group.clone(),
                last_delivery.clone(),
                opts.stop.clone(),
                offsets_at_end.clone(),
            );
            let (drain, quiet, settle) = (opts.drain, opts.quiet, opts.settle);
            let stop_sending = stop_sending.clone();
            consumer_tasks.push(tokio::spawn(async move {
                let mut i = pid as usize;
                loop {
                    let now = Instant::now();
                    let idle = now.duration_since(*last.lock().unwrap());
                    let caught_up = rec.outstanding() == 0 && at_end.load(Ordering::Relaxed);
                    let sending_ended = stop_sending();
                    let drained =
                        now > sending_ended && (idle > quiet || (idle > settle && caught_up));
                    if now > sending_ended + drain || drained || stop.load(Ordering::Relaxed) {
                        return;
                    }
                    i += 1;
                    let node = i % chans.len();
                    let mut c = chans[node].clone();
                    if receive_once(&mut c, &rec, pid, node, &topic, &group).await {
                        *last.lock().unwrap() = Instant::now();
                    }
                }
            }));
        }
    }
    for t in tasks.into_iter().chain(consumer_tasks) {
        let _ = t.await;
    }
    consumers_done.store(true, Ordering::Relaxed);
    let drain = watcher.await.ok().flatten();
    Ok((rec.ops(), drain))
}

/// Where a send goes: the node, and the producer's one node if it is pinned.
#[derive(Debug, Clone, Copy)]
struct Target {
    node: usize,
    pinned_to: Option<usize>,
}

/// One send attempt to `to.node`, recorded; returns its outcome's type.
async fn send_one(
    c: &mut Messaging,
    rec: &Recorder,
    pid: u64,
    to: Target,
    topic: &str,
    sent: Sent,
) -> OpType {
    let op = |t: OpType, error: Option<String>| Op {
        time_ms: 0,
        process: pid,
        op_type: t,
        f: OpFn::Send,
        sent: Some(sent.clone()),
        delivered: vec![],
        error,
        node: Some(to.node),
        pinned_to: to.pinned_to,
    };
    rec.push(op(OpType::Invoke, None));
    let msg = Message {
        topic: res(topic),
        user_properties: Default::default(),
        system_properties: Some(SystemProperties {
            message_id: sent.id.clone(),
            message_type: if sent.group.is_some() {
                MessageType::Fifo as i32
            } else {
                MessageType::Normal as i32
            },
            message_group: sent.group.clone(),
            keys: sent
                .seq
                .map(|s| vec![format!("seq-{s}")])
                .unwrap_or_default(),
            ..Default::default()
        }),
        body: sent.id.clone().into_bytes(),
    };
    let outcome = match c
        .send_message(with_client_id(SendMessageRequest {
            messages: vec![msg],
        }))
        .await
    {
        Ok(r) => {
            let code = r.into_inner().status.map_or(0, |s| s.code);
            if code == Code::Ok as i32 {
                op(OpType::Ok, None)
            } else if code == Code::ProxyTimeout as i32 || code == Code::InternalServerError as i32
            {
                // May still commit.
                op(OpType::Info, Some(format!("code {code}")))
            } else {
                op(OpType::Fail, Some(format!("code {code}")))
            }
        }
        // No connection: the request never left.
        Err(s) if s.message().contains("tcp connect error") => {
            op(OpType::Fail, Some(s.message().to_owned()))
        }
        Err(s) => op(OpType::Info, Some(s.message().to_owned())),
    };
    let t = outcome.op_type;
    rec.push(outcome);
    t
}

/// A ReceiveMessage of up to 32 messages from any queue of `topic` (tags `*`),
/// invisible for `invisible_s`, long-polling `long_poll_s`.
pub fn receive_request(
    group: &str,
    topic: &str,
    invisible_s: i64,
    long_poll_s: i64,
) -> ReceiveMessageRequest {
    ReceiveMessageRequest {
        group: res(group),
        message_queue: Some(MessageQueue {
            topic: res(topic),
            id: -1,
            ..Default::default()
        }),
        filter_expression: Some(FilterExpression {
            r#type: FilterType::Tag as i32,
            expression: "*".into(),
        }),
        batch_size: 32,
        invisible_duration: Some(prost_types::Duration {
            seconds: invisible_s,
            nanos: 0,
        }),
        auto_renew: false,
        long_polling_timeout: Some(prost_types::Duration {
            seconds: long_poll_s,
            nanos: 0,
        }),
    }
}

/// `msg` as a request carrying the `x-mq-client-id` header the protocol requires
/// (the broker answers CLIENT_ID_REQUIRED without it).
pub fn with_client_id<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    let id = format!("jepsen-{}", std::process::id());
    req.metadata_mut().insert(
        "x-mq-client-id",
        id.parse().expect("an ASCII client id is a valid header"),
    );
    req
}

/// One receive and the acks of what came; true if something was delivered.
async fn receive_once(
    c: &mut Messaging,
    rec: &Recorder,
    pid: u64,
    node: usize,
    topic: &str,
    group: &str,
) -> bool {
    let op = |t: OpType, delivered: Vec<Delivered>, error: Option<String>| Op {
        time_ms: 0,
        process: pid,
        op_type: t,
        f: OpFn::Receive,
        sent: None,
        delivered,
        error,
        node: Some(node),
        pinned_to: None,
    };
    rec.push(op(OpType::Invoke, vec![], None));
    let req = receive_request(group, topic, INVISIBLE_S, 2);
    let mut delivered = Vec::new();
    let mut handles = Vec::new();
    match c.receive_message(with_client_id(req)).await {
        Ok(s) => {
            let mut s = s.into_inner();
            while let Ok(Some(item)) = s.message().await {
                if let Some(Content::Message(m)) = item.content {
                    let sp = m.system_properties.unwrap_or_default();
                    let id = String::from_utf8_lossy(&m.body).into_owned();
                    let seq = sp
                        .keys
                        .iter()
                        .find_map(|k| k.strip_prefix("seq-").and_then(|s| s.parse().ok()));
                    delivered.push(Delivered {
                        id,
                        broker: "broker-a".into(),
                        topic: m.topic.as_ref().map(|t| t.name.clone()).unwrap_or_default(),
                        queue_id: sp.queue_id,
                        queue_offset: sp.queue_offset.unwrap_or(-1).max(0) as u64,
                        group: sp.message_group.clone(),
                        seq,
                    });
                    handles.push(sp.receipt_handle.unwrap_or_default());
                }
            }
        }
        Err(s) => {
            rec.push(op(OpType::Fail, vec![], Some(s.message().to_owned())));
            tokio::time::sleep(Duration::from_millis(50)).await;
            return false;
        }
    }
    let got = !delivered.is_empty();
    rec.push(op(OpType::Ok, delivered.clone(), None));
    for (d, h) in delivered.into_iter().zip(handles) {
        let ack = |t: OpType, error: Option<String>| Op {
            f: OpFn::Ack,
            ..op(t, vec![d.clone()], error)
        };
        rec.push(ack(OpType::Invoke, None));
        let reply = c
            .ack_message(with_client_id(AckMessageRequest {
                group: res(group),
                topic: res(topic),
                entries: vec![AckMessageEntry {
                    message_id: String::new(),
                    receipt_handle: h,
                }],
            }))
            .await;
        rec.push(match reply {
            Ok(r) => {
                let r = r.into_inner();
                // The entry's own status, else the call's.
                let code = r
                    .entries
                    .first()
                    .and_then(|e| e.status.as_ref())
                    .or(r.status.as_ref())
                    .map_or(0, |s| s.code);
                if code == Code::Ok as i32 {
                    ack(OpType::Ok, None)
                } else if code == Code::ProxyTimeout as i32
                    || code == Code::InternalServerError as i32
                {
                    // May still commit, as for sends.
                    ack(OpType::Info, Some(format!("code {code}")))
                } else {
                    ack(OpType::Fail, Some(format!("code {code}")))
                }
            }
            Err(s) => ack(OpType::Info, Some(s.message().to_owned())),
        });
    }
    got
}
