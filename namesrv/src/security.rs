//! Who may change a name server's registry, and the TLS its port speaks.
//!
//! **Authenticated registration** (`[auth]` of the name server's
//! configuration): broker nodes sign `RegisterBroker` and `UnregisterBroker`
//! with the 5.x clients' signature scheme ([`ledgermq_proto::signature`]),
//! made with the cluster's registration credentials (each node's `[auth]
//! registration_access_key` / `registration_secret_key`, which grant nothing
//! on the brokers) over the date and a digest of the whole request
//! ([`request_bound`]). A name server with `[auth]` refuses an unsigned or
//! wrongly signed registration with `UNAUTHENTICATED`: without the secret
//! nobody can put an address into the routes clients follow, or take a node
//! out. A signed request seen on the wire (a port without TLS) can be sent
//! again unchanged until its date leaves `max_clock_skew_ms` (a node's state
//! of a moment ago; a node unregistered until its next heartbeat); which is
//! why 0 (no bound) is refused here.
//! Route and cluster queries stay open, as RocketMQ's name server serves them.
//!
//! ```toml
//! [auth]
//! broker_access_key = "ledgermq-inner"
//! broker_secret_key = "..."
//! max_clock_skew_ms = 900000
//! ```
//!
//! **TLS** (`[tls]`, [`ledgermq_tls::TlsFiles`]: `cert_file` and `key_file`,
//! relative to the configuration file): the port then takes only TLS
//! connections, HTTP/2 (gRPC) or remoting inside them, told apart by their
//! first byte as on a plain port.

use ledgermq_proto::signature::{check_signed_by, headers_of, Credentials, SignatureError};
use serde::Deserialize;

/// What a registration's signature covers after its date: a newline and the
/// hex SHA-256 of the request as protobuf encodes it (prost's encoding is
/// deterministic: fields in number order, defaults left out, no maps in this
/// protocol). The name server re-encodes what it decoded, so a name server
/// must know every field its nodes send: upgrade name servers first (a field
/// it does not know is dropped, and the signature then fails).
pub fn request_bound<M: prost::Message>(request: &M) -> String {
    use sha2::Digest as _;
    format!(
        "\n{}",
        hex::encode(sha2::Sha256::digest(request.encode_to_vec()))
    )
}

/// The `[auth]` table of a name server.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistrationAuth {
    /// The access key broker nodes sign registrations with; registration is
    /// open (anyone may register) when unset.
    pub broker_access_key: Option<String>,
    /// Its secret key.
    pub broker_secret_key: Option<String>,
    /// The largest difference accepted between a registration's
    /// `x-mq-date-time` and this name server's clock, ms; 0 does not check it.
    pub max_clock_skew_ms: u64,
}

impl Default for RegistrationAuth {
    fn default() -> Self {
        Self {
            broker_access_key: None,
            broker_secret_key: None,
            max_clock_skew_ms: 900_000,
        }
    }
}

impl std::fmt::Debug for RegistrationAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistrationAuth")
            .field("broker_access_key", &self.broker_access_key)
            .field(
                "broker_secret_key",
                &self.broker_secret_key.as_ref().map(|_| "<redacted>"),
            )
            .field("max_clock_skew_ms", &self.max_clock_skew_ms)
            .finish()
    }
}

impl RegistrationAuth {
    /// The credentials registrations must be signed with, None when
    /// registration is open. Error: one key given without the other, an
    /// empty one, or no bound on the date's age (`max_clock_skew_ms = 0`).
    pub fn credentials(&self) -> Result<Option<Credentials>, String> {
        match (&self.broker_access_key, &self.broker_secret_key) {
            (None, None) => Ok(None),
            (Some(_), Some(_)) if self.max_clock_skew_ms == 0 => Err(
                "auth.max_clock_skew_ms must be above 0: a signed registration could \
                 otherwise be replayed forever"
                    .into(),
            ),
            (Some(a), Some(s)) if !a.is_empty() && !s.is_empty() => Ok(Some(Credentials {
                access_key: a.clone(),
                secret_key: s.clone(),
            })),
            _ => Err(
                "auth.broker_access_key and auth.broker_secret_key go together, neither empty"
                    .into(),
            ),
        }
    }
}

/// The registration check a name server runs: the credentials and the skew
/// bound, or nothing when registration is open.
#[derive(Debug, Clone, Default)]
pub struct RegistrationCheck {
    creds: Option<Credentials>,
    max_clock_skew_ms: u64,
}

impl RegistrationCheck {
    /// From the `[auth]` table. Error: as [`RegistrationAuth::credentials`].
    pub fn new(auth: &RegistrationAuth) -> Result<Self, String> {
        Ok(Self {
            creds: auth.credentials()?,
            max_clock_skew_ms: auth.max_clock_skew_ms,
        })
    }

