"""``otel-gil report --timeline out.html``: which thread held the GIL when, and who waited.

One self-contained HTML page (inline SVG, no script, no network): a row per
thread, time left to right. The upper half of a row is holding the GIL, the
lower half waiting for it: shaded by the share of each sample interval, solid
for every hold or wait of at least 1 ms, labelled with its duration (and a hold with
the function it was released in) when wide enough and described on hover, with the
code it was released in (the browser's tooltip of an SVG ``<title>``).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from otel_gil import blame as blamelib
from otel_gil_collector.attach import ThreadTrace
from otel_gil_collector.report import Capture, fmt_ns

LABEL_W = 300  # px: thread names
PLOT_W = 1200  # px: the capture
ROW_H = 20
TOP = 76  # px above the first row: title, key and time axis
HOLD, HOLD_SHADE = "#1f4e9c", "#5b8bd9"
WAIT, WAIT_SHADE = "#c92a2a", "#f08c00"
LABEL_MIN_PX = 44  # a bar this wide carries its duration as text
CHAR_PX = 5.5  # the width of a character of a bar's label (9 px sans-serif)


@dataclass(frozen=True)
class Geometry:
    """Where things are drawn: shared by the renderer and the tests that look at the picture."""

    start_ns: int
    end_ns: int
    rows: tuple[int, ...]  # tids, top to bottom

    def x(self, t_ns: int) -> float:
        span = max(self.end_ns - self.start_ns, 1)
        return LABEL_W + PLOT_W * min(max(t_ns - self.start_ns, 0), span) / span

    def y(self, tid: int) -> int:
        """Top of ``tid``'s row; its upper half is holding, its lower half waiting."""
        return TOP + ROW_H * self.rows.index(tid)

    @property
    def height(self) -> int:
        return TOP + ROW_H * len(self.rows) + 40


def geometry(capture: Capture) -> Geometry:
    """Rows: threads that held or waited for the GIL, as the report orders them (by hold)."""
    report = capture.report
    start = report["start_ns"]
    active = [t for t in capture.traces.values() if t.counters.acquisitions or t.holds or t.waits]
    active.sort(key=lambda t: (t.counters.hold_ns, t.counters.wait_ns), reverse=True)
    return Geometry(start, start + int(report["duration_s"] * 1e9), tuple(t.tid for t in active))


def _rect(x0: float, x1: float, y: float, h: float, fill: str, title: str = "", opacity: float = 1.0) -> str:
    w = max(x1 - x0, 1.0)  # a sub-pixel hold still shows
    alpha = f' fill-opacity="{opacity:.2f}"' if opacity < 1 else ""
    tip = f"<title>{html.escape(title)}</title>" if title else ""
    return f'<rect x="{x0:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"{alpha}>{tip}</rect>'


def _label(x0: float, x1: float, y: float, text: str) -> str:
    if x1 - x0 < LABEL_MIN_PX:
        return ""
    return (f'<text x="{(x0 + x1) / 2:.1f}" y="{y:.1f}" class="bar">{html.escape(text)}</text>')


def _axis(g: Geometry) -> list[str]:
    seconds = (g.end_ns - g.start_ns) / 1e9
    step = next(s for s in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
                if seconds / s <= 12)
    out, i = [], 0
    while i * step <= seconds + 1e-9:
        x = g.x(g.start_ns + int(i * step * 1e9))
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP - 6}" y2="{g.height - 40}" class="grid"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP - 10}" class="tick">{f"+{fmt_ns(i * step * 1e9)}" if i else "0"}</text>')
        i += 1
    return out


def _shades(capture: Capture, g: Geometry, tid: int) -> list[str]:
    """Share of each sample interval spent holding (upper half) and waiting (lower half)."""
    out, y = [], g.y(tid)
    prev_t, prev = g.start_ns, (0, 0)
    for t, values in capture.samples:
        hold, wait = values.get(tid, prev)
        dt = t - prev_t
        if dt > 0:
            for share, top, fill in (((hold - prev[0]) / dt, y + 2, HOLD_SHADE), ((wait - prev[1]) / dt, y + ROW_H / 2, WAIT_SHADE)):
                if share > 0.02:
                    out.append(_rect(g.x(prev_t), g.x(t), top, ROW_H / 2 - 2, fill, opacity=min(share, 1.0)))
        prev_t, prev = t, (hold, wait)
    return out


def _held_by(w, log: blamelib.HoldLog, names: dict[int, str]) -> str:
    """Who held the GIL during a wait, by time (from the hold log), else who handed it over."""
    held = log.blame(w).held_by[:3]
    if held:
        return "held meanwhile by " + ", ".join(f"{names.get(tid, '?')} {tid} {fmt_ns(ns)}" for tid, ns in held)
    return f"the GIL came from {names.get(w.blocker_tid, '?')} {w.blocker_tid}" if w.blocker_tid else "the GIL came from ?"


