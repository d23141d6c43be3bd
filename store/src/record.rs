//! The CommitLog record layout: encoding, decoding and checking, with no I/O.
//!
//! It follows RocketMQ's CommitLog message layout (`CommitLog.calMsgLength` /
//! `MessageDecoder`, message version V1: one-byte topic length) with two additions,
//! because in LedgerMQ the CommitLog is the Raft log: every record carries the Raft
//! **term** and **log index** of the entry it belongs to. One Raft entry is one or more
//! consecutive records that all carry the entry's term and log index.
//!
//! All integers are big-endian, as in RocketMQ. Byte by byte:
//!
//! | offset | size   | field | meaning |
//! |-------:|-------:|-------|---------|
//! | 0      | 4      | TOTALSIZE i32 | length of the whole record in bytes |
//! | 4      | 4      | MAGICCODE u32 | [`MAGIC_MESSAGE`], [`MAGIC_SYSTEM`] or, for end-of-segment padding, [`MAGIC_BLANK`] |
//! | 8      | 4      | CRC u32 | CRC32 (IEEE, `crc32fast`) of bytes `[12, TOTALSIZE)` except PHYSICALOFFSET `[48, 56)`, so one entry has one CRC on every replica wherever it sits (recovery checks PHYSICALOFFSET against the record's position instead) |
//! | 12     | 8      | TERM u64 | Raft term of the entry |
//! | 20     | 8      | LOGINDEX u64 | Raft log index of the entry |
//! | 28     | 4      | ENTRYREMAINING u32 | records that follow this one in the same Raft entry (0 on the entry's last record), so recovery can tell a torn entry from a whole one |
//! | 32     | 4      | QUEUEID i32 | message queue id (-1 for system records) |
//! | 36     | 4      | FLAG i32 | user flag, opaque to the store |
//! | 40     | 8      | QUEUEOFFSET i64 | always -1 here: queue offsets are assigned when the entry is applied and live in the ConsumeQueue |
//! | 48     | 8      | PHYSICALOFFSET i64 | CommitLog offset of this record's first byte |
//! | 56     | 4      | SYSFLAG i32 | RocketMQ sysflag bits ([`SYSFLAG_BORNHOST_V6`], [`SYSFLAG_STOREHOST_V6`], transaction bits, ...) |
//! | 60     | 8      | BORNTIMESTAMP i64 | milliseconds since the Unix epoch, set by the producer |
//! | 68     | 8 / 20 | BORNHOST | IPv4 address (4) + port (4), or IPv6 (16) + port (4) when SYSFLAG has [`SYSFLAG_BORNHOST_V6`] |
//! | ..     | 8      | STORETIMESTAMP i64 | milliseconds since the Unix epoch, set by the leader that proposed the entry |
//! | ..     | 8 / 20 | STOREHOSTADDRESS | as BORNHOST, with [`SYSFLAG_STOREHOST_V6`] |
//! | ..     | 4      | RECONSUMETIMES i32 | delivery attempts so far (retry topics) |
//! | ..     | 8      | PREPARED TRANSACTION OFFSET i64 | CommitLog offset of the half message, or 0 |
//! | ..     | 4      | BODYLENGTH i32 | |
//! | ..     | n      | BODY | message body (for system records: the Raft layer's payload) |
//! | ..     | 1      | TOPICLENGTH u8 | at most [`MAX_TOPIC_BYTES`] |
//! | ..     | n      | TOPIC | UTF-8 |
//! | ..     | 2      | PROPERTIESLENGTH u16 | at most [`MAX_PROPERTIES_BYTES`] |
//! | ..     | n      | PROPERTIES | `key 0x01 value 0x02` repeated, as RocketMQ's `MessageDecoder.messageProperties2String` |
//!
//! A blank (padding) record is only TOTALSIZE (the bytes left in the segment, at
//! least [`BLANK_MIN_BYTES`]) and MAGICCODE; it says "the rest of this segment is unused".
//! A TOTALSIZE of 0 marks the end of written data.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Magic of a message record (user message of some topic).
pub const MAGIC_MESSAGE: u32 = 0xDAA3_20B1;
/// Magic of a system record: a Raft entry that carries no user message (blank,
/// membership, consumer-offset commit, config change). Its body is opaque to the store.
pub const MAGIC_SYSTEM: u32 = 0xDAA3_20B2;
/// Magic of the end-of-segment padding record (RocketMQ's `BLANK_MAGIC_CODE`).
pub const MAGIC_BLANK: u32 = 0xCBD4_3194;
/// Size of the shortest padding record (TOTALSIZE + MAGICCODE). Every record leaves at
/// least this much room in its segment, so a padding record always fits.
pub const BLANK_MIN_BYTES: u64 = 8;

