//! Tests of the TOML configuration.

use super::*;

/// `config` copied into `dir`, with the test certificates of `tls/testdata`
/// where its `[tls]` names its certificate, key and CA (relative paths).
fn with_test_certs(config: &Path, dir: &Path) -> std::path::PathBuf {
    let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tls/testdata");
    let copy = dir.join(config.file_name().unwrap());
    std::fs::copy(config, &copy).unwrap();
    let cfg: BrokerConfig = toml::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
    for (path, from) in [
        (&cfg.tls.cert_file, "member.pem"),
        (&cfg.tls.key_file, "member-key.pem"),
        (&cfg.tls.ca_file, "ca.pem"),
    ] {
        if let Some(p) = path {
            assert!(p.is_relative(), "{p:?}");
            std::fs::create_dir_all(dir.join(p).parent().unwrap()).unwrap();
            std::fs::copy(testdata.join(from), dir.join(p)).unwrap();
        }
    }
    copy
}

/// deploy/compose's and deploy/systemd's broker configs load, each a different
/// member of a three-node group whose peers and client addresses agree; all
/// have authentication and TLS on.
#[test]
fn the_compose_and_systemd_configs_load() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let certs = tempfile::tempdir().unwrap();
    let secure = |config: PathBuf, dir: String| {
        let dir = certs.path().join(dir);
        std::fs::create_dir_all(&dir).unwrap();
        let copy = with_test_certs(&config, &dir);
        let c = BrokerConfig::load(&copy).unwrap();
        assert!(c.auth.enabled && c.namesrv_tls && c.tls.cert_file.is_some());
        assert!(c.auth.registration().unwrap().is_some());
        // Their remoting ports serve 4.x clients without TLS too.
        let mode = c.service_settings().remoting_tls_mode;
        assert_eq!(mode, ledgermq_tls::TlsMode::Permissive);
        copy
    };
    let mut files = Vec::new();
    for g in ["a", "b"] {
        files.push(
            (0..3)
                .map(|i| {
                    let f = root.join(format!("compose/config/{g}{i}.toml"));
                    secure(f, format!("{g}{i}"))
                })
                .collect::<Vec<_>>(),
        );
    }
    files.push(
        (1..=3)
            .map(|h| {
                let f = root.join(format!("systemd/host{h}/broker.toml"));
                secure(f, format!("host{h}"))
            })
            .collect::<Vec<_>>(),
    );
    for group in files {
        let configs: Vec<BrokerConfig> = group
            .iter()
            .map(|f| BrokerConfig::load(f).unwrap())
            .collect();
        let ids: Vec<u64> = configs.iter().map(|c| c.node_id).collect();
        assert_eq!(ids, [0, 1, 2], "{group:?}");
        for c in &configs {
            assert_eq!(c.members().unwrap(), configs[0].members().unwrap());
            assert_eq!(
                c.member_client_addrs().unwrap(),
                configs[0].member_client_addrs().unwrap()
            );
            assert_eq!(c.member_client_addrs().unwrap()[&c.node_id], c.client_addr);
        }
    }
}

#[test]
fn the_local_deploy_configs_load() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/local");
    for n in ["n0", "n1", "n2"] {
        let c = BrokerConfig::load(&root.join(format!("{n}.toml"))).unwrap();
        assert_eq!(c.members().unwrap().len(), 3);
        assert_eq!(c.namesrv_addrs, vec!["127.0.0.1:9876".to_string()]);
    }
}

#[test]
fn a_client_endpoint_is_what_the_node_announces() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("b.toml");
    let base = "cluster='c'\nbroker_group='g'\nnode_id=0\nclient_addr='127.0.0.1:8081'\n\
                store_root='/tmp/x'\n";
    let tail = "[peers]\n0='127.0.0.1:2'\n1='127.0.0.2:2'\n\
                [client_addrs]\n1='127.0.0.2:8081'\n";
    std::fs::write(&p, format!("{base}{tail}")).unwrap();
    let c = BrokerConfig::load(&p).unwrap();
    assert_eq!(c.advertised_client_addr(), "127.0.0.1:8081");
    std::fs::write(&p, format!("{base}client_endpoint='mq.local:8081'\n{tail}")).unwrap();
    let c = BrokerConfig::load(&p).unwrap();
    assert_eq!(c.advertised_client_addr(), "mq.local:8081");
    assert_eq!(c.client_addr, "127.0.0.1:8081");
    for endpoint in ["mq.local", ":8081"] {
        std::fs::write(&p, format!("{base}client_endpoint='{endpoint}'\n{tail}")).unwrap();
        let e = BrokerConfig::load(&p).unwrap_err().to_string();
        assert!(e.contains("not host:port"), "{e}");
    }
    let partial = "[peers]\n0='127.0.0.1:2'\n1='127.0.0.2:2'\n";
    let endpoint = "client_endpoint='mq.local:8081'\n";
    std::fs::write(&p, format!("{base}{endpoint}{partial}")).unwrap();
    let e = BrokerConfig::load(&p).unwrap_err().to_string();
    assert!(e.contains("node 1 is missing"), "{e}");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/dns");
    for n in ["n0", "n1", "n2"] {
        let c = BrokerConfig::load(&root.join(format!("{n}.toml"))).unwrap();
        assert_eq!(c.advertised_client_addr(), "ledgermq-group:8081");
    }
}

