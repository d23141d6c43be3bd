//! How a run's own clients reach its cluster. A plain run (the default) speaks
//! HTTP/2 in clear and signs nothing. A secure run (`jepsen run --secure`)
//! turns on what `deploy/local-secure` turns on: every node serves TLS on its
//! client port and mutual TLS on its Raft port, checks each client call's
//! signature (AK/SK, `MQv2-HMAC-SHA1`) and the caller's permissions, and signs
//! its registrations at the name server, which serves TLS only and accepts
//! signed registrations only.
//!
//! The run's certificates are made in `RUN/certs` by
//! `deploy/local-secure/make-certs.sh` (openssl; built into the harness), each
//! naming its host's address. The workload signs as [`USER`], who may publish
//! to and subscribe on the workload's topics and groups and nothing else; the
//! harness's own admin calls (LogDigest, QueueDigest, ConsumerProgress and
//! `mqadmin`) sign as [`ADMIN`]. Both are created by the group's first leader
//! from the nodes' `[[auth.users]]`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ledgermq_proto::admin_pb::broker_admin_client::BrokerAdminClient;
use ledgermq_proto::pb::messaging_service_client::MessagingServiceClient;
use ledgermq_proto::pb::{Code, QueryRouteRequest, Resource};
use ledgermq_proto::signature::{sign_request, Credentials};
use ledgermq_testkit::{AuthToml, BrokerToml, UserToml};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::workload::with_client_id;
use crate::JepsenError;

/// The workload's user (access key).
pub const USER: &str = "jepsen";
/// Its secret key.
const USER_SECRET: &str = "jepsen-secret";
/// The harness's admin user (access key).
pub const ADMIN: &str = "jepsen-admin";
/// Its secret key.
const ADMIN_SECRET: &str = "jepsen-admin-secret";
/// The members' own credentials (`inner_access_key`).
const INNER: (&str, &str) = ("ledgermq-inner", "jepsen-inner-secret");
/// The registration credentials the name server checks.
const REGISTRAR: (&str, &str) = ("ledgermq-registrar", "jepsen-registration-secret");

/// The certificate script of `deploy/local-secure`, run from the run folder.
const MAKE_CERTS: &str = include_str!("../../deploy/local-secure/make-certs.sh");

/// Signs each call with its credentials (none: the call goes unsigned).
#[derive(Clone)]
pub struct Signer(Option<Credentials>);

impl tonic::service::Interceptor for Signer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(c) = &self.0 {
            sign_request(&mut req, c);
        }
        Ok(req)
    }
}

/// A messaging client signing as [`USER`] in a secure run.
pub type Messaging = MessagingServiceClient<InterceptedService<Channel, Signer>>;
/// An admin client signing as [`ADMIN`] in a secure run.
pub type Admin = BrokerAdminClient<InterceptedService<Channel, Signer>>;

/// A secure run's files.
#[derive(Debug)]
struct Secure {
    /// `RUN/certs`.
    certs: PathBuf,
    /// The run CA's certificate, PEM.
    ca_pem: Vec<u8>,
    /// Topics and groups the workload's user may use.
    topics: Vec<String>,
    groups: Vec<String>,
}

/// How the run's clients reach the cluster: cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Access {
    secure: Option<Arc<Secure>>,
}

fn creds(pair: (&str, &str)) -> Credentials {
    Credentials {
        access_key: pair.0.into(),
        secret_key: pair.1.into(),
    }
}

impl Access {
    /// A plain run's.
    pub fn plain() -> Self {
        Self::default()
    }

