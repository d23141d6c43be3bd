//! The framed peer transport for AppendEntries: length-prefixed postcard frames on
//! a plain TCP connection, on the same port as the peer gRPC service.
//!
//! Replication is the group's busiest peer traffic, and HTTP/2 (HEADERS, DATA and
//! trailers per call, flow control, h2's buffering) was 16 % of a follower's
//! CPU, 26 % with the TCP under it (`docs/benchmarks.md`). openraft sends one AppendEntries at a time per
//! replication stream, so one connection per stream with one request in flight
//! needs no stream ids and no flow control of its own.
//!
//! **TLS.** With [`crate::network::PeerTls`] both transports run inside mutual
//! TLS (`ledgermq_tls`): the server completes the handshake, refusing a client
//! without a member certificate, before it reads the first byte below.
//!
//! **Port sharing.** The peer port peeks at each connection's first byte: this
//! transport starts with [`MAGIC`] (`L`); any other byte (an HTTP/2 client's
//! preface starts with `P`) goes to tonic. Votes, snapshots, forwarded writes and
//! the rest stay on gRPC.
//!
//! **Wire format** (all integers little-endian):
//! - handshake: the client sends [`MAGIC`] and its node id (u64); the server
//!   answers [`MAGIC`]. A node of an earlier release serves only gRPC: its h2
//!   server answers with its SETTINGS frame, not the magic, and the client then
//!   uses gRPC for that peer for [`FALL_BACK_FOR`] ([`LinkError::Unsupported`]).
//!   A handshake closed with no answer sends that one call over gRPC
//!   ([`LinkError::Closed`]).
//! - request: length (u32, of what follows), kind (u8, [`KIND_APPEND_ENTRIES`]),
//!   the postcard encoding of openraft's `AppendEntriesRequest`;
//! - answer: length (u32, of what follows), status (u8: [`STATUS_OK`],
//!   [`STATUS_UNAVAILABLE`] or [`STATUS_BAD_REQUEST`]), the log command set this
//!   node decodes (u8, [`crate::format::LOG_COMMANDS`], as the gRPC answer's
//!   header carries it), then for OK the postcard encoding of
//!   `Result<AppendEntriesResponse, RaftError>`, else a UTF-8 reason.
//!
//! A request over [`MAX_REQUEST_BYTES`] (the gRPC service's decoding limit) or an
//! answer over [`MAX_ANSWER_BYTES`] closes the connection; buffers grow with the
//! bytes that arrive, not with the length announced.

use std::time::Duration;

use ledgermq_tls::Stream;
use openraft::error::RaftError;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::server::PeerService;
use crate::types::{NodeId, TypeConfig};

/// First bytes of a framed connection (its first byte is not HTTP/2's `P`).
pub const MAGIC: &[u8; 8] = b"LMQRAFT1";
/// Request kind: AppendEntries.
pub const KIND_APPEND_ENTRIES: u8 = 1;
/// Answer status: the payload is openraft's result.
pub const STATUS_OK: u8 = 0;
/// Answer status: not served now (Raft not started yet, or dropped by the network
/// filter); the caller treats the peer as unreachable, as gRPC's UNAVAILABLE.
pub const STATUS_UNAVAILABLE: u8 = 1;
/// Answer status: the request could not be decoded or is of an unknown kind.
pub const STATUS_BAD_REQUEST: u8 = 2;
/// Largest request frame a server reads, bytes (as the gRPC service's limit).
pub const MAX_REQUEST_BYTES: usize = 256 << 20;
/// Largest answer frame a client reads, bytes.
pub const MAX_ANSWER_BYTES: usize = 16 << 20;
/// How long a client uses gRPC for a peer whose port did not speak this
/// transport (a node of an earlier release) before it tries again.
pub const FALL_BACK_FOR: Duration = Duration::from_secs(60);
/// A server connection with no request for this long is closed (a leader sends
/// heartbeats every few hundred ms at most; a silent client is gone).
pub const IDLE_CLOSE: Duration = Duration::from_secs(30);
/// How long a new connection has to send its first byte, or its handshake.
pub const FIRST_BYTES_WAIT: Duration = Duration::from_secs(10);

/// The request frame for `rpc`: header and postcard payload in one buffer.
pub fn request_frame(rpc: &AppendEntriesRequest<TypeConfig>) -> Result<Vec<u8>, postcard::Error> {
    let mut frame = postcard::to_extend(rpc, vec![0, 0, 0, 0, KIND_APPEND_ENTRIES])?;
    let len = u32::try_from(frame.len() - 4).map_err(|_| postcard::Error::SerializeBufferFull)?;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    Ok(frame)
}

/// An answer frame with `status` and `payload`.
pub fn answer_frame(status: u8, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len() + 2).expect("answers are far below 4 GiB");
    let mut frame = Vec::with_capacity(6 + payload.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.push(status);
    frame.push(crate::format::LOG_COMMANDS);
    frame.extend_from_slice(payload);
    frame
}

