//! Messages on the 4.x wire: the stored-message layout a pull answer's body
//! concatenates (RocketMQ's `MessageDecoder.decode`, `CommitLog.calMsgLength`;
//! facts in `../shared/docs/rocketmq-remoting.md` §4), the batch a producer
//! sends with SEND_BATCH_MESSAGE (`MessageDecoder.encodeMessage`), the
//! properties string, and the offset message id (`MessageDecoder.createMessageId`,
//! §5). All integers big-endian. No I/O.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::error::RemotingError;

/// MAGICCODE of a stored message with a one-byte topic length (`MESSAGE_MAGIC_CODE`).
pub const MAGIC_V1: i32 = 0xDAA3_20A7_u32 as i32;
/// MAGICCODE of a stored message with a two-byte topic length (`MESSAGE_MAGIC_CODE_V2`).
pub const MAGIC_V2: i32 = 0xDAA3_20AB_u32 as i32;
/// SYSFLAG bit: the born host is IPv6.
pub const SYSFLAG_BORNHOST_V6: i32 = 0x10;
/// SYSFLAG bit: the store host is IPv6.
pub const SYSFLAG_STOREHOST_V6: i32 = 0x20;
/// SYSFLAG bit: the body is compressed (`MessageSysFlag.COMPRESSED_FLAG`).
pub const SYSFLAG_COMPRESSED: i32 = 0x1;
/// SYSFLAG bits of a transaction's state (`TRANSACTION_PREPARED_TYPE` 0x4,
/// `COMMIT` 0x8, `ROLLBACK` 0xC).
pub const SYSFLAG_TRANSACTION_MASK: i32 = 0xC;
/// Most messages one batch body may hold (a bound on what decoding allocates
/// beyond the body's own bytes).
pub const MAX_BATCH_MESSAGES: usize = 4096;

const NAME_VALUE_SEPARATOR: char = '\u{1}';
const PROPERTY_SEPARATOR: char = '\u{2}';

/// One stored message as a pull answer carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireMessage<'a> {
    /// Message queue id.
    pub queue_id: i32,
    /// User flag.
    pub flag: i32,
    /// Queue offset.
    pub queue_offset: i64,
    /// CommitLog offset (LedgerMQ: the message's physical offset on the node
    /// that answers; every replica holds the same bytes at the same offset).
    pub physical_offset: i64,
    /// SYSFLAG; the host bits are set from the addresses.
    pub sys_flag: i32,
    /// Producer's timestamp, ms since the Unix epoch.
    pub born_timestamp_ms: i64,
    /// Producer's address.
    pub born_host: SocketAddr,
    /// When the message was stored, ms since the Unix epoch.
    pub store_timestamp_ms: i64,
    /// The address of the node (its remoting address).
    pub store_host: SocketAddr,
    /// Delivery attempts so far.
    pub reconsume_times: i32,
    /// CommitLog offset of a half message, or 0.
    pub prepared_transaction_offset: i64,
    /// Body, as stored.
    pub body: &'a [u8],
    /// Topic.
    pub topic: &'a str,
    /// Properties, encoded (`k\u{1}v\u{2}` repeated).
    pub properties: &'a str,
}

fn host_len(a: &SocketAddr) -> usize {
    match a.ip() {
        IpAddr::V4(_) => 8,
        IpAddr::V6(_) => 20,
    }
}

fn put_host(out: &mut Vec<u8>, a: &SocketAddr) {
    match a.ip() {
        IpAddr::V4(ip) => out.extend_from_slice(&ip.octets()),
        IpAddr::V6(ip) => out.extend_from_slice(&ip.octets()),
    }
    out.extend_from_slice(&(a.port() as i32).to_be_bytes());
}

/// CRC of a body as RocketMQ stores it (`UtilAll.crc32`: CRC32 masked to 31 bits).
pub fn body_crc(body: &[u8]) -> i32 {
    (crc32fast::hash(body) & 0x7FFF_FFFF) as i32
}