/// RocketMQ sysflag bit: the born host is IPv6.
pub const SYSFLAG_BORNHOST_V6: i32 = 1 << 4;
/// RocketMQ sysflag bit: the store host is IPv6.
pub const SYSFLAG_STOREHOST_V6: i32 = 1 << 5;

/// Longest topic name the layout carries (RocketMQ's limit for V1 records).
pub const MAX_TOPIC_BYTES: usize = 127;
/// Longest encoded properties the layout carries (RocketMQ's `Short.MAX_VALUE`).
pub const MAX_PROPERTIES_BYTES: usize = i16::MAX as usize;

/// Property holding the message tag (RocketMQ `MessageConst.PROPERTY_TAGS`).
pub const PROPERTY_TAGS: &str = "TAGS";
/// Property holding the space-separated keys (`MessageConst.PROPERTY_KEYS`).
pub const PROPERTY_KEYS: &str = "KEYS";
/// Property holding the client-made message id (`MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX`).
pub const PROPERTY_UNIQ_KEY: &str = "UNIQ_KEY";

const NAME_VALUE_SEPARATOR: char = '\u{1}';
const PROPERTY_SEPARATOR: char = '\u{2}';

/// Byte offsets of the fixed part of the layout.
pub mod pos {
    /// TOTALSIZE
    pub const TOTAL_SIZE: usize = 0;
    /// MAGICCODE
    pub const MAGIC: usize = 4;
    /// CRC
    pub const CRC: usize = 8;
    /// First byte the CRC covers.
    pub const CRC_FROM: usize = 12;
    /// TERM
    pub const TERM: usize = 12;
    /// LOGINDEX
    pub const LOG_INDEX: usize = 20;
    /// ENTRYREMAINING
    pub const ENTRY_REMAINING: usize = 28;
    /// QUEUEID
    pub const QUEUE_ID: usize = 32;
    /// FLAG
    pub const FLAG: usize = 36;
    /// QUEUEOFFSET
    pub const QUEUE_OFFSET: usize = 40;
    /// PHYSICALOFFSET
    pub const PHYSICAL_OFFSET: usize = 48;
    /// SYSFLAG
    pub const SYSFLAG: usize = 56;
    /// BORNTIMESTAMP
    pub const BORN_TIMESTAMP: usize = 60;
    /// BORNHOST
    pub const BORN_HOST: usize = 68;
}

/// Kind of a record, from its magic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RecordKind {
    /// A user message, dispatched to a ConsumeQueue when its entry is applied.
    Message,
    /// A Raft system entry (no queue offset).
    System,
}

/// A message as the store writes it: everything except the Raft term, log index and
/// physical offset, which the CommitLog fills in on append.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MessageRecord {
    /// Message or system record.
    pub kind: RecordKind,
    /// Topic name (empty for system records), at most [`MAX_TOPIC_BYTES`] bytes.
    pub topic: String,
    /// Message queue id within the topic (-1 for system records).
    pub queue_id: i32,
    /// User flag.
    pub flag: i32,
    /// RocketMQ sysflag; the two host bits are set by the encoder from the addresses.
    pub sys_flag: i32,
    /// Producer's timestamp, ms since the Unix epoch.
    pub born_timestamp_ms: i64,
    /// Producer's address.
    pub born_host: SocketAddr,
    /// Leader's timestamp when it accepted the message, ms since the Unix epoch.
    pub store_timestamp_ms: i64,
    /// Address of the node that accepted the message.
    pub store_host: SocketAddr,
    /// Delivery attempts so far.
    pub reconsume_times: i32,
    /// CommitLog offset of the prepared (half) message, or 0.
    pub prepared_transaction_offset: i64,
    /// The body bytes. Serialized as one byte string (`serde_bytes`), not as a
    /// sequence of single bytes: postcard writes the same bytes either way, but
    /// one copy instead of a call per byte (profiling the leader showed it).
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
    /// User and system properties (tags, keys, message id, ...).
    pub properties: BTreeMap<String, String>,
}

