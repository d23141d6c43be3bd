//! RocketMQ broker configuration files (Java `.properties`, as `mqbroker -c`
//! reads them: `broker-n0.properties`, or the `.conf` of RocketMQ's DLedger
//! examples), translated into this crate's configuration keys, so a RocketMQ
//! DLedger group's files start a LedgerMQ group unchanged. Parsed with the
//! `java-properties` crate (the `java.util.Properties` text format).
//!
//! RocketMQ key → LedgerMQ key (a key left out takes RocketMQ's default):
//! - `brokerClusterName` → `cluster` (`DefaultCluster`), `brokerName`
//!   (required: RocketMQ's default, the host name, would make each host a
//!   group) → `broker_group`; `dLegerGroup`, if given, must equal it;
//! - `dLegerPeers` (`n0-host:port;n1-host:port;...`) → `peers`, and
//!   `dLegerSelfId` (`n0`, one of the peers) → `node_id`;
//!   `enableDLegerCommitLog` must be true if given (a broker group is always a
//!   Raft group here);
//! - `listenPort` (10911) → `remoting_addr`, listening on every interface as
//!   RocketMQ does and announced with `client_addr`'s host. The 5.x gRPC
//!   `client_addr` is `brokerIP1` (default: the host of this node's own
//!   `dLegerPeers` entry) with port `listenPort + 2`, unless the file sets
//!   `client_addr` (whose host is then announced instead); it is bound, so
//!   `brokerIP1` must be an IP address of this host (not a NAT address);
//! - `namesrvAddr` (`;`-separated) → `namesrv_addrs`;
//! - `storePathRootDir` (`~/store`; required without `HOME`) → `store_root`; `storePathCommitLog`, if
//!   given, must be `storePathRootDir/commitlog` (where the CommitLog lives
//!   here);
//! - `mappedFileSizeCommitLog` → `commit_log_segment_bytes`;
//! - `fileReservedTime` (hours, 72) → `file_reserved_time_hours`, `deleteWhen`
//!   (`04`; one hour: RocketMQ's `04;16` form is refused) →
//!   `delete_when_hour`, `diskMaxUsedSpaceRatio` (percent, 75, held to 10..=95
//!   as RocketMQ does) → `disk_max_used_space_ratio`;
//! - `maxMessageSize` (4 MiB, the most the store takes) → `max_body_bytes`;
//!   `flushDiskType` (`ASYNC_FLUSH`; or `SYNC_FLUSH`) → `flush`;
//!   `autoCreateTopicEnable` (true) → `auto_create_topics`;
//!   `defaultTopicQueueNums` (8) → `default_topic_queue_count`.
//!
//! A key spelled as this crate's own (`client_addr`, `raft_heartbeat_ms`, ...)
//! is taken as it is (a number, `true`/`false`, or text). Any other key is
//! returned as unused, for one warning at start. A value that does not parse
//! is an error naming its key.

use std::collections::BTreeMap;

use toml::{Table, Value};

/// True for a file read as Java properties: `.properties` or `.conf`.
pub fn is_properties(path: &std::path::Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("properties" | "conf")
    )
}

/// The keys of this crate's configuration a properties file may set directly.
const OWN_KEYS: &[&str] = &[
    "cluster",
    "broker_group",
    "node_id",
    "client_addr",
    "client_endpoint",
    "remoting_addr",
    "metrics_addr",
    "store_root",
    "flush",
    "commit_log_segment_bytes",
    "namesrv_heartbeat_ms",
    "raft_heartbeat_ms",
    "raft_election_min_ms",
    "raft_election_max_ms",
    "auto_create_topics",
    "auto_create_groups",
    "exact_delivery_attempts",
    "max_body_bytes",
    "require_client_id",
    "max_queues_per_topic",
    "max_consumer_groups",
    "max_broadcast_clients_per_group",
    "broadcast_client_idle_ms",
    "max_delay_ms",
    "max_messages_per_send",
    "telemetry_reply_buffer",
    "transaction_timeout_ms",
    "transaction_check_interval_ms",
    "transaction_check_max",
    "disk_space_warning_ratio",
    "disk_force_clean_ratio",
    "file_reserved_time_hours",
    "delete_when_hour",
    "disk_max_used_space_ratio",
    "default_topic_queue_count",
    "retention_interval_ms",
    "join",
];

fn parse<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, String> {
    v.trim()
        .parse()
        .map_err(|_| format!("{key}={v:?}: not a valid value"))
}

