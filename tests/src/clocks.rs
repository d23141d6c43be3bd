//! A local cluster whose nodes each run under libfaketime with their own clock
//! offset file, for tests of what the broker does when node clocks disagree or
//! jump (`tests/tests/clock_skew.rs`, `tests/tests/clock_jump.rs`). Monotonic
//! clocks are left alone (`ledgermq_jepsen::node_env`).

use std::path::PathBuf;
use std::time::Duration;

use ledgermq_jepsen::node_env::{self, libfaketime, set_clock_offset};

use crate::cluster::{ClusterOptions, LocalCluster};

/// A running 3-node cluster with a clock offset file per node.
pub struct SkewableCluster {
    /// The cluster.
    pub cluster: LocalCluster,
    /// Each node's environment (LD_PRELOAD and libfaketime's settings).
    pub env: Vec<Vec<(String, String)>>,
    clocks: PathBuf,
    _dir: tempfile::TempDir,
}

impl SkewableCluster {
    /// Starts the cluster with every clock at the real time; None (after printing
    /// a SKIPPED line) when libfaketime is not installed. Panics on a start
    /// failure (tests only).
    pub async fn start() -> Option<Self> {
        let Some(lib) = libfaketime() else {
            println!(
                "SKIPPED: libfaketime is not installed (looked for {:?}; apt-get install libfaketime)",
                node_env::LIBFAKETIME_PATHS
            );
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let clocks = dir.path().join("clocks");
        std::fs::create_dir_all(&clocks).unwrap();
        let env: Vec<Vec<(String, String)>> = (0..3)
            .map(|i| {
                set_clock_offset(&clocks, i, 0).unwrap();
                node_env::node_env(&clocks, i, Some(&lib))
            })
            .collect();
        let opts = ClusterOptions {
            node_env: env.clone(),
            ..ClusterOptions::default()
        };
        let cluster = LocalCluster::start(&dir.path().join("cluster"), &opts)
            .await
            .unwrap();
        Some(Self {
            cluster,
            env,
            clocks,
            _dir: dir,
        })
    }

    /// Sets node `i`'s wall clock `offset_s` off the real one and waits until it
    /// shows (libfaketime re-reads the file at most every second). Panics if it
    /// does not take.
    pub async fn set_clock(&self, i: usize, offset_s: i64) {
        set_clock_offset(&self.clocks, i, offset_s).unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let seen = clock_offset_seen(&self.env[i]);
        assert!(
            (seen - offset_s).abs() <= 1,
            "node {i}'s clock is {seen} s off, not {offset_s} s: libfaketime did not take"
        );
    }
}

/// A node's wall clock as it sees it (`date +%s` under its environment `env`)
/// minus the real one, s.
pub fn clock_offset_seen(env: &[(String, String)]) -> i64 {
    let out = std::process::Command::new("date")
        .arg("+%s")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    let seen: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    seen - real
}
