//! Format versions of what a node stores outside its CommitLog: the rows of its
//! metadata store (sled) and the snapshots (stored, and sent to followers).
//! Plain functions: no I/O.
//!
//! **Envelope.** Every value this release stores is written as the ten bytes
//! [`MAGIC`] (`0xff` each), one byte of format version, then the value's bytes in
//! that version's layout: postcard for every value but a consumer offset, which is
//! its 8 bytes big-endian. A value without the envelope was written by an earlier
//! release (commit 44a2fd3 and before; `tests/fixtures/store-44a2fd3`) and is read
//! as version 1, whose layout is exactly what those releases wrote. Every stored
//! postcard value begins with a varint (a length, an enum's variant, an integer)
//! or with an `Option`'s tag (0 or 1), and ten bytes with the continuation bit
//! set are no varint postcard writes or reads (a u64 takes at most ten, the last
//! without it), nor a tag: so the magic never begins an earlier release's value,
//! and an earlier release's decoder refuses an enveloped value instead of
//! misreading it (postcard also reads non-minimal varints, so a shorter magic such
//! as `0x80 0x00` would read as 0). A consumer offset was exactly 8 bytes; an
//! earlier release skips the 19-byte enveloped ones, but it fails before it reads
//! them, on the enveloped `last_purged` and `last_applied`.
//!
//! **Versions.** Version 1 is the layout of the types as they are now. A type
//! that changes (a field added to `TopicConfig`, say) gets a new version: values
//! are then written in it, and the decoder reads 1 by converting. Version 2
//! ([`V2_TAIL`]) is version 1's bytes followed by more: a snapshot holding
//! consumer groups' retry policies or delivery attempts carries them there
//! ([`encode_with_tail`]);
//! a snapshot without any is still written as 1, which earlier releases read.
//! Version numbers are shared by every stored type: 2 is taken, so the next
//! type whose layout changes gets 3.
//! A version above the highest this release reads for the value ([`CURRENT`]
//! for a value with a tail, [`V1`] for any other) is refused with
//! [`RaftNodeError::FormatTooNew`], so a node never misreads it.
//!
//! **The log.** Commands travel in Raft entries, which are never rewritten. Their
//! encoding (`crate::codec::SystemPayload`, postcard) is versioned by variant:
//! variants are only appended, and a variant's layout never changes (a changed
//! command is a new variant). The golden-byte tests below pin every variant's
//! bytes as this release writes them. A member of an earlier release cannot
//! decode a variant appended after its time, so new variants form a new log
//! command set ([`LOG_COMMANDS`]) that a leader uses only once every member
//! decodes it.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::RaftNodeError;

