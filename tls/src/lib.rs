//! TLS for LedgerMQ's own ports, with rustls (ring), the TLS stack tonic uses
//! for the client port.
//!
//! The Raft peer port and the name server's port run their own accept loops:
//! each tells its protocols apart by a connection's first byte (framed
//! AppendEntries or HTTP/2 on the peer port; HTTP/2 or RocketMQ remoting on the
//! name server's). With TLS that byte is the first byte *inside* the TLS
//! session, so [`accept`] completes the handshake, reads that byte, and hands
//! back a [`Stream`] that gives it to its reader again. Both ends of these ports
//! are ours, so they also make the client side ([`connect`], and
//! [`TlsMaterial::tonic_client`] for tonic channels).
//!
//! **Mutual TLS** ([`TlsMaterial::acceptor`] with `mutual`): the server asks for
//! the client's certificate and accepts only one that chains to the configured
//! CA (rustls' `WebPkiClientVerifier`); a client without one fails the
//! handshake. Members of a group present their node certificate, so the CA the
//! peer port trusts decides who is a member: it should sign the group's (or the
//! cluster's) node certificates and nothing else. A certificate is not tied to
//! a node id: any member's certificate passes for any member.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

pub use files::TlsFiles;
pub use tokio_rustls::{TlsAcceptor, TlsConnector};

mod files;

/// What can go wrong setting TLS up (handshakes fail as `io::Error`s).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM input holds nothing usable of the kind asked for.
    #[error("{what}: {reason}")]
    Pem {
        /// Which input: "certificate chain", "private key" or "CA certificates".
        what: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// rustls refused the configuration (e.g. a key that does not match the
    /// certificate).
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The CA certificates make no client verifier.
    #[error("CA certificates: {0}")]
    Verifier(String),
    /// An address whose host part is not a DNS name or an IP address.
    #[error("{0:?} is not a host name or IP address TLS can check")]
    ServerName(String),
}

/// A node's TLS material, PEM: its certificate chain, its private key, and the
/// CA certificates it checks the other end against.
#[derive(Clone)]
pub struct TlsMaterial {
    /// Certificate chain, PEM, leaf first; its SANs name the addresses others
    /// dial (an IP SAN for an IP address).
    pub cert_pem: Vec<u8>,
    /// Private key, PEM (PKCS#8, SEC1 or PKCS#1); `Debug` leaves it out.
    pub key_pem: Vec<u8>,
    /// CA certificates, PEM.
    pub ca_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("cert_pem_bytes", &self.cert_pem.len())
            .field("key_pem", &"<redacted>")
            .field("ca_pem_bytes", &self.ca_pem.len())
            .finish()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(pem: &[u8], what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what,
            reason: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

impl TlsMaterial {
    fn chain(&self) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        certs(&self.cert_pem, "certificate chain")
    }

    fn key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(&self.key_pem).map_err(|e| TlsError::Pem {
            what: "private key",
            reason: e.to_string(),
        })
    }

    fn roots(&self) -> Result<Arc<rustls::RootCertStore>, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(&self.ca_pem, "CA certificates")? {
            roots.add(c).map_err(|e| TlsError::Pem {
                what: "CA certificates",
                reason: e.to_string(),
            })?;
        }
        Ok(Arc::new(roots))
    }

    /// The server side: this node's certificate and key; with `mutual`, a client
    /// must present a certificate chaining to the CA. ALPN offers `h2` (tonic's
    /// client asks for it); a client that offers none (the framed peer
    /// transport, remoting) is served too. Error: a PEM input or a key rustls
    /// refuses.
    pub fn acceptor(&self, mutual: bool) -> Result<TlsAcceptor, TlsError> {
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?;
        let builder = if mutual {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                self.roots()?,
                provider(),
            )
            .build()
            .map_err(|e| TlsError::Verifier(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder.with_single_cert(self.chain()?, self.key()?)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }

    /// The client side: servers are checked against the CA (and the name
    /// dialled); with `identity`, this node's certificate is presented when the
    /// server asks (mutual TLS). Error: a PEM input or a key rustls refuses.
    pub fn connector(&self, identity: bool) -> Result<TlsConnector, TlsError> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(self.roots()?);
        let config = if identity {
            builder.with_client_auth_cert(self.chain()?, self.key()?)?
        } else {
            builder.with_no_client_auth()
        };
        Ok(TlsConnector::from(Arc::new(config)))
    }

    /// The same client side for a tonic channel (whose URI must then be
    /// `https://`): the CA, and with `identity` this node's certificate.
    pub fn tonic_client(&self, identity: bool) -> tonic::transport::ClientTlsConfig {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca_pem));
        if identity {
            tls.identity(tonic::transport::Identity::from_pem(
                &self.cert_pem,
                &self.key_pem,
            ))
        } else {
            tls
        }
    }

    /// Checks that every input parses (the CA only when given: a server
    /// that checks no client has none) and rustls takes the pair, so a bad
    /// file stops a start rather than every later connection.
    pub fn check(&self) -> Result<(), TlsError> {
        if self.ca_pem.is_empty() {
            self.acceptor(false)?;
        } else {
            self.acceptor(true)?;
            self.connector(true)?;
        }
        Ok(())
    }
}

