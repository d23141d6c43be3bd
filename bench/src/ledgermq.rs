//! The LedgerMQ driver: RocketMQ 5 gRPC (`apache.rocketmq.v2`) straight from the
//! generated client, so it runs against any LedgerMQ cluster (and any RocketMQ 5
//! proxy that accepts raw calls).
//!
//! Producer `i` and consumer `i` each open their own connection to endpoint
//! `i mod n`. Any node accepts any call (followers pass them on to
//! their leader). Consumers receive batches of 32 from any queue (`id -1`) with a
//! short long-poll, and acknowledge each batch with one AckMessage, sent while
//! the next receive runs (up to 4 acks in flight per consumer). With a CA it
//! connects over TLS, and with credentials it signs every call as the official
//! clients do (a fresh `x-mq-date-time` and HMAC per call).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use futures::future::BoxFuture;
use futures::FutureExt;
use ledgermq_proto::admin_pb::broker_admin_client::BrokerAdminClient;
use ledgermq_proto::admin_pb::{UpdateGroupRequest, UpdateTopicRequest};
use ledgermq_proto::pb::messaging_service_client::MessagingServiceClient;
use ledgermq_proto::pb::{
    receive_message_response::Content, AckMessageEntry, AckMessageRequest, Code, Message,
    MessageType, ReceiveMessageRequest, Resource, SendMessageRequest, SystemProperties,
};
use ledgermq_proto::signature::{sign_request, Credentials};
use tokio::sync::Semaphore;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::payload::read_header;
use crate::runner::{produce, Ctx, Driver};

/// AckMessage calls a consumer task keeps in flight while it receives on.
const ACKS_IN_FLIGHT: usize = 4;

/// Where and what to send and receive.
#[derive(Debug, Clone)]
pub struct LedgerMq {
    /// Client addresses (`host:port`) of nodes.
    pub endpoints: Vec<String>,
    /// Topic.
    pub topic: String,
    /// Consumer group.
    pub group: String,
    /// FIFO messages, one message group per producer.
    pub fifo: bool,
    /// Delay messages due this long after they are sent (the topic must accept
    /// DELAY messages; `create` makes it so). The body's time header then holds
    /// the delivery time, so end-to-end latency is how late each one arrives.
    pub delay_ms: Option<u64>,
    /// Delay messages all due at this time, ms since the Unix epoch, instead
    /// (the body's time header holds it, as with `delay_ms`).
    pub deliver_at_ms: Option<u64>,
    /// Deadline of one call.
    pub call_timeout: Duration,
    /// CA certificates (PEM) to check TLS client ports against; plain HTTP/2
    /// when None.
    pub tls_ca: Option<Vec<u8>>,
    /// What every call is signed with; unsigned when None.
    pub credentials: Option<Credentials>,
}

/// Signs each call with its credentials, when there are any.
#[derive(Clone)]
pub struct Signer(Option<Arc<Credentials>>);

impl tonic::service::Interceptor for Signer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(c) = &self.0 {
            sign_request(&mut req, c);
        }
        Ok(req)
    }
}

type Client = MessagingServiceClient<InterceptedService<Channel, Signer>>;

fn res(name: &str) -> Option<Resource> {
    Some(Resource {
        resource_namespace: String::new(),
        name: name.into(),
    })
}

/// The name of a RocketMQ status code (`PROXY_TIMEOUT`), or its number.
pub fn code_name(code: i32) -> String {
    Code::try_from(code).map_or_else(|_| code.to_string(), |c| c.as_str_name().to_owned())
}

fn grpc_error(what: &str, s: &tonic::Status) -> String {
    format!("{what}: grpc {:?}", s.code())
}

