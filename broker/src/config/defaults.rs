//! Defaults of the broker configuration's keys, and the millisecond duration
//! reader (`*_ms` keys).

use std::time::Duration;

use serde::Deserialize;

pub(super) fn default_true() -> bool {
    true
}
pub(super) fn default_max_body_bytes() -> usize {
    4 << 20
}
pub(super) fn default_max_queues_per_topic() -> u32 {
    crate::broker::ServiceSettings::default().max_queues_per_topic
}
pub(super) fn default_max_consumer_groups() -> usize {
    crate::broker::ServiceSettings::default().max_consumer_groups
}
pub(super) fn default_max_broadcast_clients() -> usize {
    crate::broker::ServiceSettings::default().max_broadcast_clients_per_group
}
pub(super) fn default_broadcast_client_idle() -> Duration {
    Duration::from_millis(crate::broker::ServiceSettings::default().broadcast_client_idle_ms)
}

/// A duration written as whole milliseconds (the file's `*_ms` keys).
pub(super) fn millis<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    u64::deserialize(d).map(Duration::from_millis)
}
/// Writes a duration as its whole milliseconds (the `_ms` keys).
pub(super) fn ser_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
pub(super) fn default_max_delay() -> Duration {
    Duration::from_millis(crate::broker::ServiceSettings::default().max_delay_ms)
}
pub(super) fn default_max_messages_per_send() -> usize {
    crate::broker::ServiceSettings::default().max_messages_per_send
}
pub(super) fn default_telemetry_reply_buffer() -> usize {
    crate::broker::ServiceSettings::default().telemetry_reply_buffer
}

pub(super) fn default_transaction_timeout_ms() -> u64 {
    crate::broker::ServiceSettings::default().transaction_timeout_ms
}
pub(super) fn default_transaction_check_interval_ms() -> u64 {
    crate::broker::ServiceSettings::default().transaction_check_interval_ms
}
pub(super) fn default_transaction_check_max() -> u32 {
    crate::broker::ServiceSettings::default().transaction_check_max
}

pub(super) fn default_disk_space_warning_ratio() -> f64 {
    ledgermq_store::retention::RetentionConfig::default().disk_space_warning_ratio
}

pub(super) fn default_retention_interval() -> Duration {
    Duration::from_secs(10)
}

pub(super) fn default_disk_force_clean_ratio() -> f64 {
    ledgermq_store::retention::RetentionConfig::default().disk_force_clean_ratio
}

pub(super) fn default_flush() -> String {
    "sync".into()
}
pub(super) fn default_segment_bytes() -> u64 {
    ledgermq_store::commit_log::DEFAULT_SEGMENT_BYTES
}
pub(super) fn default_heartbeat() -> Duration {
    Duration::from_secs(3)
}
pub(super) fn default_raft_heartbeat() -> Duration {
    Duration::from_millis(ledgermq_raft::RaftTiming::default().heartbeat_interval_ms)
}
pub(super) fn default_election_min() -> Duration {
    Duration::from_millis(ledgermq_raft::RaftTiming::default().election_timeout_min_ms)
}
pub(super) fn default_election_max() -> Duration {
    Duration::from_millis(ledgermq_raft::RaftTiming::default().election_timeout_max_ms)
}

pub(super) fn default_file_reserved_time_hours() -> u64 {
    ledgermq_store::retention::RetentionConfig::default().file_reserved_time_hours
}

pub(super) fn default_delete_when_hour() -> u32 {
    ledgermq_store::retention::RetentionConfig::default().delete_when_hour
}

pub(super) fn default_disk_max_used_space_ratio() -> f64 {
    ledgermq_store::retention::RetentionConfig::default().disk_max_used_space_ratio
}

pub(super) fn default_topic_queue_count() -> u32 {
    crate::broker::ServiceSettings::default().default_queue_count
}