/// The TLS name of `addr` (`host:port`, `[v6]:port` or a bare host): a DNS name
/// or an IP address, which the server's certificate must carry as a SAN.
pub fn server_name(addr: &str) -> Result<ServerName<'static>, TlsError> {
    let host = if addr.parse::<std::net::IpAddr>().is_ok() {
        // A bare address, IPv6 included (whose colons are not a port's).
        addr
    } else {
        match addr.rsplit_once(':') {
            Some((h, port))
                if port.bytes().all(|b| b.is_ascii_digit())
                    && !h.is_empty()
                    && (h.starts_with('[') || !h.contains(':')) =>
            {
                h
            }
            _ => addr,
        }
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned()).map_err(|_| TlsError::ServerName(addr.to_owned()))
}

/// A connection on one of our ports: plain TCP, or TLS over it holding back the
/// first byte [`accept`] read to choose the protocol.
#[derive(Debug)]
pub enum Stream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls {
        /// The session.
        inner: Box<tokio_rustls::TlsStream<TcpStream>>,
        /// A byte read ahead, returned by the next read.
        first: Option<u8>,
    },
}

impl Stream {
    /// The TCP connection under it.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls { inner, .. } => inner.get_ref().0,
        }
    }

    /// True when the connection is TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls { .. })
    }
}

/// Which connections a port with `[tls]` serves (a `tls_mode` key), as
/// RocketMQ's `tls.server.mode`: `enforcing` or `permissive`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// TLS connections only (the default).
    #[default]
    Enforcing,
    /// TLS connections, and plain ones for clients that cannot speak TLS
    /// (4.x clients).
    Permissive,
}

impl TlsMode {
    /// Whether plain connections are served too ([`accept`]'s `plain_too`).
    pub fn plain_too(self) -> bool {
        self == TlsMode::Permissive
    }
}

/// How long a server gives a new connection to finish its TLS handshake and
/// send its first byte ([`accept`]'s `wait` on the name server's port and the
/// broker's remoting port).
pub const FIRST_BYTE_WAIT: Duration = Duration::from_secs(10);

/// The first byte of a TLS connection (a handshake record).
pub const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// How a new server connection starts: with `acceptor`, its TLS handshake
/// (a client that does not speak TLS, or fails the CA check, is dropped here,
/// unless `plain_too`: then a connection whose first byte is not a TLS
/// handshake's is served in plain text, RocketMQ's permissive TLS mode); then
/// its first byte, peeked on plain TCP and read ahead inside TLS, all within
/// `wait`. None: the connection closed, stayed silent or failed its handshake
/// (logged at debug level).
pub async fn accept(
    stream: TcpStream,
    acceptor: Option<&TlsAcceptor>,
    plain_too: bool,
    wait: Duration,
) -> Option<(Stream, u8)> {
    let peer = stream.peer_addr().ok();
    let start = async move {
        let mut first = [0u8; 1];
        let acceptor = match acceptor {
            Some(a) if !plain_too => a,
            // Plain, or permissive: the first byte says whether TLS starts.
            maybe => {
                if stream.peek(&mut first).await? != 1 {
                    return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
                }
                match maybe {
                    Some(a) if first[0] == TLS_HANDSHAKE_RECORD => a,
                    _ => return Ok((Stream::Plain(stream), first[0])),
                }
            }
        };
        let mut tls = acceptor.accept(stream).await?;
        tls.read_exact(&mut first).await?;
        let inner = Box::new(tokio_rustls::TlsStream::Server(tls));
        Ok((
            Stream::Tls {
                inner,
                first: Some(first[0]),
            },
            first[0],
        ))
    };
    match tokio::time::timeout(wait, start).await {
        Ok(Ok(started)) => Some(started),
        Ok(Err(e)) => {
            tracing::debug!(?peer, error = %e, "connection dropped before its first byte");
            None
        }
        Err(_) => None,
    }
}

/// Connects to `addr` (`host:port`) with TCP_NODELAY; with `connector`, over
/// TLS, the server checked against the CA under [`server_name`] of `addr`.
pub async fn connect(addr: &str, connector: Option<&TlsConnector>) -> io::Result<Stream> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let Some(connector) = connector else {
        return Ok(Stream::Plain(tcp));
    };
    let name = server_name(addr)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let tls = connector.connect(name, tcp).await?;
    Ok(Stream::Tls {
        inner: Box::new(tokio_rustls::TlsStream::Client(tls)),
        first: None,
    })
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls { inner, first } => {
                if buf.remaining() > 0 {
                    if let Some(b) = first.take() {
                        buf.put_slice(&[b]);
                        return Poll::Ready(Ok(()));
                    }
                }
                Pin::new(inner.as_mut()).poll_read(cx, buf)
            }
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls { inner, .. } => Pin::new(inner.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls { inner, .. } => Pin::new(inner.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls { inner, .. } => inner.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls { inner, .. } => Pin::new(inner.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls { inner, .. } => Pin::new(inner.as_mut()).poll_shutdown(cx),
        }
    }
}

impl tonic::transport::server::Connected for Stream {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.tcp().connect_info()
    }
}

#[cfg(test)]
mod tests;