/// The log command set this release decodes: 1 is every [`crate::types::Command`]
/// variant through `PurgeThrough` (what releases before it decode), 2 adds
/// `FifoLeasesTimed`, 3 adds the MIXED topic message type (in `UpdateTopic` and
/// `EnsureTopic`), 4 adds `ResetOffsets`, 5 transactional messages (no command:
/// [`SET_TRANSACTIONS`]), 6 `UpdateGroupWithRetryPolicy`
/// ([`SET_GROUP_RETRY_POLICIES`]), 7 `DeliveryAttempts`
/// ([`SET_DELIVERY_ATTEMPTS`]), 8 `FifoBatchLeases` ([`SET_FIFO_BATCHES`]),
/// 9 the users and permissions (`PutAclUser`, `SetAclPerm`, `DeleteAclUser`:
/// [`SET_ACL`]); `Command::log_command_set` names a
/// command's set. A member tells its leader in every AppendEntries answer
/// ([`LOG_COMMANDS_HEADER`]; an answer without it comes from an earlier release,
/// counted as set 1, though one from before `PurgeThrough` decodes less),
/// and a leader writes a command of a set only when every member decodes it
/// (`crate::peer_formats`), so a group upgraded one member at a time never
/// replicates an entry a member cannot read; `DeliveryAttempts` and
/// `FifoBatchLeases` alone are written past a member that is down (or silent for `writer::MEMBERS_ANSWER_WAIT` in
/// the term): a member of an earlier release that comes back after it stops
/// there, so upgrade a member before it rejoins.
pub const LOG_COMMANDS: u8 = 9;
/// The log command set that brings `Command::FifoLeasesTimed`.
pub const SET_TIMED_FIFO_LEASES: u8 = 2;
/// The log command set that brings topics of type `TopicMessageType::Mixed`.
pub const SET_MIXED_TOPICS: u8 = 3;
/// The log command set that brings `Command::ResetOffsets` (rewinding a group).
pub const SET_RESET_OFFSETS: u8 = 4;
/// The log command set that brings transactional messages: no command, but
/// message records a member must apply as this release does (half messages
/// in the store's half index, and a commit copy placed only if it is the first
/// end of its half: `ledgermq_store::half_index`). A leader refuses half messages
/// ([`ledgermq_store::half_index::HALF_TOPIC`]) while a member says it decodes
/// only an earlier set (`crate::writer`, `PeerFormats::no_member_says_below`: a
/// member that is down does not stop them).
pub const SET_TRANSACTIONS: u8 = 5;
/// The log command set that brings `Command::UpdateGroupWithRetryPolicy` (a
/// consumer group's retry policy). A member of an earlier set has no policies,
/// so a snapshot holds some (format [`V2_TAIL`]) only once every member
/// decodes this set.
pub const SET_GROUP_RETRY_POLICIES: u8 = 6;
/// The log command set that brings `Command::DeliveryAttempts` (a clustering
/// group's delivery attempts, replicated). Written by the weaker rule (no
/// member said it decodes less), so they may reach a snapshot (format
/// [`V2_TAIL`]) while a member is down: a member of an earlier release refuses
/// it (`FormatTooNew`) rather than misreading it.
pub const SET_DELIVERY_ATTEMPTS: u8 = 7;
/// The log command set that brings `Command::FifoBatchLeases` (a FIFO queue's
/// deliveries in flight, as one lease). Written by the weaker rule, as
/// [`SET_DELIVERY_ATTEMPTS`], so they may reach a snapshot (format
/// [`V3_TAIL`]) while a member is down: a member of an earlier release refuses
/// it (`FormatTooNew`) rather than misreading it.
pub const SET_FIFO_BATCHES: u8 = 8;
/// The log command set that brings the users and their permissions
/// (`Command::PutAclUser`, `SetAclPerm`, `DeleteAclUser`), written only once
/// every member decodes it, so a snapshot holds users (format [`V4_TAIL`])
/// only then.
pub const SET_ACL: u8 = 9;
/// What log command set `set` brings, for messages.
pub fn set_brings(set: u8) -> &'static str {
    match set {
        1 => "the first commands",
        SET_TIMED_FIFO_LEASES => "timed FIFO leases",
        SET_MIXED_TOPICS => "topics of message.type MIXED",
        SET_RESET_OFFSETS => "consumer offset resets",
        SET_TRANSACTIONS => "transactional messages",
        SET_GROUP_RETRY_POLICIES => "consumer group retry policies",
        SET_DELIVERY_ATTEMPTS => "delivery attempts",
        SET_FIFO_BATCHES => "FIFO batch leases",
        SET_ACL => "users and permissions (ACLs)",
        _ => "unknown to this release",
    }
}

/// The gRPC response header (ASCII decimal) that carries [`LOG_COMMANDS`].
pub const LOG_COMMANDS_HEADER: &str = "ledgermq-log-commands";

/// The bytes that begin every enveloped value: no postcard varint or tag.
pub const MAGIC: [u8; 10] = [0xff; 10];
/// The format version of every value whose layout has not changed: what
/// [`encode`] writes.
pub const V1: u8 = 1;
/// Version 1's bytes followed by a tail ([`encode_with_tail`]).
pub const V2_TAIL: u8 = 2;
/// Version 1's bytes followed by a longer tail, whose layout starts with
/// version 2's ([`encode_with_tail_version`]).
pub const V3_TAIL: u8 = 3;
/// Version 3's bytes with a longer tail, whose layout starts with version 3's
/// ([`encode_with_tail_version`]).
pub const V4_TAIL: u8 = 4;
/// The highest format version this release reads.
pub const CURRENT: u8 = V4_TAIL;

/// A stored value's version and its bytes in that version's layout.
fn open_envelope(bytes: &[u8]) -> (u8, &[u8]) {
    match bytes.strip_prefix(&MAGIC[..]) {
        Some([version, rest @ ..]) => (*version, rest),
        // Written before the envelope: version 1's layout.
        _ => (1, bytes),
    }
}

/// Refuses version 0 (`MetadataDamaged`) and versions above `supported`
/// (`FormatTooNew`), the highest this release reads for the value.
fn check_version(what: &str, version: u8, supported: u8) -> Result<(), RaftNodeError> {
    if version == 0 {
        return Err(RaftNodeError::MetadataDamaged(format!(
            "{what} has format version 0, which no release writes"
        )));
    }
    if version > supported {
        return Err(RaftNodeError::FormatTooNew {
            what: what.to_owned(),
            version,
            supported,
        });
    }
    Ok(())
}

