//! The result of one run: throughput, latency percentiles and errors, printed for
//! people and written as JSON for `mqbench-compare` and scripts.
//!
//! MB is 10^6 bytes of message body (headers and protocol overhead not counted).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::runner::LoadSpec;
use crate::stats::{ms, Stats};

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest seen.
    pub max: f64,
    /// Values recorded.
    pub count: u64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            p50: ms(h.value_at_quantile(0.5)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            count: h.len(),
        }
    }
}

/// Everything a run measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Summary {
    /// The system (label given to the run).
    pub system: String,
    /// Body size in bytes.
    pub body_bytes: usize,
    /// Producer tasks.
    pub producers: usize,
    /// Consumer tasks.
    pub consumers: usize,
    /// Un-acknowledged sends per producer.
    pub window: usize,
    /// Offered load in messages per second (`None`: as fast as the window allows).
    pub rate_per_sec: Option<f64>,
    /// Seconds measured (after the warm-up, until the producers stopped).
    pub seconds: f64,
    /// Sends started while measuring.
    pub sent: u64,
    /// Sends acknowledged while measuring.
    pub acked: u64,
    /// Acknowledged sends per second.
    pub send_msgs_per_s: f64,
    /// Acknowledged body MB per second.
    pub send_mb_per_s: f64,
    /// Send latency: from handing the message to the client (or, with a rate, from
    /// its scheduled start) to its acknowledgment.
    pub send_latency_ms: Latency,
    /// Messages of this run received while measuring.
    pub received: u64,
    /// Received messages per second while measuring.
    pub recv_msgs_per_s: f64,
    /// Received body MB per second while measuring.
    pub recv_mb_per_s: f64,
    /// Messages of this run received in all, including the drain after sending.
    pub received_total: u64,
    /// Acknowledged sends (warm-up included) never received by the end of the drain.
    pub not_received: u64,
    /// Messages left by earlier runs that consumers received (and acked).
    pub stale_received: u64,
    /// End-to-end latency: from the producer's send to the consumer's receipt, for
    /// every message of the run received after the warm-up (drain included).
    pub e2e_latency_ms: Latency,
    /// Errors by kind.
    pub errors: BTreeMap<String, u64>,
}

impl Summary {
    /// Builds the summary at the end of a run measured for `secs` seconds, of which
    /// `received`/`received_bytes` were received while measuring.
    pub fn build(
        spec: &LoadSpec,
        stats: &Stats,
        secs: f64,
        received: u64,
        received_bytes: u64,
    ) -> Self {
        let secs = secs.max(1e-3);
        let acked = stats.acked.load(Ordering::Relaxed);
        let acked_all = stats.acked_all.load(Ordering::Relaxed);
        let received_total = stats.received_all.load(Ordering::Relaxed);
        let send_bytes = acked as f64 * spec.body_bytes.max(crate::payload::HEADER_BYTES) as f64;
        Self {
            system: spec.label.clone(),
            body_bytes: spec.body_bytes,
            producers: spec.producers,
            consumers: spec.consumers,
            window: spec.window,
            rate_per_sec: spec.rate_per_sec,
            seconds: secs,
            sent: stats.sent.load(Ordering::Relaxed),
            acked,
            send_msgs_per_s: acked as f64 / secs,
            send_mb_per_s: send_bytes / secs / 1e6,
            send_latency_ms: Latency::of(&stats.send_histogram()),
            received,
            recv_msgs_per_s: received as f64 / secs,
            recv_mb_per_s: received_bytes as f64 / secs / 1e6,
            received_total,
            not_received: acked_all.saturating_sub(received_total),
            stale_received: stats.stale.load(Ordering::Relaxed),
            e2e_latency_ms: Latency::of(&stats.e2e_histogram()),
            errors: stats.errors(),
        }
    }

    /// The summary for people.
    pub fn render(&self) -> String {
        let lat = |l: &Latency| {
            format!(
                "p50 {:.2}  p99 {:.2}  p999 {:.2}  max {:.2}",
                l.p50, l.p99, l.p999, l.max
            )
        };
        let mut s = format!(
            "== {}: {} producer(s) x window {}{}, {} consumer(s), {} B bodies, {:.1} s measured ==\n",
            self.system,
            self.producers,
            self.window,
            self.rate_per_sec
                .map_or_else(String::new, |r| format!(" at {r} msgs/s offered")),
            self.consumers,
            self.body_bytes,
            self.seconds
        );
        s += &format!(
            "sends     {} acked of {} started: {:.0} msgs/s, {:.2} MB/s; latency ms {}\n",
            self.acked,
            self.sent,
            self.send_msgs_per_s,
            self.send_mb_per_s,
            lat(&self.send_latency_ms)
        );
        s += &format!(
            "receives  {}: {:.0} msgs/s, {:.2} MB/s; end-to-end ms {}\n",
            self.received,
            self.recv_msgs_per_s,
            self.recv_mb_per_s,
            lat(&self.e2e_latency_ms)
        );
        s += &format!(
            "drain     {} received in all; {} acknowledged never received; {} stale from earlier runs\n",
            self.received_total, self.not_received, self.stale_received
        );
        if self.errors.is_empty() {
            s += "errors    none\n";
        } else {
            s += "errors\n";
            for (k, n) in &self.errors {
                s += &format!("  {n:>8}  {k}\n");
            }
        }
        s
    }

    /// Writes `items` (one summary or a list) as pretty JSON to `path`.
    pub fn write_json<T: Serialize + ?Sized>(path: &Path, items: &T) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(items)?;
        std::fs::write(path, text + "\n")?;
        Ok(())
    }
}
