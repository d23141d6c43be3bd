//! The name server's gRPC service, its expiry scan, and the one port that
//! serves both protocols: each connection's first byte tells them apart (an
//! HTTP/2 connection preface begins with `P`; a remoting frame begins with its
//! big-endian length, whose first byte is 0 for any frame under 16 MiB), as
//! RocketMQ 5's proxy tells HTTP/2 from remoting on its port. With `[tls]` the
//! port takes TLS connections only and reads that byte inside the session
//! (`ledgermq_tls::accept`); with `[auth]` registrations must be signed
//! ([`crate::security`]).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ledgermq_tls::Stream;
use serde::Deserialize;
use tonic::{Request, Response, Status};

use crate::pb::name_server_server::{NameServer, NameServerServer};
use crate::pb::*;
use crate::registry::Registry;
use crate::{now_ms, NameSrvError};

/// Name server settings (`mqnamesrv -c FILE`, TOML).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NameServerConfig {
    /// Address to listen on (RocketMQ's default port 9876).
    pub listen: String,
    /// How often silent nodes are looked for, in ms (RocketMQ: 10 s).
    pub scan_interval_ms: u64,
    /// A node silent for longer than this is dropped, in ms (RocketMQ: 120 s).
    pub node_expiry_ms: u64,
    /// Where `GET /metrics` (Prometheus text) is served, `host:port`; none
    /// when unset.
    pub metrics_addr: Option<String>,
    /// Who may register broker nodes (`[auth]`); anyone by default.
    pub auth: crate::security::RegistrationAuth,
    /// TLS on the port (`[tls]`: `cert_file` and `key_file`); none by default.
    pub tls: ledgermq_tls::TlsFiles,
    /// With `[tls]`: `enforcing` (the default) serves TLS connections only;
    /// `permissive` serves plain ones too, as RocketMQ's `tls.server.mode`
    /// does (4.x clients, which ask for routes in plain text).
    pub tls_mode: TlsMode,
}

/// [`NameServerConfig::tls_mode`].
pub use ledgermq_tls::TlsMode;

impl Default for NameServerConfig {
    fn default() -> Self {
        Self {
            listen: "0.0.0.0:9876".into(),
            scan_interval_ms: 10_000,
            node_expiry_ms: 120_000,
            metrics_addr: None,
            auth: Default::default(),
            tls: Default::default(),
            tls_mode: TlsMode::Enforcing,
        }
    }
}

impl NameServerConfig {
    /// Reads a TOML file, or a RocketMQ `namesrv.properties` (`.properties`
    /// or `.conf`: [`Self::from_properties`]; the keys it does not use are
    /// logged in one warning); missing keys take the defaults. Error: the file
    /// cannot be read or a value does not parse, named by its key.
    pub fn load(path: &Path) -> Result<Self, NameSrvError> {
        let err = |e: String| NameSrvError::Config(format!("{}: {e}", path.display()));
        if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("properties" | "conf")
        ) {
            let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
            let (cfg, unused) = Self::from_properties(&bytes).map_err(err)?;
            if !unused.is_empty() {
                tracing::warn!(
                    file = %path.display(),
                    keys = %unused.join(", "),
                    "RocketMQ configuration keys LedgerMQ does not use, ignored"
                );
            }
            return Ok(cfg);
        }
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let mut cfg: Self = toml::from_str(&text).map_err(|e| err(e.to_string()))?;
        cfg.tls
            .resolve(path.parent().unwrap_or_else(|| Path::new(".")));
        Ok(cfg)
    }

    /// A RocketMQ name server's properties file (`bytes`, read as
    /// `java.util.Properties` reads): `listenPort` (→ `listen` on every
    /// interface) and `scanNotActiveBrokerInterval` (ms → `scan_interval_ms`),
    /// or this crate's own keys (`listen`, `scan_interval_ms`,
    /// `node_expiry_ms`, `metrics_addr`), which win over RocketMQ's; with the keys left
    /// unused, sorted. Error: a value that does not parse, named by its key.
    pub fn from_properties(bytes: &[u8]) -> Result<(Self, Vec<String>), String> {
        let props = crate::properties::read(bytes)?;
        let mut cfg = Self::default();
        let mut unused = Vec::new();
        let ms = |k: &str, v: &str| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| format!("{k}={v:?}: not a number of milliseconds"))
        };
        // RocketMQ's keys first, then this crate's own, which win.
        for (k, v) in &props {
            match k.as_str() {
                "listenPort" => {
                    let port: u16 = v
                        .trim()
                        .parse()
                        .map_err(|_| format!("listenPort={v:?}: not a port"))?;
                    cfg.listen = format!("0.0.0.0:{port}");
                }
                "scanNotActiveBrokerInterval" => cfg.scan_interval_ms = ms(k, v)?,
                "listen" | "scan_interval_ms" | "node_expiry_ms" | "metrics_addr" => {}
                _ => unused.push(k.clone()),
            }
        }
        for (k, v) in &props {
            match k.as_str() {
                "listen" => cfg.listen = v.trim().to_owned(),
                "scan_interval_ms" => cfg.scan_interval_ms = ms(k, v)?,
                "node_expiry_ms" => cfg.node_expiry_ms = ms(k, v)?,
                "metrics_addr" => cfg.metrics_addr = Some(v.trim().to_owned()),
                _ => {}
            }
        }
        Ok((cfg, unused))
    }
}

