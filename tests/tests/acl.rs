//! Authentication, ACLs and TLS (issue 20) on the group of
//! `deploy/local-secure/` (`[auth]` on, bootstrap users `admin` and `demo`;
//! `[tls]` on the client ports, with certificates its `make-certs.sh` makes
//! here), with real processes:
//! admin calls need an admin's signature; the official Python client
//! (`tests/python/acl_check.py`) sends and consumes as demo through a
//! follower (which signs what it passes on to the leader with the members'
//! own credentials), and a wrong secret, a stale date, a missing header or a
//! missing permission answer UNAUTHORIZED; users and permissions changed with
//! `mqadmin` take effect on every member. The Raft peer ports take mutual TLS
//! from members only, and the name server (TLS too) takes registrations signed
//! with the cluster's registration credentials only.

use std::path::Path;
use std::time::Duration;

use ledgermq_tests::cluster::{ClusterOptions, LocalCluster};
use ledgermq_tests::python::{run_check, run_check_env};

const ADMIN: [&str; 4] = ["--accessKey", "admin", "--secretKey", "admin-secret"];

/// The CA certificate's path, for mqadmin's `--tlsCa` and the clients.
static CA: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn ca() -> &'static str {
    CA.get().expect("set at the start of the test")
}

/// `args` with the CA (mqadmin calls the brokers and the name server over
/// TLS).
fn tls<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut v = args.to_vec();
    v.extend(["--tlsCa", ca(), "--namesrvCa", ca()]);
    v
}

/// `args` signed by the admin, over TLS.
fn with_admin<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut v = tls(args);
    v.extend(ADMIN);
    v
}

/// deploy/local-secure's files copied to `dir`, with certificates made by its
/// `make-certs.sh` in `dir/certs` (the paths the files name).
fn secure_deploy(dir: &Path) -> std::path::PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/local-secure");
    let deploy = dir.join("deploy");
    std::fs::create_dir_all(&deploy).unwrap();
    for f in ["namesrv.toml", "n0.toml", "n1.toml", "n2.toml"] {
        std::fs::copy(src.join(f), deploy.join(f)).unwrap();
    }
    let made = std::process::Command::new(src.join("make-certs.sh"))
        .arg(deploy.join("certs"))
        .output()
        .expect("make-certs.sh runs (openssl)");
    assert!(made.status.success(), "make-certs.sh: {made:?}");
    let _ = CA.set(deploy.join("certs/ca.pem").display().to_string());
    deploy
}