    /// A secure run's: makes a CA and one certificate per `(name, address)` of
    /// `hosts` in `run_dir/certs` (broker nodes `n0`.., the name server
    /// `namesrv`: see [`Access::node_cert`]). The workload's user may publish
    /// to and subscribe on `topics` and consume as `groups`. Error: `Host`
    /// when the script fails (openssl missing, say), with its output.
    pub fn secure(
        run_dir: &Path,
        hosts: &[(String, String)],
        topics: &[&str],
        groups: &[&str],
    ) -> Result<Self, JepsenError> {
        // Absolute: the nodes resolve relative paths against their config file's folder.
        let certs = std::fs::canonicalize(run_dir)?.join("certs");
        let script = run_dir.join("make-certs.sh");
        std::fs::write(&script, MAKE_CERTS)?;
        let mut make = std::process::Command::new("sh");
        make.arg(&script)
            .arg(&certs)
            .args(hosts.iter().map(|(n, a)| format!("{n}=IP:{a}")));
        // Valid from a day back: the clock faults set a node's clock up to
        // minutes back, and rustls checks certificates against it.
        if let Some(lib) = crate::node_env::libfaketime() {
            make.env("LD_PRELOAD", lib).env("FAKETIME", "-1d");
        }
        let out = make.output()?;
        if !out.status.success() {
            return Err(JepsenError::Host(format!(
                "make-certs.sh (openssl) for the secure run: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let ca_pem = std::fs::read(certs.join("ca.pem"))?;
        Ok(Self {
            secure: Some(Arc::new(Secure {
                certs,
                ca_pem,
                topics: topics.iter().map(|t| t.to_string()).collect(),
                groups: groups.iter().map(|g| g.to_string()).collect(),
            })),
        })
    }

    /// Whether this is a secure run.
    pub fn is_secure(&self) -> bool {
        self.secure.is_some()
    }

    /// The name of broker node `i`'s certificate.
    pub fn node_cert(i: usize) -> String {
        format!("n{i}")
    }

    /// Turns on, in a broker node's configuration, what a secure run turns
    /// on (see the module docs); leaves a plain run's as it is.
    pub fn configure_broker(&self, toml: &mut BrokerToml, node: usize) {
        let Some(s) = &self.secure else { return };
        let name = Self::node_cert(node);
        toml.tls = Some(ledgermq_tls::TlsFiles {
            cert_file: Some(s.certs.join(format!("{name}.pem"))),
            key_file: Some(s.certs.join(format!("{name}-key.pem"))),
            ca_file: Some(s.certs.join("ca.pem")),
        });
        toml.namesrv_tls = Some(true);
        let user = |name: &str, secret: &str, admin: bool, permissions| UserToml {
            username: name.into(),
            secret_key: secret.into(),
            admin,
            permissions,
        };
        let permissions = s
            .topics
            .iter()
            .map(|t| (format!("Topic:{t}"), "PUB|SUB".to_owned()))
            .chain(
                s.groups
                    .iter()
                    .map(|g| (format!("Group:{g}"), "SUB".to_owned())),
            )
            .collect();
        toml.auth = Some(AuthToml {
            enabled: true,
            inner_access_key: INNER.0.into(),
            inner_secret_key: INNER.1.into(),
            registration_access_key: Some(REGISTRAR.0.into()),
            registration_secret_key: Some(REGISTRAR.1.into()),
            users: vec![
                user(USER, USER_SECRET, false, permissions),
                user(ADMIN, ADMIN_SECRET, true, Default::default()),
            ],
        });
    }

    /// The tables a secure run adds to the name server's configuration (TLS
    /// only, with certificate `namesrv`; signed registrations only); empty for
    /// a plain run.
    pub fn namesrv_tables(&self) -> String {
        let Some(s) = &self.secure else {
            return String::new();
        };
        format!(
            "tls_mode = \"enforcing\"\n\n[auth]\nbroker_access_key = \"{}\"\nbroker_secret_key = \"{}\"\n\n\
             [tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            REGISTRAR.0,
            REGISTRAR.1,
            s.certs.join("namesrv.pem").display(),
            s.certs.join("namesrv-key.pem").display()
        )
    }

    /// The environment `mqadmin` reads its credentials and CAs from
    /// (`LEDGERMQ_ACCESS_KEY`, ...): admin calls sign as [`ADMIN`]; empty for a
    /// plain run.
    pub fn admin_env(&self) -> Vec<(&'static str, String)> {
        let Some(s) = &self.secure else {
            return Vec::new();
        };
        let ca = s.certs.join("ca.pem").display().to_string();
        vec![
            ("LEDGERMQ_ACCESS_KEY", ADMIN.into()),
            ("LEDGERMQ_SECRET_KEY", ADMIN_SECRET.into()),
            ("LEDGERMQ_TLS_CA", ca.clone()),
            ("LEDGERMQ_NAMESRV_TLS_CA", ca),
        ]
    }

    /// An endpoint for `addr` (`host:port`): `https` checked against the run's
    /// CA in a secure run. Error: `Host` for an address tonic refuses.
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, JepsenError> {
        let bad = |e: tonic::transport::Error| JepsenError::Host(format!("{addr}: {e}"));
        Ok(match &self.secure {
            None => Endpoint::from_shared(format!("http://{addr}")).map_err(bad)?,
            Some(s) => Endpoint::from_shared(format!("https://{addr}"))
                .map_err(bad)?
                .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&s.ca_pem)))
                .map_err(bad)?,
        })
    }

    /// The workload's client on `channel`, signing as [`USER`].
    pub fn messaging(&self, channel: Channel) -> Messaging {
        let signer = Signer(self.secure.as_ref().map(|_| creds((USER, USER_SECRET))));
        MessagingServiceClient::with_interceptor(channel, signer)
    }

    /// An admin client connected to `addr`, signing as [`ADMIN`], within
    /// `connect_timeout` if given. Error: `Host` when it cannot connect.
    pub async fn admin(
        &self,
        addr: &str,
        connect_timeout: Option<Duration>,
    ) -> Result<Admin, JepsenError> {
        let mut endpoint = self.endpoint(addr)?;
        if let Some(t) = connect_timeout {
            endpoint = endpoint.connect_timeout(t);
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| JepsenError::Host(format!("{addr}: {e}")))?;
        let signer = Signer(self.secure.as_ref().map(|_| creds((ADMIN, ADMIN_SECRET))));
        Ok(BrokerAdminClient::with_interceptor(channel, signer))
    }
}

/// Deadline of each call of [`Access::check_refusals`].
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`Access::check_refusals`] waits for a node to serve the user.
const PROBE_WAIT: Duration = Duration::from_secs(10);

