//! Test hosts: one network namespace per host, each with a veth into a bridge that
//! lives in a namespace of its own, addresses from [`crate::net`]. Traffic never
//! leaves those namespaces. Needs root, iproute2 and nftables.
//!
//! [`Network`] removes every namespace it made when dropped (also after a panic);
//! [`Network::create`] first removes namespaces a crashed run with the same prefix
//! left behind.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use crate::nemesis::Grudge;
use crate::net::{host_addr, nft_script};
use crate::JepsenError;

/// Runs `ip ARGS`; error with its stderr if it fails.
fn ip(args: &[&str]) -> Result<(), JepsenError> {
    run(Command::new("ip").args(args))
}

fn run(cmd: &mut Command) -> Result<(), JepsenError> {
    let out = cmd
        .output()
        .map_err(|e| JepsenError::Host(format!("{cmd:?}: {e}")))?;
    check(cmd, out)
}

fn check(cmd: &Command, out: Output) -> Result<(), JepsenError> {
    if out.status.success() {
        return Ok(());
    }
    Err(JepsenError::Host(format!(
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// Namespaces whose name starts with `prefix`.
pub fn namespaces_with_prefix(prefix: &str) -> Result<Vec<String>, JepsenError> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map_err(|e| JepsenError::Host(format!("ip netns list: {e}")))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_owned)
        .collect())
}

/// Removes namespaces named `{prefix}{pid}-...` whose process `pid` is gone (left by
/// a run that was killed). Returns how many were removed.
pub fn remove_orphans(prefix: &str) -> Result<usize, JepsenError> {
    let mut n = 0;
    for ns in namespaces_with_prefix(prefix)? {
        let pid = ns[prefix.len()..].split('-').next().unwrap_or("");
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            ip(&["netns", "del", &ns])?;
            n += 1;
        }
    }
    Ok(n)
}

/// A bridged network of `hosts` namespaces.
pub struct Network {
    prefix: String,
    hosts: usize,
}

impl Network {
    /// Creates the bridge namespace and `hosts` host namespaces named
    /// `{prefix}br`, `{prefix}h0`, ... with addresses 10.77.0.10 + i. Errors: `Host`
    /// with the failing command (not root, no iproute2); what was made is removed.
    pub fn create(prefix: &str, hosts: usize) -> Result<Self, JepsenError> {
        for ns in namespaces_with_prefix(prefix)? {
            let _ = ip(&["netns", "del", &ns]);
        }
        let net = Self {
            prefix: prefix.to_owned(),
            hosts,
        };
        let br = net.bridge_ns();
        ip(&["netns", "add", &br])?;
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &br, "link", "set", "br0", "up"])?;
        for i in 0..hosts {
            let ns = net.host_ns(i);
            let (v, p) = (format!("v{i}"), format!("p{i}"));
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &v, "netns", &ns, "type", "veth", "peer", "name", &p, "netns", &br,
            ])?;
            ip(&["-n", &br, "link", "set", &p, "master", "br0"])?;
            ip(&["-n", &br, "link", "set", &p, "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", host_addr(i)),
                "dev",
                &v,
            ])?;
            ip(&["-n", &ns, "link", "set", &v, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// Host `i`'s namespace.
    pub fn host_ns(&self, i: usize) -> String {
        format!("{}h{i}", self.prefix)
    }

    fn bridge_ns(&self) -> String {
        format!("{}br", self.prefix)
    }

    /// Number of hosts.
    pub fn hosts(&self) -> usize {
        self.hosts
    }

    /// A command that runs `program` inside host `i`'s namespace.
    pub fn command(&self, i: usize, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.host_ns(i), program]);
        c
    }

    /// Makes every host drop what `grudge` says (replacing the previous grudge; an
    /// empty one heals). Error: `Host` (nftables missing).
    pub fn apply(&self, grudge: &Grudge) -> Result<(), JepsenError> {
        for i in 0..self.hosts {
            let mut cmd = self.command(i, "nft");
            cmd.args(["-f", "-"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let mut child = cmd
                .spawn()
                .map_err(|e| JepsenError::Host(format!("nft in {}: {e}", self.host_ns(i))))?;
            child
                .stdin
                .take()
                .expect("piped")
                .write_all(nft_script(grudge, i).as_bytes())?;
            let out = child.wait_with_output()?;
            check(&cmd, out)?;
        }
        Ok(())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        if let Ok(all) = namespaces_with_prefix(&self.prefix) {
            for ns in all {
                if let Err(e) = ip(&["netns", "del", &ns]) {
                    eprintln!("could not remove namespace {ns}: {e}");
                }
            }
        }
    }
}