impl MessageRecord {
    /// A user message with default hosts and flags: convenient for tests and demos.
    pub fn message(topic: &str, queue_id: i32, body: Vec<u8>, store_timestamp_ms: i64) -> Self {
        let unspecified = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
        Self {
            kind: RecordKind::Message,
            topic: topic.to_owned(),
            queue_id,
            flag: 0,
            sys_flag: 0,
            born_timestamp_ms: store_timestamp_ms,
            born_host: unspecified,
            store_timestamp_ms,
            store_host: unspecified,
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body,
            properties: BTreeMap::new(),
        }
    }

    /// A system record carrying `payload` (opaque to the store).
    pub fn system(payload: Vec<u8>, store_timestamp_ms: i64) -> Self {
        let mut r = Self::message("", -1, payload, store_timestamp_ms);
        r.kind = RecordKind::System;
        r
    }

    /// Sets a property (builder style).
    pub fn with_property(mut self, key: &str, value: &str) -> Self {
        self.properties.insert(key.to_owned(), value.to_owned());
        self
    }

    /// The tag, if any.
    pub fn tag(&self) -> Option<&str> {
        self.properties.get(PROPERTY_TAGS).map(String::as_str)
    }
}

fn host_len(addr: &SocketAddr) -> usize {
    match addr {
        SocketAddr::V4(_) => 8,
        SocketAddr::V6(_) => 20,
    }
}

/// Encodes properties in RocketMQ's `key 0x01 value 0x02` form.
pub fn encode_properties(props: &BTreeMap<String, String>) -> String {
    let mut s = String::with_capacity(props.iter().map(|(k, v)| k.len() + v.len() + 2).sum());
    for (k, v) in props {
        s.push_str(k);
        s.push(NAME_VALUE_SEPARATOR);
        s.push_str(v);
        s.push(PROPERTY_SEPARATOR);
    }
    s
}

/// Decodes RocketMQ-form properties; malformed pairs are skipped.
pub fn decode_properties(s: &str) -> BTreeMap<String, String> {
    s.split(PROPERTY_SEPARATOR)
        .filter_map(|kv| kv.split_once(NAME_VALUE_SEPARATOR))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Finds one property in encoded properties without building a map.
pub fn find_property<'a>(encoded: &'a str, key: &str) -> Option<&'a str> {
    encoded
        .split(PROPERTY_SEPARATOR)
        .filter_map(|kv| kv.split_once(NAME_VALUE_SEPARATOR))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// The tag hash code stored in ConsumeQueue entries: Java's `String.hashCode()` of
/// the tag widened to i64, as RocketMQ's `MessageExtBrokerInner.tagsString2tagsCode`.
/// A message without a tag gets 0.
pub fn tag_hash(tag: Option<&str>) -> i64 {
    match tag {
        None | Some("") => 0,
        Some(t) => i64::from(java_string_hash(t)),
    }
}

/// Java's `String.hashCode()` (over UTF-16 code units), used for tag codes and
/// IndexFile key hashes as RocketMQ does.
pub fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// Encoded length in bytes of `m` (TOTALSIZE), or an error if a field exceeds the layout.
pub fn encoded_len(m: &MessageRecord, props: &str) -> Result<usize, String> {
    if m.topic.len() > MAX_TOPIC_BYTES {
        return Err(format!(
            "topic is {} bytes, at most {MAX_TOPIC_BYTES} allowed",
            m.topic.len()
        ));
    }
    if props.len() > MAX_PROPERTIES_BYTES {
        return Err(format!(
            "properties are {} bytes, at most {MAX_PROPERTIES_BYTES} allowed",
            props.len()
        ));
    }
    if m.body.len() > i32::MAX as usize {
        return Err("body longer than i32::MAX".into());
    }
    Ok(pos::BORN_HOST
        + host_len(&m.born_host)
        + 8
        + host_len(&m.store_host)
        + 4
        + 8
        + 4
        + m.body.len()
        + 1
        + m.topic.len()
        + 2
        + props.len())
}

fn put_host(out: &mut Vec<u8>, addr: &SocketAddr) {
    match addr {
        SocketAddr::V4(a) => out.extend_from_slice(&a.ip().octets()),
        SocketAddr::V6(a) => out.extend_from_slice(&a.ip().octets()),
    }
    out.extend_from_slice(&i32::from(addr.port()).to_be_bytes());
}