fn boolean(key: &str, v: &str) -> Result<bool, String> {
    match v.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{key}={v:?}: expected true or false")),
    }
}

/// A node id of `dLegerPeers` / `dLegerSelfId`: `n0` (RocketMQ's form) or `0`.
fn node_id(key: &str, v: &str) -> Result<u64, String> {
    let v = v.trim();
    v.strip_prefix('n')
        .unwrap_or(v)
        .parse()
        .map_err(|_| format!("{key}={v:?}: a node id is n<number>, e.g. n0"))
}

/// `dLegerPeers`: node id → address.
fn peers(v: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut out = BTreeMap::new();
    for peer in v.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = peer
            .split_once('-')
            .filter(|(_, a)| a.contains(':'))
            .ok_or_else(|| format!("dLegerPeers: {peer:?} is not n<id>-host:port"))?;
        if out
            .insert(node_id("dLegerPeers", id)?, addr.trim().to_owned())
            .is_some()
        {
            return Err(format!("dLegerPeers: node {id} is listed twice"));
        }
    }
    if out.is_empty() {
        return Err("dLegerPeers names no peer".into());
    }
    Ok(out)
}

/// This crate's own keys whose values are text, even when they look like a
/// number or a boolean (`broker_group=7`).
const TEXT_KEYS: &[&str] = &[
    "cluster",
    "broker_group",
    "client_addr",
    "client_endpoint",
    "remoting_addr",
    "metrics_addr",
    "store_root",
    "flush",
];

/// The value of this crate's own key `key`: text for [`TEXT_KEYS`], else a
/// number, a boolean, or text.
fn own_value(key: &str, v: &str) -> Value {
    let v = v.trim();
    if TEXT_KEYS.contains(&key) {
        Value::String(v.to_owned())
    } else if let Ok(i) = v.parse::<i64>() {
        Value::Integer(i)
    } else if let Ok(f) = v.parse::<f64>() {
        Value::Float(f)
    } else if let Ok(b) = v.parse::<bool>() {
        Value::Boolean(b)
    } else {
        Value::String(v.to_owned())
    }
}

