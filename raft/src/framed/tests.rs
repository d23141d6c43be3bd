use std::sync::atomic::Ordering;
use std::sync::Arc;

use openraft::{EntryPayload, Vote};

use super::*;
use crate::codec::log_id;
use crate::types::{Entry, Request};
use tokio::net::TcpStream;

fn request() -> AppendEntriesRequest<TypeConfig> {
    let msgs = vec![ledgermq_store::MessageRecord::message(
        "T",
        1,
        vec![7; 3000],
        5,
    )];
    AppendEntriesRequest {
        vote: Vote::new_committed(3, 0),
        prev_log_id: Some(log_id(3, 9)),
        entries: vec![Entry {
            log_id: log_id(3, 10),
            payload: EntryPayload::Normal(Request::Messages(msgs)),
        }],
        leader_commit: Some(log_id(3, 9)),
    }
}

/// A peer service with no Raft running yet, over a fresh store.
fn service_without_raft(dir: &std::path::Path) -> PeerService {
    PeerService {
        node_id: 1,
        core: Arc::new(std::sync::OnceLock::new()),
        filter: crate::NetworkFilter::default(),
        store: ledgermq_store::MessageStore::open(ledgermq_store::StoreConfig::new(dir)).unwrap(),
        contacts: crate::contact::Contacts::new(1, vec![0, 1], Duration::from_secs(1)),
        appends: Default::default(),
        node: Default::default(),
    }
}

#[tokio::test]
async fn a_request_frame_reads_back_as_the_request() {
    let rpc = request();
    let frame = request_frame(&rpc).unwrap();
    let body = read_frame(&mut &frame[..], MAX_REQUEST_BYTES)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(body.len() + 4, frame.len());
    assert_eq!(body[0], KIND_APPEND_ENTRIES);
    let back: AppendEntriesRequest<TypeConfig> = postcard::from_bytes(&body[1..]).unwrap();
    assert_eq!(
        (
            back.vote,
            back.prev_log_id,
            back.leader_commit,
            back.entries
        ),
        (rpc.vote, rpc.prev_log_id, rpc.leader_commit, rpc.entries)
    );
}

#[tokio::test]
async fn frames_over_the_limit_or_cut_short_are_errors_and_an_end_between_frames_is_not() {
    let huge = u32::MAX.to_le_bytes();
    let e = read_frame(&mut &huge[..], MAX_REQUEST_BYTES)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    // 100 bytes announced, 3 sent.
    let cut = [100u8, 0, 0, 0, 1, 2, 3];
    let e = read_frame(&mut &cut[..], MAX_REQUEST_BYTES)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    let e = read_frame(&mut &cut[..2], MAX_REQUEST_BYTES)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    assert!(read_frame(&mut &[][..], MAX_REQUEST_BYTES)
        .await
        .unwrap()
        .is_none());
}

/// A link to a port served by the peer gRPC server alone, as a node of an earlier
/// release serves it, finds it does not speak frames and falls back for a while.
#[tokio::test]
async fn a_grpc_only_peer_is_recognised_and_left_to_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let service = service_without_raft(dir.path());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(crate::network::pb::raft_peer_server::RaftPeerServer::new(
                service,
            ))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let mut link = Link::new(addr, 0, None);
    assert!(link.usable());
    let frame = request_frame(&request()).unwrap();
    let e = link.exchange(&frame).await.unwrap_err();
    assert!(matches!(e, LinkError::Unsupported), "{e:?}");
    assert!(!link.usable(), "gRPC is used for this peer for a while");
}

#[tokio::test]
async fn a_closed_port_is_an_io_error_not_a_fall_back() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let mut link = Link::new(addr, 0, None);
    let frame = request_frame(&request()).unwrap();
    assert!(matches!(link.exchange(&frame).await, Err(LinkError::Io(_))));
    assert!(link.usable());
}