/// The PEM material of node `n` in `certs` (a `make-certs.sh` output),
/// trusting the CA in `ca`.
fn node_material(certs: &Path, n: &str, ca: &Path) -> ledgermq_tls::TlsMaterial {
    let read = |p: std::path::PathBuf| std::fs::read(&p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
    ledgermq_tls::TlsMaterial {
        cert_pem: read(certs.join(format!("{n}.pem"))),
        key_pem: read(certs.join(format!("{n}-key.pem"))),
        ca_pem: read(ca.to_path_buf()),
    }
}

/// A member's certificate reaches the Raft peer port at `addr`; one from
/// another CA (made by `make-certs.sh` in `rogue`), or none, does not.
async fn the_peer_port_takes_members_only(deploy: &Path, addr: &str) {
    use ledgermq_raft::network::{lazy_channel, pb::raft_peer_client::RaftPeerClient};
    let rogue = deploy.join("rogue-certs");
    let made = std::process::Command::new(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/local-secure/make-certs.sh"),
    )
    .arg(&rogue)
    .output()
    .expect("make-certs.sh runs (openssl)");
    assert!(made.status.success(), "make-certs.sh: {made:?}");
    let ca = deploy.join("certs/ca.pem");
    let ping = |tls: Option<ledgermq_tls::TlsMaterial>| async move {
        let tls = tls.map(|m| ledgermq_raft::network::PeerTls::new(&m).unwrap());
        let channel = lazy_channel(addr, Duration::from_secs(2), tls.as_ref()).unwrap();
        RaftPeerClient::new(channel)
            .ping(ledgermq_raft::network::peer_request(1, &(), Duration::from_secs(3)).unwrap())
            .await
    };
    let member = ping(Some(node_material(&deploy.join("certs"), "n1", &ca))).await;
    assert!(member.is_ok(), "a member is served: {member:?}");
    let other_ca = ping(Some(node_material(&rogue, "n1", &ca))).await;
    assert!(other_ca.is_err(), "a certificate of another CA is refused");
    assert!(ping(None).await.is_err(), "plain HTTP/2 is refused");
}

/// The remoting port at `addr`, with `[tls]` and the default
/// `remoting_tls_mode` (enforcing), serves requests over TLS (checked
/// against the group's CA; signed ones are answered, an unsigned one is
/// refused NO_PERMISSION), and drops a plain-text connection unanswered.
async fn the_remoting_port_takes_tls_only(deploy: &Path, addr: &str) {
    use ledgermq_remoting::{acl::sign_command, RemotingCommand};
    use ledgermq_tests::remoting::call_async;
    const NO_PERMISSION: i32 = 16;
    let ca = deploy.join("certs/ca.pem");
    // The client side only needs the CA; any key pair fills the material.
    let connector = node_material(&deploy.join("certs"), "n1", &ca)
        .connector(false)
        .unwrap();
    let offsets = |signed: bool| {
        let mut cmd = RemotingCommand::request(30, [("topic", "SecureTopic"), ("queueId", "0")]);
        cmd.opaque = 7;
        if signed {
            sign_command(&mut cmd, "demo", "demo-secret");
        }
        cmd
    };
    let limit = Duration::from_secs(5);
    let mut tls = ledgermq_tls::connect(addr, Some(&connector)).await.unwrap();
    let unsigned = call_async(&mut tls, &offsets(false), limit).await;
    assert_eq!(unsigned.map(|a| a.code), Some(NO_PERMISSION));
    // Answered (the topic may not exist yet: any answer but a refusal).
    let signed = call_async(&mut tls, &offsets(true), limit).await;
    let signed = signed.expect("an answer over TLS");
    assert_ne!(signed.code, NO_PERMISSION, "{signed:?}");
    let mut plain = ledgermq_tls::connect(addr, None).await.unwrap();
    let answer = call_async(&mut plain, &offsets(true), limit).await;
    assert!(
        answer.is_none(),
        "a plain-text request was answered: {answer:?}"
    );
}

/// The name server at `addr` (TLS, checked against `ca`) takes a registration
/// only when it is signed with the registration credentials, for its own
/// addresses.
async fn registration_needs_the_members_signature(addr: &str, ca: &Path) {
    use ledgermq_namesrv::pb::name_server_client::NameServerClient;
    use ledgermq_namesrv::pb::{BrokerNode, RegisterBrokerRequest, UnregisterBrokerRequest};
    use ledgermq_namesrv::security::request_bound;
    use ledgermq_proto::signature::{sign_request_bound, Credentials};
    let tls = tonic::transport::ClientTlsConfig::new().ca_certificate(
        tonic::transport::Certificate::from_pem(std::fs::read(ca).unwrap()),
    );
    let channel = ledgermq_namesrv::registrar::endpoint(addr, Some(&tls))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = NameServerClient::new(channel);
    let node = BrokerNode {
        cluster: "HijackCluster".into(),
        broker_group: "hijack".into(),
        client_addr: "127.0.0.1:1".into(),
        ..BrokerNode::default()
    };
    // The RegisterBroker of `node` signed as `access_key`.
    let signed_as = |access_key: &str, secret: &str| {
        let mut r = tonic::Request::new(RegisterBrokerRequest {
            node: Some(node.clone()),
        });
        let bound = request_bound(r.get_ref());
        sign_request_bound(
            &mut r,
            &Credentials {
                access_key: access_key.into(),
                secret_key: secret.into(),
            },
            &bound,
        );
        r
    };
    let signed = |secret: &str| signed_as("ledgermq-registrar", secret);
    let unsigned = c
        .register_broker(RegisterBrokerRequest {
            node: Some(node.clone()),
        })
        .await
        .unwrap_err();
    assert_eq!(
        unsigned.code(),
        tonic::Code::Unauthenticated,
        "{unsigned:?}"
    );
    let wrong = c.register_broker(signed("guess")).await.unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated, "{wrong:?}");
    // Signed, but for other addresses than the request's.
    let mut moved = signed("local-secure-registration-secret");
    moved.get_mut().node.as_mut().unwrap().client_addr = "10.0.0.66:1".into();
    let moved = c.register_broker(moved).await.unwrap_err();
    assert_eq!(moved.code(), tonic::Code::Unauthenticated, "{moved:?}");
    // The members' own credentials are not the registration's.
    let inner = c
        .register_broker(signed_as("ledgermq-inner", "local-secure-inner-secret"))
        .await
        .unwrap_err();
    assert_eq!(inner.code(), tonic::Code::Unauthenticated, "{inner:?}");
    c.register_broker(signed("local-secure-registration-secret"))
        .await
        .unwrap();
    let mut gone = tonic::Request::new(UnregisterBrokerRequest {
        cluster: node.cluster.clone(),
        broker_group: node.broker_group.clone(),
        node_id: 0,
    });
    let bound = request_bound(gone.get_ref());
    sign_request_bound(
        &mut gone,
        &Credentials {
            access_key: "ledgermq-registrar".into(),
            secret_key: "local-secure-registration-secret".into(),
        },
        &bound,
    );
    c.unregister_broker(gone).await.unwrap();
    // Plain HTTP/2 gets no answer from a TLS port.
    let plain = ledgermq_namesrv::registrar::endpoint(addr, None)
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(3));
    let refused = match plain.connect().await {
        Ok(ch) => NameServerClient::new(ch)
            .list_cluster(ledgermq_namesrv::pb::ListClusterRequest {})
            .await
            .is_err(),
        Err(_) => true,
    };
    assert!(refused, "plain HTTP/2 is not served");
}

