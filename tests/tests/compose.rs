//! deploy/compose end to end: the image built FROM scratch out of this checkout's
//! binaries, two name servers and two broker groups of three nodes brought up with
//! docker-compose (TLS on every port, mutual TLS between members, ACLs, signed
//! registrations), and the official RocketMQ 5 Python client
//! (`tests/python/compose_check.py`, over TLS, signing as a user this test
//! creates with `mqadmin createUser` / `createAcl`) producing to and consuming
//! from both groups while broker-a is hit three times:
//!
//! 1. its leader's container is killed (SIGKILL), then started again;
//! 2. its (new) leader is disconnected from the network, then reconnected;
//! 3. every container, name servers included, is restarted one at a time with
//!    SIGTERM (`docker restart`), each node caught up before the next.
//!
//! It fails on a send never acknowledged, an acknowledged message never received,
//! a FIFO message group out of order, and, in the kill and rolling-restart
//! windows, a send that paused longer than `LEDGERMQ_COMPOSE_MAX_PAUSE_MS`
//! (default 3000: the goal is 2 s, which runs here met, measured at 1.0-1.8 s
//! for the kill with debug binaries on 2 cores; the margin keeps a loaded CI
//! machine from failing it) or a window with no acknowledgement in its whole
//! seconds.
//! While the leader is cut off, a send straight to each of the two members left
//! must be answered OK (the group keeps serving); the client's pause then is
//! printed, not bounded: a client whose gRPC connection is on the cut-off node
//! stalls until the network comes back (the official Python client sets no
//! keepalive, and no reset comes from a host that is gone), each attempt
//! waiting out its 3 s timeout. Needs root, a docker engine and docker-compose;
//! skipped with a message otherwise. Takes the whole project (containers,
//! network, volumes) down at the end, pass or fail.

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use ledgermq_tests::compose::{self, service_ip, wait_caught_up, wait_leader, Compose};
use ledgermq_tests::netns::hosts_text;
use tokio::io::{AsyncBufReadExt, BufReader};

const GROUP_A: [&str; 3] = ["a0", "a1", "a2"];
const GROUP_B: [&str; 3] = ["b0", "b1", "b2"];
/// The client reports sends slower than this, ms.
const SLOW_MS: u64 = 250;
/// The client's user, made by the test: publishes to and subscribes on the
/// test's topics, consumes as its groups, nothing else.
const CLIENT_USER: (&str, &str) = ("compose", "compose-client-secret");
/// A restarted member counts as caught up at this lag (the producer keeps
/// writing meanwhile).
const MAX_LAG: u64 = 200;

/// One fault's window, in seconds since the Unix epoch.
struct Phase {
    name: &'static str,
    start: f64,
    end: f64,
    bounded: bool,
}