/// The service over a shared registry.
#[derive(Clone, Default)]
pub struct NameServerService {
    registry: Arc<Mutex<Registry>>,
    metrics: Arc<crate::metrics::NamesrvMetrics>,
    registration: crate::security::RegistrationCheck,
}

impl NameServerService {
    /// Drops nodes silent for longer than `expiry_ms`.
    pub fn expire(&self, expiry_ms: u64) {
        for n in self.registry.lock().unwrap().expire(now_ms(), expiry_ms) {
            tracing::info!(cluster = %n.cluster, group = %n.broker_group, node = n.node_id, "node expired");
        }
    }
}

#[tonic::async_trait]
impl NameServer for NameServerService {
    async fn register_broker(
        &self,
        req: Request<RegisterBrokerRequest>,
    ) -> Result<Response<RegisterBrokerResponse>, Status> {
        self.registration.check(&req, now_ms())?;
        let node = req
            .into_inner()
            .node
            .ok_or_else(|| Status::invalid_argument("RegisterBroker needs a node"))?;
        if node.cluster.is_empty() || node.broker_group.is_empty() || node.client_addr.is_empty() {
            return Err(Status::invalid_argument(
                "cluster, broker_group and client_addr are required",
            ));
        }
        self.registry.lock().unwrap().register(node, now_ms());
        self.metrics.registrations.inc();
        Ok(Response::new(RegisterBrokerResponse {}))
    }

    async fn unregister_broker(
        &self,
        req: Request<UnregisterBrokerRequest>,
    ) -> Result<Response<UnregisterBrokerResponse>, Status> {
        self.registration.check(&req, now_ms())?;
        let r = req.into_inner();
        self.registry
            .lock()
            .unwrap()
            .unregister(&r.cluster, &r.broker_group, r.node_id);
        Ok(Response::new(UnregisterBrokerResponse {}))
    }

    async fn query_route(
        &self,
        req: Request<QueryRouteRequest>,
    ) -> Result<Response<QueryRouteResponse>, Status> {
        let topic = req.into_inner().topic;
        self.metrics
            .route_queries
            .with_label_values(&["grpc"])
            .inc();
        Ok(Response::new(
            self.registry.lock().unwrap().route(&topic, now_ms()),
        ))
    }

    async fn list_cluster(
        &self,
        _req: Request<ListClusterRequest>,
    ) -> Result<Response<ListClusterResponse>, Status> {
        Ok(Response::new(ListClusterResponse {
            nodes: self.registry.lock().unwrap().cluster(now_ms()),
        }))
    }
}

/// Serves the name server on `listener` until `shutdown` resolves, scanning for silent
/// nodes every `scan_interval_ms`.
pub async fn serve(
    cfg: &NameServerConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), NameSrvError> {
    let service = NameServerService {
        registration: crate::security::RegistrationCheck::new(&cfg.auth)
            .map_err(NameSrvError::Config)?,
        ..NameServerService::default()
    };
    if cfg.tls.ca_file.is_some() {
        return Err(NameSrvError::Config(
            "tls.ca_file: the name server checks no client certificate; leave it out".into(),
        ));
    }
    let tls = cfg
        .tls
        .load(false)
        .map_err(NameSrvError::Config)?
        .map(|m| m.acceptor(false))
        .transpose()
        .map_err(|e| NameSrvError::Config(format!("tls: {e}")))?;
    let metrics = match &cfg.metrics_addr {
        Some(addr) => {
            let s = service.clone();
            let render: crate::metrics::Render =
                Arc::new(move || s.metrics.render(&s.registry.lock().unwrap(), now_ms()));
            Some(crate::metrics::serve_metrics(addr, render).await?)
        }
        None => None,
    };
    let scanner = {
        let s = service.clone();
        let (every, expiry) = (
            Duration::from_millis(cfg.scan_interval_ms.max(1)),
            cfg.node_expiry_ms,
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                s.expire(expiry);
            }
        })
    };
    let (grpc_tx, grpc_rx) = tokio::sync::mpsc::channel::<std::io::Result<Stream>>(64);
    let plain_too = cfg.tls_mode.plain_too();
    let splitter = tokio::spawn(split_protocols(
        listener,
        service.clone(),
        grpc_tx,
        tls,
        plain_too,
    ));
    let incoming = tokio_stream::wrappers::ReceiverStream::new(grpc_rx);
    let r = tonic::transport::Server::builder()
        .add_service(NameServerServer::new(service))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| NameSrvError::Transport(e.to_string()));
    scanner.abort();
    splitter.abort();
    if let Some(m) = metrics {
        m.stop().await;
    }
    r
}