/// Where a record goes: its Raft entry and its place in the CommitLog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Raft term of the entry.
    pub term: u64,
    /// Raft log index of the entry.
    pub log_index: u64,
    /// Records of the same entry that follow this one.
    pub entry_remaining: u32,
    /// CommitLog offset of the record's first byte.
    pub physical_offset: u64,
}

/// Appends the encoding of `m` at `at` to `out`. `props` must be
/// `encode_properties(&m.properties)` and `len` must be `encoded_len(m, props)`.
pub fn encode_into(out: &mut Vec<u8>, m: &MessageRecord, props: &str, len: usize, at: Placement) {
    let start = out.len();
    out.reserve(len);
    let mut sys_flag = m.sys_flag & !(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6);
    if m.born_host.is_ipv6() {
        sys_flag |= SYSFLAG_BORNHOST_V6;
    }
    if m.store_host.is_ipv6() {
        sys_flag |= SYSFLAG_STOREHOST_V6;
    }
    let magic = match m.kind {
        RecordKind::Message => MAGIC_MESSAGE,
        RecordKind::System => MAGIC_SYSTEM,
    };
    out.extend_from_slice(&(len as i32).to_be_bytes());
    out.extend_from_slice(&magic.to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes()); // CRC, filled below
    out.extend_from_slice(&at.term.to_be_bytes());
    out.extend_from_slice(&at.log_index.to_be_bytes());
    out.extend_from_slice(&at.entry_remaining.to_be_bytes());
    out.extend_from_slice(&m.queue_id.to_be_bytes());
    out.extend_from_slice(&m.flag.to_be_bytes());
    out.extend_from_slice(&(-1i64).to_be_bytes());
    out.extend_from_slice(&(at.physical_offset as i64).to_be_bytes());
    out.extend_from_slice(&sys_flag.to_be_bytes());
    out.extend_from_slice(&m.born_timestamp_ms.to_be_bytes());
    put_host(out, &m.born_host);
    out.extend_from_slice(&m.store_timestamp_ms.to_be_bytes());
    put_host(out, &m.store_host);
    out.extend_from_slice(&m.reconsume_times.to_be_bytes());
    out.extend_from_slice(&m.prepared_transaction_offset.to_be_bytes());
    out.extend_from_slice(&(m.body.len() as i32).to_be_bytes());
    out.extend_from_slice(&m.body);
    out.push(m.topic.len() as u8);
    out.extend_from_slice(m.topic.as_bytes());
    out.extend_from_slice(&(props.len() as u16).to_be_bytes());
    out.extend_from_slice(props.as_bytes());
    debug_assert_eq!(
        out.len() - start,
        len,
        "encoded_len disagrees with encode_into"
    );
    let crc = record_crc(&out[start..]);
    out[start + pos::CRC..start + pos::CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

/// The CRC of one encoded record (see the layout table for what it covers).
pub fn record_crc(record: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&record[pos::CRC_FROM..pos::PHYSICAL_OFFSET]);
    h.update(&record[pos::PHYSICAL_OFFSET + 8..]);
    h.finalize()
}

/// What the first bytes at a position say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// TOTALSIZE is 0: no data written here.
    End,
    /// Padding to the end of the segment, `len` bytes.
    Blank {
        /// Bytes to the end of the segment.
        len: u64,
    },
    /// A record of `len` bytes (not yet checked beyond its magic and length).
    Record {
        /// TOTALSIZE.
        len: u64,
        /// From the magic.
        kind: RecordKind,
    },
}

/// Reads TOTALSIZE and MAGICCODE from `head` (at least 8 bytes) found with `room` bytes
/// left in the segment. Returns an error string for an impossible header.
pub fn parse_header(head: &[u8], room: u64) -> Result<Header, String> {
    let total = i32::from_be_bytes(head[0..4].try_into().unwrap());
    let magic = u32::from_be_bytes(head[4..8].try_into().unwrap());
    if total == 0 && magic == 0 {
        return Ok(Header::End);
    }
    if total < 0 || total as u64 > room {
        return Err(format!(
            "record length {total} exceeds the {room} bytes left in the segment"
        ));
    }
    let len = total as u64;
    match magic {
        MAGIC_BLANK if len == room => Ok(Header::Blank { len }),
        MAGIC_BLANK => Err(format!(
            "padding of {len} bytes does not reach the segment end ({room} left)"
        )),
        MAGIC_MESSAGE | MAGIC_SYSTEM if (len as usize) < min_record_len() => Err(format!(
            "record length {len} is below the minimum {}",
            min_record_len()
        )),
        MAGIC_MESSAGE => Ok(Header::Record {
            len,
            kind: RecordKind::Message,
        }),
        MAGIC_SYSTEM => Ok(Header::Record {
            len,
            kind: RecordKind::System,
        }),
        other => Err(format!("unknown magic {other:#010x}")),
    }
}