    /// Checks a registration request's signature headers at `now_ms` (this
    /// name server's wall clock), made over the date and the request's
    /// [`request_bound`] (computed only when registration is not open). No
    /// I/O. Error: `UNAUTHENTICATED` saying why.
    pub fn check<M: prost::Message>(
        &self,
        req: &tonic::Request<M>,
        now_ms: u64,
    ) -> Result<(), tonic::Status> {
        let Some(creds) = &self.creds else {
            return Ok(());
        };
        let now_ms = i64::try_from(now_ms).unwrap_or(i64::MAX);
        check_signed_by(
            creds,
            headers_of(req.metadata()),
            now_ms,
            self.max_clock_skew_ms,
            &request_bound(req.get_ref()),
        )
        .map_err(|e: SignatureError| {
            tonic::Status::unauthenticated(format!("broker registration refused: {e}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::{BrokerNode, RegisterBrokerRequest};
    use ledgermq_proto::signature::sign_request_bound;

    fn check() -> RegistrationCheck {
        RegistrationCheck::new(&RegistrationAuth {
            broker_access_key: Some("ledgermq-inner".into()),
            broker_secret_key: Some("inner-secret".into()),
            ..RegistrationAuth::default()
        })
        .unwrap()
    }

    fn node(client_addr: &str) -> BrokerNode {
        BrokerNode {
            cluster: "c".into(),
            broker_group: "g".into(),
            client_addr: client_addr.into(),
            ..BrokerNode::default()
        }
    }

    fn register(node: BrokerNode) -> tonic::Request<RegisterBrokerRequest> {
        tonic::Request::new(RegisterBrokerRequest { node: Some(node) })
    }

    /// A RegisterBroker of [`node`] signed by `access_key` / `secret_key`.
    fn signed(access_key: &str, secret_key: &str) -> tonic::Request<RegisterBrokerRequest> {
        let mut r = register(node("127.0.0.1:1"));
        let bound = request_bound(r.get_ref());
        sign_request_bound(
            &mut r,
            &Credentials {
                access_key: access_key.into(),
                secret_key: secret_key.into(),
            },
            &bound,
        );
        r
    }

    #[test]
    fn only_the_brokers_credentials_register_when_auth_is_on() {
        let now = crate::now_ms();
        assert!(check()
            .check(&signed("ledgermq-inner", "inner-secret"), now)
            .is_ok());
        // The same headers for another node's addresses.
        let mut moved = signed("ledgermq-inner", "inner-secret");
        moved.get_mut().node = Some(node("10.0.0.66:1"));
        let e = check().check(&moved, now).unwrap_err();
        assert!(e.message().contains("check signature failed"), "{e:?}");
        for (req, why) in [
            (signed("ledgermq-inner", "guess"), "check signature failed"),
            (signed("admin", "inner-secret"), "not found"),
            (register(node("127.0.0.1:1")), "authentication is required"),
        ] {
            let e = check().check(&req, now).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated);
            assert!(e.message().contains(why), "{e:?}");
        }
        // A signature from an hour ago.
        let e = check()
            .check(&signed("ledgermq-inner", "inner-secret"), now + 3_600_000)
            .unwrap_err();
        assert!(e.message().contains("ms from this node's clock"), "{e:?}");
        // Open registration reads nothing.
        let open = RegistrationCheck::default();
        assert!(open.check(&register(node("127.0.0.1:1")), now).is_ok());
    }

    #[test]
    fn the_bound_covers_every_field_of_the_request() {
        let node = node("127.0.0.1:1");
        let bound = |n: &BrokerNode| request_bound(register(n.clone()).get_ref());
        let b = bound(&node);
        assert_eq!(b, bound(&node.clone()));
        for changed in [
            BrokerNode {
                term: 9,
                ..node.clone()
            },
            BrokerNode {
                role: 1,
                ..node.clone()
            },
            BrokerNode {
                cut_off: true,
                ..node.clone()
            },
            BrokerNode {
                topics: vec![Default::default()],
                ..node.clone()
            },
        ] {
            assert_ne!(bound(&changed), b);
        }
    }

    #[test]
    fn the_keys_go_together_and_the_secret_is_never_shown() {
        let half = RegistrationAuth {
            broker_access_key: Some("k".into()),
            ..RegistrationAuth::default()
        };
        assert!(half.credentials().is_err());
        let full = RegistrationAuth {
            broker_access_key: Some("k".into()),
            broker_secret_key: Some("very-secret".into()),
            ..RegistrationAuth::default()
        };
        assert!(!format!("{full:?}").contains("very-secret"));
        let unbounded = RegistrationAuth {
            max_clock_skew_ms: 0,
            ..full
        };
        assert!(unbounded.credentials().is_err());
    }
}
