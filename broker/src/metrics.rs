//! A broker node's Prometheus metrics, served at `GET /metrics` on
//! `metrics_addr` ([`ledgermq_namesrv::metrics::serve_metrics`]).
//!
//! RocketMQ 5's names where RocketMQ has the metric
//! (<https://rocketmq.apache.org/docs/observability/01metrics>), with its
//! labels; every metric carries the constant labels `cluster`,
//! `node_type="broker"`, `broker_group` and `node_id` (`<group>-<member id>`).
//! A send is counted by the node that took it from the client (a follower
//! passes it on through Raft; the leader does not count it again); a receive a
//! follower relays is counted by the leader that served it; a call is timed by
//! the node the client called, relay included (not again where it was relayed).
//!
//! - `rocketmq_messages_in_total{topic,message_type}`,
//!   `rocketmq_throughput_in_total{topic,message_type}` (body bytes) and the
//!   histogram `rocketmq_message_size{topic,message_type}` (bytes): messages
//!   whose send was answered OK;
//! - `rocketmq_messages_out_total{topic,consumer_group}`,
//!   `rocketmq_throughput_out_total{topic,consumer_group}`: messages handed to
//!   consumers (gRPC receive, 4.x pull; at most [`MAX_OUT_SERIES`] pairs,
//!   then `consumer_group="_overflow"`);
//! - `rocketmq_rpc_latency{protocol_type,request_code,response_code}` (ms,
//!   histogram): `grpc_v2` calls by method and gRPC status, `remoting` requests
//!   by request and response code (a method or request code the node does not
//!   serve: `other`);
//! - read at each scrape: `rocketmq_consumer_lag_messages{topic,consumer_group}`
//!   (queue ends minus committed consumer offsets; the leader only, so a sum
//!   over nodes counts each group once), `rocketmq_topic_number`,
//!   `rocketmq_consumer_group_number`, `rocketmq_storage_size` (bytes under the
//!   store root, measured at most every 30 s), `ledgermq_store_disk_used_ratio`;
//! - Raft, read at each scrape: `ledgermq_raft_role{role}` (1 for this node's
//!   role), `ledgermq_raft_term`, `ledgermq_raft_last_log_index`,
//!   `ledgermq_raft_applied_index`, `ledgermq_raft_apply_lag_entries` (last log
//!   index minus applied index; openraft 0.9 does not report the commit index,
//!   which lies between them), and on the leader
//!   `ledgermq_raft_follower_match_index{follower}` and
//!   `ledgermq_raft_follower_lag_entries{follower}`; counted as they happen:
//!   `ledgermq_raft_term_changes_total` (elections seen) and
//!   `ledgermq_raft_leader_changes_total`;
//! - `ledgermq_store_flush_latency_ms` (histogram): each CommitLog fsync.

use std::path::Path;
use std::time::Duration;

pub mod scrape;

use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

/// Milliseconds buckets of latency histograms.
const LATENCY_MS_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 3000.0, 10000.0,
];
/// RocketMQ's message size buckets: 1 KiB, 4 KiB, 512 KiB, 1, 2 and 4 MiB.
const SIZE_BUCKETS: &[f64] = &[
    1024.0,
    4096.0,
    524_288.0,
    1_048_576.0,
    2_097_152.0,
    4_194_304.0,
];

/// Most distinct (topic, consumer group) pairs the out counters keep: a 4.x
/// pull names any group it likes, and every series is kept for good. Past it,
/// the group is labelled `_overflow`.
pub const MAX_OUT_SERIES: usize = 10_000;

/// Every metric of one broker node (see the module docs).
pub struct BrokerMetrics {
    registry: Registry,
    out_series: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
    /// Held by a scrape from its first gauge reset to its encoding; when the
    /// store size was last measured.
    pub(crate) scrape_lock: std::sync::Mutex<Option<std::time::Instant>>,
    messages_in: IntCounterVec,
    throughput_in: IntCounterVec,
    message_size: HistogramVec,
    messages_out: IntCounterVec,
    throughput_out: IntCounterVec,
    rpc_latency: HistogramVec,
    flush_latency: Histogram,
    pub(crate) term_changes: IntCounter,
    pub(crate) leader_changes: IntCounter,
    pub(crate) consumer_lag: IntGaugeVec,
    pub(crate) topic_number: IntGauge,
    pub(crate) group_number: IntGauge,
    pub(crate) storage_size: IntGauge,
    pub(crate) disk_used_ratio: Gauge,
    pub(crate) raft_role: IntGaugeVec,
    pub(crate) raft_term: IntGauge,
    pub(crate) raft_last_log_index: IntGauge,
    pub(crate) raft_applied_index: IntGauge,
    pub(crate) raft_apply_lag: IntGauge,
    pub(crate) follower_match_index: IntGaugeVec,
    pub(crate) follower_lag: IntGaugeVec,
}

