//! Serving a broker node's client port: the MessagingService and the admin service.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::admin_pb::broker_admin_server::BrokerAdminServer;
use crate::broker::Broker;
use crate::consumers::OffsetCommitter;
use crate::error::BrokerError;
use crate::grpc::admin::Admin;
use crate::grpc::service::Service;
use crate::leader_term::LeaderTerms;
use crate::pb::messaging_service_server::MessagingServiceServer;
use crate::timers::TimerDelivery;
use crate::transactions::check::TransactionCheck;

/// A serving client port (see [`serve`]). Dropping it leaves the port serving
/// until the process exits.
#[must_use = "the client port stops only through ClientServer::stop"]
pub struct ClientServer {
    task: JoinHandle<()>,
    leader_terms: LeaderTerms,
    shutdown: tokio::sync::oneshot::Sender<()>,
}

impl ClientServer {
    /// The term whose leader-term services run now, if any
    /// ([`LeaderTerms::services_term`]).
    pub fn services_term(&self) -> Option<u64> {
        self.leader_terms.services_term()
    }

    /// Stops serving: the listening socket closes at once, and calls on open
    /// connections get up to `drain` to finish (a write taken before a leadership
    /// hand-over is forwarded to the new leader and answered). Calls still open
    /// after it (long polls, Telemetry streams, each on its connection's own task)
    /// are left to end with the process. The leader-term services (the
    /// consumer-offset committer) are then told their term ended, and get what is
    /// left of `drain` to finish a commit under way.
    pub async fn stop(self, drain: Duration) {
        let deadline = tokio::time::Instant::now() + drain;
        let _ = self.shutdown.send(());
        let mut task = self.task;
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            task.abort();
            let _ = task.await;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.leader_terms.stop(left).await;
    }
}

/// Binds `addr` and serves the client protocol and the admin service (over
/// TLS when the broker has a certificate, `ServiceSettings::tls`) until
/// [`ClientServer::stop`]; also starts the leader-term services
/// ([`crate::leader_term`]) while this node leads: the consumer-offset
/// committer, every 100 ms, the delivery of due delay messages
/// ([`crate::timers`]), every 20 ms, and the checks back of orphaned
/// transactions ([`crate::transactions::check`]), every 500 ms. Error: the address cannot be bound.
pub async fn serve(broker: Arc<Broker>, addr: SocketAddr) -> Result<ClientServer, BrokerError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| BrokerError::Transport(format!("bind {addr}: {e}")))?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let leader_terms = LeaderTerms::start(
        broker.node.status(),
        vec![
            Arc::new(OffsetCommitter {
                consumers: broker.consumers.clone(),
                interval: Duration::from_millis(100),
            }),
            Arc::new(TimerDelivery {
                node: broker.node.clone(),
                interval: Duration::from_millis(20),
                max_messages: 256,
                max_bytes: 1 << 20,
            }),
            Arc::new(TransactionCheck {
                broker: broker.clone(),
                tick: Duration::from_millis(500),
            }),
            Arc::new(crate::acl_bootstrap::AclBootstrap {
                broker: broker.clone(),
                interval: Duration::from_secs(1),
            }),
        ],
    );
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = &broker.settings.tls {
        let identity = tonic::transport::Identity::from_pem(&tls.cert_pem, &tls.key_pem);
        server = server
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .map_err(|e| BrokerError::Transport(format!("TLS on {addr}: {e}")))?;
    }
    let router = server
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .layer(crate::grpc::metrics_layer::RpcMetricsLayer(
            broker.metrics.clone(),
        ))
        .add_service(
            MessagingServiceServer::new(Service(broker.clone()))
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20),
        )
        .add_service({
            let b = broker.clone();
            BrokerAdminServer::with_interceptor(Admin(broker), move |req: tonic::Request<()>| {
                crate::grpc::guard::admit_admin(&b, req.metadata()).map(|()| req)
            })
        });
    let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let stopped = async {
            if stopped.await.is_err() {
                // Dropped without `stop`: serve on.
                std::future::pending::<()>().await;
            }
        };
        if let Err(e) = router.serve_with_incoming_shutdown(incoming, stopped).await {
            tracing::error!(error = %e, "client service stopped");
        }
    });
    Ok(ClientServer {
        task,
        leader_terms,
        shutdown,
    })
}