impl Access {
    /// In a secure run, checks that node `addr` serves the run's rules: a
    /// call signed as [`USER`] on its first topic is answered OK (within
    /// [`PROBE_WAIT`]: the node may not have applied the users yet), a call
    /// in plain text fails, and an unsigned call over TLS and a signed call on
    /// a topic the user has no right on are answered UNAUTHORIZED (the
    /// reference proxy's answer to both). Returns what was checked, in words.
    /// Call from inside the clients' namespace. Error: `Host` naming the
    /// answer that was wrong.
    pub async fn check_refusals(&self, addr: &str) -> Result<String, JepsenError> {
        let Some(s) = &self.secure else {
            return Ok("a plain run: nothing to refuse".into());
        };
        let route = |topic: &str| {
            with_client_id(QueryRouteRequest {
                topic: Some(Resource {
                    resource_namespace: String::new(),
                    name: topic.into(),
                }),
                endpoints: None,
            })
        };
        let wrong = |what: &str, got: String| {
            Err(JepsenError::Host(format!(
                "secure run: {what} to {addr}: {got}"
            )))
        };
        let probe = |e: Endpoint| {
            e.connect_timeout(PROBE_TIMEOUT)
                .timeout(PROBE_TIMEOUT)
                .connect_lazy()
        };
        // A plain run's access: HTTP/2 in clear, and no signature.
        let plain = Access::plain();
        let allowed = s.topics.first().map_or("", String::as_str);
        let tls = probe(self.endpoint(addr)?);
        let signed = self.messaging(tls.clone());
        let unsigned = plain.messaging(tls);
        let deadline = std::time::Instant::now() + PROBE_WAIT;
        loop {
            let answer = match signed.clone().query_route(route(allowed)).await {
                Ok(r) => match r.into_inner().status.map_or(-1, |st| st.code) {
                    code if code == Code::Ok as i32 => break,
                    code => format!("code {code}"),
                },
                Err(st) => format!("gRPC error {st}"),
            };
            if std::time::Instant::now() > deadline {
                return wrong(
                    "a call on the user's topic",
                    format!("answered {answer}, not OK"),
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        if let Ok(r) = plain
            .messaging(probe(plain.endpoint(addr)?))
            .query_route(route(allowed))
            .await
        {
            return wrong(
                "a plain-text call",
                format!("answered {:?}", r.into_inner().status),
            );
        }
        for (mut c, topic, what) in [
            (unsigned, allowed, "an unsigned call"),
            (
                signed,
                "JepsenForbidden",
                "a call on a topic the user has no right on",
            ),
        ] {
            let code = match c.query_route(route(topic)).await {
                Ok(r) => r.into_inner().status.map_or(-1, |st| st.code),
                Err(st) => return wrong(what, format!("gRPC error {st}")),
            };
            if code != Code::Unauthorized as i32 {
                return wrong(what, format!("answered code {code}, not UNAUTHORIZED"));
            }
        }
        Ok(format!(
            "{addr} served {USER}'s topic, and refused plain text, an unsigned call and a topic {USER} has no right on (UNAUTHORIZED)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_run_changes_nothing_and_signs_nothing() {
        let a = Access::plain();
        let mut t = BrokerToml::member(
            "C",
            "g",
            0,
            &["h:1".into()],
            &["h:2".into()],
            Path::new("/s"),
        );
        let before = t.to_toml();
        a.configure_broker(&mut t, 0);
        assert_eq!(t.to_toml(), before);
        assert!(a.namesrv_tables().is_empty() && a.admin_env().is_empty());
        let mut s = Signer(None);
        let req = tonic::service::Interceptor::call(&mut s, tonic::Request::new(())).unwrap();
        assert!(req.metadata().get("authorization").is_none());
    }

    #[test]
    fn a_secure_run_names_its_files_users_and_permissions() {
        let a = Access {
            secure: Some(Arc::new(Secure {
                certs: PathBuf::from("/run/certs"),
                ca_pem: Vec::new(),
                topics: vec!["T".into()],
                groups: vec!["G".into()],
            })),
        };
        let raft = ["h:1".to_owned(), "h:2".to_owned()];
        let mut t = BrokerToml::member("C", "g", 1, &raft, &raft, Path::new("/s"));
        a.configure_broker(&mut t, 1);
        let v: toml::Value = toml::from_str(&t.to_toml()).unwrap();
        assert_eq!(v["tls"]["cert_file"].as_str(), Some("/run/certs/n1.pem"));
        assert_eq!(v["tls"]["ca_file"].as_str(), Some("/run/certs/ca.pem"));
        assert_eq!(v["namesrv_tls"].as_bool(), Some(true));
        let users = v["auth"]["users"].as_array().unwrap();
        assert_eq!(users[0]["username"].as_str(), Some(USER));
        assert_eq!(users[0]["admin"].as_bool(), Some(false));
        assert_eq!(users[0]["permissions"]["Topic:T"].as_str(), Some("PUB|SUB"));
        assert_eq!(users[0]["permissions"]["Group:G"].as_str(), Some("SUB"));
        assert_eq!(users[1]["admin"].as_bool(), Some(true));
        let ns: toml::Value = toml::from_str(&a.namesrv_tables()).unwrap();
        assert_eq!(
            ns["tls"]["cert_file"].as_str(),
            Some("/run/certs/namesrv.pem")
        );
        assert_eq!(ns["auth"]["broker_access_key"].as_str(), Some(REGISTRAR.0));
        let mut s = Signer(Some(creds((USER, USER_SECRET))));
        let req = tonic::service::Interceptor::call(&mut s, tonic::Request::new(())).unwrap();
        let auth = req
            .metadata()
            .get("authorization")
            .unwrap()
            .to_str()
            .unwrap();
        assert!(auth.contains("Credential=jepsen,"), "{auth}");
    }
}
