//! `apache.rocketmq.v2.MessagingService` over a [`Broker`]. Errors travel as a
//! `Status` inside OK gRPC responses, as the protocol wants; consumption calls that
//! reach a follower are passed on to the leader.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use crate::broker::{Broker, Target, CLIENT_ID_HEADER, FORWARDED_HEADER};
use crate::error::refuse;
use crate::error::ErrorKind;
use crate::grpc::consume::{self, ack_local, change_invisible_local, forward_to_dlq_local};
use crate::grpc::guard;
use crate::grpc::message::duration;
use crate::grpc::relay::{Answer, Attempt, Next, Relay};
use crate::grpc::route::{self, EndpointStyle};
use crate::grpc::send;
use crate::grpc::settings::merged_settings;
use crate::grpc::transaction;
use crate::grpc::ToStatus;
use crate::pb::messaging_service_client::MessagingServiceClient;
use crate::pb::messaging_service_server::MessagingService;
use crate::pb::{self, telemetry_command};

/// The service handle.
#[derive(Clone)]
pub struct Service(pub Arc<Broker>);

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn client_id(md: &MetadataMap) -> Option<String> {
    md.get(CLIENT_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|c| !c.trim().is_empty())
        .map(str::to_owned)
}

/// The client id of a call; the CLIENT_ID_REQUIRED status (as the reference proxy
/// answers) when the broker requires one and the call has none.
fn client_of(b: &Broker, md: &MetadataMap) -> Result<Option<String>, pb::Status> {
    match client_id(md) {
        None if b.settings.require_client_id => Err(refuse(
            ErrorKind::ClientIdRequired,
            format!("the {CLIENT_ID_HEADER} header (client id) is required"),
        )
        .to_status()),
        id => Ok(id),
    }
}

/// Metadata key of the client's language.
const LANGUAGE_HEADER: &str = "x-mq-language";

/// Metadata key of the client's version.
const VERSION_HEADER: &str = "x-mq-client-version";