/// Both name servers, as `mqadmin -n` takes them.
fn namesrv_addrs() -> String {
    format!(
        "{}:9876;{}:9876",
        service_ip("namesrv1"),
        service_ip("namesrv2")
    )
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[test]
fn compose_groups_ride_out_a_leader_kill_a_cut_off_leader_and_a_rolling_restart() {
    if let Some(why) = compose::skip_reason() {
        eprintln!("SKIPPED compose: {why}");
        return;
    }
    let bin_dir = ledgermq_testkit::bin("mqbroker")
        .expect("cargo build --bins first")
        .parent()
        .expect("a directory")
        .to_owned();
    let project = Compose::up("lmqcompose", "ledgermq:test", &bin_dir).expect("compose up");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let outcome = rt.block_on(scenario(&project));
    // Every container's whole log, kept past the test's end when it failed or
    // LEDGERMQ_COMPOSE_KEEP_LOGS is set.
    let path = std::env::temp_dir().join(format!("lmqcompose-{}.log", std::process::id()));
    if outcome.is_err() || std::env::var_os("LEDGERMQ_COMPOSE_KEEP_LOGS").is_some() {
        let _ = std::fs::write(&path, project.logs(usize::MAX));
        println!("container logs in {}", path.display());
    }
    match outcome {
        Ok(report) => println!("{report}"),
        Err(e) => {
            panic!(
                "{e:#}\n--- container logs (all of them in {}) ---\n{}",
                path.display(),
                project.logs(40)
            )
        }
    }
}

async fn scenario(c: &Compose) -> Result<String> {
    let leader_a = wait_leader(&GROUP_A, Duration::from_secs(60)).await?;
    wait_leader(&GROUP_B, Duration::from_secs(60)).await?;
    println!("broker-a led by {leader_a}");
    for args in [
        &["updateTopic", "-t", "CoA", "-q", "4", "-b", "broker-a"][..],
        &[
            "updateTopic",
            "-t",
            "CoFifo",
            "-q",
            "4",
            "--fifo",
            "-b",
            "broker-a",
        ],
        &["updateTopic", "-t", "CoB", "-q", "4", "-b", "broker-b"],
        &["updateSubGroup", "-g", "CoSimple"],
        &["updateSubGroup", "-g", "CoFifoGroup", "--fifo"],
        &["createUser", "-u", CLIENT_USER.0, "-p", CLIENT_USER.1],
        &[
            "createAcl",
            "-s",
            CLIENT_USER.0,
            "-r",
            "Topic:CoA,Topic:CoFifo,Topic:CoB",
            "-a",
            "Pub,Sub",
        ],
        &[
            "createAcl",
            "-s",
            CLIENT_USER.0,
            "-r",
            "Group:CoSimple,Group:CoFifoGroup",
            "-a",
            "Sub",
        ],
    ] {
        let namesrv = namesrv_addrs();
        let mut all = args.to_vec();
        all.extend(["-n", &namesrv]);
        c.mqadmin("a0", &all)?;
    }
    // The client asks broker-a for CoB's route, which it takes from the name
    // servers once broker-b has announced the topic.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !c
        .mqadmin("a1", &["topicRoute", "-n", &namesrv_addrs(), "-t", "CoB"])
        .unwrap_or_default()
        .contains("broker-b")
    {
        if std::time::Instant::now() > deadline {
            bail!("CoB has no route on the name servers");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let dir = tempfile::tempdir()?;
    let hosts = dir.path().join("hosts");
    let ips = |g: &[&str; 3]| g.map(service_ip);
    let (a, b) = (ips(&GROUP_A), ips(&GROUP_B));
    let (a, b): (Vec<&str>, Vec<&str>) = (
        a.iter().map(String::as_str).collect(),
        b.iter().map(String::as_str).collect(),
    );
    std::fs::write(&hosts, hosts_text(&[("broker-a", &a), ("broker-b", &b)]))?;
    let stop = dir.path().join("stop");
    let err_path = dir.path().join("compose_check.err");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/compose_check.py");
    // A mount namespace of its own, whose /etc/hosts names each group's members
    // as the compose network's aliases do inside it.
    let mut child = tokio::process::Command::new("unshare")
        .args(["-m", "--", "sh", "-c"])
        .arg(r#"mount --bind "$0" /etc/hosts && exec python3 "$@""#)
        .arg(&hosts)
        .arg(script)
        .args([
            "--access",
            "broker-a:8081",
            "--slow-s",
            &(SLOW_MS as f64 / 1000.0).to_string(),
            "--tls",
            "--access-key",
            CLIENT_USER.0,
        ])
        // The secret key by environment, not on a command line.
        .env("LEDGERMQ_SECRET_KEY", CLIENT_USER.1)
        .env(
            "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
            compose::certs_dir().join("ca.pem"),
        )
        .arg("--stop-file")
        .arg(&stop)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err_path)?)
        .kill_on_drop(true)
        .spawn()
        .context("unshare python3 (scripts/test installs the client)")?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
    if !matches!(&first, Ok(Ok(Some(l))) if l == "started") {
        let err = std::fs::read_to_string(&err_path).unwrap_or_default();
        bail!("compose_check.py did not start: {first:?}\n{err}");
    }
    // Sends before this (the first of each topic, routes still being fetched)
    // are not judged.
    let started = now();

    let phases = faults(c).await;
    std::fs::write(&stop, b"")?;
    let summary = tokio::time::timeout(Duration::from_secs(120), async {
        let mut last = String::new();
        while let Ok(Some(l)) = lines.next_line().await {
            last = l;
        }
        last
    })
    .await
    .unwrap_or_default();
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
    let tail = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
    let (phases, events) = phases?;
    let report = judge(&summary, started, &phases, &events)
        .with_context(|| format!("client stderr:\n{tail}"))?;
    if !matches!(status, Ok(Ok(s)) if s.success()) {
        bail!("compose_check.py failed ({status:?}): {summary}\n{tail}");
    }
    Ok(report)
}

/// The three faults on broker-a, while the client runs: their windows, each
/// from its fault to the next fault (its recovery included), and what was done
/// when, for the report.
async fn faults(c: &Compose) -> Result<(Vec<Phase>, Vec<(f64, String)>)> {
    let mut phases: Vec<Phase> = Vec::new();
    let mut events = Vec::new();
    let begin = |phases: &mut Vec<Phase>, name, bounded| {
        let start = now();
        if let Some(p) = phases.last_mut() {
            p.end = start;
        }
        phases.push(Phase {
            name,
            start,
            end: f64::MAX,
            bounded,
        });
    };
    tokio::time::sleep(Duration::from_secs(3)).await;

    let victim = wait_leader(&GROUP_A, Duration::from_secs(10)).await?;
    begin(&mut phases, "leader killed", true);
    c.docker(&["kill"], &victim)?;
    events.push((now(), format!("killed {victim}")));
    let rest: Vec<&str> = GROUP_A.into_iter().filter(|s| *s != victim).collect();
    let next = wait_leader(&rest, Duration::from_secs(30)).await?;
    events.push((now(), format!("{next} leads")));
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.docker(&["start"], &victim)?;
    wait_caught_up(&GROUP_A, &victim, MAX_LAG, Duration::from_secs(60)).await?;
    events.push((now(), format!("{victim} caught up")));

    let cut = wait_leader(&GROUP_A, Duration::from_secs(10)).await?;
    begin(&mut phases, "leader cut off", false);
    c.disconnect(&cut)?;
    events.push((now(), format!("cut {cut} off")));
    let rest: Vec<&str> = GROUP_A.into_iter().filter(|s| *s != cut).collect();
    let next = wait_leader(&rest, Duration::from_secs(30)).await?;
    events.push((now(), format!("{next} leads")));
    // The group serves through both members it has left, whatever the
    // client's own connection is stuck on.
    for (i, s) in rest.iter().enumerate() {
        compose::send_probe(s, "CoA", &format!("probe-{i}-{}", now()), CLIENT_USER).await?;
        events.push((now(), format!("a send through {s} answered OK")));
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    c.reconnect(&cut)?;
    events.push((now(), format!("reconnected {cut}")));
    wait_caught_up(&GROUP_A, &cut, MAX_LAG, Duration::from_secs(60)).await?;
    events.push((now(), format!("{cut} caught up")));

    begin(&mut phases, "rolling restart", true);
    for s in ["namesrv1", "namesrv2", "a0", "a1", "a2", "b0", "b1", "b2"] {
        events.push((now(), format!("restarting {s}")));
        c.docker(&["restart", "-t", "15"], s)?;
        let group = match &s[..1] {
            "a" => &GROUP_A,
            "b" => &GROUP_B,
            _ => {
                // Every node heartbeats to it again before the next one goes.
                compose::wait_namesrv_nodes(s, 6, Duration::from_secs(30)).await?;
                events.push((now(), format!("{s} knows every node")));
                continue;
            }
        };
        wait_caught_up(group, s, MAX_LAG, Duration::from_secs(60)).await?;
        events.push((now(), format!("{s} caught up")));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    if let Some(p) = phases.last_mut() {
        p.end = now();
    }
    Ok((phases, events))
}

/// Checks the client's summary: nothing lost, nothing out of order, and no send
/// in a bounded phase paused past the bound. Returns the report.
fn judge(
    summary: &str,
    started: f64,
    phases: &[Phase],
    events: &[(f64, String)],
) -> Result<String> {
    let v: serde_json::Value =
        serde_json::from_str(summary).with_context(|| format!("summary {summary:?}"))?;
    let count = |k: &str| v[k].as_u64().unwrap_or(u64::MAX);
    let max_pause_ms: f64 = std::env::var("LEDGERMQ_COMPOSE_MAX_PAUSE_MS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000.0);
    let sends = v["sends"].as_array().cloned().unwrap_or_default();
    let acks_per_s = v["acks_per_s"].as_object().cloned().unwrap_or_default();
    let mut report = format!(
        "acknowledged {} sends in {} s ({} failed attempts), lost {}, FIFO out of order {}\n",
        count("sent_acked"),
        v["send_s"],
        count("failed_attempts"),
        count("lost"),
        count("fifo_out_of_order")
    );
    let mut over = Vec::new();
    for (i, p) in phases.iter().enumerate() {
        // A send is judged by the window it started in; the first window also
        // takes the sends between the client's start and the first fault.
        let from = if i == 0 { started } else { p.start };
        let longest = sends
            .iter()
            .filter_map(|s| Some((s[0].as_f64()?, s[1].as_f64()?)))
            .filter(|(t0, _)| *t0 >= from && *t0 < p.end)
            .map(|(_, took)| took * 1000.0)
            .fold(0.0, f64::max);
        // Whole seconds inside the window.
        let acks: u64 = acks_per_s
            .iter()
            .filter_map(|(s, n)| Some((s.parse::<f64>().ok()?, n.as_u64()?)))
            .filter(|(s, _)| *s >= p.start.ceil() && *s + 1.0 <= p.end.floor())
            .map(|(_, n)| n)
            .sum();
        let longest_text = if longest > 0.0 {
            format!("{longest:.0} ms")
        } else {
            format!("under {SLOW_MS} ms")
        };
        report += &format!(
            "{}: {:.1} s, {acks} sends acknowledged, longest send {longest_text}\n",
            p.name,
            p.end - p.start
        );
        if p.bounded && acks == 0 {
            over.push(format!("{}: no send acknowledged", p.name));
        }
        if p.bounded && longest > max_pause_ms {
            over.push(format!("{}: {longest:.0} ms", p.name));
        }
    }
    // What happened when, and the slow sends among it, in seconds from the first
    // fault.
    let zero = phases.first().map_or(0.0, |p| p.start);
    let mut timeline: Vec<(f64, String)> = events.to_vec();
    timeline.extend(sends.iter().filter_map(|s| {
        Some((
            s[0].as_f64()?,
            format!(
                "send {} took {:.0} ms",
                s[2].as_str()?,
                s[1].as_f64()? * 1000.0
            ),
        ))
    }));
    timeline.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (t, what) in timeline {
        report += &format!("  {:>7.3} s  {what}\n", t - zero);
    }
    for k in ["never_acked", "lost", "fifo_out_of_order"] {
        if count(k) != 0 {
            bail!("{k} = {} ({summary})\n{report}", v[k]);
        }
    }
    if count("sent_acked") == 0 {
        bail!("nothing acknowledged ({summary})");
    }
    if !over.is_empty() {
        bail!("sends paused over {max_pause_ms} ms or stopped: {over:?}\n{report}");
    }
    Ok(report)
}
