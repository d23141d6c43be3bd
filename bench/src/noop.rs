//! A RocketMQ 5 `MessagingService` that stores nothing: SendMessage answers OK at
//! once (one result entry per message, with its message id), Heartbeat answers OK,
//! every other call is UNIMPLEMENTED. `mqbench` against it measures what the gRPC
//! transport alone (tonic/h2 on both sides, protobuf, loopback TCP) costs on the
//! machine: the ceiling of any broker that speaks this protocol through tonic there.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};

use futures::Stream;
use ledgermq_proto::pb;
use ledgermq_proto::pb::messaging_service_server::{MessagingService, MessagingServiceServer};
use tonic::{Request, Response, Status, Streaming};

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The no-op service; `offset` numbers the messages it was sent.
#[derive(Default)]
pub struct Noop {
    offset: AtomicI64,
}

fn ok() -> Option<pb::Status> {
    Some(pb::Status::ok())
}

fn unimplemented<T>(what: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!(
        "{what}: the no-op service only answers SendMessage and Heartbeat"
    )))
}

#[tonic::async_trait]
impl MessagingService for Noop {
    async fn query_route(
        &self,
        _: Request<pb::QueryRouteRequest>,
    ) -> Result<Response<pb::QueryRouteResponse>, Status> {
        unimplemented("QueryRoute")
    }

    async fn heartbeat(
        &self,
        _: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        Ok(Response::new(pb::HeartbeatResponse { status: ok() }))
    }

    async fn send_message(
        &self,
        req: Request<pb::SendMessageRequest>,
    ) -> Result<Response<pb::SendMessageResponse>, Status> {
        let entries = req
            .into_inner()
            .messages
            .into_iter()
            .map(|m| pb::SendResultEntry {
                status: ok(),
                message_id: m
                    .system_properties
                    .map(|p| p.message_id)
                    .unwrap_or_default(),
                transaction_id: String::new(),
                offset: self.offset.fetch_add(1, Ordering::Relaxed),
            })
            .collect();
        Ok(Response::new(pb::SendMessageResponse {
            status: ok(),
            entries,
        }))
    }

    async fn query_assignment(
        &self,
        _: Request<pb::QueryAssignmentRequest>,
    ) -> Result<Response<pb::QueryAssignmentResponse>, Status> {
        unimplemented("QueryAssignment")
    }

    type ReceiveMessageStream = BoxStream<pb::ReceiveMessageResponse>;

    async fn receive_message(
        &self,
        _: Request<pb::ReceiveMessageRequest>,
    ) -> Result<Response<Self::ReceiveMessageStream>, Status> {
        unimplemented("ReceiveMessage")
    }

    async fn ack_message(
        &self,
        _: Request<pb::AckMessageRequest>,
    ) -> Result<Response<pb::AckMessageResponse>, Status> {
        unimplemented("AckMessage")
    }

    async fn forward_message_to_dead_letter_queue(
        &self,
        _: Request<pb::ForwardMessageToDeadLetterQueueRequest>,
    ) -> Result<Response<pb::ForwardMessageToDeadLetterQueueResponse>, Status> {
        unimplemented("ForwardMessageToDeadLetterQueue")
    }

    async fn end_transaction(
        &self,
        _: Request<pb::EndTransactionRequest>,
    ) -> Result<Response<pb::EndTransactionResponse>, Status> {
        unimplemented("EndTransaction")
    }

    type TelemetryStream = BoxStream<pb::TelemetryCommand>;

    async fn telemetry(
        &self,
        _: Request<Streaming<pb::TelemetryCommand>>,
    ) -> Result<Response<Self::TelemetryStream>, Status> {
        unimplemented("Telemetry")
    }

    async fn notify_client_termination(
        &self,
        _: Request<pb::NotifyClientTerminationRequest>,
    ) -> Result<Response<pb::NotifyClientTerminationResponse>, Status> {
        unimplemented("NotifyClientTermination")
    }

    async fn change_invisible_duration(
        &self,
        _: Request<pb::ChangeInvisibleDurationRequest>,
    ) -> Result<Response<pb::ChangeInvisibleDurationResponse>, Status> {
        unimplemented("ChangeInvisibleDuration")
    }
}

/// Serves [`Noop`] on `addr` until the process ends, with the transport settings
/// of `mqbroker`'s client port (TCP_NODELAY, HTTP/2 keep-alive every 10 s, 64 MiB
/// message limit). Error: the address cannot be bound.
pub async fn serve(addr: SocketAddr) -> std::io::Result<()> {
    serve_on(tokio::net::TcpListener::bind(addr).await?).await
}

/// [`serve`] on a bound listener.
pub async fn serve_on(listener: tokio::net::TcpListener) -> std::io::Result<()> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .add_service(
            MessagingServiceServer::new(Noop::default())
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20),
        )
        .serve_with_incoming(incoming)
        .await
        .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledgermq::LedgerMq;
    use crate::runner::{run, LoadSpec};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn the_load_tool_sends_to_the_noop_service() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_on(listener));
        let driver = LedgerMq {
            endpoints: vec![addr.to_string()],
            topic: "T".into(),
            group: "G".into(),
            fifo: false,
            delay_ms: None,
            deliver_at_ms: None,
            call_timeout: Duration::from_secs(5),
            tls_ca: None,
            credentials: None,
        };
        let spec = LoadSpec::sends_only("noop", 200);
        let s = run(Arc::new(driver), spec).await;
        assert_eq!((s.sent, s.acked), (200, 200), "errors: {:?}", s.errors);
        assert!(s.errors.is_empty());
    }
}
