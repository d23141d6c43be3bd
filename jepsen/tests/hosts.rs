//! The namespaced test network (needs root, iproute2 and nftables; `.ci/run`
//! installs them): hosts reach each other over the bridge, a grudge cuts exactly
//! its links (one-way cuts included), healing restores them, and dropping the
//! network removes every namespace.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ledgermq_jepsen::hosts::{namespaces_with_prefix, Network};
use ledgermq_jepsen::nemesis::{isolate, one_way, Grudge};
use ledgermq_jepsen::net::host_addr;

const PORT: u16 = 7411;

/// A TCP listener in host `i` that accepts forever.
fn listen(net: &Network, i: usize) -> Child {
    net.command(i, "python3")
        .args([
            "-c",
            &format!(
                "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
                 s.bind(('{}',{PORT}))\ns.listen(64)\nwhile True:\n  c,_=s.accept()\n  c.close()",
                host_addr(i)
            ),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Whether host `from` can open a TCP connection to host `to` within 300 ms.
fn reaches(net: &Network, from: usize, to: usize) -> bool {
    net.command(from, "python3")
        .args([
            "-c",
            &format!(
                "import socket\nsocket.create_connection(('{}',{PORT}),timeout=0.3)",
                host_addr(to)
            ),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

fn wait_reaches(net: &Network, from: usize, to: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !reaches(net, from, to) {
        assert!(Instant::now() < deadline, "{from} never reached {to}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn grudges_cut_exactly_their_links_and_the_network_cleans_up() {
    let prefix = format!("lmqj{}-", std::process::id());
    {
        let net = Network::create(&prefix, 3).expect("root, iproute2 and nftables");
        let mut listeners: Vec<Child> = (0..3).map(|i| listen(&net, i)).collect();
        for (a, b) in [(0, 1), (1, 2), (2, 0)] {
            wait_reaches(&net, a, b);
        }
        net.apply(&isolate(3, 1)).unwrap();
        assert!(!reaches(&net, 0, 1) && !reaches(&net, 1, 2));
        assert!(reaches(&net, 0, 2));
        // One way: host 2 cannot send, so its connections fail, while packets to it
        // still arrive (a SYN reaches it; its SYN-ACK is dropped).
        net.apply(&one_way(3, 2)).unwrap();
        assert!(!reaches(&net, 2, 0));
        assert!(reaches(&net, 0, 1));
        net.apply(&Grudge::new()).unwrap();
        wait_reaches(&net, 2, 0);
        wait_reaches(&net, 1, 2);
        for l in &mut listeners {
            let _ = l.kill();
            let _ = l.wait();
        }
    }
    assert!(namespaces_with_prefix(&prefix).unwrap().is_empty());
    // The host's own network namespace was never touched.
    let out = Command::new("ip").args(["-4", "addr"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("10.77.0."));
}
