//! The nemesis's hands: injecting each [`FaultKind`] into the running cluster and
//! the test network, and undoing it at the heal.

use std::path::Path;
use std::time::Duration;

use rand::rngs::StdRng;

use crate::disk;
use crate::hosts::Network;
use crate::nemesis::{halves, isolate, lone_node, majorities_ring, one_way, FaultKind, Grudge};
use crate::procs::{Cluster, NODES};
use crate::JepsenError;

/// How long a node may take to stop after SIGTERM (hand over leadership, flush,
/// close) before the harness kills it and reports it.
pub const TERMINATE_GRACE: Duration = Duration::from_secs(10);

/// How a running fault is undone.
pub enum Undo {
    /// Heal the network.
    Heal,
    /// Start a stopped node again.
    Restart(usize),
    /// SIGCONT a paused node.
    Continue(usize),
    /// Several of the above.
    All(Vec<Undo>),
    /// Nothing left to undo (the node came back by itself).
    Nothing,
}

/// What an injected fault did: how to undo it, a description, and the one node it
/// hit (if it hit one).
pub type Injected = (Undo, String, Option<usize>);

/// The current leader (the highest term's claim), if the name server knows one.
pub fn leader(c: &Cluster, net: &Network) -> Option<usize> {
    c.leaders(net)
        .ok()?
        .into_iter()
        .max_by_key(|l| l.1)
        .map(|l| l.0)
}

/// A power loss on stopped node `n` (killed and reaped: [`Cluster::kill`] waits for
/// it): every page of its store the kernel still holds dirty is erased. Returns
/// what was erased, per kind of file.
fn lose_power(dir: &Path, n: usize) -> Result<String, JepsenError> {
    let lost = disk::power_loss(&Cluster::store_root(dir, n))?;
    Ok(format!("node {n} lost power: {}", lost.describe()))
}

/// A damaged tail on stopped node `n`. Returns what was done.
fn damage(dir: &Path, n: usize, rng: &mut StdRng) -> Result<String, JepsenError> {
    Ok(
        match disk::damage_tail(&Cluster::store_root(dir, n), rng)? {
            Some(f) => format!("{} at offset {}", f.what, f.offset),
            None => "nothing written after the checkpoint; tail left intact".into(),
        },
    )
}

/// Starts fault `kind`; returns how to undo it, what it did and whom it hit.
/// `pick` chooses the random node.
pub fn inject(
    kind: FaultKind,
    rng: &mut StdRng,
    pick: u64,
    c: &mut Cluster,
    net: &Network,
    dir: &Path,
) -> Result<Injected, JepsenError> {
    let random = (pick % NODES as u64) as usize;
    // Another node than `n`, drawn from `pick` too.
    let other = |n: usize| (n + 1 + (pick / NODES as u64 % (NODES as u64 - 1)) as usize) % NODES;
    let grudge = |g: Grudge, what: String, target| -> Result<Injected, JepsenError> {
        net.apply(&g)?;
        Ok((Undo::Heal, format!("{what}; dropped links {g:?}"), target))
    };
    let leader_or_random = |c: &Cluster| leader(c, net).unwrap_or(random);
    Ok(match kind {
        FaultKind::PartitionHalves => {
            let g = halves(NODES, rng);
            let alone = lone_node(NODES, &g);
            grudge(g, "random halves".into(), alone)?
        }
        FaultKind::IsolateLeader => {
            let l = leader_or_random(c);
            grudge(
                isolate(NODES, l),
                format!("node {l} (leader) isolated"),
                Some(l),
            )?
        }
        FaultKind::MajoritiesRing => {
            grudge(majorities_ring(NODES, rng), "majorities ring".into(), None)?
        }
        FaultKind::OneWay => grudge(
            one_way(NODES, random),
            format!("node {random} cannot send"),
            Some(random),
        )?,
        FaultKind::KillLeader | FaultKind::KillRandom => {
            let n = match kind {
                FaultKind::KillLeader => leader_or_random(c),
                _ => random,
            };
            c.kill(n);
            (
                Undo::Restart(n),
                format!("node {n} killed (SIGKILL)"),
                Some(n),
            )
        }
        FaultKind::KillMajority => {
            let l = leader_or_random(c);
            let o = other(l);
            c.kill(l);
            c.kill(o);
            (
                Undo::All(vec![Undo::Restart(l), Undo::Restart(o)]),
                format!("nodes {l} (leader) and {o} killed (SIGKILL): no quorum"),
                None,
            )
        }
        FaultKind::PauseLeader => {
            let n = leader_or_random(c);
            c.signal(n, "STOP")?;
            (
                Undo::Continue(n),
                format!("node {n} paused (SIGSTOP)"),
                Some(n),
            )
        }
        FaultKind::TerminateLeader => {
            let n = leader_or_random(c);
            let how = match c.terminate(n, TERMINATE_GRACE)? {
                Some(status) => format!("stopped ({status})"),
                None => format!(
                    "did not stop within {} s: killed",
                    TERMINATE_GRACE.as_secs()
                ),
            };
            (
                Undo::Restart(n),
                format!("node {n} (leader) sent SIGTERM under load: {how}"),
                Some(n),
            )
        }
        FaultKind::PowerLoss => {
            c.kill(random);
            (
                Undo::Restart(random),
                lose_power(dir, random)?,
                Some(random),
            )
        }
        FaultKind::PowerLossAll => {
            let mut what = Vec::new();
            for n in 0..NODES {
                c.kill(n);
            }
            for n in 0..NODES {
                what.push(lose_power(dir, n)?);
            }
            (
                Undo::All((0..NODES).map(Undo::Restart).collect()),
                format!("every node lost power at once: {}", what.join("; ")),
                None,
            )
        }
        FaultKind::PowerLossPartitioned => {
            // `random` loses power and comes back at once, while `o` is cut off:
            // the group's quorum is the node that lost its tail and the third one.
            let o = other(random);
            let g = isolate(NODES, o);
            net.apply(&g)?;
            c.kill(random);
            let lost = lose_power(dir, random)?;
            c.restart(net, random)?;
            (
                Undo::Heal,
                format!("node {o} isolated; {lost}; node {random} restarted at once"),
                None,
            )
        }
        FaultKind::CorruptTail => {
            c.kill(random);
            let what = damage(dir, random, rng)?;
            (
                Undo::Restart(random),
                format!("node {random} killed, {what}"),
                Some(random),
            )
        }
        FaultKind::QuickRestart => {
            // Back before the group has elected a new leader.
            let n = leader_or_random(c);
            c.kill(n);
            let what = damage(dir, n, rng)?;
            c.restart(net, n)?;
            (
                Undo::Nothing,
                format!("node {n} (leader) killed, {what}, restarted at once"),
                Some(n),
            )
        }
    })
}

/// Undoes a fault.
pub fn undo(u: Undo, c: &mut Cluster, net: &Network) -> Result<(), JepsenError> {
    match u {
        Undo::Heal => net.apply(&Grudge::new()),
        Undo::Restart(n) => c.restart(net, n),
        Undo::Continue(n) => c.signal(n, "CONT"),
        Undo::All(us) => us.into_iter().try_for_each(|u| undo(u, c, net)),
        Undo::Nothing => Ok(()),
    }
}