/// Serves `service` on a new loopback port as a node does (the accept loop,
/// with `tls` if given, and the gRPC server behind it); returns its address and
/// the sender whose drop stops the accept loop.
async fn serve_port(
    service: &PeerService,
    tls: Option<ledgermq_tls::TlsAcceptor>,
) -> (String, tokio::sync::watch::Sender<bool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (grpc_tx, grpc_rx) = tokio::sync::mpsc::channel(4);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(accept_loop(listener, service.clone(), grpc_tx, stop, tls));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(crate::network::pb::raft_peer_server::RaftPeerServer::new(
                service.clone(),
            ))
            .serve_with_incoming(tokio_stream::wrappers::ReceiverStream::new(grpc_rx)),
    );
    (addr, stop_tx)
}

/// The shared port: a framed client is served by the framed server (which
/// answers UNAVAILABLE until Raft runs, on the same connection request after
/// request), and a gRPC client on the same port still reaches the gRPC service.
#[tokio::test]
async fn one_port_serves_frames_and_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let service = service_without_raft(dir.path());
    let (addr, _stop) = serve_port(&service, None).await;

    let mut link = Link::new(addr.clone(), 0, None);
    let answer = link
        .exchange(&request_frame(&request()).unwrap())
        .await
        .unwrap();
    assert_eq!(answer.status, STATUS_UNAVAILABLE);
    assert_eq!(answer.log_commands, crate::format::LOG_COMMANDS);
    // The connection is kept and answers the next request in turn.
    let unknown = [1u8, 0, 0, 0, 99];
    let answer = link.exchange(&unknown).await.unwrap();
    // Raft is not running: that is checked before the kind.
    assert_eq!(answer.status, STATUS_UNAVAILABLE);
    assert!(link.usable());
    // Only answers Raft gave are counted.
    assert_eq!(service.appends.framed.load(Ordering::Relaxed), 0);

    let channel = crate::network::lazy_channel(&addr, Duration::from_secs(1), None).unwrap();
    let mut client = crate::network::pb::raft_peer_client::RaftPeerClient::new(channel);
    let status = client
        .ping(crate::network::peer_request(0, &(), Duration::from_secs(2)).unwrap())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("not running yet"), "{status:?}");
}

/// The group's peer TLS for a node holding `cert` (`tls/testdata`: `member`
/// chains to the group's CA, `rogue` to another), trusting the group's CA.
fn peer_tls(cert: &str) -> crate::network::PeerTls {
    let read = |name: &str| {
        std::fs::read(format!(
            "{}/../tls/testdata/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    };
    crate::network::PeerTls::new(&ledgermq_tls::TlsMaterial {
        cert_pem: read(&format!("{cert}.pem")),
        key_pem: read(&format!("{cert}-key.pem")),
        ca_pem: read("ca.pem"),
    })
    .unwrap()
}

/// With mutual TLS the shared port serves a member on both transports, and
/// nothing to a peer without a member certificate or without TLS: no framed
/// answer and no gRPC service (which would say Raft is not running yet).
#[tokio::test]
async fn with_mutual_tls_only_a_member_reaches_frames_or_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let service = service_without_raft(dir.path());
    let member = peer_tls("member");
    let (addr, _stop) = serve_port(&service, Some(member.acceptor.clone())).await;
    let frame = request_frame(&request()).unwrap();
    let ping = |tls: Option<crate::network::PeerTls>| {
        let addr = addr.clone();
        async move {
            let channel =
                crate::network::lazy_channel(&addr, Duration::from_secs(1), tls.as_ref()).unwrap();
            crate::network::pb::raft_peer_client::RaftPeerClient::new(channel)
                .ping(crate::network::peer_request(0, &(), Duration::from_secs(2)).unwrap())
                .await
                .unwrap_err()
        }
    };

    let mut link = Link::new(addr.clone(), 0, Some(member.connector.clone()));
    let answer = link.exchange(&frame).await.unwrap();
    assert_eq!(answer.status, STATUS_UNAVAILABLE);
    let status = ping(Some(member.clone())).await;
    assert!(status.message().contains("not running yet"), "{status:?}");

    let rogue = peer_tls("rogue");
    let mut link = Link::new(addr.clone(), 0, Some(rogue.connector.clone()));
    assert!(link.exchange(&frame).await.is_err());
    let mut link = Link::new(addr.clone(), 0, None);
    assert!(link.exchange(&frame).await.is_err());
    for tls in [Some(rogue), None] {
        let status = ping(tls).await;
        assert!(!status.message().contains("not running yet"), "{status:?}");
    }
}

#[tokio::test]
async fn a_bad_handshake_or_an_oversized_frame_closes_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let service = service_without_raft(dir.path());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (grpc_tx, _grpc_rx) = tokio::sync::mpsc::channel(4);
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(accept_loop(listener, service, grpc_tx, stop, None));

    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"LMQRAFT9\0\0\0\0\0\0\0\0").await.unwrap();
    let mut buf = Vec::new();
    assert_eq!(
        s.read_to_end(&mut buf).await.unwrap(),
        0,
        "closed, no answer"
    );

    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(MAGIC).await.unwrap();
    s.write_all(&0u64.to_le_bytes()).await.unwrap();
    let mut back = [0u8; 8];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, MAGIC);
    s.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
    let mut buf = Vec::new();
    assert_eq!(
        s.read_to_end(&mut buf).await.unwrap(),
        0,
        "closed, no answer"
    );
}

