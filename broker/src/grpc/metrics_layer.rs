//! A tower layer around the client port's gRPC services that times each call
//! into `rocketmq_rpc_latency` (`protocol_type="grpc_v2"`, `request_code` the
//! method name, `response_code` the gRPC status code the response headers
//! carry, `0` when they carry none: the status then comes in the trailers,
//! which for this service's unary calls means OK). A streaming call is timed
//! to its response headers; Telemetry, which lives as long as the client, is
//! not timed, nor is a call another member passed on (its first member
//! timed it, relay included). A path that names no method of these services is labelled
//! `other`, so clients cannot grow the label set.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use crate::metrics::BrokerMetrics;

/// The methods of `apache.rocketmq.v2.MessagingService` and of the admin
/// service (`proto/`); any other path is labelled `other`.
const KNOWN_METHODS: &[&str] = &[
    "QueryRoute",
    "Heartbeat",
    "SendMessage",
    "QueryAssignment",
    "ReceiveMessage",
    "AckMessage",
    "ForwardMessageToDeadLetterQueue",
    "EndTransaction",
    "Telemetry",
    "NotifyClientTermination",
    "ChangeInvisibleDuration",
    "UpdateTopic",
    "UpdateGroup",
    "LogDigest",
    "QueueDigest",
    "ConsumerProgress",
    "ResetOffset",
    "QueryMessage",
    "CheckTransaction",
    "RaftStatus",
];

/// The layer ([`tonic::transport::Server::layer`]).
#[derive(Clone)]
pub struct RpcMetricsLayer(pub Arc<BrokerMetrics>);

impl<S> tower::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcMetrics {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// The service the layer wraps around each gRPC service.
#[derive(Clone)]
pub struct RpcMetrics<S> {
    inner: S,
    metrics: Arc<BrokerMetrics>,
}

impl<S, B, R> tower::Service<http::Request<B>> for RpcMetrics<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // A label only for the services' own methods: a path is the client's
        // to choose, and every distinct label value is kept for good.
        let named = req.uri().path().rsplit('/').next().unwrap_or_default();
        let method: &'static str = KNOWN_METHODS
            .iter()
            .find(|m| **m == named)
            .copied()
            .unwrap_or("other");
        // A call a follower passed on is timed by that follower, where the
        // client's call is: timing it here too would count it twice.
        let forwarded = req.headers().contains_key(crate::broker::FORWARDED_HEADER);
        let metrics = self.metrics.clone();
        let started = Instant::now();
        let call = self.inner.call(req);
        Box::pin(async move {
            let result = call.await;
            if method != "Telemetry" && !forwarded {
                let code = match &result {
                    Ok(r) => r
                        .headers()
                        .get("grpc-status")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("0")
                        .to_owned(),
                    Err(_) => "transport".to_owned(),
                };
                metrics.rpc("grpc_v2", method, &code, started.elapsed());
            }
            result
        })
    }
}