/// Records consumer `client` of `group` as connected here (consumerConnection),
/// unless the call was passed on by another node (the client is that node's).
fn note_consumer(
    b: &Broker,
    md: &MetadataMap,
    remote: Option<std::net::SocketAddr>,
    group: &str,
    client: Option<&str>,
) {
    let Some(client) = client.filter(|_| !forwarded(md)) else {
        return;
    };
    // Only groups this broker group has: a client cannot fill the registry
    // with names it makes up (a group auto-created by this very call is
    // recorded from the consumer's next call).
    if crate::message::check_group(group).is_err() || !b.has_group(group) {
        return;
    }
    let text = |k: &str| {
        md.get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    b.consumer_clients.seen(
        group,
        client,
        crate::consumer_clients::ClientInfo {
            protocol: "gRPC 5.x",
            language: text(LANGUAGE_HEADER),
            version: text(VERSION_HEADER),
            addr: remote.map(|a| a.to_string()).unwrap_or_default(),
            conn_id: None,
        },
    );
}

fn style(md: &MetadataMap) -> EndpointStyle {
    EndpointStyle::for_language(md.get(LANGUAGE_HEADER).and_then(|v| v.to_str().ok()))
}

/// Whether a call was passed on by another node already (it is not passed on again).
pub(crate) fn forwarded(md: &MetadataMap) -> bool {
    md.contains_key(FORWARDED_HEADER)
}

/// A request to pass on to the leader, with the client id and the forwarded mark,
/// due within `timeout`, signed with the members' own credentials when
/// authentication is on ([`guard::sign_onward`]).
pub(crate) fn onward<T>(b: &Broker, msg: T, client: Option<&str>, timeout: Duration) -> Request<T> {
    let mut r = Request::new(msg);
    guard::sign_onward(b, r.metadata_mut());
    r.metadata_mut().insert(
        FORWARDED_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    if let Some(Ok(v)) = client.map(|c| c.parse()) {
        r.metadata_mut().insert(CLIENT_ID_HEADER, v);
    }
    r.set_timeout(timeout);
    r
}

/// Deadline for finding the leader of a short call.
const CALL_LEADER_WAIT: Duration = Duration::from_millis(2500);

/// Runs a consumption call on the ready leader: here (`local`), or passed on to
/// the leader (`remote`, the same call on the leader's client). A leader that
/// cannot be reached (this node may not have noticed it died yet), or a node
/// that says it does not lead, is looked for again until [`CALL_LEADER_WAIT`]
/// passes. Acks and changes of invisible duration may be repeated safely; a
/// repeated dead-lettering whose first attempt copied the message but did not
/// ack it copies it again (at least once). What the client is told is decided by
/// [`Relay`]: once an attempt went unanswered, any failure is an unknown outcome;
/// `failed` makes the call's answer of a failure status.
pub(crate) async fn on_leader<Req, Resp>(
    b: &Broker,
    req: Request<Req>,
    local: impl AsyncFn(&Broker, &Req, Option<&str>) -> Resp,
    remote: impl AsyncFn(
        MessagingServiceClient<Channel>,
        Request<Req>,
    ) -> Result<Response<Resp>, Status>,
    failed: impl Fn(pb::Status) -> Resp,
) -> Result<Response<Resp>, Status>
where
    Req: Clone + guard::Needs,
    Resp: Answer,
{
    let md = req.metadata().clone();
    if let Err(s) = guard::admit(b, &md, req.get_ref()) {
        return Ok(Response::new(failed(s)));
    }
    let cid = match client_of(b, &md) {
        Ok(c) => c,
        Err(s) => return Ok(Response::new(failed(s))),
    };
    let msg = req.into_inner();
    let deadline = Instant::now() + CALL_LEADER_WAIT;
    let mut relay = Relay::default();
    let r = loop {
        let attempt = match b.target(forwarded(&md), deadline).await {
            // Served here, through the same rule: this node may have become
            // the leader after an attempt elsewhere went unanswered.
            Ok(Target::Local) => Attempt::Answered(local(b, &msg, cid.as_deref()).await),
            Ok(Target::Leader(ch)) => {
                let c = Broker::messaging_client(ch);
                let left = deadline.saturating_duration_since(Instant::now());
                let req = onward(
                    b,
                    msg.clone(),
                    cid.as_deref(),
                    left.max(Duration::from_millis(200)),
                );
                match remote(c, req).await {
                    Ok(r) => Attempt::Answered(r.into_inner()),
                    Err(s) => Attempt::Unanswered(s.message().to_owned()),
                }
            }
            Err(e) => break failed(relay.no_leader(e).to_status()),
        };
        match relay.after(attempt, Instant::now() >= deadline) {
            Next::Pass(r) => break r,
            Next::Fail(e) => break failed(e.to_status()),
            Next::TryAgain => {
                tracing::debug!("the call was not served; looking for the leader again");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    Ok(Response::new(r))
}

#[tonic::async_trait]
impl MessagingService for Service {
    async fn query_route(
        &self,
        req: Request<pb::QueryRouteRequest>,
    ) -> Result<Response<pb::QueryRouteResponse>, Status> {
        if let Err(s) = guard::admit(&self.0, req.metadata(), req.get_ref())
            .and_then(|()| client_of(&self.0, req.metadata()))
        {
            return Ok(Response::new(pb::QueryRouteResponse {
                status: Some(s),
                message_queues: vec![],
            }));
        }
        let style = style(req.metadata());
        Ok(Response::new(
            route::query_route(&self.0, req.into_inner(), style).await,
        ))
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let checked = guard::admit(&self.0, req.metadata(), req.get_ref())
            .and_then(|()| client_of(&self.0, req.metadata()));
        let status = match checked {
            Ok(cid) => {
                let r = req.get_ref();
                let consumer = [
                    pb::ClientType::PushConsumer,
                    pb::ClientType::SimpleConsumer,
                    pb::ClientType::PullConsumer,
                ]
                .iter()
                .any(|t| *t as i32 == r.client_type);
                if let (true, Some(g)) = (consumer, r.group.as_ref()) {
                    note_consumer(
                        &self.0,
                        req.metadata(),
                        req.remote_addr(),
                        &g.name,
                        cid.as_deref(),
                    );
                }
                pb::Status::ok()
            }
            Err(s) => s,
        };
        Ok(Response::new(pb::HeartbeatResponse {
            status: Some(status),
        }))
    }

    async fn send_message(
        &self,
        req: Request<pb::SendMessageRequest>,
    ) -> Result<Response<pb::SendMessageResponse>, Status> {
        if let Err(s) = guard::admit(&self.0, req.metadata(), req.get_ref())
            .and_then(|()| client_of(&self.0, req.metadata()))
        {
            let entries = req
                .get_ref()
                .messages
                .iter()
                .map(|m| pb::SendResultEntry {
                    status: Some(s.clone()),
                    message_id: m
                        .system_properties
                        .as_ref()
                        .map(|p| p.message_id.clone())
                        .unwrap_or_default(),
                    transaction_id: String::new(),
                    offset: 0,
                })
                .collect();
            return Ok(Response::new(pb::SendMessageResponse {
                status: Some(s),
                entries,
            }));
        }
        Ok(Response::new(send::send(&self.0, req.into_inner()).await))
    }

    async fn query_assignment(
        &self,
        req: Request<pb::QueryAssignmentRequest>,
    ) -> Result<Response<pb::QueryAssignmentResponse>, Status> {
        if let Err(s) = guard::admit(&self.0, req.metadata(), req.get_ref())
            .and_then(|()| client_of(&self.0, req.metadata()))
        {
            return Ok(Response::new(pb::QueryAssignmentResponse {
                status: Some(s),
                assignments: vec![],
            }));
        }
        let style = style(req.metadata());
        Ok(Response::new(
            route::query_assignment(&self.0, req.into_inner(), style).await,
        ))
    }

    type ReceiveMessageStream = BoxStream<pb::ReceiveMessageResponse>;

    async fn receive_message(
        &self,
        req: Request<pb::ReceiveMessageRequest>,
    ) -> Result<Response<Self::ReceiveMessageStream>, Status> {
        let started = Instant::now();
        let md = req.metadata().clone();
        let checked =
            guard::admit(&self.0, &md, req.get_ref()).and_then(|()| client_of(&self.0, &md));
        let cid = match checked {
            Ok(c) => c,
            Err(s) => {
                let item = pb::ReceiveMessageResponse {
                    content: Some(pb::receive_message_response::Content::Status(s)),
                };
                return Ok(Response::new(Box::pin(futures::stream::iter([Ok(item)]))));
            }
        };
        let remote = req.remote_addr();
        let msg = req.into_inner();
        let b = &self.0;
        if let Some(g) = &msg.group {
            note_consumer(b, &md, remote, &g.name, cid.as_deref());
        }
        let wait = crate::consume::long_poll_wait_ms(
            msg.long_polling_timeout
                .as_ref()
                .map(crate::grpc::message::duration_ms),
            b.settings.max_long_polling_ms,
        );
        let find_by = started + Duration::from_millis(wait);
        let items = loop {
            match b.target(forwarded(&md), find_by).await {
                Ok(Target::Local) => {
                    break consume::receive_local(b, &msg, cid.as_deref(), started).await
                }
                Ok(Target::Leader(ch)) => {
                    let mut c = Broker::messaging_client(ch);
                    // The leader's long poll must end before ours does.
                    let mut m = msg.clone();
                    let left = find_by
                        .saturating_duration_since(Instant::now())
                        .as_millis() as u64;
                    m.long_polling_timeout = Some(duration(left + (left / 4).max(500)));
                    let due = Duration::from_millis(left + 1000);
                    match c.receive_message(onward(b, m, cid.as_deref(), due)).await {
                        Ok(s) => {
                            let items = drain(s.into_inner()).await;
                            if !items.is_empty() {
                                break items;
                            }
                        }
                        Err(e) => tracing::debug!(error = %e, "leader unreachable; looking again"),
                    }
                    if Instant::now() >= find_by {
                        break vec![status_only(
                            ErrorKind::MessageNotFound,
                            "no leader answered; no new message",
                        )];
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(_) => {
                    // No leader during the whole long poll: nothing to deliver.
                    break vec![status_only(
                        ErrorKind::MessageNotFound,
                        "no leader; no new message",
                    )];
                }
            }
        };
        Ok(Response::new(Box::pin(futures::stream::iter(
            items.into_iter().map(Ok),
        ))))
    }

    async fn ack_message(
        &self,
        req: Request<pb::AckMessageRequest>,
    ) -> Result<Response<pb::AckMessageResponse>, Status> {
        let entries = req.get_ref().entries.clone();
        on_leader(
            &self.0,
            req,
            ack_local,
            async |mut c, r| c.ack_message(r).await,
            |s: pb::Status| consume::ack_failed(&entries, s),
        )
        .await
    }

    async fn forward_message_to_dead_letter_queue(
        &self,
        req: Request<pb::ForwardMessageToDeadLetterQueueRequest>,
    ) -> Result<Response<pb::ForwardMessageToDeadLetterQueueResponse>, Status> {
        on_leader(
            &self.0,
            req,
            forward_to_dlq_local,
            async |mut c, r| c.forward_message_to_dead_letter_queue(r).await,
            |s| pb::ForwardMessageToDeadLetterQueueResponse { status: Some(s) },
        )
        .await
    }

    async fn end_transaction(
        &self,
        req: Request<pb::EndTransactionRequest>,
    ) -> Result<Response<pb::EndTransactionResponse>, Status> {
        on_leader(
            &self.0,
            req,
            transaction::end_local,
            async |mut c, r| c.end_transaction(r).await,
            |s| pb::EndTransactionResponse { status: Some(s) },
        )
        .await
    }

    type TelemetryStream = BoxStream<pb::TelemetryCommand>;

    async fn telemetry(
        &self,
        req: Request<Streaming<pb::TelemetryCommand>>,
    ) -> Result<Response<Self::TelemetryStream>, Status> {
        // The stream's sender is authenticated when it opens; each Settings
        // command on it is checked for the permissions it asks for.
        let principal = guard::principal(&self.0, req.metadata()).map_err(|e| e.to_status());
        let client = match principal
            .clone()
            .and_then(|_| client_of(&self.0, req.metadata()))
        {
            Ok(c) => c.unwrap_or_default(),
            Err(s) => {
                let reply = pb::TelemetryCommand {
                    status: Some(s),
                    command: None,
                };
                return Ok(Response::new(Box::pin(futures::stream::iter([Ok(reply)]))));
            }
        };
        let mut inbound = req.into_inner();
        // Bounded: a client that sends commands but does not read the replies
        // loses its stream (RESOURCE_EXHAUSTED) instead of growing this buffer.
        let buffer = self.0.settings.telemetry_reply_buffer.max(1);
        let (mut tx, rx) = futures::channel::mpsc::channel(buffer - 1);
        let (cut_tx, cut_rx) = futures::channel::oneshot::channel::<()>();
        // Transaction checks back come on their own bounded channel: a burst of
        // them fills neither the replies' buffer nor cuts the stream (a check a
        // full channel cannot take goes to another producer of the topic).
        let (checks_tx, checks_rx) = futures::channel::mpsc::channel(CHECKS_BUFFER);
        let b = self.0.clone();
        tokio::spawn(async move {
            let stream = b.producers.stream_id();
            while let Ok(Some(cmd)) = inbound.message().await {
                if let Some(telemetry_command::Command::Settings(s)) = cmd.command {
                    if let Ok(p) = &principal {
                        // The user as it is now: it may have been changed or
                        // deleted since the stream opened.
                        let checked = guard::refreshed(&b, p)
                            .and_then(|p| p.authorize(&guard::Needs::needs(&s)));
                        if let Err(e) = checked {
                            tracing::info!(error = %e, "a telemetry client's settings are refused");
                            let reply = pb::TelemetryCommand {
                                status: Some(e.to_status()),
                                command: None,
                            };
                            let _ = tx.try_send(Ok(reply));
                            break;
                        }
                    }
                    // A producer's stream is where its transactions are checked back.
                    if let Some(pb::settings::PubSub::Publishing(p)) = &s.pub_sub {
                        let topics = p.topics.iter().map(|t| t.name.clone()).collect();
                        b.producers
                            .register(stream, &client, topics, checks_tx.clone());
                    }
                    let reply = pb::TelemetryCommand {
                        status: Some(pb::Status::ok()),
                        command: Some(telemetry_command::Command::Settings(merged_settings(&b, s))),
                    };
                    match tx.try_send(Ok(reply)) {
                        Ok(()) => {}
                        Err(e) if e.is_full() => {
                            tracing::warn!(
                                buffer,
                                "a telemetry client does not read its replies; ending its stream"
                            );
                            let _ = cut_tx.send(());
                            break;
                        }
                        Err(_) => break,
                    }
                }
                // Thread stack traces and verification results are not used by
                // this broker; transactions are ended by EndTransaction.
            }
            b.producers.remove(stream);
        });
        Ok(Response::new(Box::pin(futures::stream::select(
            cut_short(rx, cut_rx),
            checks_rx,
        ))))
    }

    async fn notify_client_termination(
        &self,
        req: Request<pb::NotifyClientTerminationRequest>,
    ) -> Result<Response<pb::NotifyClientTerminationResponse>, Status> {
        let status = guard::admit(&self.0, req.metadata(), req.get_ref())
            .and_then(|()| client_of(&self.0, req.metadata()))
            .map_or_else(|s| s, |_| pb::Status::ok());
        Ok(Response::new(pb::NotifyClientTerminationResponse {
            status: Some(status),
        }))
    }

    async fn change_invisible_duration(
        &self,
        req: Request<pb::ChangeInvisibleDurationRequest>,
    ) -> Result<Response<pb::ChangeInvisibleDurationResponse>, Status> {
        on_leader(
            &self.0,
            req,
            change_invisible_local,
            async |mut c, r| c.change_invisible_duration(r).await,
            |s| pb::ChangeInvisibleDurationResponse {
                status: Some(s),
                receipt_handle: String::new(),
            },
        )
        .await
    }
}

/// Transaction checks back buffered for one producer's Telemetry stream.
const CHECKS_BUFFER: usize = 64;

/// `replies` until `cut` fires, then RESOURCE_EXHAUSTED (buffered replies are
/// dropped); all of `replies` if `cut` is dropped unfired.
fn cut_short(
    replies: futures::channel::mpsc::Receiver<Result<pb::TelemetryCommand, Status>>,
    cut: futures::channel::oneshot::Receiver<()>,
) -> impl Stream<Item = Result<pb::TelemetryCommand, Status>> + Send + 'static {
    use futures::{FutureExt, StreamExt};
    let cut = cut.shared();
    let stop = {
        let cut = cut.clone();
        async move {
            if cut.await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    let tail = futures::stream::once(async move {
        cut.await.ok().map(|()| {
            Err(Status::resource_exhausted(
                "telemetry replies were not read: stream ended",
            ))
        })
    })
    .filter_map(futures::future::ready);
    replies.take_until(stop).chain(tail)
}

/// Everything a leader's receive stream sends (what came before a break included).
async fn drain(mut s: Streaming<pb::ReceiveMessageResponse>) -> Vec<pb::ReceiveMessageResponse> {
    let mut items = Vec::new();
    loop {
        match s.message().await {
            Ok(Some(i)) => items.push(i),
            Ok(None) => return items,
            Err(e) => {
                tracing::debug!(error = %e, "leader's receive stream broke");
                return items;
            }
        }
    }
}

fn status_only(kind: ErrorKind, message: &str) -> pb::ReceiveMessageResponse {
    consume::status_item(refuse(kind, message).to_status())
}