impl BrokerMetrics {
    /// The metrics of member `node_id` of `broker_group` in `cluster`.
    pub fn new(cluster: &str, broker_group: &str, node_id: u64) -> Self {
        let registry = Registry::new_custom(
            None,
            Some(
                [
                    ("cluster".to_string(), cluster.to_string()),
                    ("node_type".to_string(), "broker".to_string()),
                    ("broker_group".to_string(), broker_group.to_string()),
                    ("node_id".to_string(), format!("{broker_group}-{node_id}")),
                ]
                .into(),
            ),
        )
        .expect("valid constant labels");
        let reg = |c: Box<dyn prometheus::core::Collector>| {
            registry.register(c).expect("metric names are unique");
        };
        let counters = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            reg(Box::new(c.clone()));
            c
        };
        let gauges = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
            reg(Box::new(g.clone()));
            g
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid metric");
            reg(Box::new(g.clone()));
            g
        };
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            reg(Box::new(c.clone()));
            c
        };
        let histograms = |name: &str, help: &str, buckets: &[f64], labels: &[&str]| {
            let h = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                labels,
            )
            .expect("valid metric");
            reg(Box::new(h.clone()));
            h
        };
        let in_labels = &["topic", "message_type"];
        let out_labels = &["topic", "consumer_group"];
        let flush_latency = Histogram::with_opts(
            HistogramOpts::new(
                "ledgermq_store_flush_latency_ms",
                "Duration of each CommitLog fsync, ms.",
            )
            .buckets(LATENCY_MS_BUCKETS.to_vec()),
        )
        .expect("valid metric");
        reg(Box::new(flush_latency.clone()));
        let disk_used_ratio = Gauge::new(
            "ledgermq_store_disk_used_ratio",
            "Used fraction of the disk holding the store.",
        )
        .expect("valid metric");
        reg(Box::new(disk_used_ratio.clone()));
        Self {
            out_series: Default::default(),
            scrape_lock: Default::default(),
            messages_in: counters(
                "rocketmq_messages_in_total",
                "Messages whose send was answered OK.",
                in_labels,
            ),
            throughput_in: counters(
                "rocketmq_throughput_in_total",
                "Body bytes of messages whose send was answered OK.",
                in_labels,
            ),
            message_size: histograms(
                "rocketmq_message_size",
                "Body size of messages sent, bytes.",
                SIZE_BUCKETS,
                in_labels,
            ),
            messages_out: counters(
                "rocketmq_messages_out_total",
                "Messages handed to consumers.",
                out_labels,
            ),
            throughput_out: counters(
                "rocketmq_throughput_out_total",
                "Body bytes of messages handed to consumers.",
                out_labels,
            ),
            rpc_latency: histograms(
                "rocketmq_rpc_latency",
                "Time to answer a client call, ms.",
                LATENCY_MS_BUCKETS,
                &["protocol_type", "request_code", "response_code"],
            ),
            flush_latency,
            term_changes: counter(
                "ledgermq_raft_term_changes_total",
                "Raft term changes this node saw (elections).",
            ),
            leader_changes: counter(
                "ledgermq_raft_leader_changes_total",
                "Changes of the leader this node knows.",
            ),
            consumer_lag: gauges(
                "rocketmq_consumer_lag_messages",
                "Messages not yet consumed by a consumer group (leader only).",
                out_labels,
            ),
            topic_number: gauge("rocketmq_topic_number", "Topics of this broker group."),
            group_number: gauge(
                "rocketmq_consumer_group_number",
                "Consumer groups of this broker group.",
            ),
            storage_size: gauge("rocketmq_storage_size", "Bytes under the store root."),
            disk_used_ratio,
            raft_role: gauges(
                "ledgermq_raft_role",
                "1 for this node's Raft role.",
                &["role"],
            ),
            raft_term: gauge("ledgermq_raft_term", "Current Raft term."),
            raft_last_log_index: gauge("ledgermq_raft_last_log_index", "Last log index."),
            raft_applied_index: gauge("ledgermq_raft_applied_index", "Last applied log index."),
            raft_apply_lag: gauge(
                "ledgermq_raft_apply_lag_entries",
                "Entries in the log not applied yet.",
            ),
            follower_match_index: gauges(
                "ledgermq_raft_follower_match_index",
                "Each follower's match index (leader only).",
                &["follower"],
            ),
            follower_lag: gauges(
                "ledgermq_raft_follower_lag_entries",
                "Entries each follower is behind the leader's last log index (leader only).",
                &["follower"],
            ),
            registry,
        }
    }

    /// Messages of `topic` (`message_type`: `normal`, `fifo`, `delay` or
    /// `transaction`) with bodies of `body_bytes` each, whose send was
    /// answered OK. One label lookup per metric, not per message.
    pub fn messages_in(
        &self,
        topic: &str,
        message_type: &str,
        body_bytes: impl IntoIterator<Item = usize>,
    ) {
        let labels = [topic, message_type];
        let size = self.message_size.with_label_values(&labels);
        let (mut count, mut bytes) = (0u64, 0u64);
        for b in body_bytes {
            size.observe(b as f64);
            count += 1;
            bytes += b as u64;
        }
        self.messages_in.with_label_values(&labels).inc_by(count);
        self.throughput_in.with_label_values(&labels).inc_by(bytes);
    }

    /// `count` messages of `topic` with `body_bytes` in all handed to
    /// consumer group `group` (`_overflow` once [`MAX_OUT_SERIES`] pairs are
    /// counted and this is a new one).
    pub fn messages_out(&self, topic: &str, group: &str, count: u64, body_bytes: u64) {
        let group = {
            let mut seen = self.out_series.lock().unwrap();
            let key = (topic.to_owned(), group.to_owned());
            if seen.contains(&key) || seen.len() < MAX_OUT_SERIES && seen.insert(key) {
                group
            } else {
                "_overflow"
            }
        };
        let labels = [topic, group];
        self.messages_out.with_label_values(&labels).inc_by(count);
        self.throughput_out
            .with_label_values(&labels)
            .inc_by(body_bytes);
    }

    /// Messages and body bytes counted in (sends answered OK) and out (handed
    /// to consumers) since start, over every label: `(in, in_bytes, out,
    /// out_bytes)`.
    pub fn totals(&self) -> (u64, u64, u64, u64) {
        let sum = |c: &IntCounterVec| -> u64 {
            prometheus::core::Collector::collect(c)
                .iter()
                .flat_map(|f| f.get_metric())
                .map(|m| m.get_counter().get_value() as u64)
                .sum()
        };
        (
            sum(&self.messages_in),
            sum(&self.throughput_in),
            sum(&self.messages_out),
            sum(&self.throughput_out),
        )
    }

    /// A client call answered after `took`.
    pub fn rpc(
        &self,
        protocol_type: &str,
        request_code: &str,
        response_code: &str,
        took: Duration,
    ) {
        self.rpc_latency
            .with_label_values(&[protocol_type, request_code, response_code])
            .observe(took.as_secs_f64() * 1000.0);
    }

    /// One CommitLog fsync that took `took`.
    pub fn flush(&self, took: Duration) {
        self.flush_latency.observe(took.as_secs_f64() * 1000.0);
    }

    /// The registry's text (after [`scrape::render`] set the gauges).
    pub fn encode(&self) -> String {
        ledgermq_namesrv::metrics::encode(&self.registry)
    }
}