/// A framed server of its own: answers the handshake, then echoes each request
/// body as an OK answer, after `delays[i]` for the i-th request of the
/// connection; with `close_after`, closes each connection after that many.
async fn echo_server(delays: Vec<Duration>, close_after: Option<usize>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let delays = delays.clone();
            tokio::spawn(async move {
                let mut hello = [0u8; 16];
                s.read_exact(&mut hello).await.unwrap();
                s.write_all(MAGIC).await.unwrap();
                let mut n = 0;
                while let Ok(Some(body)) = read_frame(&mut s, MAX_REQUEST_BYTES).await {
                    tokio::time::sleep(delays.get(n).copied().unwrap_or_default()).await;
                    if s.write_all(&answer_frame(STATUS_OK, &body)).await.is_err() {
                        return;
                    }
                    n += 1;
                    if close_after == Some(n) {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_exchange_cut_by_its_deadline_never_hands_its_answer_to_the_next() {
    let addr = echo_server(vec![Duration::from_millis(300)], None).await;
    let mut link = Link::new(addr, 0, None);
    let cut = tokio::time::timeout(Duration::from_millis(50), link.exchange(b"\x01\0\0\0A")).await;
    assert!(cut.is_err(), "the first answer comes after the deadline");
    let answer = link.exchange(b"\x01\0\0\0B").await.unwrap();
    assert_eq!(answer.payload, b"B", "its own answer, not the late one");
}

#[tokio::test]
async fn a_kept_connection_the_peer_closed_is_replaced_and_the_request_sent_again() {
    let addr = echo_server(vec![], Some(1)).await;
    let mut link = Link::new(addr, 0, None);
    assert_eq!(link.exchange(b"\x01\0\0\0A").await.unwrap().payload, b"A");
    // The server has closed that connection by now.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(link.exchange(b"\x01\0\0\0B").await.unwrap().payload, b"B");
}

#[tokio::test]
async fn stopping_the_accept_loop_closes_the_port_and_its_framed_connections() {
    let dir = tempfile::tempdir().unwrap();
    let service = service_without_raft(dir.path());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (grpc_tx, _grpc_rx) = tokio::sync::mpsc::channel(4);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let accept = tokio::spawn(accept_loop(listener, service, grpc_tx, stop, None));
    let mut link = Link::new(addr.to_string(), 0, None);
    let frame = request_frame(&request()).unwrap();
    assert_eq!(
        link.exchange(&frame).await.unwrap().status,
        STATUS_UNAVAILABLE
    );
    stop_tx.send(true).unwrap();
    accept.await.unwrap();
    let mut conn = link.conn.take().expect("kept");
    let mut buf = Vec::new();
    let closed = conn.read_to_end(&mut buf).await;
    assert!(matches!(closed, Ok(0)) || closed.is_err(), "{closed:?}");
    assert!(TcpStream::connect(addr).await.is_err(), "nothing listens");
}
