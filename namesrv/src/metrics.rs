//! Prometheus metrics: the HTTP endpoint that `mqbroker` and `mqnamesrv` serve
//! (`GET /metrics`, the text exposition format 0.0.4,
//! <https://prometheus.io/docs/instrumenting/exposition_formats/>), and the name
//! server's own metrics.
//!
//! Name server metrics (each with the constant label `node_type="nameserver"`):
//! - `ledgermq_namesrv_broker_nodes{role}` (gauge): broker nodes registered, by
//!   the role they last announced;
//! - `rocketmq_topic_number` (gauge): topics some registered node serves;
//! - `ledgermq_namesrv_registrations_total` (counter): RegisterBroker calls
//!   (heartbeats included);
//! - `ledgermq_namesrv_route_queries_total{protocol_type}` (counter): route
//!   queries, `grpc` (LedgerMQ's own QueryRoute) or `remoting`
//!   (GET_ROUTEINFO_BY_TOPIC).

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::pb::Role;
use crate::registry::Registry as Routes;
use crate::NameSrvError;

/// Renders the current metrics as Prometheus text.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// The text of every metric family `registry` holds.
pub fn encode(registry: &Registry) -> String {
    use prometheus::Encoder;
    let mut out = Vec::new();
    // The text encoder fails only on a writer error; a Vec never fails.
    let _ = prometheus::TextEncoder::new().encode(&registry.gather(), &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// A running metrics endpoint ([`MetricsServer::stop`]; dropped, it serves on
/// until the runtime ends). A connection open at the stop may be served a
/// while longer: give `render` no strong hold on what must go away (a
/// `Weak`).
pub struct MetricsServer {
    /// The address it listens on.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsServer {
    /// Stops serving; returns once the task (and what `render` holds) is gone.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Serves `GET /metrics` on `addr` (`host:port`; port 0 picks one) with what
/// `render` returns at each scrape (run on a blocking thread). Error: the
/// address cannot be bound.
pub async fn serve_metrics(addr: &str, render: Render) -> Result<MetricsServer, NameSrvError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| NameSrvError::Transport(format!("metrics: bind {addr}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| NameSrvError::Transport(format!("metrics: {e}")))?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let render = render.clone();
            async move {
                // Off the runtime's workers: a broker's render reads the disk.
                let text = tokio::task::spawn_blocking(move || render())
                    .await
                    .unwrap_or_default();
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    text,
                )
            }
        }),
    );
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    });
    tracing::info!(%addr, "metrics at http://{addr}/metrics");
    Ok(MetricsServer { addr, task })
}

/// The name server's metrics (see the module docs).
pub struct NamesrvMetrics {
    registry: Registry,
    nodes: IntGaugeVec,
    topics: prometheus::IntGauge,
    /// RegisterBroker calls.
    pub registrations: IntCounter,
    /// Route queries by protocol (`grpc`, `remoting`).
    pub route_queries: IntCounterVec,
}

impl Default for NamesrvMetrics {
    fn default() -> Self {
        let opts =
            |name: &str, help: &str| Opts::new(name, help).const_label("node_type", "nameserver");
        let registry = Registry::new();
        let nodes = IntGaugeVec::new(
            opts(
                "ledgermq_namesrv_broker_nodes",
                "Broker nodes registered, by announced role.",
            ),
            &["role"],
        )
        .expect("valid metric");
        let topics = prometheus::IntGauge::with_opts(opts(
            "rocketmq_topic_number",
            "Topics served by some registered broker node.",
        ))
        .expect("valid metric");
        let registrations = IntCounter::with_opts(opts(
            "ledgermq_namesrv_registrations_total",
            "RegisterBroker calls (heartbeats included).",
        ))
        .expect("valid metric");
        let route_queries = IntCounterVec::new(
            opts(
                "ledgermq_namesrv_route_queries_total",
                "Route queries by protocol.",
            ),
            &["protocol_type"],
        )
        .expect("valid metric");
        for c in [
            Box::new(nodes.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(topics.clone()),
            Box::new(registrations.clone()),
            Box::new(route_queries.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        Self {
            registry,
            nodes,
            topics,
            registrations,
            route_queries,
        }
    }
}

impl NamesrvMetrics {
    /// The metrics as text, the gauges read from `routes` now (`now_ms`).
    pub fn render(&self, routes: &Routes, now_ms: u64) -> String {
        self.nodes.reset();
        for n in routes.cluster(now_ms) {
            let role = Role::try_from(n.node.map_or(0, |n| n.role)).unwrap_or(Role::Unspecified);
            self.nodes
                .with_label_values(&[role.as_str_name().to_ascii_lowercase().as_str()])
                .inc();
        }
        self.topics.set(routes.topics().len() as i64);
        encode(&self.registry)
    }
}