async fn user_may(access: &str, user: &str, secret: &str, publish: bool, subscribe: bool) {
    let (p, s) = (
        if publish { "1" } else { "0" },
        if subscribe { "1" } else { "0" },
    );
    run_check(
        "acl_check.py",
        &[
            "user",
            "--access",
            access,
            "--user",
            user,
            "--secret",
            secret,
            "--can-publish",
            p,
            "--can-subscribe",
            s,
            "--tls-ca",
            ca(),
        ],
        Duration::from_secs(60),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acls_and_tls_allow_what_a_user_may_do_and_refuse_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let deploy = secure_deploy(dir.path());
    let opts = ClusterOptions {
        deploy_dir: Some(deploy.clone()),
        tls_ca: Some(ca().into()),
        ..ClusterOptions::default()
    };
    let cluster = LocalCluster::start(dir.path(), &opts).await.unwrap();
    the_peer_port_takes_members_only(&deploy, "127.0.0.1:41011").await;
    the_remoting_port_takes_tls_only(&deploy, "127.0.0.1:11011").await;
    registration_needs_the_members_signature(&cluster.namesrv_addr, Path::new(ca())).await;

    // Admin calls: refused without a signature and for a user that is not an
    // admin; the bootstrap admin may once the leader has created it.
    let refused = cluster
        .admin(&tls(&["updateTopic", "-t", "SecureTopic", "-q", "4"]))
        .unwrap_err()
        .to_string();
    assert!(refused.contains("no authorization header"), "{refused}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while cluster
        .admin(&with_admin(&[
            "updateTopic",
            "-t",
            "SecureTopic",
            "-q",
            "4",
        ]))
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the bootstrap admin was never created"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let not_admin = cluster
        .admin(&tls(&[
            "updateSubGroup",
            "-g",
            "SecureGroup",
            "--accessKey",
            "demo",
            "--secretKey",
            "demo-secret",
        ]))
        .unwrap_err()
        .to_string();
    assert!(not_admin.contains("not an admin"), "{not_admin}");
    let leader = cluster
        .prepare(
            "broker-s",
            &[&with_admin(&["updateSubGroup", "-g", "SecureGroup"])],
        )
        .await
        .unwrap();
    let follower = cluster
        .nodes
        .iter()
        .enumerate()
        .find(|(i, _)| *i != leader)
        .map(|(_, n)| n.client_addr.clone())
        .unwrap();

    // Without TLS mqadmin does not get through (the name server's port does
    // not speak plain HTTP/2: a transport failure, not a refusal by a service).
    let plain = cluster
        .admin(&[&["updateSubGroup", "-g", "SecureGroup"][..], &ADMIN[..]].concat())
        .unwrap_err()
        .to_string();
    assert!(
        plain.contains("transport error")
            && !plain.contains("authoriz")
            && !plain.contains("signature"),
        "{plain}"
    );
    run_check_env(
        "acl_check.py",
        &["main", "--access", &follower, "--tls-ca", ca()],
        // The official client's gRPC checks the server against this CA.
        &[("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", ca())],
        Duration::from_secs(180),
    )
    .await;

    // A user made with mqadmin: publish only, then both, then deleted.
    for c in [
        &["createUser", "-u", "u2", "-p", "u2-secret"][..],
        &[
            "createAcl",
            "-s",
            "User:u2",
            "-r",
            "Topic:SecureTopic",
            "-a",
            "Pub",
        ],
        &[
            "createAcl",
            "-s",
            "User:u2",
            "-r",
            "Group:SecureGroup",
            "-a",
            "Sub",
        ],
    ] {
        cluster.admin(&with_admin(c)).unwrap();
    }
    let again = cluster
        .admin(&with_admin(&["createUser", "-u", "u2", "-p", "x"]))
        .unwrap_err()
        .to_string();
    assert!(again.contains("exists"), "{again}");
    // Applied on the follower within a heartbeat or two.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    user_may(&follower, "u2", "u2-secret", true, false).await;
    cluster
        .admin(&with_admin(&[
            "updateAcl",
            "-s",
            "User:u2",
            "-r",
            "Topic:SecureTopic",
            "-a",
            "Pub,Sub",
        ]))
        .unwrap();
    let listed = cluster
        .admin(&with_admin(&["listUser", "-u", "u2"]))
        .unwrap();
    assert!(listed.contains("Topic:SecureTopic=PUB|SUB"), "{listed}");
    assert!(!listed.contains("u2-secret"), "{listed}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    user_may(&follower, "u2", "u2-secret", true, true).await;
    cluster
        .admin(&with_admin(&["deleteUser", "-u", "u2"]))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    user_may(&follower, "u2", "u2-secret", false, false).await;

    // updateUser without -t keeps the user's type: the admin, given a new
    // secret, is still an admin, and the old secret no longer signs.
    cluster
        .admin(&with_admin(&[
            "updateUser",
            "-u",
            "admin",
            "-p",
            "admin-secret-2",
        ]))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let old = cluster
        .admin(&with_admin(&["updateSubGroup", "-g", "SecureGroup"]))
        .unwrap_err()
        .to_string();
    assert!(old.contains("check signature failed"), "{old}");
    cluster
        .admin(&tls(&[
            "updateSubGroup",
            "-g",
            "SecureGroup",
            "--accessKey",
            "admin",
            "--secretKey",
            "admin-secret-2",
        ]))
        .unwrap();
}

/// deploy/local-secure's files copied to `dir` without TLS (`[tls]`,
/// `namesrv_tls` and `remoting_tls_mode` left out: the 4.x client speaks
/// remoting in plain text),
/// with a transaction check every second, and on ports of their own (name
/// server 9887, clients 8281-8283, Raft 41021-41023, remoting 11021-11023),
/// so it can run beside the TLS test.
fn plain_secure_deploy(dir: &Path) -> std::path::PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/local-secure");
    let deploy = dir.join("deploy");
    std::fs::create_dir_all(&deploy).unwrap();
    for f in ["namesrv.toml", "n0.toml", "n1.toml", "n2.toml"] {
        let text = std::fs::read_to_string(src.join(f)).unwrap();
        let text = text.split("\n[tls]").next().unwrap();
        assert!(!text.contains("[tls]"), "{f}: [tls] is its last table");
        let text: String = text
            .lines()
            .filter(|l| !l.starts_with("namesrv_tls") && !l.starts_with("remoting_tls_mode"))
            .map(|l| {
                l.replace("9886", "9887")
                    .replace("818", "828")
                    .replace("4101", "4102")
                    .replace("1101", "1102")
                    .replace("local-secure/n", "local-secure-remoting/n")
                    .replace(
                        "flush = \"sync\"",
                        "flush = \"sync\"\ntransaction_check_interval_ms = 1000",
                    )
                    + "\n"
            })
            .collect();
        std::fs::write(deploy.join(f), text).unwrap();
    }
    deploy
}

/// A 4.x client (PyPI `rocketmq` 0.4.4, the C++ core) with session
/// credentials signs its remoting requests with the ACL hook's signature: the
/// right user sends and consumes on what it may; a wrong secret, or a topic
/// it may not publish to, answers NO_PERMISSION.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remoting_clients_sign_with_their_session_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let deploy = plain_secure_deploy(dir.path());
    let opts = ClusterOptions {
        deploy_dir: Some(deploy),
        ..ClusterOptions::default()
    };
    let cluster = LocalCluster::start(dir.path(), &opts).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while cluster
        .admin(
            &[
                &["updateTopic", "-t", "SecureTopic", "-q", "4"][..],
                &ADMIN[..],
            ]
            .concat(),
        )
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the bootstrap admin was never created"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    cluster
        .prepare(
            "broker-s",
            &[
                &[
                    &["updateTopic", "-t", "OtherTopic", "-q", "4"][..],
                    &ADMIN[..],
                ]
                .concat(),
                &[&["updateSubGroup", "-g", "SecureGroup"][..], &ADMIN[..]].concat(),
            ],
        )
        .await
        .unwrap();
    let path = ledgermq_tests::python::remoting_client_path();
    let summary = run_check_env(
        "acl_remoting_check.py",
        &["--namesrv", &cluster.namesrv_addr, "--count", "20"],
        &[("PYTHONPATH", &path)],
        Duration::from_secs(240),
    )
    .await;
    assert!(summary.contains("\"consumed\": 20"), "{summary}");
    what_a_request_points_at_is_checked("127.0.0.1:11021");
    let leader = cluster.leader("broker-s").await.expect("a leader");
    check_backs_go_to_producers_that_may_publish(&format!("127.0.0.1:{}", 11021 + leader));
}

/// On leader remoting port `leader`: a transaction is checked back only on a
/// connection whose user may publish to the half message's topic (the check
/// shows the whole message). demo, there the only producer of group PG, is
/// asked about its own half on SecureTopic, and not about the admin's half
/// of the same group on OtherTopic, which demo may not publish to; once the
/// admin is a producer of PG too, it is. An UNREGISTER_CLIENT naming demo's
/// client id from another connection does not unregister demo.
fn check_backs_go_to_producers_that_may_publish(leader: &str) {
    use ledgermq_remoting::{acl::sign_command, RemotingCommand};
    use ledgermq_tests::remoting::{call, send_request, Client};
    let signed = |mut cmd: RemotingCommand, user: &str, secret: &str| {
        sign_command(&mut cmd, user, secret);
        cmd
    };
    let half = |topic: &str| {
        send_request(
            topic,
            0,
            "TRAN_MSG\u{1}true\u{2}CHECK_IMMUNITY_TIME_IN_SECONDS\u{1}1\u{2}",
            b"half",
        )
    };
    let txid = |answer: RemotingCommand| {
        assert_eq!(answer.code, 0, "{answer:?}");
        answer.ext_fields["transactionId"].clone()
    };
    let heartbeat = |client: &str| {
        let mut hb = RemotingCommand::request(34, [] as [(&str, &str); 0]);
        hb.body = format!(
            r#"{{"clientID":"{client}","producerDataSet":[{{"groupName":"PG"}}],"consumerDataSet":[]}}"#
        )
        .into_bytes();
        hb
    };
    let mut demo = Client::connect(leader);
    assert_eq!(
        demo.call(signed(heartbeat("demo-p"), "demo", "demo-secret"))
            .code,
        0
    );
    let unregister =
        RemotingCommand::request(35, [("clientID", "demo-p"), ("producerGroup", "PG")]);
    assert_eq!(
        call(leader, &signed(unregister, "admin", "admin-secret")).code,
        0
    );
    let others = txid(call(
        leader,
        &signed(half("OtherTopic"), "admin", "admin-secret"),
    ));
    let own = txid(demo.call(signed(half("SecureTopic"), "demo", "demo-secret")));
    let check = demo.wait_request(39, &own, Duration::from_secs(20));
    assert_eq!(check.ext_fields["transactionId"], own);
    // Checks run every second: three more rounds, demo the group's only
    // producer.
    let leaked = demo.next_request(39, &others, Duration::from_secs(3));
    assert!(
        leaked.is_none(),
        "demo was shown a half message of OtherTopic: {leaked:?}"
    );
    let mut admin = Client::connect(leader);
    assert_eq!(
        admin
            .call(signed(heartbeat("admin-p"), "admin", "admin-secret"))
            .code,
        0
    );
    let check = admin.wait_request(39, &others, Duration::from_secs(20));
    assert_eq!(check.ext_fields["transactionId"], others);
}

/// On the remoting port at `addr`: a message named by offset (VIEW,
/// CONSUMER_SEND_MSG_BACK) needs SUB on its own topic, and a V2 send goes to
/// the topic its short field names, the one the check read.
fn what_a_request_points_at_is_checked(addr: &str) {
    use ledgermq_remoting::{acl::sign_command, message, RemotingCommand};
    use ledgermq_tests::remoting::{call, send_request};
    const NO_PERMISSION: i32 = 16;
    let as_user = |mut cmd: RemotingCommand, user: &str, secret: &str| {
        sign_command(&mut cmd, user, secret);
        call(addr, &cmd)
    };
    let offset_of = |answer: &RemotingCommand| {
        assert_eq!(answer.code, 0, "{answer:?}");
        message::decode_offset_message_id(&answer.ext_fields["msgId"])
            .expect("an offset message id")
            .1
            .to_string()
    };
    let view = |offset: &str, user: &str, secret: &str| {
        as_user(
            RemotingCommand::request(33, [("offset", offset)]),
            user,
            secret,
        )
    };
    // The stored message's topic, as the admin reads it (once this node has
    // applied it).
    let topic_at = |offset: &str| {
        for _ in 0..50 {
            let v = view(offset, "admin", "admin-secret");
            if v.code == 0 {
                return message::decode_messages(&v.body).unwrap()[0]
                    .topic
                    .to_owned();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the message at {offset} never became readable");
    };
    let other = offset_of(&as_user(
        send_request("OtherTopic", 0, "", b"not for demo"),
        "admin",
        "admin-secret",
    ));
    assert_eq!(topic_at(&other), "OtherTopic");
    assert_eq!(view(&other, "demo", "demo-secret").code, NO_PERMISSION);
    let back = as_user(
        RemotingCommand::request(
            36,
            [
                ("offset", other.as_str()),
                ("group", "SecureGroup"),
                ("delayLevel", "0"),
                ("originTopic", "OtherTopic"),
            ],
        ),
        "demo",
        "demo-secret",
    );
    assert_eq!(back.code, NO_PERMISSION, "{back:?}");
    // A V2 send with a long `topic` beside its `b`: stored in `b`'s topic.
    let mut both = send_request("SecureTopic", 0, "", b"to SecureTopic");
    both.ext_fields.insert("topic".into(), "OtherTopic".into());
    let sent = offset_of(&as_user(both, "demo", "demo-secret"));
    assert_eq!(topic_at(&sent), "SecureTopic");
}