impl LedgerMq {
    fn endpoint(&self, addr: &str) -> Result<Endpoint> {
        let scheme = if self.tls_ca.is_some() {
            "https"
        } else {
            "http"
        };
        let e = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .with_context(|| format!("bad endpoint {addr}"))?;
        Ok(match &self.tls_ca {
            Some(ca) => e.tls_config(
                tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(ca)),
            )?,
            None => e,
        })
    }

    fn signer(&self) -> Signer {
        Signer(self.credentials.clone().map(Arc::new))
    }

    fn client(&self, i: usize) -> Result<Client> {
        let addr = &self.endpoints[i % self.endpoints.len()];
        let channel = self
            .endpoint(addr)?
            .connect_timeout(Duration::from_secs(5))
            .timeout(self.call_timeout)
            .tcp_nodelay(true)
            .connect_lazy();
        Ok(MessagingServiceClient::with_interceptor(
            channel,
            self.signer(),
        ))
    }

    /// Creates or updates the topic (`queues` queues) and the consumer group on every
    /// endpoint given (each commits the change through its group's Raft log;
    /// repeating it on the same group is harmless), then waits a moment for
    /// followers to apply it. Errors if no endpoint accepted it.
    pub async fn create(&self, queues: u32) -> Result<()> {
        let mut ok = 0;
        let mut last_err = String::new();
        for addr in &self.endpoints {
            let channel = match self.endpoint(addr) {
                Ok(e) => e.connect().await.map_err(anyhow::Error::from),
                Err(e) => Err(e),
            };
            let mut c = match channel {
                Ok(ch) => BrokerAdminClient::with_interceptor(ch, self.signer()),
                Err(e) => {
                    last_err = format!("{addr}: {e}");
                    continue;
                }
            };
            let topic = c
                .update_topic(UpdateTopicRequest {
                    name: self.topic.clone(),
                    queue_count: queues,
                    perm: 6,
                    fifo: self.fifo,
                    message_type: if self.delay_ms.is_some() || self.deliver_at_ms.is_some() {
                        "DELAY".into()
                    } else {
                        String::new()
                    },
                })
                .await;
            let group = c
                .update_group(UpdateGroupRequest {
                    name: self.group.clone(),
                    fifo: self.fifo,
                    broadcast: false,
                    max_delivery_attempts: 0,
                    retry_policy: String::new(),
                })
                .await;
            match (topic, group) {
                (Ok(t), Ok(g)) if t.get_ref().error.is_empty() && g.get_ref().error.is_empty() => {
                    ok += 1
                }
                (Ok(t), Ok(g)) => {
                    last_err = format!("{addr}: {} {}", t.get_ref().error, g.get_ref().error)
                }
                (Err(s), _) | (_, Err(s)) => last_err = format!("{addr}: {}", s.message()),
            }
        }
        if ok == 0 {
            bail!(
                "creating topic {} / group {} failed: {last_err}",
                self.topic,
                self.group
            );
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        Ok(())
    }

    fn message(
        &self,
        mut body: Vec<u8>,
        message_id: String,
        message_group: Option<String>,
    ) -> Message {
        let mut message_type = if message_group.is_some() {
            MessageType::Fifo
        } else {
            MessageType::Normal
        };
        let mut delivery_timestamp = None;
        let due_us = match (self.deliver_at_ms, self.delay_ms, read_header(&body)) {
            (Some(at_ms), _, Some(_)) => Some(at_ms * 1000),
            (None, Some(delay_ms), Some((sent_us, _))) => Some(sent_us + delay_ms * 1000),
            _ => None,
        };
        if let Some(due_us) = due_us {
            // The header's time becomes the delivery time (µs).
            body[..8].copy_from_slice(&due_us.to_le_bytes());
            delivery_timestamp = Some(prost_types::Timestamp {
                seconds: (due_us / 1_000_000) as i64,
                nanos: ((due_us % 1_000_000) * 1000) as i32,
            });
            message_type = MessageType::Delay;
        }
        Message {
            topic: res(&self.topic),
            user_properties: Default::default(),
            system_properties: Some(SystemProperties {
                message_id,
                message_type: message_type as i32,
                message_group,
                delivery_timestamp,
                ..Default::default()
            }),
            body,
        }
    }
}

/// `msg` as a call from client `id`: the broker requires the `x-mq-client-id`
/// header, as the reference proxy does.
fn as_client<T>(msg: T, id: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Ok(v) = id.parse() {
        req.metadata_mut().insert("x-mq-client-id", v);
    }
    req
}

impl LedgerMq {
    fn receive_request(&self) -> ReceiveMessageRequest {
        // Batches of 32 from any queue, tags `*`, invisible 30 s, 1 s long poll.
        ledgermq_jepsen::workload::receive_request(&self.group, &self.topic, 30, 1)
    }