#[test]
fn a_config_naming_the_removed_durable_mark_still_loads() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("b.toml");
    std::fs::write(
        &p,
        "cluster='c'\nbroker_group='g'\nnode_id=0\nclient_addr='127.0.0.1:1'\n\
         store_root='/tmp/x'\ndurable_mark_file='/tmp/x.durable-mark'\n\
         [peers]\n0='127.0.0.1:2'\n",
    )
    .unwrap();
    let c = BrokerConfig::load(&p).unwrap();
    c.store_config().unwrap();
}

#[test]
fn durations_are_read_from_their_millisecond_keys() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("b.toml");
    let base = "cluster='c'\nbroker_group='g'\nnode_id=0\nclient_addr='127.0.0.1:1'\n\
                store_root='/tmp/x'\n";
    let peers = "[peers]\n0='127.0.0.1:2'\n";
    std::fs::write(&p, format!("{base}{peers}")).unwrap();
    let c = BrokerConfig::load(&p).unwrap();
    assert_eq!(c.namesrv_heartbeat, Duration::from_secs(3));
    assert_eq!(c.retention_interval, Duration::from_secs(10));
    assert_eq!(c.broadcast_client_idle, Duration::from_secs(120));
    let timed = "namesrv_heartbeat_ms=1500\nraft_heartbeat_ms=70\nraft_election_min_ms=400\n\
                 raft_election_max_ms=800\nbroadcast_client_idle_ms=5000\nretention_interval_ms=250\n";
    std::fs::write(&p, format!("{base}{timed}{peers}")).unwrap();
    let c = BrokerConfig::load(&p).unwrap();
    assert_eq!(c.namesrv_heartbeat, Duration::from_millis(1500));
    assert_eq!(c.raft_heartbeat, Duration::from_millis(70));
    assert_eq!(c.raft_election_min, Duration::from_millis(400));
    assert_eq!(c.raft_election_max, Duration::from_millis(800));
    assert_eq!(c.broadcast_client_idle, Duration::from_secs(5));
    assert_eq!(c.retention_interval, Duration::from_millis(250));
    assert_eq!(c.service_settings().stale_member_ms, 4500);
    // A negative or fractional value names its key.
    for bad in ["retention_interval_ms=-1\n", "namesrv_heartbeat_ms=1.5\n"] {
        std::fs::write(&p, format!("{base}{bad}{peers}")).unwrap();
        let e = BrokerConfig::load(&p).unwrap_err().to_string();
        let key = bad.split('=').next().unwrap();
        assert!(e.contains(key), "{e}");
    }
}

