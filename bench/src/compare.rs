//! `mqbench-compare`'s systems: start one on loopback, run the load against it
//! with the shared [`runner`](crate::runner), stop it.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ledgermq_testkit::bin;
use ledgermq_testkit::cluster::{ClusterOptions, LocalCluster};

use crate::ledgermq::LedgerMq;
use crate::nats::Nats;
use crate::peers::nats::NatsCluster;
use crate::peers::rabbit::RabbitCluster;
use crate::rabbit::Rabbit;
use crate::remoting::{route_addrs, LedgerMqRemoting};
use crate::runner::{run, LoadSpec};
use crate::summary::Summary;

/// A system of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    /// LedgerMQ 3-node group, SYNC_FLUSH (majority fsynced before the answer).
    LedgerMqSync,
    /// LedgerMQ 3-node group, ASYNC_FLUSH (majority has it in page cache).
    LedgerMqAsync,
    /// As [`System::LedgerMqSync`], over the 4.x remoting protocol.
    LedgerMqSyncRemoting,
    /// As [`System::LedgerMqAsync`], over the 4.x remoting protocol.
    LedgerMqAsyncRemoting,
    /// NATS JetStream, 3 nodes, file storage, replicas 3.
    Nats,
    /// RabbitMQ quorum queue on 3 nodes.
    RabbitMq,
}

impl System {
    /// Every system, in table order.
    pub const ALL: [System; 6] = [
        System::LedgerMqSync,
        System::LedgerMqAsync,
        System::LedgerMqSyncRemoting,
        System::LedgerMqAsyncRemoting,
        System::Nats,
        System::RabbitMq,
    ];

    /// Name as given to `--systems`.
    pub fn name(self) -> &'static str {
        match self {
            System::LedgerMqSync => "ledgermq-sync",
            System::LedgerMqAsync => "ledgermq-async",
            System::LedgerMqSyncRemoting => "ledgermq-sync-remoting",
            System::LedgerMqAsyncRemoting => "ledgermq-async-remoting",
            System::Nats => "nats",
            System::RabbitMq => "rabbitmq",
        }
    }

    /// What an acknowledged send means on this system.
    pub fn durability(self) -> &'static str {
        match self {
            System::LedgerMqSync | System::LedgerMqSyncRemoting => {
                "SYNC_FLUSH: fsynced on a majority"
            }
            System::LedgerMqAsync | System::LedgerMqAsyncRemoting => {
                "ASYNC_FLUSH: majority page cache"
            }
            System::Nats => "JetStream R3 file: quorum page cache",
            System::RabbitMq => "quorum queue: fsynced on a majority",
        }
    }
}

impl FromStr for System {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        System::ALL
            .into_iter()
            .find(|x| x.name() == s.trim())
            .with_context(|| {
                format!(
                    "unknown system {s:?}: ledgermq-sync, ledgermq-async, \
                     ledgermq-sync-remoting, ledgermq-async-remoting, nats, rabbitmq"
                )
            })
    }
}

/// Checks up front that what `system` needs is installed (a clear error naming
/// the build command or the Debian package if not).
pub fn check_installed(system: System) -> Result<()> {
    use crate::peers::proc::find_binary;
    match system {
        System::LedgerMqSync
        | System::LedgerMqAsync
        | System::LedgerMqSyncRemoting
        | System::LedgerMqAsyncRemoting => {
            for b in ["mqbroker", "mqnamesrv", "mqadmin"] {
                bin(b).map_err(|e| {
                    anyhow::anyhow!(
                        "{e}; build them with `cargo build --release -p ledgermq-broker -p ledgermq-namesrv` \
                         (or set LEDGERMQ_BIN_DIR)"
                    )
                })?;
            }
        }
        System::Nats => {
            find_binary("nats-server", &["/usr/sbin", "/usr/bin"], "nats-server")?;
        }
        System::RabbitMq => {
            let dirs = &["/usr/lib/rabbitmq/bin", "/usr/sbin"];
            find_binary("rabbitmq-server", dirs, "rabbitmq-server")?;
            find_binary("rabbitmqctl", dirs, "rabbitmq-server")?;
        }
    }
    Ok(())
}