/// Reads one frame's body (what follows its length), at most `max_bytes` long.
/// `Ok(None)` at a clean end of stream before a frame starts. Errors: I/O, a
/// frame over `max_bytes` or cut short (`InvalidData`, `UnexpectedEof`).
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max_bytes: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read(&mut len[..1]).await? {
        0 => return Ok(None),
        _ => r.read_exact(&mut len[1..]).await?,
    };
    let len = u32::from_le_bytes(len) as usize;
    if len > max_bytes {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is over the limit of {max_bytes}"),
        ));
    }
    // Grows with the bytes that arrive, so an announced length costs nothing.
    let mut body = Vec::with_capacity(len.min(64 << 10));
    (&mut *r).take(len as u64).read_to_end(&mut body).await?;
    if body.len() < len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Some(body))
}

/// An answer as the client reads it.
#[derive(Debug)]
pub struct Answer {
    /// [`STATUS_OK`], [`STATUS_UNAVAILABLE`] or [`STATUS_BAD_REQUEST`].
    pub status: u8,
    /// The log command set the peer decodes.
    pub log_commands: u8,
    /// openraft's result (OK) or a reason.
    pub payload: Vec<u8>,
}

/// Why an exchange over a [`Link`] failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The peer answered the handshake with other bytes: its port speaks only
    /// HTTP/2 (an earlier release; h2's server sends its SETTINGS first). The
    /// link uses gRPC for [`FALL_BACK_FOR`].
    #[error("the peer does not speak the framed transport")]
    Unsupported,
    /// The peer closed or reset a new connection before answering the handshake:
    /// a peer stopping, or an HTTP/2-only one that sent nothing. This call goes
    /// over gRPC; the next one tries frames again.
    #[error("the peer closed the connection before its handshake")]
    Closed,
    /// Connecting, writing or reading failed.
    #[error("framed peer connection: {0}")]
    Io(#[from] std::io::Error),
}

/// True for the errors of a connection the peer had already closed.
fn closed_by_peer(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
    )
}