/// Accepts connections, with `tls` completing each one's TLS handshake first
/// (a connection that does not speak TLS is then dropped), and hands each to
/// gRPC (`grpc`) or serves it as a remoting connection, by its first byte (see
/// the module doc).
async fn split_protocols(
    listener: tokio::net::TcpListener,
    service: NameServerService,
    grpc: tokio::sync::mpsc::Sender<std::io::Result<Stream>>,
    tls: Option<ledgermq_tls::TlsAcceptor>,
    plain_too: bool,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (service, grpc, tls) = (service.clone(), grpc.clone(), tls.clone());
        tokio::spawn(async move {
            let Some((stream, first)) = ledgermq_tls::accept(
                stream,
                tls.as_ref(),
                plain_too,
                ledgermq_tls::FIRST_BYTE_WAIT,
            )
            .await
            else {
                return;
            };
            if first == b'P' {
                let _ = grpc.send(Ok(stream)).await;
                return;
            }
            let registry = service.registry.clone();
            let metrics = service.metrics.clone();
            let handle = move |req: ledgermq_remoting::RemotingCommand, _conn| {
                if req.code == ledgermq_remoting::codes::request::GET_ROUTEINFO_BY_TOPIC {
                    metrics.route_queries.with_label_values(&["remoting"]).inc();
                }
                let answer = crate::remoting::handle(&registry.lock().unwrap(), &req, now_ms());
                async move { Some(answer) }
            };
            let max = ledgermq_remoting::DEFAULT_MAX_FRAME_BYTES;
            match stream {
                Stream::Plain(tcp) => {
                    ledgermq_remoting::conn::serve_connection(tcp, max, handle, |_| false, |_| {})
                        .await
                }
                tls => {
                    let peer = tls
                        .tcp()
                        .peer_addr()
                        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
                    ledgermq_remoting::conn::serve_stream(tls, peer, max, handle, |_| false, |_| {})
                        .await
                }
            }
        });
    }
}

