use super::*;
use tokio::io::AsyncWriteExt;

fn read(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/testdata/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn material(cert: &str, ca: &str) -> TlsMaterial {
    TlsMaterial {
        cert_pem: read(&format!("{cert}.pem")),
        key_pem: read(&format!("{cert}-key.pem")),
        ca_pem: read(&format!("{ca}.pem")),
    }
}

/// A server on loopback that accepts one connection with `acceptor` and, when
/// it starts, echoes its first 5 bytes back after the byte [`accept`] saw.
async fn server(acceptor: Option<TlsAcceptor>) -> (String, tokio::task::JoinHandle<Option<u8>>) {
    server_with(acceptor, false).await
}

/// [`server`], serving plain connections too when `plain_too`.
async fn server_with(
    acceptor: Option<TlsAcceptor>,
    plain_too: bool,
) -> (String, tokio::task::JoinHandle<Option<u8>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let (mut stream, first) =
            accept(tcp, acceptor.as_ref(), plain_too, Duration::from_secs(5)).await?;
        let mut got = [0u8; 5];
        stream.read_exact(&mut got).await.ok()?;
        stream.write_all(&[first]).await.ok()?;
        stream.write_all(&got).await.ok()?;
        stream.flush().await.ok()?;
        Some(first)
    });
    (addr, task)
}

async fn hello(stream: &mut Stream) -> std::io::Result<[u8; 6]> {
    stream.write_all(b"hello").await?;
    stream.flush().await?;
    let mut back = [0u8; 6];
    stream.read_exact(&mut back).await?;
    Ok(back)
}

#[tokio::test]
async fn a_member_reaches_a_member_over_mutual_tls_and_its_first_byte_is_read_again() {
    let member = material("member", "ca");
    let (addr, task) = server(Some(member.acceptor(true).unwrap())).await;
    let mut stream = connect(&addr, Some(&member.connector(true).unwrap()))
        .await
        .unwrap();
    assert!(stream.is_tls());
    assert_eq!(&hello(&mut stream).await.unwrap(), b"hhello");
    assert_eq!(task.await.unwrap(), Some(b'h'));
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused_by_a_mutual_tls_server() {
    let member = material("member", "ca");
    let (addr, task) = server(Some(member.acceptor(true).unwrap())).await;
    // TLS 1.3: the client's handshake ends before the server has checked it, so
    // the refusal shows on the first exchange.
    let refused = match connect(&addr, Some(&member.connector(false).unwrap())).await {
        Ok(mut s) => hello(&mut s).await.is_err(),
        Err(_) => true,
    };
    assert!(refused);
    assert_eq!(task.await.unwrap(), None);
}

#[tokio::test]
async fn a_client_whose_certificate_has_another_ca_is_refused() {
    let member = material("member", "ca");
    // The rogue trusts the group's CA, so only the server's check can refuse it.
    let rogue = material("rogue", "ca");
    let (addr, task) = server(Some(member.acceptor(true).unwrap())).await;
    let refused = match connect(&addr, Some(&rogue.connector(true).unwrap())).await {
        Ok(mut s) => hello(&mut s).await.is_err(),
        Err(_) => true,
    };
    assert!(refused);
    assert_eq!(task.await.unwrap(), None);
}

#[tokio::test]
async fn a_server_whose_certificate_has_another_ca_is_refused_by_the_client() {
    let rogue = material("rogue", "rogue-ca");
    let member = material("member", "ca");
    let (addr, task) = server(Some(rogue.acceptor(false).unwrap())).await;
    let err = connect(&addr, Some(&member.connector(true).unwrap()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert_eq!(task.await.unwrap(), None);
}

#[tokio::test]
async fn a_plain_client_is_refused_by_a_tls_server_and_served_by_a_plain_one() {
    let member = material("member", "ca");
    let (addr, task) = server(Some(member.acceptor(true).unwrap())).await;
    let mut plain = connect(&addr, None).await.unwrap();
    // No echo: a TLS alert at most, then the close.
    assert!(hello(&mut plain)
        .await
        .map_or(true, |back| &back != b"hhello"));
    assert_eq!(task.await.unwrap(), None);

    let (addr, task) = server(None).await;
    let mut plain = connect(&addr, None).await.unwrap();
    assert!(!plain.is_tls());
    assert_eq!(&hello(&mut plain).await.unwrap(), b"hhello");
    assert_eq!(task.await.unwrap(), Some(b'h'));
}

#[tokio::test]
async fn a_permissive_server_takes_tls_and_plain_clients() {
    let member = material("member", "ca");
    let (addr, task) = server_with(Some(member.acceptor(false).unwrap()), true).await;
    let mut tls = connect(&addr, Some(&member.connector(false).unwrap()))
        .await
        .unwrap();
    assert_eq!(&hello(&mut tls).await.unwrap(), b"hhello");
    assert_eq!(task.await.unwrap(), Some(b'h'));
    let (addr, task) = server_with(Some(member.acceptor(false).unwrap()), true).await;
    let mut plain = connect(&addr, None).await.unwrap();
    assert_eq!(&hello(&mut plain).await.unwrap(), b"hhello");
    assert_eq!(task.await.unwrap(), Some(b'h'));
}

#[test]
fn bad_pem_inputs_are_named() {
    let mut m = material("member", "ca");
    m.ca_pem = b"not a certificate".to_vec();
    assert!(matches!(
        m.check(),
        Err(TlsError::Pem {
            what: "CA certificates",
            ..
        })
    ));
    let mut m = material("member", "ca");
    m.key_pem = read("member.pem");
    assert!(matches!(
        m.check(),
        Err(TlsError::Pem {
            what: "private key",
            ..
        })
    ));
    // A key that is not the certificate's.
    let mut m = material("member", "ca");
    m.key_pem = read("rogue-key.pem");
    assert!(m.check().is_err());
    assert!(material("member", "ca").check().is_ok());
    assert!(!format!("{:?}", material("member", "ca")).contains("PRIVATE"));
}

#[test]
fn server_names_are_the_host_part_of_an_address() {
    for (addr, name) in [
        ("127.0.0.1:41011", "127.0.0.1"),
        ("localhost:9876", "localhost"),
        ("[::1]:9876", "::1"),
        ("::1", "::1"),
        ("fe80::1", "fe80::1"),
        ("broker-a.example", "broker-a.example"),
    ] {
        assert_eq!(server_name(addr).unwrap().to_str(), name, "{addr}");
    }
    assert!(matches!(
        server_name("bad host:1"),
        Err(TlsError::ServerName(_))
    ));
}
