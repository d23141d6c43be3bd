//! The nemesis's hands: injecting each [`FaultKind`] into the running cluster and
//! the test network, and undoing it at the heal. A grudge may name the name
//! server's and the clients' hosts as well as the nodes ([`crate::procs`]).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::Rng;

use crate::disk;
use crate::hosts::Network;
use crate::nemesis::{
    halves, isolate, lone_node, majorities_ring, one_way, split, FaultKind, Grudge,
};
use crate::node_env;
use crate::procs::{Cluster, CLIENT_HOST, NAMESRV_HOST, NODES};
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
    /// Stop moving node `.0`'s clock (the jumps of `.1`, if any) and set it right.
    ClockBack(usize, Option<ClockJumps>),
    /// Remove the ballast filling node `.0`'s disk.
    FreeDisk(usize),
    /// Stop delaying node `.0`'s fsyncs.
    FastDisk(usize),
}

/// A thread moving one node's clock through a seeded schedule until stopped.
pub struct ClockJumps {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<(), JepsenError>>,
}

/// What an injected fault did: how to undo it, a description, and the one node it
/// hit (if it hit one).
pub type Injected = (Undo, String, Option<usize>);

/// The current leader as the nodes themselves say ([`crate::routes::nodes_leader`]:
/// the highest term's claim among the nodes the clients reach), else as the name
/// server says (its view goes stale while it is cut off, and it expires every
/// node then), if either knows one.
pub fn leader(c: &Cluster, net: &Network) -> Option<usize> {
    if let Some((l, _)) = crate::routes::nodes_leader(c, net) {
        return Some(l);
    }
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
    node_env::reboot(dir, n)?;
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
        FaultKind::QuickRestartLagging => {
            let l = leader_or_random(c);
            quick_restart_lagging(l, other(l), rng, c, net, dir)?
        }
        FaultKind::PartitionClientLeader => {
            let l = leader_or_random(c);
            grudge(
                split(&[CLIENT_HOST], &[l]),
                format!("clients cut from node {l} (leader) both ways; the nodes see each other"),
                Some(l),
            )?
        }
        FaultKind::PartitionNamesrv => {
            // From `pick`'s high bits.
            let clients_too = (pick >> 32) & 1 == 1;
            let mut cut: Vec<usize> = (0..NODES).collect();
            if clients_too {
                cut.push(CLIENT_HOST);
            }
            let whom = if clients_too {
                "every node and the clients"
            } else {
                "every node"
            };
            grudge(
                split(&[NAMESRV_HOST], &cut),
                format!("name server cut from {whom}"),
                None,
            )?
        }
        FaultKind::Retention => {
            c.own_disks()?;
            let l = leader_or_random(c);
            let f = other(l);
            let what = crate::retention::force(c, net, l, f)?;
            (Undo::Restart(f), what, Some(f))
        }
        FaultKind::CorruptMidLog
        | FaultKind::CorruptIndex
        | FaultKind::CorruptConsumeQueue
        | FaultKind::CorruptCheckpoint
        | FaultKind::CorruptMetadata => {
            let part = match kind {
                FaultKind::CorruptMidLog => disk::Part::MidLog,
                FaultKind::CorruptIndex => disk::Part::RaftIndex,
                FaultKind::CorruptConsumeQueue => disk::Part::ConsumeQueue,
                FaultKind::CorruptCheckpoint => disk::Part::Checkpoint,
                _ => disk::Part::Metadata,
            };
            let role = role_of(c, net, random);
            // The metadata store is written out only at a flush (a purge, a
            // snapshot, a clean stop): half the time the node is stopped cleanly
            // first, so that the damage lands in everything it holds.
            let stopped = if part == disk::Part::Metadata && rng.gen_bool(0.5) {
                match c.terminate(random, TERMINATE_GRACE)? {
                    Some(_) => "stopped (SIGTERM)",
                    None => "killed (did not stop on SIGTERM)",
                }
            } else {
                c.kill(random);
                "killed"
            };
            let what = match disk::corrupt(&Cluster::store_root(dir, random), part, rng)? {
                Some(f) => f.what,
                None => format!("nothing of {part:?} to damage; left intact"),
            };
            (
                Undo::Restart(random),
                format!("node {random} ({role}) {stopped}, {what}"),
                Some(random),
            )
        }
        FaultKind::ClockSkew | FaultKind::ClockJump | FaultKind::DiskFull | FaultKind::SlowDisk => {
            let role = role_of(c, net, random);
            let (u, what) = node_fault(kind, rng, random, c)?;
            (u, format!("node {random} ({role}): {what}"), Some(random))
        }
    })
}

/// `leader` if node `n` leads now, else `follower`.
fn role_of(c: &Cluster, net: &Network, n: usize) -> &'static str {
    if leader(c, net) == Some(n) {
        "leader"
    } else {
        "follower"
    }
}

/// How long [`FaultKind::QuickRestartLagging`] cuts a follower off before the
/// leader's restart, ms: longer than the leader's damaged tail (what it wrote
/// after its last checkpoint, at most a flush interval of 500 ms) takes to write.
pub const LAG_MS: u64 = 2_000;

