//! The LedgerMQ driver over the 4.x remoting protocol, with a pipelined client
//! of its own (no 4.x client library installs as a Rust crate cheaply): one
//! connection per producer, up to the window of SEND_MESSAGE_V2 requests in
//! flight on it, answered by opaque; consumers pull (PULL_MESSAGE, 32 at a
//! time, long polling) every queue assigned to them concurrently, committing
//! their offsets piggybacked on the next pull, as a 4.x push consumer does.
//!
//! Producer `i` and consumer `i` use node `i mod n` of `addrs` (remoting
//! addresses, the leader first).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use futures::future::BoxFuture;
use futures::FutureExt;
use ledgermq_remoting::codes::{request, response};
use ledgermq_remoting::conn::write_frames;
use ledgermq_remoting::message::decode_messages;
use ledgermq_remoting::{split_frame, RemotingCommand};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::runner::{produce, Ctx, Driver};

type Pending = Arc<Mutex<HashMap<i32, oneshot::Sender<RemotingCommand>>>>;

/// One pipelined remoting connection: requests are written by one writer task
/// in the order they are made, answers matched to their request by opaque.
pub struct RemotingClient {
    out: mpsc::Sender<Vec<u8>>,
    pending: Pending,
    next_opaque: AtomicI32,
    reader: tokio::task::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
}

impl Drop for RemotingClient {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

impl RemotingClient {
    /// Connects to `addr` (`host:port`).
    pub async fn connect(addr: &str) -> Result<Self> {
        let stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
            .await
            .map_err(|_| anyhow!("connecting to {addr}: timed out"))?
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        let (mut rd, mut wr) = stream.into_split();
        let (out, mut rx) = mpsc::channel::<Vec<u8>>(4096);
        let pending: Pending = Arc::default();
        let writer = tokio::spawn(async move { write_frames(&mut rx, &mut wr).await });
        let p = pending.clone();
        let reader = tokio::spawn(async move {
            let mut buf = Vec::with_capacity(1 << 20);
            let mut chunk = vec![0u8; 256 << 10];
            loop {
                let mut used = 0;
                while let Ok(Some((frame, n))) = split_frame(&buf[used..], 64 << 20) {
                    used += n;
                    let Ok(cmd) = RemotingCommand::decode(frame) else {
                        continue;
                    };
                    if cmd.is_response() {
                        if let Some(tx) = p.lock().unwrap().remove(&cmd.opaque) {
                            let _ = tx.send(cmd);
                        }
                    }
                }
                buf.drain(..used);
                match rd.read(&mut chunk).await {
                    Ok(0) | Err(_) => {
                        // Every waiting call fails: its sender is dropped.
                        p.lock().unwrap().clear();
                        return;
                    }
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        });
        Ok(Self {
            out,
            pending,
            next_opaque: AtomicI32::new(1),
            reader,
            writer,
        })
    }

    /// Sends `cmd` (its opaque replaced) and waits up to `timeout` for its answer.
    pub async fn call(
        &self,
        mut cmd: RemotingCommand,
        timeout: Duration,
    ) -> Result<RemotingCommand> {
        let opaque = self.next_opaque.fetch_add(1, Ordering::Relaxed);
        cmd.opaque = opaque;
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(opaque, tx);
        let bytes = cmd.encode()?;
        if self.out.send(bytes).await.is_err() {
            self.pending.lock().unwrap().remove(&opaque);
            bail!("connection closed");
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => bail!("connection closed"),
            Err(_) => {
                self.pending.lock().unwrap().remove(&opaque);
                bail!("timed out")
            }
        }
    }
}

/// A request with `fields`, JSON header, no body.
pub fn request(code: i32, fields: &[(&str, String)]) -> RemotingCommand {
    RemotingCommand::request(code, fields.iter().map(|(k, v)| (*k, v.clone())))
}

/// The remoting addresses of a topic's broker group from a name server
/// (GET_ROUTEINFO_BY_TOPIC), broker id 0 (the leader) first, each once (routes
/// list the leader under its member id as well).
pub async fn route_addrs(namesrv: &str, topic: &str) -> Result<Vec<String>> {
    let c = RemotingClient::connect(namesrv).await?;
    let r = c
        .call(
            request(request::GET_ROUTEINFO_BY_TOPIC, &[("topic", topic.into())]),
            Duration::from_secs(5),
        )
        .await?;
    if r.code != response::SUCCESS {
        bail!("route of {topic}: code {} {:?}", r.code, r.remark);
    }
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    let addrs = v["brokerDatas"][0]["brokerAddrs"]
        .as_object()
        .context("route without broker addresses")?;
    let mut ids: Vec<(u64, String)> = addrs
        .iter()
        .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_str()?.to_owned())))
        .collect();
    ids.sort();
    let mut out: Vec<String> = Vec::with_capacity(ids.len());
    for (_, a) in ids {
        if !out.contains(&a) {
            out.push(a);
        }
    }
    Ok(out)
}