/// The client end for one peer: one connection, opened when first needed and
/// dropped on any error (or when the caller gives up mid-exchange), so an answer
/// is never matched with the wrong request.
pub struct Link {
    addr: String,
    from: NodeId,
    conn: Option<Stream>,
    fall_back_until: Option<tokio::time::Instant>,
    tls: Option<ledgermq_tls::TlsConnector>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("addr", &self.addr)
            .field("from", &self.from)
            .field("connected", &self.conn.is_some())
            .field("fall_back_until", &self.fall_back_until)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Link {
    /// A link from node `from` to the peer port at `addr` (`host:port`), over
    /// TLS with `tls` (the member's client side of mutual TLS).
    pub fn new(addr: String, from: NodeId, tls: Option<ledgermq_tls::TlsConnector>) -> Self {
        Link {
            addr,
            from,
            conn: None,
            fall_back_until: None,
            tls,
        }
    }

    /// False while the peer is taken for one that speaks only gRPC.
    pub fn usable(&self) -> bool {
        self.fall_back_until
            .is_none_or(|t| tokio::time::Instant::now() >= t)
    }

    /// Sends `frame` and reads its answer, connecting first if needed. A kept
    /// connection the peer has closed meanwhile (its restart, or its idle close)
    /// is replaced and the frame sent once more: AppendEntries may be repeated.
    /// Cancel safe: a cancelled exchange leaves no connection behind.
    pub async fn exchange(&mut self, frame: &[u8]) -> Result<Answer, LinkError> {
        if let Some(conn) = self.conn.take() {
            match round_trip(conn, frame).await {
                Ok((conn, answer)) => {
                    self.conn = Some(conn);
                    return Ok(answer);
                }
                Err(e) if closed_by_peer(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let conn = match self.connect().await {
            Err(LinkError::Unsupported) => {
                self.fall_back_until = Some(tokio::time::Instant::now() + FALL_BACK_FOR);
                return Err(LinkError::Unsupported);
            }
            other => other?,
        };
        let (conn, answer) = round_trip(conn, frame).await?;
        self.conn = Some(conn);
        Ok(answer)
    }

    async fn connect(&self) -> Result<Stream, LinkError> {
        // The TCP connect within 500 ms; a TLS handshake (two more round
        // trips) gets 2 s more.
        let bound = Duration::from_millis(if self.tls.is_some() { 2500 } else { 500 });
        let mut conn =
            tokio::time::timeout(bound, ledgermq_tls::connect(&self.addr, self.tls.as_ref()))
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        let mut hello = Vec::with_capacity(16);
        hello.extend_from_slice(MAGIC);
        hello.extend_from_slice(&self.from.to_le_bytes());
        conn.write_all(&hello).await?;
        conn.flush().await?;
        let mut back = [0u8; 8];
        let mut got = 0;
        while got < back.len() {
            match conn.read(&mut back[got..]).await {
                Ok(0) => return Err(LinkError::Closed),
                Ok(n) => got += n,
                Err(e) if closed_by_peer(&e) => return Err(LinkError::Closed),
                Err(e) => return Err(e.into()),
            }
            if back[..got] != MAGIC[..got] {
                return Err(LinkError::Unsupported);
            }
        }
        Ok(conn)
    }
}

/// Writes `frame` on `conn` and reads one answer.
async fn round_trip(mut conn: Stream, frame: &[u8]) -> std::io::Result<(Stream, Answer)> {
    conn.write_all(frame).await?;
    conn.flush().await?;
    let body = read_frame(&mut conn, MAX_ANSWER_BYTES)
        .await?
        .ok_or(std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
    if body.len() < 2 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "answer frame shorter than its header",
        ));
    }
    let answer = Answer {
        status: body[0],
        log_commands: body[1],
        payload: body[2..].to_vec(),
    };
    Ok((conn, answer))
}

/// Serves one framed connection (its first byte already seen to be [`MAGIC`]'s)
/// until the client closes it, it idles for [`IDLE_CLOSE`], a frame is malformed,
/// or the task is aborted (node shutdown).
pub async fn serve(mut stream: Stream, service: PeerService) {
    let mut hello = [0u8; 16];
    match tokio::time::timeout(FIRST_BYTES_WAIT, stream.read_exact(&mut hello)).await {
        Ok(Ok(_)) if &hello[..8] == MAGIC => {}
        _ => return,
    }
    let from = NodeId::from_le_bytes(hello[8..].try_into().expect("8 bytes"));
    if stream.write_all(MAGIC).await.is_err() || stream.flush().await.is_err() {
        return;
    }
    loop {
        let body = match tokio::time::timeout(
            IDLE_CLOSE,
            read_frame(&mut stream, MAX_REQUEST_BYTES),
        )
        .await
        {
            Ok(Ok(Some(body))) => body,
            Ok(Ok(None)) => return,
            Ok(Err(e)) => {
                tracing::debug!(from, error = %e, "framed peer connection closed");
                return;
            }
            Err(_) => return,
        };
        let answer = answer(&service, from, &body).await;
        if stream.write_all(&answer).await.is_err() || stream.flush().await.is_err() {
            return;
        }
        if answer[4] == STATUS_OK {
            service
                .appends
                .framed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// The answer frame to one request `body` from node `from`.
async fn answer(service: &PeerService, from: NodeId, body: &[u8]) -> Vec<u8> {
    let Some(core) = service.core.get() else {
        return answer_frame(STATUS_UNAVAILABLE, b"starting: Raft is not running yet");
    };
    if service.filter.is_blocked(from, service.node_id) {
        return answer_frame(STATUS_UNAVAILABLE, b"dropped by the network filter");
    }
    service.contacts.heard_from(from);
    let rpc: AppendEntriesRequest<TypeConfig> = match body.split_first() {
        Some((&KIND_APPEND_ENTRIES, payload)) => match postcard::from_bytes(payload) {
            Ok(rpc) => rpc,
            Err(e) => return answer_frame(STATUS_BAD_REQUEST, format!("decode: {e}").as_bytes()),
        },
        _ => return answer_frame(STATUS_BAD_REQUEST, b"unknown request kind"),
    };
    let res: Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>> =
        service.append_entries_on(core, rpc).await;
    if let Err(RaftError::Fatal(e)) = &res {
        // Stopping (or stopped by a storage error): the leader backs off, as from
        // a node that is down, rather than resending at once.
        return answer_frame(STATUS_UNAVAILABLE, format!("Raft stopped: {e}").as_bytes());
    }
    match postcard::to_stdvec(&res) {
        Ok(payload) => answer_frame(STATUS_OK, &payload),
        Err(e) => answer_frame(STATUS_BAD_REQUEST, format!("encode: {e}").as_bytes()),
    }
}

/// Accepts peer connections on `listener` until `stop` turns true, with `tls`
/// completing each one's mutual TLS handshake first: those starting with
/// [`MAGIC`]'s first byte are served here, every other one goes to the gRPC
/// server through `grpc`. On `stop` it returns, which closes the listener and
/// every framed connection (they run on tasks it owns).
pub async fn accept_loop(
    listener: tokio::net::TcpListener,
    service: PeerService,
    grpc: tokio::sync::mpsc::Sender<std::io::Result<Stream>>,
    stop: tokio::sync::watch::Receiver<bool>,
    tls: Option<ledgermq_tls::TlsAcceptor>,
) {
    let mut framed = tokio::task::JoinSet::new();
    let stop = stopped(stop);
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            () = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "peer accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            // Reap finished connections so the set does not grow.
            Some(_) = framed.join_next(), if !framed.is_empty() => continue,
        };
        let _ = stream.set_nodelay(true);
        // The handshake and the first byte are awaited on the connection's own
        // task, so a silent client holds up nothing else.
        let (service, grpc, tls) = (service.clone(), grpc.clone(), tls.clone());
        framed.spawn(async move {
            match ledgermq_tls::accept(stream, tls.as_ref(), false, FIRST_BYTES_WAIT).await {
                Some((stream, first)) if first == MAGIC[0] => serve(stream, service).await,
                Some((stream, _)) => {
                    let _ = grpc.send(Ok(stream)).await;
                }
                None => {}
            }
        });
    }
}

/// Resolves once `stop` holds true, or its sender is gone.
pub async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