/// Starts `system` with its files under `dir`, runs `spec` (its label replaced by
/// the system's name) and stops it.
pub async fn run_system(system: System, spec: &LoadSpec, dir: &Path) -> Result<Summary> {
    let spec = LoadSpec {
        label: system.name().to_owned(),
        ..spec.clone()
    };
    match system {
        System::LedgerMqSync => run_ledgermq("sync", false, spec, dir).await,
        System::LedgerMqAsync => run_ledgermq("async", false, spec, dir).await,
        System::LedgerMqSyncRemoting => run_ledgermq("sync", true, spec, dir).await,
        System::LedgerMqAsyncRemoting => run_ledgermq("async", true, spec, dir).await,
        System::Nats => run_nats(spec, dir).await,
        System::RabbitMq => run_rabbit(spec, dir).await,
    }
}

async fn run_ledgermq(flush: &str, remoting: bool, spec: LoadSpec, dir: &Path) -> Result<Summary> {
    let opts = ClusterOptions {
        flush: flush.into(),
        remoting,
        ..ClusterOptions::default()
    };
    println!(
        "[{}] starting a 3-node LedgerMQ group (flush {flush})",
        spec.label
    );
    let cluster = LocalCluster::start(dir, &opts)
        .await
        .context("starting the LedgerMQ cluster")?;
    let leader = cluster
        .wait_leader("broker-a", Duration::from_secs(20))
        .await?;
    // Producer 0 and consumer 0 talk to the leader, as on the other systems.
    let first = cluster.nodes[leader].client_addr.clone();
    let mut endpoints = vec![first.clone()];
    endpoints.extend(
        cluster
            .client_addrs("broker-a")
            .into_iter()
            .filter(|a| *a != first),
    );
    let driver = LedgerMq {
        endpoints,
        topic: "BenchTopic".into(),
        group: "BenchGroup".into(),
        fifo: false,
        delay_ms: None,
        deliver_at_ms: None,
        call_timeout: Duration::from_secs(10),
        tls_ca: None,
        credentials: None,
    };
    driver.create(8).await?;
    let driver: Arc<dyn crate::runner::Driver> = if remoting {
        // The name server learns the topic with the next announcements.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let addrs = route_addrs(&cluster.namesrv_addr, "BenchTopic").await?;
        Arc::new(LedgerMqRemoting {
            addrs,
            topic: "BenchTopic".into(),
            group: "BenchGroup".into(),
            queues: 8,
            call_timeout: Duration::from_secs(10),
        })
    } else {
        Arc::new(driver)
    };
    let label = spec.label.clone();
    let whole_run = spec.warmup.is_zero();
    let pid = cluster.nodes[leader].pid();
    let pids: Vec<u32> = cluster.nodes.iter().filter_map(|n| n.pid()).collect();
    let all_cpu = |pids: &[u32]| pids.iter().filter_map(|&p| cpu_time_us(p)).sum::<u64>();
    let all_before = all_cpu(&pids);
    let before = pid.and_then(cpu_time_us);
    let summary = run(driver, spec).await;
    print_nodes_cpu(
        &label,
        all_cpu(&pids).saturating_sub(all_before),
        &summary,
        whole_run,
    );
    let after = pid.and_then(cpu_time_us);
    if let (Some(b), Some(a)) = (before, after) {
        let cpu_us = a.saturating_sub(b);
        if whole_run && summary.acked > 0 {
            println!(
                "[{label}] leader (node {leader}) CPU: {:.1} µs per acknowledged send \
                 ({:.2} s of CPU over {} sends, consuming included)",
                cpu_us as f64 / summary.acked as f64,
                cpu_us as f64 / 1e6,
                summary.acked
            );
        } else {
            println!(
                "[{label}] leader (node {leader}) CPU: {:.2} s over the run, warm-up \
                 included (--warmup-secs 0 gives it per acknowledged send)",
                cpu_us as f64 / 1e6
            );
        }
    }
    drop(cluster);
    Ok(summary)
}

/// Prints the three nodes' CPU time per acknowledged send, `cpu_us` being what
/// they used over the run; only for a run with no warm-up (`whole_run`), whose
/// every acknowledged send the CPU time covers.
fn print_nodes_cpu(label: &str, cpu_us: u64, summary: &Summary, whole_run: bool) {
    if whole_run && summary.acked > 0 {
        println!(
            "[{label}] all three nodes' CPU: {:.1} µs per acknowledged send",
            cpu_us as f64 / summary.acked as f64
        );
    }
}