/// Translates the properties file `bytes` (ISO 8859-1 with `\u` escapes, as
/// `java.util.Properties` reads them) into a table of this crate's keys
/// (deserialised and checked as a TOML file is), and the keys it left unused,
/// sorted. `home` is the user's home directory (the default store root is
/// `home/store`, as RocketMQ's; `None` or empty: `storePathRootDir` is then
/// required). Error: a text that is not properties, or a
/// value that does not parse, named by its key.
pub fn to_toml(bytes: &[u8], home: Option<&str>) -> Result<(Table, Vec<String>), String> {
    let props = ledgermq_namesrv::properties::read(bytes)?;
    let get = |k: &str| props.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    let mut t = Table::new();
    let mut used: Vec<&str> = Vec::new();
    let mut take = |k: &'static str| {
        used.push(k);
        get(k)
    };
    let cluster = take("brokerClusterName").unwrap_or("DefaultCluster");
    t.insert("cluster".into(), cluster.into());
    // RocketMQ defaults brokerName to the host name, which would make every
    // host a group of its own: required here.
    let name = take("brokerName")
        .or_else(|| get("broker_group"))
        .ok_or("brokerName is required: it names the broker group (one Raft group)")?;
    t.insert("broker_group".into(), name.into());
    if let Some(g) = take("dLegerGroup").filter(|g| *g != name) {
        return Err(format!(
            "dLegerGroup={g:?}: must equal brokerName ({name:?}); a broker group is one Raft group"
        ));
    }
    if let Some(v) = take("enableDLegerCommitLog") {
        if !boolean("enableDLegerCommitLog", v)? {
            return Err(
                "enableDLegerCommitLog=false: LedgerMQ's broker groups are always Raft groups"
                    .into(),
            );
        }
    }
    let members = match take("dLegerPeers") {
        Some(v) => peers(v)?,
        None => BTreeMap::new(),
    };
    let self_id = take("dLegerSelfId")
        .map(|v| node_id("dLegerSelfId", v))
        .transpose()?;
    if !members.is_empty() {
        let peers: Table = members
            .iter()
            .map(|(id, a)| (id.to_string(), Value::from(a.as_str())))
            .collect();
        t.insert("peers".into(), peers.into());
    }
    if let Some(id) = self_id {
        if !members.is_empty() && !members.contains_key(&id) {
            return Err(format!("dLegerSelfId=n{id}: not among dLegerPeers"));
        }
        let id = i64::try_from(id).map_err(|_| format!("dLegerSelfId=n{id}: too large"))?;
        t.insert("node_id".into(), Value::Integer(id));
    }
    let own_host = self_id
        .and_then(|id| members.get(&id))
        .and_then(|a| a.rsplit_once(':'))
        .map(|(h, _)| h.to_owned());
    let listen_port: u16 = match take("listenPort") {
        Some(v) => parse("listenPort", v)?,
        None => 10911,
    };
    if let Some(host) = take("brokerIP1")
        .map(str::to_owned)
        .or_else(|| own_host.clone())
    {
        t.insert(
            "remoting_addr".into(),
            format!("0.0.0.0:{listen_port}").into(),
        );
        let client_port = listen_port
            .checked_add(2)
            .ok_or_else(|| format!("listenPort={listen_port}: leaves no port for client_addr"))?;
        t.insert("client_addr".into(), format!("{host}:{client_port}").into());
    }
    if let Some(v) = take("namesrvAddr") {
        let addrs: Vec<Value> = v
            .split(';')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(Value::from)
            .collect();
        t.insert("namesrv_addrs".into(), addrs.into());
    }
    let root =
        match (take("storePathRootDir"), home.filter(|h| !h.is_empty())) {
            (Some(root), _) => std::path::PathBuf::from(root),
            (None, Some(home)) => std::path::Path::new(home).join("store"),
            (None, None) => return Err(
                "storePathRootDir is required when HOME is not set (RocketMQ's default is ~/store)"
                    .into(),
            ),
        };
    t.insert("store_root".into(), root.display().to_string().into());
    if let Some(cl) = take("storePathCommitLog") {
        if root.join("commitlog") != std::path::Path::new(cl) {
            return Err(format!(
                "storePathCommitLog={cl:?}: the CommitLog lives in storePathRootDir/commitlog"
            ));
        }
    }
    // Counts: whole, not negative, and within TOML's integers.
    let mut number = |rocketmq: &'static str, own: &str, max: u64| -> Result<(), String> {
        used.push(rocketmq);
        if let Some(v) = get(rocketmq) {
            let n: u64 = parse(rocketmq, v)?;
            if n > max {
                return Err(format!("{rocketmq}={v:?}: at most {max}"));
            }
            t.insert(own.into(), Value::Integer(n as i64));
        }
        Ok(())
    };
    number(
        "mappedFileSizeCommitLog",
        "commit_log_segment_bytes",
        i64::MAX as u64,
    )?;
    number(
        "fileReservedTime",
        "file_reserved_time_hours",
        i64::MAX as u64,
    )?;
    number(
        "maxMessageSize",
        "max_body_bytes",
        ledgermq_store::commit_log::DEFAULT_MAX_MESSAGE_SIZE_BYTES as u64,
    )?;
    number(
        "defaultTopicQueueNums",
        "default_topic_queue_count",
        crate::broker::MAX_QUEUES.into(),
    )?;
    used.push("diskMaxUsedSpaceRatio");
    if let Some(v) = get("diskMaxUsedSpaceRatio") {
        let percent: u64 = parse("diskMaxUsedSpaceRatio", v)?;
        t.insert(
            "disk_max_used_space_ratio".into(),
            Value::Float(percent.clamp(10, 95) as f64 / 100.0),
        );
    }
    used.push("deleteWhen");
    if let Some(v) = get("deleteWhen") {
        let hour: u8 = parse("deleteWhen", v).map_err(|_| {
            format!("deleteWhen={v:?}: one hour of the day, 00-23 (several are not supported)")
        })?;
        t.insert("delete_when_hour".into(), Value::Integer(hour.into()));
    }
    used.push("flushDiskType");
    let flush = match get("flushDiskType").unwrap_or("ASYNC_FLUSH") {
        "SYNC_FLUSH" => "sync",
        "ASYNC_FLUSH" => "async",
        v => return Err(format!("flushDiskType={v:?}: SYNC_FLUSH or ASYNC_FLUSH")),
    };
    t.insert("flush".into(), flush.into());
    used.push("autoCreateTopicEnable");
    let auto_create = match get("autoCreateTopicEnable") {
        Some(v) => boolean("autoCreateTopicEnable", v)?,
        None => true,
    };
    t.insert("auto_create_topics".into(), auto_create.into());
    // RocketMQ 5's Prometheus exporter (BrokerConfig.metricsExporterType, PROM
    // or 2; metricsPromExporterHost, by default brokerIP1; and
    // metricsPromExporterPort, 5557 by default). Another exporter (OTLP_GRPC,
    // LOG) is not served: its keys stay unused, so the start warns of them.
    match get("metricsExporterType") {
        Some("PROM" | "2") => {
            used.extend([
                "metricsExporterType",
                "metricsPromExporterHost",
                "metricsPromExporterPort",
            ]);
            let port: u16 = match get("metricsPromExporterPort") {
                Some(v) => parse("metricsPromExporterPort", v)?,
                None => 5557,
            };
            let host = get("metricsPromExporterHost")
                .or_else(|| get("brokerIP1"))
                .map(str::to_owned)
                .or_else(|| own_host.clone())
                .unwrap_or_else(|| "0.0.0.0".into());
            let host = if host.contains(':') && !host.starts_with('[') {
                format!("[{host}]")
            } else {
                host
            };
            t.insert("metrics_addr".into(), format!("{host}:{port}").into());
        }
        None | Some("DISABLE" | "0") => used.push("metricsExporterType"),
        Some(_) => {}
    }
    let mut unused = Vec::new();
    for (k, v) in &props {
        if OWN_KEYS.contains(&k.as_str()) {
            t.insert(k.clone(), own_value(k, v));
        } else if !used.contains(&k.as_str()) {
            unused.push(k.clone());
        }
    }
    Ok((t, unused))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BrokerConfig;
    use std::path::Path;

    fn deploy(n: u64) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
            "../deploy/rocketmq-properties/broker-n{n}.properties"
        ))
    }

    #[test]
    fn rocketmqs_dledger_example_loads_unchanged() {
        for n in 0..3u64 {
            let c = BrokerConfig::load(&deploy(n)).unwrap();
            assert_eq!(
                (c.cluster.as_str(), c.broker_group.as_str()),
                ("RaftCluster", "RaftNode00")
            );
            assert_eq!(c.node_id, n);
            assert_eq!(c.members().unwrap()[&1], "127.0.0.1:40912");
            let port = 30911 + 10 * n;
            assert_eq!(c.remoting_addr, Some(format!("0.0.0.0:{port}")));
            assert_eq!(c.client_addr, format!("127.0.0.1:{}", port + 2));
            assert_eq!(c.namesrv_addrs, ["127.0.0.1:9876"]);
            assert_eq!(c.store_root, Path::new(&format!("/tmp/rmqstore/node0{n}")));
            assert_eq!(c.flush, "async");
            assert_eq!(c.commit_log_segment_bytes, 64 << 20);
            assert_eq!(c.max_body_bytes, 4 << 20);
            assert!(c.auto_create_topics);
            assert_eq!(c.service_settings().default_queue_count, 4);
            let r = c.store_config().unwrap().retention;
            assert_eq!((r.file_reserved_time_hours, r.delete_when_hour), (48, 4));
            assert!((r.disk_max_used_space_ratio - 0.8).abs() < 1e-9);
        }
        let (_, unused) = to_toml(&std::fs::read(deploy(0)).unwrap(), Some("/home/u")).unwrap();
        assert_eq!(unused, ["sendMessageThreadPoolNums"]);
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let base = std::fs::read_to_string(deploy(0)).unwrap();
        for (line, key) in [
            ("dLegerSelfId=x1", "dLegerSelfId"),
            ("dLegerPeers=n0:127.0.0.1", "dLegerPeers"),
            ("dLegerGroup=Other", "dLegerGroup"),
            ("enableDLegerCommitLog=false", "enableDLegerCommitLog"),
            ("listenPort=99999", "listenPort"),
            ("flushDiskType=SOMETIMES", "flushDiskType"),
            ("fileReservedTime=two days", "fileReservedTime"),
            ("storePathCommitLog=/elsewhere", "storePathCommitLog"),
            ("autoCreateTopicEnable=yes", "autoCreateTopicEnable"),
            ("fileReservedTime=-1", "fileReservedTime"),
            ("maxMessageSize=8388608", "maxMessageSize"),
            ("defaultTopicQueueNums=5000", "defaultTopicQueueNums"),
            ("deleteWhen=04;16", "deleteWhen"),
            ("dLegerSelfId=n7", "dLegerSelfId"),
            ("dLegerSelfId=n99999999999999999999", "dLegerSelfId"),
            ("diskMaxUsedSpaceRatio=0.8", "diskMaxUsedSpaceRatio"),
        ] {
            let e = to_toml(format!("{base}\n{line}\n").as_bytes(), Some("/h")).unwrap_err();
            assert!(e.contains(key), "{line}: {e}");
        }
        // Ranges are checked as for a TOML file, naming LedgerMQ's key.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b.properties");
        std::fs::write(&p, format!("{base}\ndeleteWhen=25\n")).unwrap();
        let e = BrokerConfig::load(&p).unwrap_err().to_string();
        assert!(e.contains("delete_when_hour"), "{e}");
        // RocketMQ holds diskMaxUsedSpaceRatio to 10..=95.
        std::fs::write(&p, format!("{base}\ndiskMaxUsedSpaceRatio=150\n")).unwrap();
        let r = BrokerConfig::load(&p)
            .unwrap()
            .store_config()
            .unwrap()
            .retention;
        assert!((r.disk_max_used_space_ratio - 0.95).abs() < 1e-9);
    }

    #[test]
    fn left_out_keys_take_rocketmqs_defaults_and_own_keys_are_taken() {
        let text = "brokerName=g\ndLegerPeers=n0-10.0.0.1:40911\ndLegerSelfId=n0\n\
                    client_addr=10.0.0.1:8081\nraft_heartbeat_ms=100\nbrokerIP1=10.0.0.9";
        let (t, unused) = to_toml(text.as_bytes(), Some("/home/u")).unwrap();
        assert!(unused.is_empty(), "{unused:?}");
        assert_eq!(t["client_addr"].as_str(), Some("10.0.0.1:8081"));
        // Listening on every interface (announced with client_addr's host).
        assert_eq!(t["remoting_addr"].as_str(), Some("0.0.0.0:10911"));
        assert_eq!(t["raft_heartbeat_ms"].as_integer(), Some(100));
        assert_eq!(t["store_root"].as_str(), Some("/home/u/store"));
        assert_eq!(t["flush"].as_str(), Some("async"));
        assert_eq!(t["auto_create_topics"].as_bool(), Some(true));
        assert_eq!(t["cluster"].as_str(), Some("DefaultCluster"));
        // Without brokerIP1 or client_addr: this node's dLegerPeers host.
        let (t, _) = to_toml(
            b"brokerName=g\ndLegerPeers=n0-10.0.0.1:40911\ndLegerSelfId=n0",
            Some("/h"),
        )
        .unwrap();
        assert_eq!(t["client_addr"].as_str(), Some("10.0.0.1:10913"));
        // Read as java.util.Properties reads (ISO 8859-1, \\u escapes).
        let (t, _) = to_toml(
            b"brokerName=caf\x80\nbrokerClusterName=\\u00e9t\xe9",
            Some("/h"),
        )
        .unwrap();
        assert_eq!(t["broker_group"].as_str(), Some("caf\u{80}"));
        assert_eq!(t["cluster"].as_str(), Some("\u{e9}t\u{e9}"));
        // An own text key that looks like a number stays text.
        let (t, _) = to_toml(b"broker_group=7\ncluster=2024\nnode_id=0", Some("/h")).unwrap();
        assert_eq!(t["broker_group"].as_str(), Some("7"));
        assert_eq!(t["cluster"].as_str(), Some("2024"));
        assert_eq!(t["node_id"].as_integer(), Some(0));
        // Required: brokerName, and storePathRootDir without HOME.
        let e = to_toml(b"dLegerPeers=n0-10.0.0.1:1\ndLegerSelfId=n0", Some("/h")).unwrap_err();
        assert!(e.contains("brokerName"), "{e}");
        let e = to_toml(b"brokerName=g", None).unwrap_err();
        assert!(e.contains("storePathRootDir"), "{e}");
        let e = to_toml(b"brokerName=g", Some("")).unwrap_err();
        assert!(e.contains("storePathRootDir"), "{e}");
        let big = b"brokerName=g\ndLegerPeers=n9223372036854775808-10.0.0.1:1\n\
                    dLegerSelfId=n9223372036854775808";
        let e = to_toml(big, Some("/h")).unwrap_err();
        assert!(e.contains("dLegerSelfId") && e.contains("too large"), "{e}");
    }
}