/// Where and what to send and receive over remoting.
#[derive(Debug, Clone)]
pub struct LedgerMqRemoting {
    /// Remoting addresses (`host:port`) of nodes, the leader first.
    pub addrs: Vec<String>,
    /// Topic (it must exist).
    pub topic: String,
    /// Consumer group.
    pub group: String,
    /// Queues of the topic.
    pub queues: u32,
    /// Deadline of one call.
    pub call_timeout: Duration,
}

static MESSAGE_IDS: AtomicU64 = AtomicU64::new(0);

impl LedgerMqRemoting {
    async fn pull_queue(
        self: Arc<Self>,
        client: Arc<RemotingClient>,
        queue_id: u32,
        ctx: Arc<Ctx>,
    ) {
        let q = queue_id.to_string();
        let start = client
            .call(
                request(
                    request::GET_MAX_OFFSET,
                    &[("topic", self.topic.clone()), ("queueId", q.clone())],
                ),
                self.call_timeout,
            )
            .await;
        let mut offset: u64 = match start.ok().and_then(|r| r.ext_fields.get("offset").cloned()) {
            Some(o) => o.parse().unwrap_or(0),
            None => return ctx.stats.on_error("receive: GET_MAX_OFFSET failed"),
        };
        while !ctx.recv_stopped() {
            let req = request(
                request::PULL_MESSAGE,
                &[
                    ("consumerGroup", self.group.clone()),
                    ("topic", self.topic.clone()),
                    ("queueId", q.clone()),
                    ("queueOffset", offset.to_string()),
                    ("maxMsgNums", "32".into()),
                    // COMMIT_OFFSET | SUSPEND
                    ("sysFlag", "3".into()),
                    ("commitOffset", offset.to_string()),
                    ("suspendTimeoutMillis", "500".into()),
                    ("subscription", "*".into()),
                    ("subVersion", "0".into()),
                ],
            );
            let r = match client.call(req, self.call_timeout).await {
                Ok(r) => r,
                Err(e) => {
                    ctx.stats.on_error(&format!("receive: {e}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let next = r
                .ext_fields
                .get("nextBeginOffset")
                .and_then(|o| o.parse().ok());
            match r.code {
                response::SUCCESS => match decode_messages(&r.body) {
                    Ok(msgs) => {
                        for m in msgs {
                            ctx.stats.on_receive(m.body);
                        }
                    }
                    Err(e) => ctx.stats.on_error(&format!("receive: {e}")),
                },
                response::PULL_NOT_FOUND
                | response::PULL_RETRY_IMMEDIATELY
                | response::PULL_OFFSET_MOVED => {}
                code => {
                    ctx.stats.on_error(&format!("receive: code {code}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            if let Some(n) = next {
                offset = n;
            }
        }
    }
}

impl Driver for LedgerMqRemoting {
    fn producer(self: Arc<Self>, idx: usize, ctx: Arc<Ctx>) -> BoxFuture<'static, ()> {
        async move {
            let addr = &self.addrs[idx % self.addrs.len()];
            let client = match RemotingClient::connect(addr).await {
                Ok(c) => Arc::new(c),
                Err(e) => return ctx.stats.on_error(&format!("send: {e}")),
            };
            let me = self.clone();
            let rr = Arc::new(AtomicU64::new(idx as u64));
            produce(ctx.clone(), move |body| {
                let (client, me, rr) = (client.clone(), me.clone(), rr.clone());
                async move {
                    let id = MESSAGE_IDS.fetch_add(1, Ordering::Relaxed);
                    let queue = rr.fetch_add(1, Ordering::Relaxed) % me.queues as u64;
                    let mut req = request(
                        request::SEND_MESSAGE_V2,
                        &[
                            ("a", "BenchProducer".into()),
                            ("b", me.topic.clone()),
                            ("c", "TBW102".into()),
                            ("d", "4".into()),
                            ("e", queue.to_string()),
                            ("f", "0".into()),
                            ("g", "0".into()),
                            ("h", "0".into()),
                            (
                                "i",
                                format!("UNIQ_KEY\u{1}{:016X}{id:016X}\u{2}", std::process::id()),
                            ),
                        ],
                    );
                    req.body = body;
                    let r = client
                        .call(req, me.call_timeout)
                        .await
                        .map_err(|e| format!("send: {e}"))?;
                    if r.code == response::SUCCESS {
                        Ok(())
                    } else {
                        Err(format!("send: code {}", r.code))
                    }
                }
            })
            .await
        }
        .boxed()
    }

    fn consumer(self: Arc<Self>, idx: usize, ctx: Arc<Ctx>) -> BoxFuture<'static, ()> {
        async move {
            let addr = &self.addrs[idx % self.addrs.len()];
            let client = match RemotingClient::connect(addr).await {
                Ok(c) => Arc::new(c),
                Err(e) => return ctx.stats.on_error(&format!("receive: {e}")),
            };
            let consumers = ctx.spec.consumers.max(1) as u32;
            let tasks: Vec<_> = (0..self.queues)
                .filter(|q| q % consumers == idx as u32)
                .map(|q| tokio::spawn(self.clone().pull_queue(client.clone(), q, ctx.clone())))
                .collect();
            for t in tasks {
                let _ = t.await;
            }
        }
        .boxed()
    }
}