/// Every key the harnesses' writer (`ledgermq_testkit::BrokerToml`) sets loads,
/// with the value it wrote.
#[test]
fn the_test_kits_broker_files_load() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("b.toml");
    let raft = ["127.0.0.1:2".to_owned(), "127.0.0.2:2".to_owned()];
    let client = ["127.0.0.1:8081".to_owned(), "127.0.0.2:8081".to_owned()];
    let mut t = ledgermq_testkit::BrokerToml::member("C", "g", 1, &raft, &client, dir.path());
    t.namesrv_addrs = vec!["127.0.0.1:9876".into()];
    t.flush = "async".into();
    t.commit_log_segment_bytes = Some(1 << 20);
    t.namesrv_heartbeat_ms = Some(700);
    t.disk_space_warning_ratio = Some(0.99);
    t.retention_interval_ms = Some(300);
    t.client_endpoint = Some("mq.local:8081".into());
    t.auto_create_topics = Some(true);
    t.transaction_check_interval_ms = Some(1_500);
    t.transaction_check_max = Some(4);
    t.remoting_addr = Some("127.0.0.2:10911".into());
    t.metrics_addr = Some("127.0.0.2:5557".into());
    let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tls/testdata");
    t.tls = Some(ledgermq_tls::TlsFiles {
        cert_file: Some(testdata.join("member.pem")),
        key_file: Some(testdata.join("member-key.pem")),
        ca_file: Some(testdata.join("ca.pem")),
    });
    t.namesrv_tls = Some(true);
    t.auth = Some(ledgermq_testkit::AuthToml {
        enabled: true,
        inner_access_key: "inner".into(),
        inner_secret_key: "inner-secret".into(),
        registration_access_key: Some("registrar".into()),
        registration_secret_key: Some("registrar-secret".into()),
        users: vec![ledgermq_testkit::UserToml {
            username: "u".into(),
            secret_key: "u-secret".into(),
            admin: false,
            permissions: [("Topic:T".to_owned(), "PUB|SUB".to_owned())].into(),
        }],
    });
    t.write(&p).unwrap();
    let c = BrokerConfig::load(&p).unwrap();
    assert_eq!(
        (c.cluster.as_str(), c.broker_group.as_str(), c.node_id),
        ("C", "g", 1)
    );
    assert_eq!(c.client_addr, "127.0.0.2:8081");
    assert_eq!(c.remoting_addr.as_deref(), Some("127.0.0.2:10911"));
    assert_eq!(c.metrics_addr.as_deref(), Some("127.0.0.2:5557"));
    assert_eq!(c.namesrv_addrs, vec!["127.0.0.1:9876".to_owned()]);
    assert_eq!(c.store_root, dir.path());
    assert!(matches!(c.flush_mode().unwrap(), FlushMode::Async));
    assert_eq!(c.commit_log_segment_bytes, 1 << 20);
    assert_eq!(c.namesrv_heartbeat, Duration::from_millis(700));
    assert_eq!(c.disk_space_warning_ratio, 0.99);
    assert_eq!(c.retention_interval, Duration::from_millis(300));
    assert_eq!(c.advertised_client_addr(), "mq.local:8081");
    assert!(c.auto_create_topics);
    let s = c.service_settings();
    assert_eq!(
        (s.transaction_check_interval_ms, s.transaction_check_max),
        (1_500, 4)
    );
    assert_eq!(c.members().unwrap().len(), 2);
    assert_eq!(c.member_client_addrs().unwrap().len(), 2);
    assert_eq!(c.tls.ca_file, Some(testdata.join("ca.pem")));
    assert!(c.namesrv_tls);
    let a = &c.auth;
    assert!(a.enabled);
    assert_eq!(a.inner_access_key.as_deref(), Some("inner"));
    assert_eq!(a.inner_secret_key.as_deref(), Some("inner-secret"));
    assert_eq!(a.registration_access_key.as_deref(), Some("registrar"));
    assert_eq!(
        a.registration_secret_key.as_deref(),
        Some("registrar-secret")
    );
    assert_eq!(a.users.len(), 1);
    let u = &a.users[0];
    assert_eq!(
        (u.username.as_str(), u.secret_key.as_str(), u.admin),
        ("u", "u-secret", false)
    );
    assert_eq!(
        u.permissions.get("Topic:T").map(String::as_str),
        Some("PUB|SUB")
    );
}

#[test]
fn bad_configs_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("b.toml");
    let base = "cluster='c'\nbroker_group='g'\nclient_addr='127.0.0.1:1'\nstore_root='/tmp/x'\n";
    for (extra, needle) in [
        ("node_id=5\n[peers]\n0='127.0.0.1:2'\n", "not among"),
        (
            "node_id=0\nflush='sometimes'\n[peers]\n0='127.0.0.1:2'\n",
            "flush mode",
        ),
        ("node_id=0\n[peers]\nx='127.0.0.1:2'\n", "not a number"),
        (
            "node_id=0\ncolour='red'\n[peers]\n0='127.0.0.1:2'\n",
            "unknown field",
        ),
        (
            "node_id=0\nremoting_addr='127.0.0.1:3'\nremoting_tls_mode='permissive'\n\
             [peers]\n0='127.0.0.1:2'\n",
            "remoting_tls_mode needs [tls]",
        ),
        (
            "node_id=0\nremoting_tls_mode='sometimes'\n[peers]\n0='127.0.0.1:2'\n",
            "unknown variant",
        ),
        (
            "node_id=0\nmax_queues_per_topic=2000\n[peers]\n0='127.0.0.1:2'\n",
            "max_queues_per_topic",
        ),
        (
            "node_id=0\nmax_messages_per_send=0\n[peers]\n0='127.0.0.1:2'\n",
            "at least 1",
        ),
        (
            "node_id=0\nmax_queues_per_topic=0\n[peers]\n0='127.0.0.1:2'\n",
            "max_queues_per_topic must be 1..=",
        ),
        (
            "node_id=0\nmax_body_bytes=8388608\n[peers]\n0='127.0.0.1:2'\n",
            "max_body_bytes",
        ),
        (
            "node_id=0\ndefault_topic_queue_count=0\n[peers]\n0='127.0.0.1:2'\n",
            "default_topic_queue_count",
        ),
    ] {
        std::fs::write(&p, format!("{base}{extra}")).unwrap();
        let e = BrokerConfig::load(&p).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    }
}

