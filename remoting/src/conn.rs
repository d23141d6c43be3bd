//! One server-side remoting connection over tokio (feature `io`): frames are
//! read with [`crate::split_frame`]'s bound, each request is handled in its
//! own task (a long-polling pull never holds up a send on the same
//! connection), except oneway requests the caller marks as ordered (a 4.x
//! client's `sendOneway` with a queue selector relies on the broker taking
//! them in the order they arrived), which one task per connection handles one
//! after another; at most [`MAX_IN_FLIGHT`] requests (and
//! [`MAX_ORDERED_QUEUED`] ordered ones) are in hand at once, their answers
//! queued included (reading pauses beyond that), and answers
//! and server-initiated requests are written by one writer task in the order
//! they are ready. A frame that does not decode
//! closes the connection: its opaque cannot be trusted, and the stream cannot
//! be resynchronised.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Semaphore};

use crate::command::{RemotingCommand, FLAG_ONEWAY};
use crate::frame::split_frame;

/// Most requests of one connection handled at once.
pub const MAX_IN_FLIGHT: usize = 1024;
/// Most ordered oneway requests of one connection queued at once, apart from
/// [`MAX_IN_FLIGHT`]: a client flooding oneway sends pauses its own reading at
/// this depth without taking every slot of its other requests.
pub const MAX_ORDERED_QUEUED: usize = 256;
/// Most encoded frames queued for writing on one connection.
const WRITE_QUEUE: usize = 1024;

static NEXT_CONN_ID: AtomicU64 = AtomicU64::new(1);

/// A connection as its handler sees it: who is at the other end, and a way to
/// send it requests of the server's own (oneway notifications such as
/// NOTIFY_CONSUMER_IDS_CHANGED). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Conn {
    /// Unique in this process.
    pub id: u64,
    /// The client's address.
    pub peer: SocketAddr,
    out: mpsc::Sender<Vec<u8>>,
    next_opaque: Arc<AtomicI32>,
}

impl Conn {
    /// Sends `cmd` to the client as a oneway request with a fresh opaque.
    /// False if the connection is closed or its write queue is full (a
    /// notification is then dropped; the client polls anyway).
    pub fn send_oneway(&self, mut cmd: RemotingCommand) -> bool {
        cmd.flag |= FLAG_ONEWAY;
        cmd.opaque = self.next_opaque.fetch_add(1, Ordering::Relaxed);
        match cmd.encode() {
            Ok(bytes) => self.out.try_send(bytes).is_ok(),
            Err(e) => {
                tracing::warn!(error = %e, "server request not encodable");
                false
            }
        }
    }

    /// True once the connection is gone.
    pub fn is_closed(&self) -> bool {
        self.out.is_closed()
    }
}

