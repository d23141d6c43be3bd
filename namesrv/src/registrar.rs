//! What a broker node runs to stay known: one task per name server that registers
//! every `heartbeat_interval` and at once when the node's role, term or topics change
//! (so a new leader shows in routes within about a second of its election). Each
//! name server has its own task and deadline, so one that is down never delays the
//! heartbeats to the others. With [`NameServerAccess`]'s credentials every
//! registration is signed (`crate::security`), and with its TLS the name servers
//! are called over TLS.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Endpoint;

use crate::pb::name_server_client::NameServerClient;
use crate::pb::{BrokerNode, RegisterBrokerRequest, UnregisterBrokerRequest};

/// How a broker node reaches the name servers.
#[derive(Debug, Clone, Default)]
pub struct NameServerAccess {
    /// What registrations are signed with (the cluster's registration
    /// credentials, which grant nothing on the brokers); unsigned when None.
    pub credentials: Option<ledgermq_proto::signature::Credentials>,
    /// TLS to the name servers (checked against the CA it holds); plain
    /// HTTP/2 when None.
    pub tls: Option<tonic::transport::ClientTlsConfig>,
}

/// An endpoint for the name server at `addr` (`host:port`): `https` with `tls`,
/// else `http`. Error: an address that makes no URI.
pub fn endpoint(
    addr: &str,
    tls: Option<&tonic::transport::ClientTlsConfig>,
) -> Result<Endpoint, tonic::transport::Error> {
    match tls {
        Some(tls) => Endpoint::from_shared(format!("https://{addr}"))?.tls_config(tls.clone()),
        None => Endpoint::from_shared(format!("http://{addr}")),
    }
}

/// Heartbeats to every name server.
pub struct Registrar {
    tx: watch::Sender<Option<BrokerNode>>,
    tasks: Vec<JoinHandle<()>>,
    addrs: Vec<String>,
    call_timeout: Duration,
    access: NameServerAccess,
}

/// What makes a change worth an immediate heartbeat.
fn urgent_key(n: &BrokerNode) -> (i32, u64, bool, Vec<crate::pb::TopicConfig>) {
    (n.role, n.term, n.cut_off, n.topics.clone())
}

impl Registrar {
    /// Starts one heartbeat task per address in `namesrv_addrs` (`host:port`),
    /// reaching them as `access` says.
    pub fn start(
        namesrv_addrs: Vec<String>,
        heartbeat_interval: Duration,
        call_timeout: Duration,
        access: NameServerAccess,
    ) -> Self {
        let (tx, _) = watch::channel(None::<BrokerNode>);
        let tasks = namesrv_addrs
            .iter()
            .map(|addr| {
                tokio::spawn(heartbeat_loop(
                    addr.clone(),
                    tx.subscribe(),
                    heartbeat_interval,
                    call_timeout,
                    access.clone(),
                ))
            })
            .collect();
        Self {
            tx,
            tasks,
            addrs: namesrv_addrs,
            call_timeout,
            access,
        }
    }

    /// Publishes the node's current description; the tasks send it at once if its
    /// role, term or topics changed, else with the next periodic heartbeat.
    pub fn update(&self, node: BrokerNode) {
        self.tx.send_replace(Some(node));
    }

    /// Stops heartbeating and, with `unregister`, tells every name server the node
    /// is gone (each call bounded by the call timeout).
    pub async fn stop(self, unregister: bool) {
        for t in &self.tasks {
            t.abort();
        }
        let last = self.tx.borrow().clone();
        if let (true, Some(n)) = (unregister, last) {
            let calls = self.addrs.iter().map(|addr| {
                let req = UnregisterBrokerRequest {
                    cluster: n.cluster.clone(),
                    broker_group: n.broker_group.clone(),
                    node_id: n.node_id,
                };
                let (addr, timeout, access) = (addr.clone(), self.call_timeout, &self.access);
                async move {
                    let Some(mut c) = client(&addr, timeout, access) else {
                        return;
                    };
                    let req = access.signed(req);
                    let _ = tokio::time::timeout(timeout, c.unregister_broker(req)).await;
                }
            });
            futures::future::join_all(calls).await;
        }
    }
}

impl NameServerAccess {
    /// `msg` as a request, signed now over its [`crate::security::request_bound`]
    /// when there are credentials.
    fn signed<M: prost::Message>(&self, msg: M) -> tonic::Request<M> {
        let mut req = tonic::Request::new(msg);
        if let Some(creds) = &self.credentials {
            let bound = crate::security::request_bound(req.get_ref());
            ledgermq_proto::signature::sign_request_bound(&mut req, creds, &bound);
        }
        req
    }
}

fn client(
    addr: &str,
    timeout: Duration,
    access: &NameServerAccess,
) -> Option<NameServerClient<tonic::transport::Channel>> {
    let ep = endpoint(addr, access.tls.as_ref()).ok()?;
    Some(NameServerClient::new(
        ep.connect_timeout(timeout).tcp_nodelay(true).connect_lazy(),
    ))
}

async fn heartbeat_loop(
    addr: String,
    mut rx: watch::Receiver<Option<BrokerNode>>,
    every: Duration,
    timeout: Duration,
    access: NameServerAccess,
) {
    let Some(mut c) = client(&addr, timeout, &access) else {
        tracing::error!(%addr, "bad name server address");
        return;
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_key = None;
    // After a failure, urgent sends wait for a backoff (doubling from 200 ms up to
    // the heartbeat period) so an unreachable name server is not called, and
    // logged, on every metrics change.
    let mut failures = 0u32;
    let mut urgent_after = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = rx.changed() => {
                if changed.is_err() {
                    return;
                }
                let key = rx.borrow().as_ref().map(urgent_key);
                if key == last_key {
                    continue;
                }
                tokio::time::sleep_until(urgent_after).await;
            }
        }
        let Some(node) = rx.borrow_and_update().clone() else {
            continue;
        };
        let key = Some(urgent_key(&node));
        // Signed per call: the signature's date must be recent.
        let req = access.signed(RegisterBrokerRequest { node: Some(node) });
        let error = match tokio::time::timeout(timeout, c.register_broker(req)).await {
            Ok(Ok(_)) => {
                if failures > 0 {
                    tracing::info!(%addr, "name server reachable again");
                }
                failures = 0;
                last_key = key;
                continue;
            }
            Ok(Err(s)) => s.to_string(),
            Err(_) => "timed out".to_string(),
        };
        if failures == 0 {
            tracing::warn!(%addr, %error, "heartbeat to name server failed; retrying with backoff");
        } else {
            tracing::debug!(%addr, %error, failures, "heartbeat to name server failed");
        }
        failures = failures.saturating_add(1);
        let backoff = Duration::from_millis(200)
            .saturating_mul(1 << failures.min(16))
            .min(every);
        urgent_after = tokio::time::Instant::now() + backoff;
    }
}
