//! The run's report: per-second series from the history (no I/O) and the HTML page
//! with throughput and latency over time, fault windows shaded (plots drawn as SVG
//! by `plotters`).

use plotters::prelude::*;
use serde::Serialize;

use crate::history::{acked_sends, Op, OpFn, OpType};

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
         <h1>{t}</h1>\n<h2 class=\"{cls}\">{v}</h2>\n{throughput}\n{latency}\n\
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
        let page = html("run", "valid", "{}", &timeline(&h), &shades);
        assert_eq!(page.matches("<svg").count(), 2, "{page}");
        assert!(page.contains("kill-leader &lt;n1&gt;"));
    }
}