fn envelope(version: u8, capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + 1 + capacity);
    out.extend_from_slice(&MAGIC);
    out.push(version);
    out
}

/// `value` in format [`V1`]: the envelope, then its postcard encoding.
/// Errors: `Codec` if postcard cannot encode it.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, RaftNodeError> {
    Ok(postcard::to_extend(value, envelope(V1, 64))?)
}

/// `value` with `tail` after it, in format [`V2_TAIL`]: the envelope, `value`'s
/// postcard encoding (version 1's layout), then `tail`'s. Errors: `Codec`.
pub fn encode_with_tail<T: Serialize, U: Serialize>(
    value: &T,
    tail: &U,
) -> Result<Vec<u8>, RaftNodeError> {
    encode_with_tail_version(V2_TAIL, value, tail)
}

/// `value` with `tail` after it in format `version` ([`V2_TAIL`] to
/// [`V4_TAIL`]): the envelope, `value`'s postcard encoding (version 1's
/// layout), then `tail`'s (that version's tail layout). Errors: `Codec`.
pub fn encode_with_tail_version<T: Serialize, U: Serialize>(
    version: u8,
    value: &T,
    tail: &U,
) -> Result<Vec<u8>, RaftNodeError> {
    debug_assert!((V2_TAIL..=V4_TAIL).contains(&version));
    let out = postcard::to_extend(value, envelope(version, 64))?;
    Ok(postcard::to_extend(tail, out)?)
}

/// Decodes a value [`encode`] or [`encode_with_tail`] wrote (or an earlier
/// release's, without the envelope): the value and, for format [`V2_TAIL`], its
/// tail; `what` names it in errors. Errors: as [`decode`]; `Codec` also when a
/// version 2 value's tail does not decode.
pub fn decode_with_tail<T: DeserializeOwned, U: DeserializeOwned>(
    what: &str,
    bytes: &[u8],
) -> Result<(T, Option<U>), RaftNodeError> {
    let (version, body) = open_envelope(bytes);
    check_version(what, version, V2_TAIL)?;
    if version < V2_TAIL {
        return Ok((postcard::from_bytes(body)?, None));
    }
    let (value, rest) = postcard::take_from_bytes(body)?;
    Ok((value, Some(postcard::from_bytes(rest)?)))
}

/// A value and its tail as [`decode_with_tail`] reads them, for a value that
/// has a tail layout per format version up to [`V4_TAIL`]: the value, the
/// format version, and the tail's bytes (empty below [`V2_TAIL`]), which the
/// caller decodes in that version's layout. Errors: as [`decode`].
pub fn decode_versioned_tail<'a, T: DeserializeOwned>(
    what: &str,
    bytes: &'a [u8],
) -> Result<(T, u8, &'a [u8]), RaftNodeError> {
    let (version, body) = open_envelope(bytes);
    check_version(what, version, V4_TAIL)?;
    if version < V2_TAIL {
        return Ok((postcard::from_bytes(body)?, version, &[]));
    }
    let (value, rest) = postcard::take_from_bytes(body)?;
    Ok((value, version, rest))
}

/// Decodes a stored value [`encode`] wrote (or an earlier release's, without
/// the envelope); `what` names it in errors. Errors: `FormatTooNew` for a
/// version above [`V1`] (a later format, or a value with a tail, which only
/// [`decode_with_tail`] reads), `MetadataDamaged` for version 0, `Codec` when
/// the bytes do not decode.
pub fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, RaftNodeError> {
    let (version, body) = open_envelope(bytes);
    check_version(what, version, V1)?;
    Ok(postcard::from_bytes(body)?)
}

/// A consumer offset in the current format (19 bytes: the envelope, then the
/// offset big-endian).
pub fn encode_offset(offset: u64) -> Vec<u8> {
    let mut out = envelope(V1, 8);
    out.extend_from_slice(&offset.to_be_bytes());
    out
}

/// Decodes a stored consumer offset: 8 bytes big-endian (written before the
/// envelope) or an envelope around them. Errors: `FormatTooNew`; `MetadataDamaged`
/// when the bytes are not an offset (or claim version 0).
pub fn decode_offset(bytes: &[u8]) -> Result<u64, RaftNodeError> {
    let (version, body) = match bytes.len() {
        8 => (1, bytes),
        _ => open_envelope(bytes),
    };
    check_version("consumer offset", version, V1)?;
    <[u8; 8]>::try_from(body)
        .map(u64::from_be_bytes)
        .map_err(|_| {
            RaftNodeError::MetadataDamaged(format!(
                "a consumer offset row holds {} bytes",
                bytes.len()
            ))
        })
}

#[cfg(test)]
mod tests;
