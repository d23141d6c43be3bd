//! The run's report: per-second series from the history (no I/O) and the HTML page
//! with throughput and latency over time, fault windows shaded (plots drawn as SVG
//! by `plotters`).

use plotters::prelude::*;
use serde::Serialize;

use crate::history::{acked_sends, Op, OpFn, OpType};
use crate::roles::{role_spans, Role, RoleSample};

/// One second of the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Second {
    /// Seconds since the run started.
    pub t_s: u64,
    /// Sends acknowledged in this second.
    pub acked: u64,
    /// Sends that failed or ended unknown in this second.
    pub failed: u64,
    /// Messages delivered to consumers in this second.
    pub delivered: u64,
    /// Median latency of the sends acknowledged in this second, ms.
    pub p50_ms: Option<f64>,
    /// 99th percentile of the same, ms.
    pub p99_ms: Option<f64>,
}

/// A fault window to shade, in ms since the start, with its label.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shade {
    /// Start, ms.
    pub start_ms: u64,
    /// End, ms.
    pub end_ms: u64,
    /// What the fault was.
    pub label: String,
}

/// One row of the availability table: a fault kind's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AvailabilityRow {
    /// The fault kind.
    pub kind: String,
    /// Faults of that kind in the run.
    pub faults: usize,
    /// Whether the availability promise covers it (and so the bound applies).
    pub promised: bool,
    /// Every producer's acknowledged rate from 2 s in, over the fault-free rate.
    pub all_ratio: Option<f64>,
    /// The same for the producers that spread over every node (checked).
    pub spread_ratio: Option<f64>,
    /// The same for the producers pinned to one node each.
    pub pinned_ratio: Option<f64>,
    /// Through the nodes the fault did not hit.
    pub others_ratio: Option<f64>,
    /// Median time to the first ack after the fault took effect, ms.
    pub rto_p50_ms: Option<u64>,
}

/// What the page shows besides the per-second series and the faults.
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// The availability table, one row per fault kind.
    pub availability: Vec<AvailabilityRow>,
    /// The availability bound (a fraction).
    pub bound: f64,
    /// Each node's role and term over the run.
    pub roles: Vec<RoleSample>,
    /// Nodes in the run.
    pub nodes: usize,
}

/// The `q` quantile (0..=1) of sorted `v` (nearest rank).
pub fn quantile(v: &[u64], q: f64) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

/// Latencies (ms) of acknowledged sends, each with its completion time (ms).
pub fn send_latencies(ops: &[Op]) -> Vec<(u64, u64)> {
    acked_sends(ops)
        .into_iter()
        .map(|(t0, t, _)| (t, t.saturating_sub(t0)))
        .collect()
}

/// The per-second series of a history.
pub fn timeline(ops: &[Op]) -> Vec<Second> {
    let end_s = ops.iter().map(|o| o.time_ms / 1000).max().unwrap_or(0);
    let mut secs: Vec<Second> = (0..=end_s)
        .map(|t_s| Second {
            t_s,
            ..Default::default()
        })
        .collect();
    let mut lat: Vec<Vec<u64>> = vec![Vec::new(); secs.len()];
    for (t, l) in send_latencies(ops) {
        lat[(t / 1000) as usize].push(l);
    }
    for o in ops {
        let s = &mut secs[(o.time_ms / 1000) as usize];
        match (o.f, o.op_type) {
            (OpFn::Send, OpType::Ok) => s.acked += 1,
            (OpFn::Send, OpType::Fail | OpType::Info) => s.failed += 1,
            (OpFn::Receive, OpType::Ok) => s.delivered += o.delivered.len() as u64,
            _ => {}
        }
    }
    for (s, mut l) in secs.iter_mut().zip(lat) {
        l.sort_unstable();
        s.p50_ms = quantile(&l, 0.5).map(|v| v as f64);
        s.p99_ms = quantile(&l, 0.99).map(|v| v as f64);
    }
    secs
}

type Series<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);