/// Appends `m` in the stored layout (V1 magic, or V2 for a topic over 127
/// bytes). Error: `TooLarge` (a topic over `i16::MAX` bytes, properties over
/// `i16::MAX` bytes, a record over `i32::MAX` bytes), found before anything is
/// written: `out` is unchanged then.
pub fn encode_message(out: &mut Vec<u8>, m: &WireMessage<'_>) -> Result<(), RemotingError> {
    let topic = m.topic.as_bytes();
    let props = m.properties.as_bytes();
    if topic.len() > i16::MAX as usize {
        return Err(RemotingError::TooLarge("topic"));
    }
    if props.len() > i16::MAX as usize {
        return Err(RemotingError::TooLarge("properties"));
    }
    let v2 = topic.len() > 127;
    let total = 4
        + 4
        + 4
        + 4
        + 4
        + 8
        + 8
        + 4
        + 8
        + host_len(&m.born_host)
        + 8
        + host_len(&m.store_host)
        + 4
        + 8
        + 4
        + m.body.len()
        + if v2 { 2 } else { 1 }
        + topic.len()
        + 2
        + props.len();
    let total = i32::try_from(total).map_err(|_| RemotingError::TooLarge("message"))?;
    let mut sys_flag = m.sys_flag & !(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6);
    if m.born_host.is_ipv6() {
        sys_flag |= SYSFLAG_BORNHOST_V6;
    }
    if m.store_host.is_ipv6() {
        sys_flag |= SYSFLAG_STOREHOST_V6;
    }
    out.reserve(total as usize);
    out.extend_from_slice(&total.to_be_bytes());
    out.extend_from_slice(&(if v2 { MAGIC_V2 } else { MAGIC_V1 }).to_be_bytes());
    out.extend_from_slice(&body_crc(m.body).to_be_bytes());
    out.extend_from_slice(&m.queue_id.to_be_bytes());
    out.extend_from_slice(&m.flag.to_be_bytes());
    out.extend_from_slice(&m.queue_offset.to_be_bytes());
    out.extend_from_slice(&m.physical_offset.to_be_bytes());
    out.extend_from_slice(&sys_flag.to_be_bytes());
    out.extend_from_slice(&m.born_timestamp_ms.to_be_bytes());
    put_host(out, &m.born_host);
    out.extend_from_slice(&m.store_timestamp_ms.to_be_bytes());
    put_host(out, &m.store_host);
    out.extend_from_slice(&m.reconsume_times.to_be_bytes());
    out.extend_from_slice(&m.prepared_transaction_offset.to_be_bytes());
    out.extend_from_slice(&(m.body.len() as i32).to_be_bytes());
    out.extend_from_slice(m.body);
    if v2 {
        out.extend_from_slice(&(topic.len() as i16).to_be_bytes());
    } else {
        out.push(topic.len() as u8);
    }
    out.extend_from_slice(topic);
    out.extend_from_slice(&(props.len() as i16).to_be_bytes());
    out.extend_from_slice(props);
    Ok(())
}

fn get_host(r: &mut Reader<'_>, v6: bool) -> Result<SocketAddr, RemotingError> {
    let ip: IpAddr = if v6 {
        let o: [u8; 16] = r.take(16, "message: host")?.try_into().expect("16");
        Ipv6Addr::from(o).into()
    } else {
        let o: [u8; 4] = r.take(4, "message: host")?.try_into().expect("4");
        Ipv4Addr::from(o).into()
    };
    let port = r.i32("message: port")?;
    Ok(SocketAddr::new(ip, port as u16))
}

fn i64_at(r: &mut Reader<'_>, what: &'static str) -> Result<i64, RemotingError> {
    Ok(i64::from_be_bytes(r.take(8, what)?.try_into().expect("8")))
}