/// Length of the shortest possible record (IPv4 hosts, empty body, topic, properties).
pub const fn min_record_len() -> usize {
    pos::BORN_HOST + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 2
}

/// A checked, borrowed record: its fixed fields are read on demand.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    bytes: &'a [u8],
    kind: RecordKind,
    body: (usize, usize),
    topic: (usize, usize),
    props: (usize, usize),
    store_ts_at: usize,
    store_host_at: usize,
}

fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}
fn be_u64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

fn read_host(b: &[u8], at: usize, v6: bool) -> SocketAddr {
    if v6 {
        let ip: [u8; 16] = b[at..at + 16].try_into().unwrap();
        SocketAddr::new(IpAddr::from(ip), be_i32(b, at + 16) as u16)
    } else {
        let ip: [u8; 4] = b[at..at + 4].try_into().unwrap();
        SocketAddr::new(IpAddr::from(ip), be_i32(b, at + 4) as u16)
    }
}

impl<'a> RecordView<'a> {
    /// Checks `bytes` (exactly one record: `bytes.len()` == TOTALSIZE) and returns a
    /// view. Verifies magic, CRC and that every length field stays inside the record.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, String> {
        Self::parse_with(bytes, true)
    }

    /// As [`RecordView::parse`] without recomputing the CRC, for bytes that `parse`
    /// (or `CommitLog::read_record`) already accepted: a read path then checks each
    /// record's CRC once, not once per view. Bounds are still checked.
    pub fn parse_checked_before(bytes: &'a [u8]) -> Result<Self, String> {
        Self::parse_with(bytes, false)
    }

    fn parse_with(bytes: &'a [u8], check_crc: bool) -> Result<Self, String> {
        if bytes.len() < min_record_len() {
            return Err(format!(
                "record of {} bytes is shorter than the minimum",
                bytes.len()
            ));
        }
        let total = be_i32(bytes, pos::TOTAL_SIZE);
        if total as usize != bytes.len() {
            return Err(format!(
                "TOTALSIZE {total} differs from the {} bytes read",
                bytes.len()
            ));
        }
        let kind = match u32::from_be_bytes(bytes[4..8].try_into().unwrap()) {
            MAGIC_MESSAGE => RecordKind::Message,
            MAGIC_SYSTEM => RecordKind::System,
            m => return Err(format!("unknown magic {m:#010x}")),
        };
        let stored_crc = u32::from_be_bytes(bytes[pos::CRC..pos::CRC + 4].try_into().unwrap());
        let crc = if check_crc {
            record_crc(bytes)
        } else {
            stored_crc
        };
        if crc != stored_crc {
            return Err(format!(
                "CRC mismatch: stored {stored_crc:#010x}, computed {crc:#010x}"
            ));
        }
        // With the CRC good, the variable part is what the encoder wrote; still check
        // bounds so that a colliding CRC can never make us read outside the record.
        let sys_flag = be_i32(bytes, pos::SYSFLAG);
        let born_len = if sys_flag & SYSFLAG_BORNHOST_V6 != 0 {
            20
        } else {
            8
        };
        let store_len = if sys_flag & SYSFLAG_STOREHOST_V6 != 0 {
            20
        } else {
            8
        };
        let store_ts_at = pos::BORN_HOST + born_len;
        let store_host_at = store_ts_at + 8;
        let body_len_at = store_host_at + store_len + 4 + 8;
        let need = |at: usize, n: usize| -> Result<(), String> {
            if at + n > bytes.len() {
                Err(format!(
                    "field at {at} of {n} bytes runs past the record end"
                ))
            } else {
                Ok(())
            }
        };
        need(body_len_at, 4)?;
        let body_len = be_i32(bytes, body_len_at);
        if body_len < 0 {
            return Err(format!("negative body length {body_len}"));
        }
        let body_at = body_len_at + 4;
        need(body_at, body_len as usize + 1)?;
        let topic_len_at = body_at + body_len as usize;
        let topic_len = bytes[topic_len_at] as usize;
        let topic_at = topic_len_at + 1;
        need(topic_at, topic_len + 2)?;
        let props_len_at = topic_at + topic_len;
        let props_len = u16::from_be_bytes([bytes[props_len_at], bytes[props_len_at + 1]]) as usize;
        let props_at = props_len_at + 2;
        if props_at + props_len != bytes.len() {
            return Err("properties do not end at TOTALSIZE".into());
        }
        std::str::from_utf8(&bytes[topic_at..topic_at + topic_len])
            .map_err(|e| format!("topic: {e}"))?;
        std::str::from_utf8(&bytes[props_at..props_at + props_len])
            .map_err(|e| format!("properties: {e}"))?;
        Ok(Self {
            bytes,
            kind,
            body: (body_at, body_len as usize),
            topic: (topic_at, topic_len),
            props: (props_at, props_len),
            store_ts_at,
            store_host_at,
        })
    }

    /// The raw record bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
    /// Message or system record.
    pub fn kind(&self) -> RecordKind {
        self.kind
    }
    /// TOTALSIZE.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }
    /// Always false: a record is never empty.
    pub fn is_empty(&self) -> bool {
        false
    }
    /// The stored CRC32.
    pub fn crc(&self) -> u32 {
        u32::from_be_bytes(self.bytes[pos::CRC..pos::CRC + 4].try_into().unwrap())
    }
    /// Raft term.
    pub fn term(&self) -> u64 {
        be_u64(self.bytes, pos::TERM)
    }
    /// Raft log index.
    pub fn log_index(&self) -> u64 {
        be_u64(self.bytes, pos::LOG_INDEX)
    }
    /// Records of the same Raft entry that follow this one.
    pub fn entry_remaining(&self) -> u32 {
        u32::from_be_bytes(
            self.bytes[pos::ENTRY_REMAINING..pos::ENTRY_REMAINING + 4]
                .try_into()
                .unwrap(),
        )
    }
    /// Message queue id.
    pub fn queue_id(&self) -> i32 {
        be_i32(self.bytes, pos::QUEUE_ID)
    }
    /// Physical offset written in the record.
    pub fn physical_offset(&self) -> u64 {
        be_i64(self.bytes, pos::PHYSICAL_OFFSET) as u64
    }
    /// Store timestamp, ms since the Unix epoch.
    pub fn store_timestamp_ms(&self) -> i64 {
        be_i64(self.bytes, self.store_ts_at)
    }
    /// Body bytes.
    pub fn body(&self) -> &'a [u8] {
        &self.bytes[self.body.0..self.body.0 + self.body.1]
    }
    /// Topic.
    pub fn topic(&self) -> &'a str {
        std::str::from_utf8(&self.bytes[self.topic.0..self.topic.0 + self.topic.1])
            .expect("checked in parse")
    }
    /// Encoded properties.
    pub fn properties_str(&self) -> &'a str {
        std::str::from_utf8(&self.bytes[self.props.0..self.props.0 + self.props.1])
            .expect("checked in parse")
    }
    /// One property.
    pub fn property(&self, key: &str) -> Option<&'a str> {
        find_property(self.properties_str(), key)
    }

    /// Decodes every field into an owned [`MessageRecord`].
    pub fn to_record(&self) -> MessageRecord {
        let b = self.bytes;
        let sys_flag = be_i32(b, pos::SYSFLAG);
        MessageRecord {
            kind: self.kind,
            topic: self.topic().to_owned(),
            queue_id: self.queue_id(),
            flag: be_i32(b, pos::FLAG),
            sys_flag,
            born_timestamp_ms: be_i64(b, pos::BORN_TIMESTAMP),
            born_host: read_host(b, pos::BORN_HOST, sys_flag & SYSFLAG_BORNHOST_V6 != 0),
            store_timestamp_ms: self.store_timestamp_ms(),
            store_host: read_host(b, self.store_host_at, sys_flag & SYSFLAG_STOREHOST_V6 != 0),
            reconsume_times: be_i32(b, self.body.0 - 4 - 8 - 4),
            prepared_transaction_offset: be_i64(b, self.body.0 - 4 - 8),
            body: self.body().to_vec(),
            properties: decode_properties(self.properties_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv6Addr, SocketAddrV6};

    fn sample(v6: bool) -> MessageRecord {
        let mut m = MessageRecord::message("TopicA", 3, b"hello world".to_vec(), 1_700_000_000_123)
            .with_property(PROPERTY_TAGS, "tagA")
            .with_property(PROPERTY_KEYS, "k1 k2");
        m.flag = 7;
        m.reconsume_times = 2;
        m.prepared_transaction_offset = 99;
        m.born_host = "10.1.2.3:4567".parse().unwrap();
        if v6 {
            m.store_host = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, 10911, 0, 0));
        }
        m
    }

    fn encode(m: &MessageRecord, term: u64, idx: u64, phys: u64) -> Vec<u8> {
        let props = encode_properties(&m.properties);
        let len = encoded_len(m, &props).unwrap();
        let mut out = Vec::new();
        let at = Placement {
            term,
            log_index: idx,
            entry_remaining: 0,
            physical_offset: phys,
        };
        encode_into(&mut out, m, &props, len, at);
        out
    }

    #[test]
    fn round_trips_every_field() {
        for v6 in [false, true] {
            let m = sample(v6);
            let bytes = encode(&m, 5, 42, 4096);
            let v = RecordView::parse(&bytes).unwrap();
            assert_eq!(
                (v.term(), v.log_index(), v.physical_offset()),
                (5, 42, 4096)
            );
            assert_eq!(v.property(PROPERTY_TAGS), Some("tagA"));
            let mut expect = m.clone();
            if v6 {
                expect.sys_flag |= SYSFLAG_STOREHOST_V6;
            }
            assert_eq!(v.to_record(), expect);
        }
    }

    #[test]
    fn crc_does_not_depend_on_the_physical_offset() {
        let a = RecordView::parse(&encode(&sample(false), 1, 1, 0))
            .unwrap()
            .crc();
        let b = RecordView::parse(&encode(&sample(false), 1, 1, 777))
            .unwrap()
            .crc();
        assert_eq!(a, b);
    }

    #[test]
    fn any_flipped_bit_outside_the_physical_offset_is_detected() {
        let bytes = encode(&sample(false), 1, 1, 0);
        for i in 0..bytes.len() * 8 {
            if (pos::PHYSICAL_OFFSET * 8..(pos::PHYSICAL_OFFSET + 8) * 8).contains(&i) {
                continue;
            }
            let mut b = bytes.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(
                RecordView::parse(&b).is_err(),
                "flip of bit {i} went unnoticed"
            );
        }
    }

    #[test]
    fn a_re_view_of_checked_bytes_skips_only_the_crc() {
        let mut bytes = encode(&sample(false), 1, 1, 0);
        let last = bytes.len() - 1;
        bytes[last] ^= 1; // inside the properties: CRC now wrong, bounds still fine
        assert!(RecordView::parse(&bytes).is_err());
        assert!(RecordView::parse_checked_before(&bytes).is_ok());
        assert!(
            RecordView::parse_checked_before(&bytes[..last]).is_err(),
            "bounds are still checked"
        );
    }

    #[test]
    fn header_parsing() {
        assert_eq!(parse_header(&[0; 8], 100), Ok(Header::End));
        let mut h = [0u8; 8];
        h[..4].copy_from_slice(&100i32.to_be_bytes());
        h[4..].copy_from_slice(&MAGIC_BLANK.to_be_bytes());
        assert_eq!(parse_header(&h, 100), Ok(Header::Blank { len: 100 }));
        assert!(parse_header(&h, 101).is_err());
        assert!(parse_header(&h, 99).is_err());
    }

    #[test]
    fn java_hash_matches_java() {
        // Values from java.lang.String.hashCode().
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("TagA"), 2598919);
        assert_eq!(java_string_hash("hello world"), 1794106052);
        assert_eq!(tag_hash(None), 0);
    }

    #[test]
    fn properties_round_trip() {
        let m = sample(false);
        let s = encode_properties(&m.properties);
        assert_eq!(decode_properties(&s), m.properties);
        assert_eq!(find_property(&s, PROPERTY_KEYS), Some("k1 k2"));
        assert_eq!(find_property(&s, "nope"), None);
    }
}
