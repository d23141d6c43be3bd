//! A blocking 4.x remoting client for tests: one request, its answer; and a
//! connection that also reads what the server asks ([`Client`]: transaction
//! check backs).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use ledgermq_remoting::command::FLAG_ONEWAY;
use ledgermq_remoting::{split_frame, RemotingCommand};

/// Reads the next answer on `s`, skipping the server's own requests (a
/// NOTIFY_CONSUMER_IDS_CHANGED); `None` when the peer closed the connection
/// or nothing came within its read timeout.
pub fn read_answer(s: &mut TcpStream) -> Option<RemotingCommand> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        if let Ok(Some((frame, used))) = split_frame(&buf, 64 << 20) {
            let cmd = RemotingCommand::decode(frame).ok()?;
            if cmd.is_response() {
                return Some(cmd);
            }
            buf.drain(..used);
            continue;
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The bodies a PULL_MESSAGE of `topic`'s queue `queue_id` from offset 0 (at
/// most 32) answers on `addr`, for consumer group `group`; none when it
/// answers anything but SUCCESS.
pub fn pull_bodies(addr: &str, group: &str, topic: &str, queue_id: u32) -> Vec<Vec<u8>> {
    let q = queue_id.to_string();
    let r = call(
        addr,
        &RemotingCommand::request(
            11,
            [
                ("consumerGroup", group),
                ("topic", topic),
                ("queueId", &q),
                ("queueOffset", "0"),
                ("maxMsgNums", "32"),
            ],
        ),
    );
    if r.code != 0 {
        return Vec::new();
    }
    ledgermq_remoting::message::decode_messages(&r.body)
        .expect("a pull answer in RocketMQ's stored layout")
        .into_iter()
        .map(|m| m.body.to_vec())
        .collect()
}

/// A SEND_MESSAGE_V2 (310) of `body` to queue `queue_id` of `topic`, from
/// producer group `PG`, with `properties` in RocketMQ's encoding
/// (`KEY\u{1}value\u{2}`...; empty for none).
pub fn send_request(topic: &str, queue_id: u32, properties: &str, body: &[u8]) -> RemotingCommand {
    let q = queue_id.to_string();
    let mut r = RemotingCommand::request(
        310,
        [
            ("a", "PG"),
            ("b", topic),
            ("c", "TBW102"),
            ("d", "4"),
            ("e", &q),
            ("f", "0"),
            ("g", "1700000000000"),
            ("h", "0"),
            ("i", properties),
        ],
    );
    r.body = body.to_vec();
    r
}

/// Connects to `addr` (a 10 s read timeout), sends `cmd`, returns its answer.
/// Panics when none comes.
pub fn call(addr: &str, cmd: &RemotingCommand) -> RemotingCommand {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&cmd.encode().unwrap()).unwrap();
    read_answer(&mut s).expect("an answer")
}

/// A client connection that keeps the server's own requests it reads.
pub struct Client {
    s: TcpStream,
    buf: Vec<u8>,
    /// The server's own requests read so far and not yet taken.
    pub server_requests: Vec<RemotingCommand>,
    opaque: i32,
}

impl Client {
    /// Connects to `addr` (`host:port`), reading with a 200 ms timeout.
    pub fn connect(addr: &str) -> Self {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        Self {
            s,
            buf: Vec::new(),
            server_requests: Vec::new(),
            opaque: 0,
        }
    }

    /// Reads one frame, if one comes within the read timeout.
    pub fn read_frame(&mut self) -> Option<RemotingCommand> {
        loop {
            if let Ok(Some((frame, used))) = split_frame(&self.buf, 64 << 20) {
                let cmd = RemotingCommand::decode(frame).unwrap();
                self.buf.drain(..used);
                return Some(cmd);
            }
            let mut chunk = [0u8; 65536];
            match self.s.read(&mut chunk) {
                Ok(0) => panic!("the server closed the connection"),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(_) => return None,
            }
        }
    }

    /// Sends `cmd` with the next opaque; returns it.
    pub fn send(&mut self, mut cmd: RemotingCommand) -> i32 {
        self.opaque += 1;
        cmd.opaque = self.opaque;
        self.s.write_all(&cmd.encode().unwrap()).unwrap();
        self.opaque
    }

    /// Sends `cmd` and returns its answer (within 10 s), keeping the server's
    /// requests read meanwhile.
    pub fn call(&mut self, cmd: RemotingCommand) -> RemotingCommand {
        let opaque = self.send(cmd);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            match self.read_frame() {
                Some(c) if c.is_response() && c.opaque == opaque => return c,
                Some(c) if !c.is_response() => self.server_requests.push(c),
                _ => {}
            }
        }
        panic!("no answer to opaque {opaque}");
    }

    /// Sends `cmd` oneway.
    pub fn oneway(&mut self, mut cmd: RemotingCommand) {
        cmd.flag |= FLAG_ONEWAY;
        self.send(cmd);
    }

    /// The next server request with `code` and `transactionId`, within
    /// `limit`. Panics when none comes.
    pub fn wait_request(&mut self, code: i32, txid: &str, limit: Duration) -> RemotingCommand {
        self.next_request(code, txid, limit)
            .unwrap_or_else(|| panic!("no request {code} for {txid}"))
    }

    /// The next server request with `code` and `transactionId` within
    /// `limit`, or None.
    pub fn next_request(
        &mut self,
        code: i32,
        txid: &str,
        limit: Duration,
    ) -> Option<RemotingCommand> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(i) = self.server_requests.iter().position(|c| {
                c.code == code
                    && c.ext_fields.get("transactionId").map(String::as_str) == Some(txid)
            }) {
                return Some(self.server_requests.remove(i));
            }
            if Instant::now() >= deadline {
                return None;
            }
            if let Some(c) = self.read_frame() {
                if !c.is_response() {
                    self.server_requests.push(c);
                }
            }
        }
    }
}

/// Sends `cmd` on `stream` (a TLS session, say) and returns its answer
/// within `limit`, skipping the server's own requests; None when the stream
/// closes or fails first, or nothing comes in time.
pub async fn call_async<S>(
    stream: &mut S,
    cmd: &RemotingCommand,
    limit: Duration,
) -> Option<RemotingCommand>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        stream.write_all(&cmd.encode().ok()?).await.ok()?;
        let mut buf = Vec::new();
        loop {
            while let Ok(Some((frame, used))) = split_frame(&buf, 64 << 20) {
                let answer = RemotingCommand::decode(frame).ok()?;
                buf.drain(..used);
                if answer.is_response() && answer.opaque == cmd.opaque {
                    return Some(answer);
                }
            }
            let mut chunk = [0u8; 65536];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(limit, exchange).await.ok().flatten()
}