/// Decodes a pull answer's body: stored messages one after another, as
/// [`encode_message`] writes them (V1 or V2 magic). Error: `Message` (a
/// length that overruns the body or disagrees with TOTALSIZE, an unknown
/// magic, a topic or properties that are not UTF-8).
pub fn decode_messages(buf: &[u8]) -> Result<Vec<WireMessage<'_>>, RemotingError> {
    let mut r = Reader { buf, at: 0 };
    let mut out = Vec::new();
    while r.at < buf.len() {
        let start = r.at;
        let total = r.i32("message: total size")?;
        let magic = r.i32("message: magic")?;
        if magic != MAGIC_V1 && magic != MAGIC_V2 {
            return Err(RemotingError::Message("message: unknown magic"));
        }
        let _crc = r.i32("message: body crc")?;
        let queue_id = r.i32("message: queue id")?;
        let flag = r.i32("message: flag")?;
        let queue_offset = i64_at(&mut r, "message: queue offset")?;
        let physical_offset = i64_at(&mut r, "message: physical offset")?;
        let sys_flag = r.i32("message: sysflag")?;
        let born_timestamp_ms = i64_at(&mut r, "message: born timestamp")?;
        let born_host = get_host(&mut r, sys_flag & SYSFLAG_BORNHOST_V6 != 0)?;
        let store_timestamp_ms = i64_at(&mut r, "message: store timestamp")?;
        let store_host = get_host(&mut r, sys_flag & SYSFLAG_STOREHOST_V6 != 0)?;
        let reconsume_times = r.i32("message: reconsume times")?;
        let prepared_transaction_offset = i64_at(&mut r, "message: prepared offset")?;
        let body_len = usize::try_from(r.i32("message: body length")?)
            .map_err(|_| RemotingError::Message("message: negative body length"))?;
        let body = r.take(body_len, "message: body overruns")?;
        let topic_len = if magic == MAGIC_V2 {
            usize::try_from(r.i16("message: topic length")?)
                .map_err(|_| RemotingError::Message("message: negative topic length"))?
        } else {
            r.take(1, "message: topic length")?[0] as usize
        };
        let topic = std::str::from_utf8(r.take(topic_len, "message: topic overruns")?)
            .map_err(|_| RemotingError::Message("message: topic not UTF-8"))?;
        let props_len = usize::try_from(r.i16("message: properties length")?)
            .map_err(|_| RemotingError::Message("message: negative properties length"))?;
        let properties = std::str::from_utf8(r.take(props_len, "message: properties overrun")?)
            .map_err(|_| RemotingError::Message("message: properties not UTF-8"))?;
        if usize::try_from(total).ok() != Some(r.at - start) {
            return Err(RemotingError::Message("message: total size disagrees"));
        }
        out.push(WireMessage {
            queue_id,
            flag,
            queue_offset,
            physical_offset,
            sys_flag,
            born_timestamp_ms,
            born_host,
            store_timestamp_ms,
            store_host,
            reconsume_times,
            prepared_transaction_offset,
            body,
            topic,
            properties,
        });
    }
    Ok(out)
}

/// One message of a SEND_BATCH_MESSAGE body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchItem {
    /// User flag.
    pub flag: i32,
    /// Body.
    pub body: Vec<u8>,
    /// Properties, decoded.
    pub properties: BTreeMap<String, String>,
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], RemotingError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(RemotingError::Message(what))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn i32(&mut self, what: &'static str) -> Result<i32, RemotingError> {
        Ok(i32::from_be_bytes(
            self.take(4, what)?.try_into().expect("4"),
        ))
    }
    fn i16(&mut self, what: &'static str) -> Result<i16, RemotingError> {
        Ok(i16::from_be_bytes(
            self.take(2, what)?.try_into().expect("2"),
        ))
    }
}

/// Decodes a batch body: `[TOTALSIZE i32][MAGIC i32][BODYCRC i32][FLAG i32]
/// [BODYLEN i32][BODY][PROPLEN i16][PROPS]` repeated. Error: `Message` (a
/// length that overruns the body or disagrees with TOTALSIZE, a negative
/// length, more than [`MAX_BATCH_MESSAGES`] messages, an empty batch).
pub fn decode_batch(body: &[u8]) -> Result<Vec<BatchItem>, RemotingError> {
    let mut r = Reader { buf: body, at: 0 };
    let mut out = Vec::new();
    while r.at < body.len() {
        if out.len() == MAX_BATCH_MESSAGES {
            return Err(RemotingError::Message("too many messages in a batch"));
        }
        let start = r.at;
        let total = r.i32("batch: total size")?;
        let _magic = r.i32("batch: magic")?;
        let _crc = r.i32("batch: body crc")?;
        let flag = r.i32("batch: flag")?;
        let body_len = r.i32("batch: body length")?;
        let body_len = usize::try_from(body_len)
            .map_err(|_| RemotingError::Message("batch: negative body length"))?;
        let body = r.take(body_len, "batch: body overruns")?.to_vec();
        let props_len = r.i16("batch: properties length")?;
        let props_len = usize::try_from(props_len)
            .map_err(|_| RemotingError::Message("batch: negative properties length"))?;
        let props = r.take(props_len, "batch: properties overrun")?;
        if usize::try_from(total).ok() != Some(r.at - start) {
            return Err(RemotingError::Message("batch: total size disagrees"));
        }
        out.push(BatchItem {
            flag,
            body,
            properties: decode_properties(&String::from_utf8_lossy(props)),
        });
    }
    if out.is_empty() {
        return Err(RemotingError::Message("batch: no messages"));
    }
    Ok(out)
}