def _label_fitting(x0: float, x1: float, y: float, short: str, long: str) -> str:
    """``long`` where the bar has room for it, else ``short``."""
    return _label(x0, x1, y, long if x1 - x0 >= CHAR_PX * len(long) else short)


def _row(t: ThreadTrace, g: Geometry, names: dict[int, str], log: blamelib.HoldLog,
         code: dict[tuple[int, int], str]) -> list[str]:
    y = g.y(t.tid)
    c = t.counters
    out = [
        f'<text x="{LABEL_W - 8}" y="{y + ROW_H - 6}" class="name">{html.escape(t.name)} {t.tid}'
        f"<title>held {fmt_ns(c.hold_ns)}, waited {fmt_ns(c.wait_ns)}, {c.acquisitions} acquisitions</title></text>"
    ]
    for start, end in t.holds:
        x0, x1 = g.x(start), g.x(end)
        where = code.get((t.tid, end))
        out.append(_rect(x0, x1, y + 2, ROW_H / 2 - 2, HOLD,
                         f"{t.name} {t.tid} held the GIL {fmt_ns(end - start)} from +{fmt_ns(start - g.start_ns)}"
                         + (f", released in {where}" if where else "")))
        out.append(_label_fitting(x0, x1, y + ROW_H / 2 - 1, fmt_ns(end - start),
                                  f"{fmt_ns(end - start)} {where.split(' (')[0]}" if where else fmt_ns(end - start)))
    for w in t.waits:
        x0, x1 = g.x(w.start_ns), g.x(w.end_ns)
        out.append(_rect(x0, x1, y + ROW_H / 2, ROW_H / 2 - 2, WAIT,
                         f"{t.name} {t.tid} waited {fmt_ns(w.end_ns - w.start_ns)} from +{fmt_ns(w.start_ns - g.start_ns)}; "
                         f"{_held_by(w, log, names)}"))
        out.append(_label(x0, x1, y + ROW_H - 3, fmt_ns(w.end_ns - w.start_ns)))
    return out


def _key(y: int) -> list[str]:
    out, x = [], 0
    for fill, opacity, text in ((HOLD, 1, "holding, 1 ms or longer"), (HOLD_SHADE, 0.6, "share of time holding"),
                                (WAIT, 1, "waiting, 1 ms or longer"), (WAIT_SHADE, 0.6, "share of time waiting")):
        out.append(_rect(x + 8, x + 22, y - 9, 10, fill, opacity=opacity))
        out.append(f'<text x="{x + 26}" y="{y}">{text}</text>')
        x += 190
    out.append(f'<text x="{x + 8}" y="{y}">(upper half of a row: holding; lower half: waiting; hover for details)</text>')
    return out


_STYLE = """
body { font: 13px system-ui, sans-serif; margin: 0; color: #222; }
svg text { font-size: 11px; } .title { font-size: 14px; font-weight: bold; }
.name { text-anchor: end; } .tick { text-anchor: middle; fill: #555; }
.bar { text-anchor: middle; fill: #fff; font-size: 9px; pointer-events: none; }
.grid { stroke: #ddd; } .band { fill: #f4f4f4; }
"""


def render(capture: Capture) -> str:
    """The timeline page of a capture, as HTML; the SVG's origin is the page's."""
    report, g = capture.report, geometry(capture)
    names = {tid: t.name for tid, t in capture.traces.items()}
    log = blamelib.HoldLog(capture.holds)
    code = {}  # (tid, end) of a logged hold -> where it was released: the long holds drawn are logged too
    for h in capture.holds:
        location = capture.locations.get(h.index)
        if location is not None and location.frames:
            code[(h.tid, h.end_ns)] = f"{location.frames[0].function} ({location.frames[0].file}:{location.frames[0].line or '?'})"
    lost = sum(t.lost for t in capture.traces.values())
    title = (f"GIL timeline of pid {report['pid']} ({report['interpreter']}), "
             f"{report['duration_s']:.2f} s: held {report['hold_pct']:.1f} % of wall time, "
             f"waited {report['wait_pct']:.1f} % (summed over threads)")
    if lost:
        title += f"; {lost} holds/waits of 1 ms or more came too fast to draw"
    parts = [f'<text x="8" y="18" class="title">{html.escape(title)}</text>', *_key(40), *_axis(g)]
    for i, tid in enumerate(g.rows):
        if i % 2 == 0:
            parts.append(f'<rect x="0" y="{g.y(tid)}" width="{LABEL_W + PLOT_W}" height="{ROW_H}" class="band"/>')
        parts += _shades(capture, g, tid)
        parts += _row(capture.traces[tid], g, names, log, code)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{_STYLE}</style></head>
<body><svg xmlns="http://www.w3.org/2000/svg" width="{LABEL_W + PLOT_W + 20}" height="{g.height}">
{chr(10).join(parts)}
</svg></body></html>
"""


def write(capture: Capture, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(render(capture))
    return path