/// Writes the encoded frames `rx` yields to `wr` until `rx` ends or a write
/// fails; whatever else is queued when one is taken goes out in the same
/// write (up to 256 KiB), so pipelined answers cost fewer system calls. Each
/// batch is flushed (a no-op on TCP; a TLS session's records go out then).
pub async fn write_frames<W: tokio::io::AsyncWrite + Unpin>(
    rx: &mut mpsc::Receiver<Vec<u8>>,
    wr: &mut W,
) {
    while let Some(mut batch) = rx.recv().await {
        while batch.len() < (256 << 10) {
            match rx.try_recv() {
                Ok(more) => batch.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        if wr.write_all(&batch).await.is_err() || wr.flush().await.is_err() {
            return;
        }
    }
}

/// Serves one connection until the client closes it, a frame fails to decode
/// or a write fails. `handle` answers a request with its response, or `None`
/// for a oneway request (a response to a oneway request is not written).
/// Oneway requests for which `in_order` is true are handled one at a time in
/// arrival order. `on_close` runs once, after the connection is gone.
pub async fn serve_connection<H, F>(
    stream: TcpStream,
    max_frame_bytes: usize,
    handle: H,
    in_order: fn(&RemotingCommand) -> bool,
    on_close: impl FnOnce(&Conn),
) where
    H: Fn(RemotingCommand, Conn) -> F + Send + Sync + 'static,
    F: Future<Output = Option<RemotingCommand>> + Send + 'static,
{
    let peer = stream
        .peer_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    serve_halves(rd, wr, peer, max_frame_bytes, handle, in_order, on_close).await;
}

/// [`serve_connection`] over any byte stream (a TLS session), from `peer`.
pub async fn serve_stream<S, H, F>(
    stream: S,
    peer: SocketAddr,
    max_frame_bytes: usize,
    handle: H,
    in_order: fn(&RemotingCommand) -> bool,
    on_close: impl FnOnce(&Conn),
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
    H: Fn(RemotingCommand, Conn) -> F + Send + Sync + 'static,
    F: Future<Output = Option<RemotingCommand>> + Send + 'static,
{
    let (rd, wr) = tokio::io::split(stream);
    serve_halves(rd, wr, peer, max_frame_bytes, handle, in_order, on_close).await;
}

async fn serve_halves<R, W, H, F>(
    mut rd: R,
    mut wr: W,
    peer: SocketAddr,
    max_frame_bytes: usize,
    handle: H,
    in_order: fn(&RemotingCommand) -> bool,
    on_close: impl FnOnce(&Conn),
) where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Fn(RemotingCommand, Conn) -> F + Send + Sync + 'static,
    F: Future<Output = Option<RemotingCommand>> + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(WRITE_QUEUE);
    let conn = Conn {
        id: NEXT_CONN_ID.fetch_add(1, Ordering::Relaxed),
        peer,
        out: tx,
        next_opaque: Arc::new(AtomicI32::new(1)),
    };
    let writer = tokio::spawn(async move { write_frames(&mut rx, &mut wr).await });
    let handle = Arc::new(handle);
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let ordered_slots = Arc::new(Semaphore::new(MAX_ORDERED_QUEUED));
    // Ordered oneway requests, with their slots, to one task.
    let (ordered_tx, mut ordered_rx) =
        mpsc::unbounded_channel::<(RemotingCommand, tokio::sync::OwnedSemaphorePermit)>();
    let ordered = {
        let (h, c) = (handle.clone(), conn.clone());
        tokio::spawn(async move {
            while let Some((cmd, permit)) = ordered_rx.recv().await {
                let _ = h(cmd, c.clone()).await;
                drop(permit);
            }
        })
    };
    let mut buf: Vec<u8> = Vec::with_capacity(64 << 10);
    let mut chunk = vec![0u8; 64 << 10];
    'read: loop {
        // Take every whole frame buffered.
        let mut used = 0;
        loop {
            match split_frame(&buf[used..], max_frame_bytes) {
                Ok(Some((frame, n))) => {
                    let cmd = match RemotingCommand::decode(frame) {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::debug!(%peer, error = %e, "bad remoting frame; closing");
                            break 'read;
                        }
                    };
                    used += n;
                    if cmd.is_response() {
                        // Answers to our oneway requests do not exist; ignore
                        // anything else a client answers.
                        continue;
                    }
                    if cmd.is_oneway() && in_order(&cmd) {
                        // At most MAX_ORDERED_QUEUED queued.
                        let Ok(permit) = ordered_slots.clone().acquire_owned().await else {
                            break 'read;
                        };
                        let _ = ordered_tx.send((cmd, permit));
                        continue;
                    }
                    let Ok(permit) = slots.clone().acquire_owned().await else {
                        break 'read;
                    };
                    let (h, c) = (handle.clone(), conn.clone());
                    tokio::spawn(async move {
                        let oneway = cmd.is_oneway();
                        let answer = h(cmd, c.clone()).await;
                        if let (false, Some(resp)) = (oneway, answer) {
                            match resp.encode() {
                                Ok(bytes) => {
                                    let _ = c.out.send(bytes).await;
                                }
                                Err(e) => tracing::warn!(error = %e, "response not encodable"),
                            }
                        }
                        // Only once the answer is queued: a client that stops
                        // reading stops being read.
                        drop(permit);
                    });
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "bad remoting frame length; closing");
                    break 'read;
                }
            }
        }
        buf.drain(..used);
        match rd.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    on_close(&conn);
    drop(ordered_tx);
    let _ = ordered.await;
    // The writer ends by itself once every handler task and registry has
    // dropped its clone of the connection (answers in flight still go out).
    drop(writer);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    fn oneway(code: i32, n: usize) -> Vec<u8> {
        let mut c = RemotingCommand::request(code, [("n", n.to_string())]);
        c.flag = FLAG_ONEWAY;
        c.encode().unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ordered_oneway_requests_are_handled_in_arrival_order() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<(i32, usize)>>> = Arc::default();
        let s = seen.clone();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            serve_connection(
                stream,
                1 << 20,
                move |req, _conn| {
                    let s = s.clone();
                    async move {
                        let n: usize = req.ext_fields["n"].parse().unwrap();
                        // Later requests finish sooner if run at once.
                        tokio::time::sleep(Duration::from_millis(20 - n as u64 % 20)).await;
                        s.lock().unwrap().push((req.code, n));
                        None
                    }
                },
                |req| req.code == 10,
                |_| {},
            )
            .await;
        });
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut bytes = Vec::new();
        for n in 0..40 {
            bytes.extend(oneway(10, n));
            bytes.extend(oneway(11, n));
        }
        client.write_all(&bytes).await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while seen.lock().unwrap().len() < 80 {
            assert!(std::time::Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let seen = seen.lock().unwrap();
        let ordered: Vec<usize> = seen.iter().filter(|x| x.0 == 10).map(|x| x.1).collect();
        assert_eq!(ordered, (0..40).collect::<Vec<_>>());
        let others: Vec<usize> = seen.iter().filter(|x| x.0 == 11).map(|x| x.1).collect();
        assert_ne!(others, (0..40).collect::<Vec<_>>(), "the rest run at once");
    }
}
