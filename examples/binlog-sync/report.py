"""The binlog-sync example's report: the replica's lag over time as an SVG plot, and
a Markdown page with the run's numbers. Standard library only."""

import json
import os


def read_jsonl(path):
    """The JSON lines of a stats file (every process that appended to it)."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut short by a SIGKILL
    return out


def lag_svg(samples, faults, t0_ms, width=900, height=320):
    """An SVG line plot of the replica's lag: `samples` are (t_ms, max_lag_s, mean_lag_s)
    and `faults` (t_ms, label) are drawn as vertical lines; time from t0_ms, in s."""
    left, right, top, bottom = 60, 20, 30, 45
    pw, ph = width - left - right, height - top - bottom
    ts = [(t - t0_ms) / 1000.0 for t, _, _ in samples] + \
         [(t - t0_ms) / 1000.0 for t, _ in faults]
    t_max = max(ts + [1.0])
    lag_max = max([lag for _, lag, _ in samples if lag is not None] + [1.0])
    step = next(s for s in (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600, 10 ** 9)
                if lag_max / s <= 6)
    lag_max = float(step * (int(lag_max / step) + 1))

    def x(t):
        return left + pw * t / t_max

    def y(v):
        return top + ph * (1.0 - v / lag_max)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="18">Replica lag (apply time minus binlog time) per '
             f'second: max (red), mean (blue)</text>',
             f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="black"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black"/>']
    v = 0.0
    while v <= lag_max:
        parts.append(f'<text x="{left - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.0f} s</text>')
        v += step
    for i in range(6):
        t = t_max * i / 5
        parts.append(f'<text x="{x(t):.1f}" y="{top + ph + 18}" text-anchor="middle">{t:.0f} s</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle">'
                 f'time since the capture started</text>')
    for i, (t, label) in enumerate(faults):
        xx = x((t - t0_ms) / 1000.0)
        short = label.split(" (")[0]  # "broker leader n0 killed -9"
        parts.append(f'<line x1="{xx:.1f}" y1="{top}" x2="{xx:.1f}" y2="{top + ph}" '
                     f'stroke="gray" stroke-dasharray="4,3"/>')
        parts.append(f'<text x="{xx + 3:.1f}" y="{top + 12 + 14 * i}" fill="gray">{short}</text>')
    for idx, color in ((1, "red"), (2, "blue")):
        pts = [f"{x((s[0] - t0_ms) / 1000.0):.1f},{y(s[idx]):.1f}"
               for s in samples if s[idx] is not None]
        if pts:
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                         f'points="{" ".join(pts)}"/>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def markdown(result, params, faults, t0_ms, lag_rows):
    """The report page: parameters, faults, the result line, lag summary."""
    lines = ["# Binlog sync over LedgerMQ FIFO messages", "",
             "Written by `examples/binlog-sync/run.sh`.", "", "## Parameters", ""]
    for k, v in params.items():
        lines.append(f"- {k}: `{v}`")
    lines += ["", "## Faults", ""]
    for t, label in faults:
        lines.append(f"- {(t - t0_ms) / 1000.0:.1f} s: {label}")
    lines += ["", "## Result", "", "```json", json.dumps(result, indent=2), "```", "",
              "## Replica lag", "", "![replica lag](lag.svg)", "",
              "| time (s) | applied | max lag (s) | mean lag (s) |", "|---|---|---|---|"]
    lines += lag_rows
    return "\n".join(lines) + "\n"
