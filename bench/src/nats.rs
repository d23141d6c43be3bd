//! The NATS JetStream driver (`async-nats`): acknowledged publishes to a
//! file-storage stream, consumed by a durable pull consumer with explicit acks.
//!
//! Producer `i` and consumer `i` connect to server `i mod n`.
//! A publish counts as sent once the stream leader's PubAck arrives (stored by a
//! quorum of replicas, in their page cache: JetStream fsyncs on an interval).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use async_nats::jetstream::{self, consumer, stream};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};

use crate::runner::{produce, Ctx, Driver};

/// Stream name.
pub const STREAM: &str = "BENCH";
/// Subject the producers publish to (the stream takes `bench.>`).
pub const SUBJECT: &str = "bench.data";
/// Durable pull consumer shared by the consumer tasks.
pub const CONSUMER: &str = "bench";

/// Servers to use.
#[derive(Debug, Clone)]
pub struct Nats {
    /// Client URLs (`nats://127.0.0.1:4222`).
    pub urls: Vec<String>,
}

async fn connect(url: &str) -> Result<jetstream::Context> {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(url)
        .await?;
    Ok(jetstream::new(client))
}

impl Nats {
    /// Creates the stream (file storage, `replicas` replicas) and the durable pull
    /// consumer; retries for up to 30 s while the JetStream cluster elects its
    /// metadata leader. Returns the server name of the stream's leader, if known.
    pub async fn prepare(&self, replicas: usize) -> Result<Option<String>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.try_prepare(replicas).await {
                Ok(leader) => return Ok(leader),
                Err(e) if Instant::now() > deadline => {
                    bail!("creating the JetStream stream failed: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }

    async fn try_prepare(&self, replicas: usize) -> Result<Option<String>> {
        let js = connect(&self.urls[0]).await?;
        let s = js
            .get_or_create_stream(stream::Config {
                name: STREAM.into(),
                subjects: vec!["bench.>".into()],
                storage: stream::StorageType::File,
                num_replicas: replicas,
                ..Default::default()
            })
            .await?;
        s.get_or_create_consumer(
            CONSUMER,
            consumer::pull::Config {
                durable_name: Some(CONSUMER.into()),
                ack_policy: consumer::AckPolicy::Explicit,
                max_ack_pending: 100_000,
                ..Default::default()
            },
        )
        .await?;
        let info = s.get_info().await?;
        Ok(info.cluster.and_then(|c| c.leader))
    }

    async fn consume(self: Arc<Self>, idx: usize, ctx: Arc<Ctx>) {
        let url = &self.urls[idx % self.urls.len()];
        let js = match connect(url).await {
            Ok(js) => js,
            Err(e) => return ctx.stats.on_error(&format!("receive: connect {e}")),
        };
        let messages = async {
            let s = js.get_stream(STREAM).await?;
            let c: consumer::PullConsumer = s.get_consumer(CONSUMER).await?;
            let m = c.stream().max_messages_per_batch(256).messages().await?;
            Ok::<_, async_nats::Error>(m)
        };
        let mut messages = match messages.await {
            Ok(m) => m,
            Err(e) => return ctx.stats.on_error(&format!("receive: consumer {e}")),
        };
        while !ctx.recv_stopped() {
            let next = tokio::time::timeout(Duration::from_millis(500), messages.next()).await;
            match next {
                Err(_) => continue,
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    ctx.stats.on_error(&format!("receive: {:?}", e.kind()));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Ok(Some(Ok(m))) => {
                    ctx.stats.on_receive(&m.payload);
                    if m.ack().await.is_err() {
                        ctx.stats.on_error("ack: failed");
                    }
                }
            }
        }
    }
}

impl Driver for Nats {
    fn producer(self: Arc<Self>, idx: usize, ctx: Arc<Ctx>) -> BoxFuture<'static, ()> {
        async move {
            let js = match connect(&self.urls[idx % self.urls.len()]).await {
                Ok(js) => js,
                Err(e) => return ctx.stats.on_error(&format!("send: connect {e}")),
            };
            produce(ctx.clone(), move |body| {
                let js = js.clone();
                async move {
                    let ack = js
                        .publish(SUBJECT, bytes::Bytes::from(body))
                        .await
                        .map_err(|e| format!("send: publish {:?}", e.kind()))?;
                    ack.await
                        .map(|_| ())
                        .map_err(|e| format!("send: ack {:?}", e.kind()))
                }
            })
            .await
        }
        .boxed()
    }

    fn consumer(self: Arc<Self>, idx: usize, ctx: Arc<Ctx>) -> BoxFuture<'static, ()> {
        self.consume(idx, ctx).boxed()
    }
}