/// RocketMQ's Prometheus exporter keys set `metrics_addr` (host: the
/// exporter's, else brokerIP1, else every interface; IPv6 in brackets); an
/// exporter LedgerMQ has not (OTLP_GRPC, LOG) leaves its keys unused, warned
/// of at start, and the broker starts without metrics.
#[test]
fn rocketmq_prometheus_exporter_keys_set_the_metrics_address() {
    use super::properties::to_toml;
    let toml = |extra: &str| {
        to_toml(
            format!("brokerName=b\nstorePathRootDir=/tmp/x\n{extra}").as_bytes(),
            None,
        )
    };
    let (t, unused) = toml("metricsExporterType=PROM\n").unwrap();
    assert_eq!(t["metrics_addr"].as_str(), Some("0.0.0.0:5557"));
    assert!(unused.is_empty(), "{unused:?}");
    let (t, _) = toml(
        "metricsExporterType=2\nmetricsPromExporterHost=10.0.0.1\nmetricsPromExporterPort=9100\n",
    )
    .unwrap();
    assert_eq!(t["metrics_addr"].as_str(), Some("10.0.0.1:9100"));
    let (t, _) = toml("metricsExporterType=PROM\nbrokerIP1=10.0.0.7\n").unwrap();
    assert_eq!(t["metrics_addr"].as_str(), Some("10.0.0.7:5557"));
    let (t, _) = toml("metricsExporterType=PROM\nmetricsPromExporterHost=::1\n").unwrap();
    assert_eq!(t["metrics_addr"].as_str(), Some("[::1]:5557"));
    let (t, unused) = toml("metricsPromExporterPort=9100\n").unwrap();
    assert!(t.get("metrics_addr").is_none());
    assert_eq!(unused, ["metricsPromExporterPort"]);
    let (t, unused) = toml("metricsExporterType=OTLP_GRPC\n").unwrap();
    assert!(t.get("metrics_addr").is_none());
    assert_eq!(unused, ["metricsExporterType"]);
}

/// getBrokerConfig shows the whole serialized configuration to whoever can
/// reach the admin service: every key must be one this list names, so that a
/// key added later (a secret, say) is seen here first and either listed or
/// kept out with `skip_serializing`. A rendered configuration also loads back
/// as the same one.
#[test]
fn the_rendered_configuration_holds_only_the_keys_listed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/n0.toml");
    let cfg = BrokerConfig::load(&root).unwrap();
    let text = toml::to_string(&cfg).unwrap();
    // Every serialized field, unset options included (TOML leaves those out;
    // JSON writes them as null).
    let json = serde_json::to_value(&cfg).unwrap();
    let keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let listed = [
        "auth",
        "auto_create_groups",
        "auto_create_topics",
        "broadcast_client_idle_ms",
        "broker_group",
        "client_addr",
        "client_addrs",
        "client_endpoint",
        "cluster",
        "commit_log_segment_bytes",
        "default_topic_queue_count",
        "delete_when_hour",
        "disk_force_clean_ratio",
        "disk_max_used_space_ratio",
        "disk_space_warning_ratio",
        "exact_delivery_attempts",
        "file_reserved_time_hours",
        "flush",
        "join",
        "max_body_bytes",
        "max_broadcast_clients_per_group",
        "max_consumer_groups",
        "max_delay_ms",
        "max_messages_per_send",
        "max_queues_per_topic",
        "metrics_addr",
        "namesrv_addrs",
        "namesrv_heartbeat_ms",
        "namesrv_tls",
        "node_id",
        "peers",
        "raft_election_max_ms",
        "raft_election_min_ms",
        "raft_heartbeat_ms",
        "remoting_addr",
        "require_client_id",
        "retention_interval_ms",
        "store_root",
        "telemetry_reply_buffer",
        "transaction_check_interval_ms",
        "transaction_check_max",
        "tls",
        "transaction_timeout_ms",
    ];
    let unlisted: Vec<&&str> = keys.iter().filter(|k| !listed.contains(k)).collect();
    assert!(unlisted.is_empty(), "keys not listed: {unlisted:?}");
    let gone: Vec<&&str> = listed.iter().filter(|k| !keys.contains(k)).collect();
    assert!(gone.is_empty(), "listed keys no longer rendered: {gone:?}");
    let back: BrokerConfig = toml::from_str(&text).unwrap();
    assert_eq!(format!("{back:?}"), format!("{cfg:?}"));
}