/// Bytes of the regular files under `dir`, recursively (0 for what cannot be
/// read).
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample of `name` whose labels include all of `labels`.
    fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .find(|l| {
                labels
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }

    #[test]
    fn client_chosen_groups_cannot_grow_the_out_series_past_the_cap() {
        let m = BrokerMetrics::new("C", "g", 0);
        for i in 0..MAX_OUT_SERIES {
            m.messages_out("T", &format!("G{i}"), 1, 10);
        }
        m.messages_out("T", "one-too-many", 2, 20);
        m.messages_out("T", "G0", 1, 10);
        let text = m.encode();
        assert!(!text.contains("one-too-many"));
        let out = |g| {
            sample(
                &text,
                "rocketmq_messages_out_total",
                &[("consumer_group", g)],
            )
        };
        assert_eq!(out("_overflow"), Some(2.0));
        assert_eq!(out("G0"), Some(2.0));
    }

    #[test]
    fn a_send_is_counted_in_messages_bytes_and_size_with_the_node_labels() {
        let m = BrokerMetrics::new("C", "g", 1);
        m.messages_in("T", "fifo", [2000]);
        let text = m.encode();
        let l = [
            ("cluster", "C"),
            ("node_type", "broker"),
            ("broker_group", "g"),
            ("node_id", "g-1"),
            ("topic", "T"),
            ("message_type", "fifo"),
        ];
        assert_eq!(sample(&text, "rocketmq_messages_in_total", &l), Some(1.0));
        assert_eq!(
            sample(&text, "rocketmq_throughput_in_total", &l),
            Some(2000.0)
        );
        let le = |b| [l.as_slice(), &[("le", b)]].concat();
        assert_eq!(
            sample(&text, "rocketmq_message_size_bucket", &le("1024")),
            Some(0.0)
        );
        assert_eq!(
            sample(&text, "rocketmq_message_size_bucket", &le("4096")),
            Some(1.0)
        );
    }
}