/// Runs `spec` with `driver`, and prints the CPU time the servers in process
/// groups `groups` used per acknowledged send.
async fn run_counting_groups(
    driver: Arc<dyn crate::runner::Driver>,
    spec: LoadSpec,
    groups: &[u32],
) -> Summary {
    let (label, whole_run) = (spec.label.clone(), spec.warmup.is_zero());
    let before = group_cpu_time_us(groups);
    let summary = run(driver, spec).await;
    let used = group_cpu_time_us(groups).saturating_sub(before);
    print_nodes_cpu(&label, used, &summary, whole_run);
    summary
}

/// CPU time (user + system) used so far by every live process whose process
/// group is one of `groups`, in µs, from `/proc/*/stat` (field 5 is the group;
/// proc(5)). A process that exited is not counted.
pub fn group_cpu_time_us(groups: &[u32]) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // Field 5 (the process group) is the third after the parenthesised name.
            stat.rfind(')')
                .and_then(|i| stat[i + 2..].split_whitespace().nth(2)?.parse::<u32>().ok())
                .is_some_and(|g| groups.contains(&g))
        })
        .filter_map(cpu_time_us)
        .sum()
}

/// CPU time (user + system, every thread) process `pid` has used so far, in µs,
/// from `/proc/PID/stat` (fields 14 and 15, clock ticks; proc(5)); None if it
/// cannot be read.
pub fn cpu_time_us(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3, so fields 14 and 15 are at 11 and 12.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks * 1_000_000 / hz as u64)
}

async fn run_nats(spec: LoadSpec, dir: &Path) -> Result<Summary> {
    println!("[{}] starting a 3-node NATS JetStream cluster", spec.label);
    let mut cluster = NatsCluster::start(dir, 3)?;
    let mut driver = Nats {
        urls: cluster.urls.clone(),
    };
    let leader = driver.prepare(3).await?;
    // Producer 0 and consumer 0 talk to the stream's leader.
    if let Some(i) = leader.and_then(|l| cluster.names.iter().position(|n| *n == l)) {
        driver.urls.rotate_left(i);
    }
    let summary = run_counting_groups(Arc::new(driver), spec, &cluster.process_groups()).await;
    cluster.stop();
    Ok(summary)
}

async fn run_rabbit(spec: LoadSpec, dir: &Path) -> Result<Summary> {
    println!(
        "[{}] starting a 3-node RabbitMQ cluster (about a minute on 2 cores)",
        spec.label
    );
    let d = dir.to_path_buf();
    let mut cluster = tokio::task::spawn_blocking(move || RabbitCluster::start(&d, 3)).await??;
    let status = cluster.ctl(&["-n", &cluster.names[0], "cluster_status"])?;
    if cluster.names.iter().any(|n| !status.contains(n.as_str())) {
        bail!("the RabbitMQ nodes did not form one cluster:\n{status}");
    }
    // The queue is declared through node 1, whose member becomes its leader;
    // producer 0 and consumer 0 talk to node 1.
    let driver = Rabbit {
        uris: cluster.uris.clone(),
        prefetch: 1000,
    };
    driver.prepare().await?;
    let summary = run_counting_groups(Arc::new(driver), spec, &cluster.process_groups()).await;
    cluster.stop();
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_of_this_process_grows_as_it_works() {
        let pid = std::process::id();
        let before = cpu_time_us(pid).expect("own /proc/PID/stat");
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while cpu_time_us(pid).unwrap() == before {
            for i in 0..100_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no CPU time counted"
            );
        }
        std::hint::black_box(x);
        assert_eq!(cpu_time_us(u32::MAX), None);
        // This test's own process group holds this process, so its CPU counts.
        // SAFETY: getpgrp(2) has no preconditions.
        let group = unsafe { libc::getpgrp() } as u32;
        assert!(group_cpu_time_us(&[group]) >= cpu_time_us(pid).unwrap());
        assert_eq!(group_cpu_time_us(&[u32::MAX]), 0);
    }
}
