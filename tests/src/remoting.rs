//! A blocking 4.x remoting client for tests: one request, its answer.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

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
