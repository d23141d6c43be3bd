//! The crates.io RocketMQ Rust client (`rocketmq-client-rust` 1.0.0, which
//! speaks the 4.x remoting protocol), unmodified, against a LedgerMQ name
//! server: `ledgermq-rust-remoting-client NAMESRV TOPIC`.
//!
//! A `DefaultMQProducer` sends `plain-0..4` (tag TagA, keys `key-N`); a
//! `TransactionMQProducer` sends `commit-1` (its local transaction commits),
//! `rollback-1` (rolls back) and `unknown-1` (answers UNKNOWN, so the broker
//! checks it back, and the check commits it), then waits up to 30 s for that
//! check. Prints one JSON line: `{"sent": N, "transactions": 3, "checked":
//! [bodies]}`; exits 1 if a send failed, no check came, or a message other
//! than `unknown-1` was checked back (its own end was not taken).

#![recursion_limit = "256"]

use std::any::Any;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rocketmq_client_rust::{
    ClientError, ClientResult, ClientRuntime, ClientRuntimeConfig, DefaultMQProducer,
    LocalTransactionState, TransactionListener, TransactionMQProducer,
};
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_model::common::message::MessageTrait;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};

/// Commits `commit-*`, rolls back `rollback-*`, leaves the rest UNKNOWN; a
/// check back commits, and its message body is recorded.
#[derive(Clone, Default)]
struct Listener {
    checked: Arc<Mutex<Vec<String>>>,
}

impl TransactionListener for Listener {
    fn execute_local_transaction(
        &self,
        msg: &dyn MessageTrait,
        _arg: Option<&(dyn Any + Send + Sync)>,
    ) -> LocalTransactionState {
        let body = msg
            .get_body()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default();
        if body.starts_with("commit") {
            LocalTransactionState::CommitMessage
        } else if body.starts_with("rollback") {
            LocalTransactionState::RollbackMessage
        } else {
            LocalTransactionState::Unknown
        }
    }

    fn check_local_transaction(&self, msg: &MessageExt) -> LocalTransactionState {
        let body = msg
            .get_body()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default();
        self.checked.lock().unwrap().push(body);
        LocalTransactionState::CommitMessage
    }
}

fn message(topic: &str, body: &str, key: &str) -> Message {
    Message::builder()
        .topic(topic)
        .tags("TagA")
        .keys(vec![key.to_owned()])
        .body_slice(body.as_bytes())
        .build_unchecked()
}

async fn run(rt: Arc<ClientRuntime>, ns: String, topic: String) -> ClientResult<bool> {
    let mut producer = DefaultMQProducer::builder(rt.clone())
        .producer_group("RustRemotingPG")
        .name_server_addr(ns.clone())
        .build();
    producer.start().await?;
    let mut sent = 0;
    for i in 0..5 {
        let m = message(&topic, &format!("plain-{i}"), &format!("key-{i}"));
        if producer.send_with_timeout(m, 5000).await?.is_some() {
            sent += 1;
        }
    }
    producer.shutdown().await;
    let listener = Listener::default();
    let mut tx = TransactionMQProducer::builder(rt)
        .producer_group("RustRemotingTxPG")
        .name_server_addr(ns)
        .topics(vec![topic.clone()])
        .transaction_listener(listener.clone())
        .build();
    tx.start().await?;
    for body in ["commit-1", "rollback-1", "unknown-1"] {
        tx.send_message_in_transaction::<(), _>(message(&topic, body, body), None)
            .await?;
    }
    let mut waited = Duration::ZERO;
    while listener.checked.lock().unwrap().is_empty() && waited < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        waited += Duration::from_millis(200);
    }
    // Let the check's END_TRANSACTION go out before the connection closes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    tx.shutdown().await;
    let checked = listener.checked.lock().unwrap().clone();
    println!(
        "{{\"sent\": {sent}, \"transactions\": 3, \"checked\": {:?}}}",
        checked
    );
    Ok(sent == 5 && !checked.is_empty() && checked.iter().all(|b| b == "unknown-1"))
}

fn main() {
    let mut args = std::env::args().skip(1);
    let ns = args.next().unwrap_or_else(|| "127.0.0.1:9876".into());
    let topic = args.next().unwrap_or_else(|| "RustRemoting".into());
    let owner = RuntimeOwner::plan(RuntimeConfig::default())
        .expect("a default runtime configuration is valid")
        .build()
        .expect("the client runtime starts");
    let telemetry = rocketmq_observability::install_global(
        &rocketmq_observability::TelemetryBootstrapConfig::default(),
    )
    .map_err(|e| ClientError::internal("telemetry", e))
    .expect("telemetry starts");
    let rt = ClientRuntime::try_new(
        owner.root_context().component("ledgermq-test"),
        ClientRuntimeConfig::default(),
        telemetry.handle(),
    )
    .expect("the client runtime starts");
    let ok = owner.block_on(async {
        let r = run(rt.clone(), ns, topic).await;
        let _ = rt.shutdown().await;
        r
    });
    match ok {
        Ok(true) => std::process::exit(0),
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("client error: {e}");
            std::process::exit(1)
        }
    }
}