/// One SVG line chart of `series` over time with `shades` drawn behind.
fn chart(
    title: &str,
    y_desc: &str,
    series: &[Series<'_>],
    shades: &[Shade],
    log_y: bool,
) -> String {
    let mut svg = String::new();
    let x_max = series
        .iter()
        .flat_map(|s| s.2.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let y_max = series
        .iter()
        .flat_map(|s| s.2.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 1.1;
    let result = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
        let root = SVGBackend::with_string(&mut svg, (960, 320)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut b = ChartBuilder::on(&root);
        b.caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(60);
        macro_rules! draw {
            ($chart:expr, $bottom:expr) => {{
                let mut c = $chart;
                c.configure_mesh()
                    .x_desc("seconds since start")
                    .y_desc(y_desc)
                    .draw()?;
                for s in shades {
                    c.draw_series(std::iter::once(Rectangle::new(
                        [
                            (s.start_ms as f64 / 1000.0, $bottom),
                            (s.end_ms as f64 / 1000.0, y_max),
                        ],
                        RGBColor(255, 160, 160).mix(0.35).filled(),
                    )))?;
                }
                for (name, color, points) in series {
                    let color = *color;
                    c.draw_series(LineSeries::new(points.iter().copied(), color))?
                        .label(*name)
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
                }
                c.configure_series_labels()
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .draw()?;
            }};
        }
        if log_y {
            draw!(
                b.build_cartesian_2d(0f64..x_max, (0.5f64..y_max).log_scale())?,
                0.5
            );
        } else {
            draw!(b.build_cartesian_2d(0f64..x_max, 0f64..y_max)?, 0.0);
        }
        root.present()?;
        Ok(())
    })();
    match result {
        Ok(()) => svg,
        Err(e) => format!("<p>chart {title:?} could not be drawn: {e}</p>"),
    }
}

/// Each node's role over time as colored bands (one row per node), fault
/// windows shaded behind.
fn role_chart(samples: &[RoleSample], nodes: usize, shades: &[Shade]) -> String {
    let mut svg = String::new();
    let x_max = samples
        .iter()
        .map(|s| s.t_ms as f64 / 1000.0)
        .fold(1.0, f64::max);
    let color = |r: Role| match r {
        Role::Leader => RGBColor(0, 150, 0),
        Role::Follower => RGBColor(120, 160, 230),
        Role::NoLeader => RGBColor(240, 170, 0),
        Role::Unreachable => RGBColor(90, 90, 90),
    };
    let result = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
        let root =
            SVGBackend::with_string(&mut svg, (960, 60 + 40 * nodes as u32)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut c = ChartBuilder::on(&root)
            .caption(
                "Role per node (green leader, blue follower, orange no leader known, grey unreachable)",
                ("sans-serif", 16),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..x_max, 0f64..nodes as f64)?;
        c.configure_mesh()
            .x_desc("seconds since start")
            .y_labels(nodes)
            .y_label_formatter(&|y| format!("node {}", y.floor() as usize))
            .draw()?;
        for s in shades {
            c.draw_series(std::iter::once(Rectangle::new(
                [
                    (s.start_ms as f64 / 1000.0, 0.0),
                    (s.end_ms as f64 / 1000.0, nodes as f64),
                ],
                RGBColor(255, 160, 160).mix(0.35).filled(),
            )))?;
        }
        for n in 0..nodes {
            let y = n as f64;
            c.draw_series(role_spans(samples, n).into_iter().map(|(a, b, r)| {
                Rectangle::new(
                    [(a as f64 / 1000.0, y + 0.2), (b as f64 / 1000.0, y + 0.8)],
                    color(r).filled(),
                )
            }))?;
        }
        root.present()?;
        Ok(())
    })();
    match result {
        Ok(()) => svg,
        Err(e) => format!("<p>role chart could not be drawn: {e}</p>"),
    }
}

/// The availability table's HTML rows.
fn availability_rows(rows: &[AvailabilityRow], bound: f64) -> String {
    let pct = |r: Option<f64>| r.map_or("-".to_owned(), |r| format!("{:.0} %", r * 100.0));
    rows.iter()
        .map(|r| {
            let below = r.promised && r.spread_ratio.is_some_and(|x| x < bound);
            format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                esc(&r.kind),
                r.faults,
                if r.promised { format!("{:.0} %", bound * 100.0) } else { "-".into() },
                pct(r.all_ratio),
                if below { "bad" } else { "" },
                pct(r.spread_ratio),
                pct(r.pinned_ratio),
                pct(r.others_ratio),
                r.rto_p50_ms.map_or("-".into(), |v| v.to_string()),
            )
        })
        .collect()
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The HTML report: `results` (pretty JSON of the findings) on top, then the
/// throughput and latency charts, then the fault table rows given.
pub fn html(
    title: &str,
    verdict: &str,
    results_json: &str,
    secs: &[Second],
    shades: &[Shade],
    extras: &Extras,
) -> String {
    let pts = |f: &dyn Fn(&Second) -> Option<f64>| -> Vec<(f64, f64)> {
        secs.iter()
            .filter_map(|s| f(s).map(|v| (s.t_s as f64 + 0.5, v)))
            .collect()
    };
    let throughput = chart(
        "Throughput (fault windows shaded)",
        "per second",
        &[
            ("acked sends/s", BLUE, pts(&|s| Some(s.acked as f64))),
            ("delivered/s", GREEN, pts(&|s| Some(s.delivered as f64))),
            (
                "failed or unknown sends/s",
                RED,
                pts(&|s| Some(s.failed as f64)),
            ),
        ],
        shades,
        false,
    );
    let latency = chart(
        "Send latency (acknowledged sends)",
        "ms (log scale)",
        &[
            ("p50", BLUE, pts(&|s| s.p50_ms)),
            ("p99", MAGENTA, pts(&|s| s.p99_ms)),
        ],
        shades,
        true,
    );
    let colors = [BLUE, MAGENTA, GREEN, RED, CYAN];
    let term_points: Vec<(String, Vec<(f64, f64)>)> = (0..extras.nodes)
        .map(|n| {
            let pts = extras
                .roles
                .iter()
                .filter(|s| s.node == n)
                .filter_map(|s| Some((s.t_ms as f64 / 1000.0, s.term? as f64)))
                .collect();
            (format!("node {n}"), pts)
        })
        .collect();
    let term_refs: Vec<Series<'_>> = term_points
        .iter()
        .enumerate()
        .map(|(n, (name, p))| (name.as_str(), colors[n % colors.len()], p.clone()))
        .collect();
    let terms = chart("Term per node", "term", &term_refs, shades, false);
    let roles = role_chart(&extras.roles, extras.nodes, shades);
    let avail = availability_rows(&extras.availability, extras.bound);
    let mut rows = String::new();
    for s in shades {
        rows.push_str(&format!(
            "<tr><td>{:.1}</td><td>{:.1}</td><td>{}</td></tr>\n",
            s.start_ms as f64 / 1000.0,
            s.end_ms as f64 / 1000.0,
            esc(&s.label)
        ));
    }
    format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\n\
         <style>body{{font-family:sans-serif;margin:2em}}pre{{background:#f4f4f4;padding:1em;overflow:auto;max-height:40em}}\
         td,th{{padding:2px 10px;text-align:left}}.ok{{color:#070}}.bad{{color:#b00}}</style></head><body>\n\
         <h1>{t}</h1>\n<h2 class=\"{cls}\">{v}</h2>\n{throughput}\n{latency}\n{roles}\n{terms}\n\
         <h2>Availability per fault kind</h2>\n<p>Acknowledged sends per second from 2 s after each fault took effect until its heal, over the fault-free rate. \
         The bound applies to the producers that spread over every node, under the kinds the promise covers.</p>\n\
         <table><tr><th>fault kind</th><th>faults</th><th>bound</th><th>all producers</th><th>spread producers</th><th>pinned producers</th><th>via the other nodes</th><th>RTO p50 ms</th></tr>\n{avail}</table>\n\
         <h2>Faults</h2>\n<table><tr><th>start s</th><th>healed s</th><th>fault</th></tr>\n{rows}</table>\n\
         <h2>results.json</h2>\n<pre>{r}</pre>\n</body></html>\n",
        t = esc(title),
        cls = if verdict.starts_with("valid") { "ok" } else { "bad" },
        v = esc(verdict),
        r = esc(results_json),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::send_op;

    #[test]
    fn series_count_per_second_and_pair_latencies() {
        let h = vec![
            send_op(100, 1, OpType::Invoke, "a", None),
            send_op(130, 1, OpType::Ok, "a", None),
            send_op(200, 2, OpType::Invoke, "b", None),
            send_op(1300, 2, OpType::Info, "b", None),
            send_op(1400, 1, OpType::Invoke, "c", None),
            send_op(1410, 1, OpType::Ok, "c", None),
        ];
        assert_eq!(send_latencies(&h), vec![(130, 30), (1410, 10)]);
        let t = timeline(&h);
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].acked, t[0].failed, t[0].p50_ms), (1, 0, Some(30.0)));
        assert_eq!((t[1].acked, t[1].failed, t[1].p99_ms), (1, 1, Some(10.0)));
        assert_eq!(quantile(&[1, 2, 3, 4], 0.5), Some(2));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn the_page_holds_both_charts_and_the_faults() {
        let h = vec![
            send_op(100, 1, OpType::Invoke, "a", None),
            send_op(130, 1, OpType::Ok, "a", None),
        ];
        let shades = [Shade {
            start_ms: 0,
            end_ms: 500,
            label: "kill-leader <n1>".into(),
        }];
        let sample = |t_ms, node, role, term| RoleSample {
            t_ms,
            node,
            role,
            term,
        };
        let extras = Extras {
            availability: vec![AvailabilityRow {
                kind: "isolate-leader".into(),
                faults: 1,
                promised: true,
                all_ratio: Some(0.7),
                spread_ratio: Some(0.75),
                pinned_ratio: Some(0.6),
                others_ratio: Some(0.9),
                rto_p50_ms: Some(1200),
            }],
            bound: 0.8,
            roles: vec![
                sample(0, 0, Role::Leader, Some(1)),
                sample(0, 1, Role::Follower, Some(1)),
                sample(250, 0, Role::Unreachable, None),
                sample(250, 1, Role::Leader, Some(2)),
            ],
            nodes: 2,
        };
        let page = html("run", "valid", "{}", &timeline(&h), &shades, &extras);
        assert_eq!(page.matches("<svg").count(), 4, "{page}");
        assert!(page.contains("kill-leader &lt;n1&gt;"));
        // The spread producers' 75 % is below the 80 % bound: marked.
        assert!(
            page.contains("<td>isolate-leader</td><td>1</td><td>80 %</td><td>70 %</td><td class=\"bad\">75 %</td><td>60 %</td><td>90 %</td><td>1200</td>"),
            "{page}"
        );
    }
}