/// Binds `cfg.listen` (or `addr`) and returns the listener and its address.
pub async fn bind(addr: &str) -> Result<(tokio::net::TcpListener, SocketAddr), NameSrvError> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| NameSrvError::Transport(format!("binding {addr}: {e}")))?;
    let local = l
        .local_addr()
        .map_err(|e| NameSrvError::Transport(e.to_string()))?;
    Ok((l, local))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_material() -> ledgermq_tls::TlsMaterial {
        let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tls/testdata");
        ledgermq_tls::TlsMaterial {
            cert_pem: std::fs::read(testdata.join("member.pem")).unwrap(),
            key_pem: std::fs::read(testdata.join("member-key.pem")).unwrap(),
            ca_pem: std::fs::read(testdata.join("ca.pem")).unwrap(),
        }
    }

    /// A name server with `[tls]` (the test certificate) in `mode`; its address.
    async fn tls_namesrv(mode: TlsMode) -> String {
        let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tls/testdata");
        let cfg = NameServerConfig {
            tls: ledgermq_tls::TlsFiles {
                cert_file: Some(testdata.join("member.pem")),
                key_file: Some(testdata.join("member-key.pem")),
                ca_file: None,
            },
            tls_mode: mode,
            ..NameServerConfig::default()
        };
        let (listener, addr) = bind("127.0.0.1:0").await.unwrap();
        tokio::spawn(async move { serve(&cfg, listener, std::future::pending()).await });
        addr.to_string()
    }

    /// Sends a route query on `s` and reads one frame back, if any comes.
    async fn route_query(
        s: &mut ledgermq_tls::Stream,
    ) -> Option<ledgermq_remoting::RemotingCommand> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let query = ledgermq_remoting::RemotingCommand::request(
            ledgermq_remoting::codes::request::GET_ROUTEINFO_BY_TOPIC,
            [("topic", "NoSuchTopic")],
        );
        s.write_all(&query.encode().unwrap()).await.ok()?;
        s.flush().await.ok()?;
        let mut buf = Vec::new();
        loop {
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(15), s.read(&mut chunk))
                .await
                .expect("an answer or a close within 15 s")
                .ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Ok(Some((frame, _))) = ledgermq_remoting::split_frame(&buf, 1 << 20) {
                let answer = ledgermq_remoting::RemotingCommand::decode(frame).ok()?;
                assert_eq!(answer.opaque, query.opaque);
                return answer.is_response().then_some(answer);
            }
        }
    }

    /// A name server with `[tls]` serves gRPC and remoting inside TLS (the
    /// first byte read ahead inside the session picks the protocol), and,
    /// enforcing, nothing in plain text; permissive, plain remoting too.
    #[tokio::test]
    async fn with_tls_both_protocols_are_served_inside_it_and_plain_text_as_the_mode_says() {
        let client = test_material();
        for mode in [TlsMode::Enforcing, TlsMode::Permissive] {
            let addr = tls_namesrv(mode).await;
            let mut s = ledgermq_tls::connect(&addr, Some(&client.connector(false).unwrap()))
                .await
                .unwrap();
            assert!(
                route_query(&mut s).await.is_some(),
                "{mode:?}: remoting inside TLS"
            );
            let tls = client.tonic_client(false);
            let channel = crate::registrar::endpoint(&addr, Some(&tls))
                .unwrap()
                .connect()
                .await
                .unwrap();
            crate::pb::name_server_client::NameServerClient::new(channel)
                .list_cluster(ListClusterRequest {})
                .await
                .unwrap();
            let mut plain = ledgermq_tls::connect(&addr, None).await.unwrap();
            assert_eq!(
                route_query(&mut plain).await.is_some(),
                mode == TlsMode::Permissive,
                "{mode:?}: plain remoting"
            );
        }
    }

    #[test]
    fn a_ca_file_is_refused_since_no_client_certificate_is_checked() {
        let cfg = NameServerConfig {
            tls: ledgermq_tls::TlsFiles {
                ca_file: Some("ca.pem".into()),
                ..Default::default()
            },
            ..NameServerConfig::default()
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = rt.block_on(async {
            let (listener, _) = bind("127.0.0.1:0").await.unwrap();
            serve(&cfg, listener, std::future::pending()).await
        });
        assert!(matches!(e, Err(NameSrvError::Config(m)) if m.contains("ca_file")));
    }

    #[test]
    fn the_compose_and_systemd_namesrv_configs_load() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        let c = NameServerConfig::load(&root.join("compose/config/namesrv.toml")).unwrap();
        assert_eq!(c.listen, "0.0.0.0:9876");
        for h in 1..=3 {
            let c = NameServerConfig::load(&root.join(format!("systemd/host{h}/namesrv.toml")))
                .unwrap();
            assert_eq!(c.listen, format!("10.0.0.{}:9876", 10 + h));
            // Signed registrations and TLS, with the host's certificate.
            assert!(c.auth.credentials().unwrap().is_some());
            assert!(c
                .tls
                .cert_file
                .as_ref()
                .unwrap()
                .ends_with(format!("certs/host{h}.pem")));
            assert_eq!(c.tls_mode, TlsMode::Permissive);
        }
    }

    #[test]
    fn a_rocketmq_namesrv_properties_file_is_read() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/rocketmq-properties/namesrv.properties");
        let text = std::fs::read_to_string(&path).unwrap();
        let (cfg, unused) = NameServerConfig::from_properties(text.as_bytes()).unwrap();
        assert_eq!(cfg.listen, "0.0.0.0:9876");
        assert_eq!(unused, ["rocketmqHome"]);
        assert_eq!(
            NameServerConfig::load(&path).unwrap().listen,
            "0.0.0.0:9876"
        );
        // The own key wins, whichever comes first in the file.
        let (cfg, _) = NameServerConfig::from_properties(
            b"listen=127.0.0.1:1\nlistenPort=2\nscanNotActiveBrokerInterval=5000",
        )
        .unwrap();
        assert_eq!(
            (cfg.listen.as_str(), cfg.scan_interval_ms),
            ("127.0.0.1:1", 5000)
        );
        let e = NameServerConfig::from_properties(b"listenPort=98765").unwrap_err();
        assert!(e.contains("listenPort"), "{e}");
    }
}
