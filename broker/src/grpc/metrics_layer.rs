//! A tower layer around the client port's gRPC services that times each call
//! into `rocketmq_rpc_latency` (`protocol_type="grpc_v2"`, `request_code` the
//! method name, `response_code` the gRPC status code the response headers
//! carry, `0` when they carry none: the status then comes in the trailers,
//! which for this service's unary calls means OK). A streaming call is timed
//! to its response headers; Telemetry, which lives as long as the client, is
//! not timed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use crate::metrics::BrokerMetrics;

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
        let method = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let metrics = self.metrics.clone();
        let started = Instant::now();
        let call = self.inner.call(req);
        Box::pin(async move {
            let result = call.await;
            if method != "Telemetry" {
                let code = match &result {
                    Ok(r) => r
                        .headers()
                        .get("grpc-status")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("0")
                        .to_owned(),
                    Err(_) => "transport".to_owned(),
                };
                metrics.rpc("grpc_v2", &method, &code, started.elapsed());
            }
            result
        })
    }
}