    async fn consume(self: Arc<Self>, idx: usize, ctx: Arc<Ctx>) {
        let mut c = match self.client(idx) {
            Ok(c) => c,
            Err(e) => return ctx.stats.on_error(&format!("receive: {e}")),
        };
        let client_id = format!("mqbench-c{idx}");
        let acks = Arc::new(Semaphore::new(ACKS_IN_FLIGHT));
        while !ctx.recv_stopped() {
            let mut handles = Vec::new();
            match c
                .receive_message(as_client(self.receive_request(), &client_id))
                .await
            {
                Ok(stream) => {
                    let mut stream = stream.into_inner();
                    loop {
                        match stream.message().await {
                            Ok(Some(item)) => match item.content {
                                Some(Content::Message(m)) => {
                                    ctx.stats.on_receive(&m.body);
                                    let sp = m.system_properties.unwrap_or_default();
                                    handles.push(AckMessageEntry {
                                        message_id: sp.message_id,
                                        receipt_handle: sp.receipt_handle.unwrap_or_default(),
                                    });
                                }
                                Some(Content::Status(s))
                                    if s.code != Code::Ok as i32
                                        && s.code != Code::MessageNotFound as i32 =>
                                {
                                    ctx.stats.on_error(&format!(
                                        "receive: status {}",
                                        code_name(s.code)
                                    ));
                                }
                                _ => {}
                            },
                            Ok(None) => break,
                            Err(s) => {
                                ctx.stats.on_error(&grpc_error("receive", &s));
                                break;
                            }
                        }
                    }
                }
                Err(s) => {
                    ctx.stats.on_error(&grpc_error("receive", &s));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            if handles.is_empty() {
                continue;
            }
            let req = AckMessageRequest {
                group: res(&self.group),
                topic: res(&self.topic),
                entries: handles,
            };
            // Acks run beside the next receive (at most ACKS_IN_FLIGHT at once), as a
            // client's consumption threads would.
            let Ok(permit) = acks.clone().acquire_owned().await else {
                break;
            };
            let (mut ac, ctx) = (c.clone(), ctx.clone());
            let req = as_client(req, &client_id);
            tokio::spawn(async move {
                match ac.ack_message(req).await {
                    Ok(r) => {
                        let code = r.into_inner().status.map_or(0, |s| s.code);
                        if code != Code::Ok as i32 {
                            ctx.stats
                                .on_error(&format!("ack: status {}", code_name(code)));
                        }
                    }
                    Err(s) => ctx.stats.on_error(&grpc_error("ack", &s)),
                }
                drop(permit);
            });
        }
        let _ = acks.acquire_many(ACKS_IN_FLIGHT as u32).await;
    }
}

impl Driver for LedgerMq {
    fn producer(self: Arc<Self>, idx: usize, ctx: Arc<Ctx>) -> BoxFuture<'static, ()> {
        async move {
            let client = match self.client(idx) {
                Ok(c) => c,
                Err(e) => return ctx.stats.on_error(&format!("send: {e}")),
            };
            let group = self.fifo.then(|| format!("mqbench-p{idx}"));
            let client_id = format!("mqbench-p{idx}");
            // Unique ids in RocketMQ's 32-hex-digit shape: run, producer, sequence.
            let id_prefix = format!("{:016X}{:04X}", ctx.stats.run_id(), idx as u16);
            let mut seq = 0u64;
            produce(ctx.clone(), move |body| {
                let mut c = client.clone();
                seq += 1;
                let id = format!("{id_prefix}{seq:012X}");
                let req = as_client(
                    SendMessageRequest {
                        messages: vec![self.message(body, id, group.clone())],
                    },
                    &client_id,
                );
                async move {
                    match c.send_message(req).await {
                        Ok(r) => {
                            let code = r.into_inner().status.map_or(0, |s| s.code);
                            if code == Code::Ok as i32 {
                                Ok(())
                            } else {
                                Err(format!("send: status {}", code_name(code)))
                            }
                        }
                        Err(s) => Err(grpc_error("send", &s)),
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
