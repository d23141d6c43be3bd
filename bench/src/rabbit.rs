//! The RabbitMQ driver (`lapin`, AMQP 0-9-1): a quorum queue, publisher confirms
//! with a window of un-confirmed publishes, consumers with manual acks.
//!
//! Producer `i` and consumer `i` connect to node `i mod n` (RabbitMQ passes
//! both on to the queue's leader). A publish counts as sent once its confirm
//! arrives: a quorum queue confirms after a majority of its Raft
//! members wrote (and fsynced) the message to their logs.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use crate::runner::{produce, Ctx, Driver};

/// Queue name.
pub const QUEUE: &str = "bench";

/// Nodes to use.
#[derive(Debug, Clone)]
pub struct Rabbit {
    /// AMQP URIs (`amqp://guest:guest@127.0.0.1:5672/%2f`).
    pub uris: Vec<String>,
    /// Unacknowledged deliveries a consumer may hold.
    pub prefetch: u16,
}

/// A short name of a lapin error's kind (`IOError`, `ProtocolError`).
fn kind_name(e: &lapin::Error) -> String {
    let k = format!("{:?}", e.kind());
    k.split(['(', ' ', '{'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

async fn channel(uri: &str) -> Result<(Connection, Channel)> {
    let conn = Connection::connect(uri, ConnectionProperties::default())
        .await
        .with_context(|| format!("connecting to {uri}"))?;
    let ch = conn.create_channel().await?;
    Ok((conn, ch))
}

impl Rabbit {
    /// Declares the durable quorum queue (its members: every node of the cluster).
    pub async fn prepare(&self) -> Result<()> {
        let (_conn, ch) = channel(&self.uris[0]).await?;
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        ch.queue_declare(
            QUEUE.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
        )
        .await
        .context("declaring the quorum queue")?;
        Ok(())
    }

    async fn consume(self: Arc<Self>, idx: usize, ctx: Arc<Ctx>) {
        let uri = &self.uris[idx % self.uris.len()];
        let setup = async {
            let (conn, ch) = channel(uri).await?;
            ch.basic_qos(self.prefetch, BasicQosOptions::default())
                .await?;
            let c = ch
                .basic_consume(
                    QUEUE.into(),
                    format!("bench-{idx}").as_str().into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            Ok::<_, anyhow::Error>((conn, c))
        };
        let (_conn, mut consumer) = match setup.await {
            Ok(x) => x,
            Err(e) => return ctx.stats.on_error(&format!("receive: {e:#}")),
        };
        while !ctx.recv_stopped() {
            let next = tokio::time::timeout(Duration::from_millis(500), consumer.next()).await;
            match next {
                Err(_) => continue,
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    ctx.stats.on_error(&format!("receive: {}", kind_name(&e)));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Ok(Some(Ok(d))) => {
                    ctx.stats.on_receive(&d.data);
                    if let Err(e) = d.ack(BasicAckOptions::default()).await {
                        ctx.stats.on_error(&format!("ack: {}", kind_name(&e)));
                    }
                }
            }
        }
    }
}

impl Driver for Rabbit {
    fn producer(self: Arc<Self>, idx: usize, ctx: Arc<Ctx>) -> BoxFuture<'static, ()> {
        async move {
            let uri = &self.uris[idx % self.uris.len()];
            let setup = async {
                let (conn, ch) = channel(uri).await?;
                ch.confirm_select(ConfirmSelectOptions::default()).await?;
                Ok::<_, anyhow::Error>((conn, ch))
            };
            let (_conn, ch) = match setup.await {
                Ok(x) => x,
                Err(e) => return ctx.stats.on_error(&format!("send: {e:#}")),
            };
            produce(ctx.clone(), move |body| {
                let ch = ch.clone();
                async move {
                    let confirm = ch
                        .basic_publish(
                            "".into(),
                            QUEUE.into(),
                            BasicPublishOptions::default(),
                            &body,
                            BasicProperties::default().with_delivery_mode(2),
                        )
                        .await
                        .map_err(|e| format!("send: publish {}", kind_name(&e)))?;
                    match confirm.await {
                        Ok(c) if c.is_ack() => Ok(()),
                        Ok(_) => Err("send: nack".to_owned()),
                        Err(e) => Err(format!("send: confirm {}", kind_name(&e))),
                    }
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