/// Encodes a batch body (what a producer sends; for tests and the bench client).
pub fn encode_batch(items: &[BatchItem]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in items {
        let props = encode_properties(&m.properties);
        let total = 4 + 4 + 4 + 4 + 4 + m.body.len() + 2 + props.len();
        out.extend_from_slice(&(total as i32).to_be_bytes());
        out.extend_from_slice(&0i32.to_be_bytes());
        out.extend_from_slice(&body_crc(&m.body).to_be_bytes());
        out.extend_from_slice(&m.flag.to_be_bytes());
        out.extend_from_slice(&(m.body.len() as i32).to_be_bytes());
        out.extend_from_slice(&m.body);
        out.extend_from_slice(&(props.len() as i16).to_be_bytes());
        out.extend_from_slice(props.as_bytes());
    }
    out
}

/// Properties as RocketMQ writes them (`messageProperties2String`).
pub fn encode_properties(p: &BTreeMap<String, String>) -> String {
    let mut s = String::new();
    for (k, v) in p {
        s.push_str(k);
        s.push(NAME_VALUE_SEPARATOR);
        s.push_str(v);
        s.push(PROPERTY_SEPARATOR);
    }
    s
}

/// Properties as RocketMQ reads them (`string2messageProperties`): pairs
/// without a name-value separator are skipped.
pub fn decode_properties(s: &str) -> BTreeMap<String, String> {
    s.split(PROPERTY_SEPARATOR)
        .filter_map(|kv| kv.split_once(NAME_VALUE_SEPARATOR))
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The offset message id: uppercase hex of the store host's address and port
/// (i32) and an 8-byte offset: 32 characters for IPv4, 56 for IPv6.
pub fn offset_message_id(store_host: SocketAddr, offset: u64) -> String {
    let mut b = Vec::with_capacity(28);
    put_host(&mut b, &store_host);
    b.extend_from_slice(&offset.to_be_bytes());
    b.iter().map(|x| format!("{x:02X}")).collect()
}

/// Decodes an offset message id to its store host and offset; `None` for
/// anything else (a wrong length, not hex).
pub fn decode_offset_message_id(id: &str) -> Option<(SocketAddr, u64)> {
    if !id.is_ascii() || !matches!(id.len(), 32 | 56) {
        return None;
    }
    let bytes: Vec<u8> = (0..id.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&id[i..i + 2], 16).ok())
        .collect::<Option<_>>()?;
    let (ip, rest): (IpAddr, &[u8]) = if bytes.len() == 16 {
        let o: [u8; 4] = bytes[..4].try_into().ok()?;
        (Ipv4Addr::from(o).into(), &bytes[4..])
    } else {
        let o: [u8; 16] = bytes[..16].try_into().ok()?;
        (Ipv6Addr::from(o).into(), &bytes[16..])
    };
    let port = i32::from_be_bytes(rest[..4].try_into().ok()?);
    let port = u16::try_from(port).ok()?;
    let offset = u64::from_be_bytes(rest[4..12].try_into().ok()?);
    Some((SocketAddr::new(ip, port), offset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample<'a>(topic: &'a str, body: &'a [u8], props: &'a str) -> WireMessage<'a> {
        WireMessage {
            queue_id: 3,
            flag: 7,
            queue_offset: 42,
            physical_offset: 1 << 33,
            sys_flag: 0,
            born_timestamp_ms: 1_700_000_000_000,
            born_host: "10.0.0.1:5000".parse().unwrap(),
            store_timestamp_ms: 1_700_000_000_001,
            store_host: "[::1]:10911".parse().unwrap(),
            reconsume_times: 2,
            prepared_transaction_offset: 0,
            body,
            topic,
            properties: props,
        }
    }

    #[test]
    fn a_stored_message_has_java_s_layout() {
        let mut out = Vec::new();
        encode_message(&mut out, &sample("T", b"hello", "TAGS\u{1}a\u{2}")).unwrap();
        let total = i32::from_be_bytes(out[..4].try_into().unwrap()) as usize;
        assert_eq!(total, out.len());
        assert_eq!(i32::from_be_bytes(out[4..8].try_into().unwrap()), MAGIC_V1);
        assert_eq!(
            i32::from_be_bytes(out[8..12].try_into().unwrap()),
            body_crc(b"hello")
        );
        // SYSFLAG: store host IPv6 only.
        assert_eq!(
            i32::from_be_bytes(out[36..40].try_into().unwrap()),
            SYSFLAG_STOREHOST_V6
        );
        // born host v4 (8) at 48, store ts at 56, store host v6 (20) at 64.
        assert_eq!(&out[48..52], &[10, 0, 0, 1]);
        assert_eq!(i32::from_be_bytes(out[52..56].try_into().unwrap()), 5000);
        let body_len_at = 64 + 20 + 4 + 8;
        assert_eq!(
            i32::from_be_bytes(out[body_len_at..body_len_at + 4].try_into().unwrap()),
            5
        );
        assert!(out.ends_with(b"\x01T\x00\x07TAGS\x01a\x02"));
        let decoded = decode_messages(&out).unwrap();
        assert_eq!(
            decoded,
            vec![WireMessage {
                sys_flag: SYSFLAG_STOREHOST_V6,
                ..sample("T", b"hello", "TAGS\u{1}a\u{2}")
            }]
        );
        let long = "t".repeat(200);
        let mut out = Vec::new();
        encode_message(&mut out, &sample(&long, b"", "")).unwrap();
        assert_eq!(i32::from_be_bytes(out[4..8].try_into().unwrap()), MAGIC_V2);
        assert_eq!(decode_messages(&out).unwrap()[0].topic, long);
        for cut in 1..out.len() {
            assert!(decode_messages(&out[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn offset_message_ids_round_trip_and_match_java_s() {
        let id = offset_message_id("127.0.0.1:10911".parse().unwrap(), 0x1234);
        assert_eq!(id, "7F00000100002A9F0000000000001234");
        assert_eq!(
            decode_offset_message_id(&id),
            Some(("127.0.0.1:10911".parse().unwrap(), 0x1234))
        );
        let v6 = offset_message_id("[::1]:1".parse().unwrap(), 9);
        assert_eq!(v6.len(), 56);
        assert_eq!(decode_offset_message_id(&v6).unwrap().1, 9);
        for bad in [
            "",
            "XYZ",
            &"G".repeat(32),
            "7F00000100002A9F000000000000123",
        ] {
            assert_eq!(decode_offset_message_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn properties_round_trip_and_skip_malformed_pairs() {
        let p: BTreeMap<String, String> = [("KEYS", "a b"), ("TAGS", "t")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(decode_properties(&encode_properties(&p)), p);
        assert_eq!(decode_properties("noseparator\u{2}K\u{1}V").len(), 1);
    }

    proptest! {
        #[test]
        fn batches_round_trip(items in proptest::collection::vec(
            (any::<i32>(), proptest::collection::vec(any::<u8>(), 0..64), "[a-z]{1,8}", "[a-z ]{0,8}"),
            1..8,
        )) {
            let items: Vec<BatchItem> = items
                .into_iter()
                .map(|(flag, body, k, v)| BatchItem {
                    flag,
                    body,
                    properties: [(k, v)].into_iter().collect(),
                })
                .collect();
            prop_assert_eq!(decode_batch(&encode_batch(&items)).unwrap(), items);
        }

        #[test]
        fn batch_decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_batch(&bytes);
            let _ = decode_messages(&bytes);
        }

        #[test]
        fn cut_batches_are_errors(cut in 1usize..40) {
            let items = vec![BatchItem { flag: 0, body: b"0123456789".to_vec(), properties: BTreeMap::new() }];
            let full = encode_batch(&items);
            let cut = cut.min(full.len() - 1);
            prop_assert!(decode_batch(&full[..cut]).is_err());
        }
    }
}