/// [`FaultKind::QuickRestartLagging`]: follower `lagging` is cut off for
/// [`LAG_MS`] while leader `l` and the third node commit without it; then `l` is
/// killed, its tail damaged, the third node cut off instead and `l` restarted at
/// once. The heal reconnects the third node.
fn quick_restart_lagging(
    l: usize,
    lagging: usize,
    rng: &mut StdRng,
    c: &mut Cluster,
    net: &Network,
    dir: &Path,
) -> Result<Injected, JepsenError> {
    let ahead = (0..NODES)
        .find(|&n| n != l && n != lagging)
        .expect("a group of three");
    net.apply(&isolate(NODES, lagging))?;
    std::thread::sleep(Duration::from_millis(LAG_MS));
    c.kill(l);
    let what = damage(dir, l, rng)?;
    net.apply(&isolate(NODES, ahead))?;
    c.restart(net, l)?;
    Ok((
        Undo::Heal,
        format!("node {lagging} cut off for {LAG_MS} ms, then node {l} (leader) killed, {what}, restarted at once while node {ahead} is cut off"),
        None,
    ))
}

/// Node `n`'s clock, disk or fsync fault: how to undo it and what it did.
fn node_fault(
    kind: FaultKind,
    rng: &mut StdRng,
    n: usize,
    c: &Cluster,
) -> Result<(Undo, String), JepsenError> {
    let dir = c.dir();
    let sign = |rng: &mut StdRng| if rng.gen::<bool>() { 1 } else { -1 };
    Ok(match kind {
        FaultKind::ClockSkew => {
            c.fake_clocks()?;
            // Past the 2.5 s forwarded-write deadline; past the 10 s invisible
            // time of FIFO leases for most draws.
            let offset = sign(rng) * rng.gen_range(3..=30);
            node_env::set_clock_offset(dir, n, offset)?;
            (
                Undo::ClockBack(n, None),
                format!("clock set {offset:+} s off (libfaketime, within 1 s)"),
            )
        }
        FaultKind::ClockJump => {
            c.fake_clocks()?;
            let steps: Vec<(i64, u64)> = (0..8)
                .map(|_| {
                    (
                        sign(rng) * rng.gen_range(10..=120),
                        rng.gen_range(1_000..=2_500),
                    )
                })
                .collect();
            let what = steps
                .iter()
                .map(|(o, ms)| format!("{o:+} s for {ms} ms"))
                .collect::<Vec<_>>()
                .join(", ");
            (
                Undo::ClockBack(n, Some(jump_clock(dir, n, steps))),
                format!("clock jumping (libfaketime, each within 1 s), repeating: {what}"),
            )
        }
        FaultKind::DiskFull => {
            c.own_disks()?;
            let leave: u64 = [0, 1 << 20, 16 << 20][rng.gen_range(0..3)];
            let root = Cluster::store_root(dir, n);
            let took = node_env::fill_disk(&root, leave)?;
            let free = node_env::free_bytes(&root)?;
            (
                Undo::FreeDisk(n),
                format!("disk filled by a ballast of {took} bytes, {free} bytes left (asked to leave {leave})"),
            )
        }
        _ => {
            let min = rng.gen_range(20..=100);
            let max = min + rng.gen_range(50..=150);
            node_env::set_fsync_delay(dir, n, Some((min, max)))?;
            (
                Undo::FastDisk(n),
                format!("each fsync delayed {min}-{max} ms (within 100 ms)"),
            )
        }
    })
}

/// Starts a thread that sets node `n`'s clock offset to each `(offset s, for ms)`
/// of `steps` in turn, over and over, until [`Undo::ClockBack`] stops it.
fn jump_clock(dir: &Path, n: usize, steps: Vec<(i64, u64)>) -> ClockJumps {
    let stop = Arc::new(AtomicBool::new(false));
    let (dir, stopped) = (dir.to_path_buf(), stop.clone());
    let thread = std::thread::spawn(move || {
        for (offset, ms) in steps.iter().cycle() {
            node_env::set_clock_offset(&dir, n, *offset)?;
            let until = Instant::now() + Duration::from_millis(*ms);
            while Instant::now() < until {
                if stopped.load(Ordering::Relaxed) {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    });
    ClockJumps { stop, thread }
}

/// Undoes a fault.
pub fn undo(u: Undo, c: &mut Cluster, net: &Network) -> Result<(), JepsenError> {
    match u {
        Undo::Heal => net.apply(&Grudge::new()),
        Undo::Restart(n) => c.restart(net, n),
        Undo::Continue(n) => c.signal(n, "CONT"),
        Undo::All(us) => us.into_iter().try_for_each(|u| undo(u, c, net)),
        Undo::Nothing => Ok(()),
        Undo::ClockBack(n, jumps) => {
            if let Some(j) = jumps {
                j.stop.store(true, Ordering::Relaxed);
                j.thread
                    .join()
                    .map_err(|_| JepsenError::Host("the clock-jump thread panicked".into()))??;
            }
            node_env::set_clock_offset(c.dir(), n, 0)
        }
        Undo::FreeDisk(n) => node_env::free_disk(&Cluster::store_root(c.dir(), n)),
        Undo::FastDisk(n) => node_env::set_fsync_delay(c.dir(), n, None),
    }
}
