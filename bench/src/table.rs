//! `mqbench-compare`'s report: the machine, one table row per system, and the
//! ratios the goals of issue 7 are stated in.

use serde::{Deserialize, Serialize};

use crate::compare::System;
use crate::summary::Summary;

/// The machine everything ran on.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Machine {
    /// CPUs available to this process.
    pub cpus: usize,
    /// Total memory, GiB.
    pub mem_gib: f64,
    /// Kernel release.
    pub kernel: String,
}

impl Machine {
    /// Reads this machine's figures (from `/proc`).
    pub fn this() -> Self {
        let mem_kib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            })
            .unwrap_or(0.0);
        Self {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            mem_gib: mem_kib / 1024.0 / 1024.0,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
        }
    }
}

/// One system's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// `--systems` name.
    pub system: String,
    /// What an acknowledged send means there.
    pub durability: String,
    /// The run's summary, if it ran.
    pub summary: Option<Summary>,
    /// Why it did not run, if it did not.
    pub error: Option<String>,
}

/// A ratio of two systems' figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ratio {
    /// `ledgermq-async / nats, send msgs/s`.
    pub what: String,
    /// The ratio, when both ran.
    pub value: Option<f64>,
}

/// Everything `mqbench-compare` measured (also its `--json` output).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// The machine.
    pub machine: Machine,
    /// Rows, table order.
    pub rows: Vec<Row>,
    /// Ratios.
    pub ratios: Vec<Ratio>,
}

impl Report {
    /// The report of `rows`, with the ratios computed.
    pub fn new(machine: Machine, rows: Vec<Row>) -> Self {
        let get = |s: System| {
            rows.iter()
                .find(|r| r.system == s.name())
                .and_then(|r| r.summary.clone())
        };
        let mut ratios = Vec::new();
        for (a, b) in [
            (System::LedgerMqAsync, System::Nats),
            (System::LedgerMqSync, System::RabbitMq),
            (System::LedgerMqAsyncRemoting, System::Nats),
            (System::LedgerMqSyncRemoting, System::RabbitMq),
        ] {
            let (x, y) = (get(a), get(b));
            // At a fixed offered rate both sides send the same: no throughput
            // ratio then (compare their latency instead).
            let ratio = |f: fn(&Summary) -> f64| match (&x, &y) {
                (Some(x), Some(y))
                    if f(y) > 0.0 && x.rate_per_sec.is_none() && y.rate_per_sec.is_none() =>
                {
                    Some(f(x) / f(y))
                }
                _ => None,
            };
            ratios.push(Ratio {
                what: format!("{} / {}, send msgs/s", a.name(), b.name()),
                value: ratio(|s| s.send_msgs_per_s),
            });
            ratios.push(Ratio {
                what: format!("{} / {}, consume msgs/s", a.name(), b.name()),
                value: ratio(|s| s.recv_msgs_per_s),
            });
        }
        Self {
            machine,
            rows,
            ratios,
        }
    }

    /// The table for people.
    pub fn render(&self) -> String {
        let mut s = format!(
            "{:<23} {:<37} {:>6} {:>10} {:>8} {:>8} {:>8} {:>10} {:>7}\n",
            "system",
            "flush / durability",
            "size",
            "send msg/s",
            "MB/s",
            "p50 ms",
            "p99 ms",
            "cons msg/s",
            "errors"
        );
        for r in &self.rows {
            match (&r.summary, &r.error) {
                (Some(x), _) => {
                    s += &format!(
                        "{:<23} {:<37} {:>6} {:>10.0} {:>8.2} {:>8.2} {:>8.2} {:>10.0} {:>7}\n",
                        r.system,
                        r.durability,
                        x.body_bytes,
                        x.send_msgs_per_s,
                        x.send_mb_per_s,
                        x.send_latency_ms.p50,
                        x.send_latency_ms.p99,
                        x.recv_msgs_per_s,
                        x.errors.values().sum::<u64>()
                    );
                }
                (None, e) => {
                    s += &format!(
                        "{:<23} {:<37} FAILED: {}\n",
                        r.system,
                        r.durability,
                        e.as_deref().unwrap_or("?")
                    );
                }
            }
        }
        s += "\n";
        for r in &self.ratios {
            match r.value {
                Some(v) => s += &format!("{:<52} {v:>6.2}x\n", r.what),
                None => s += &format!("{:<52}    n/a\n", r.what),
            }
        }
        s += &format!(
            "\nOne machine: {} CPUs, {:.1} GiB, kernel {}. It runs everything: the 3 nodes of \
             each system (one system at a time) and the clients, over loopback.\n",
            self.machine.cpus, self.machine.mem_gib, self.machine.kernel
        );
        if let Some(x) = self.rows.iter().find_map(|r| r.summary.as_ref()) {
            s += &format!(
                "Load: {} producer(s) x window {} un-acked{}, {} consumer(s), {} B bodies, {:.0} s measured per system.\n",
                x.producers,
                x.window,
                x.rate_per_sec
                    .map_or_else(String::new, |r| format!(", {r} msgs/s offered")),
                x.consumers,
                x.body_bytes,
                x.seconds
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: System, send: f64) -> Row {
        Row {
            system: system.name().into(),
            durability: system.durability().into(),
            summary: Some(Summary {
                send_msgs_per_s: send,
                recv_msgs_per_s: send / 2.0,
                ..Default::default()
            }),
            error: None,
        }
    }

    #[test]
    fn ratios_pair_async_with_nats_and_sync_with_rabbitmq() {
        let r = Report::new(
            Machine::default(),
            vec![
                row(System::LedgerMqSync, 30.0),
                row(System::LedgerMqAsync, 40.0),
                row(System::Nats, 20.0),
            ],
        );
        assert_eq!(r.ratios[0].value, Some(2.0));
        assert_eq!(r.ratios[1].value, Some(2.0));
        assert_eq!(r.ratios[2].value, None);
        let text = r.render();
        assert!(text.contains("ledgermq-async / nats, send msgs/s"));
        assert!(text.contains("n/a"));
        assert_eq!("nats".parse::<System>().unwrap(), System::Nats);
        assert!("kafka".parse::<System>().is_err());
    }
}
