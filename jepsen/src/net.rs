//! The test network's plan (no I/O): one network namespace per host, joined by a
//! bridge in a namespace of its own, addresses in `10.77.0.0/24`, and the nftables
//! rules that carry out a grudge (see [`crate::nemesis`]) inside each host's
//! namespace. Dropping a directed link (a, b) filters a's output to b's address, so
//! one-way cuts need no help from b.

use std::net::Ipv4Addr;

use crate::nemesis::Grudge;

/// Prefix of every namespace `jepsen run` makes (`lmqj-<pid>-h0`, ...); it removes
/// its own on exit, and at start those of runs whose process is gone.
pub const NS_PREFIX: &str = "lmqj-";
/// The nftables table the nemesis owns in each host namespace.
pub const NFT_TABLE: &str = "lmq_nemesis";

/// Host `i`'s address (10.77.0.10 + i; the client namespace is a host too).
pub fn host_addr(i: usize) -> Ipv4Addr {
    debug_assert!(i < 200);
    Ipv4Addr::new(10, 77, 0, 10 + i as u8)
}

/// The `nft -f -` script that makes host `from`'s namespace drop what the grudge
/// says it must not send: it replaces the nemesis table (so applying a new grudge
/// heals the old one). An empty grudge for `from` gives a table with no drops.
pub fn nft_script(grudge: &Grudge, from: usize) -> String {
    let mut s = format!(
        "table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\ntable inet {NFT_TABLE} {{\n  chain output {{\n    type filter hook output priority 0; policy accept;\n"
    );
    for &(a, b) in grudge {
        if a == from {
            s.push_str(&format!("    ip daddr {} drop\n", host_addr(b)));
        }
    }
    s.push_str("  }\n}\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nemesis::{isolate, one_way};

    #[test]
    fn scripts_drop_exactly_the_grudges_outgoing_links() {
        let g = isolate(3, 1);
        let s1 = nft_script(&g, 1);
        assert!(s1.contains("ip daddr 10.77.0.10 drop") && s1.contains("ip daddr 10.77.0.12 drop"));
        let s0 = nft_script(&g, 0);
        assert!(s0.contains("ip daddr 10.77.0.11 drop") && !s0.contains("10.77.0.12"));
        // One way: node 2 cannot send, but still receives.
        let g = one_way(3, 2);
        assert_eq!(nft_script(&g, 0).matches("drop").count(), 0);
        assert_eq!(nft_script(&g, 2).matches("drop").count(), 2);
        // Each script first replaces the table, so it also heals the last grudge.
        assert!(s0.starts_with("table inet lmq_nemesis\ndelete table inet lmq_nemesis\n"));
    }
}
