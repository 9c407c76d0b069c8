"""Plots as inline SVG, drawn by the daemon: no script, no external asset; styled by classes from status.css."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

from tpuwatch.units import latency
from tpuwatch.views.series import fraction

WIDTH, HEIGHT = 320, 120
LEFT, RIGHT, TOP, BOTTOM = 42, 8, 8, 16
_PLOT_W, _PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM


class Plot:
    """One time plot over [start, end] x [lo, hi]; lines and marks are added, then ``svg()`` writes it."""

    def __init__(self, series: str, label: str, start: float, end: float, lo: float, hi: float) -> None:
        self.series = series
        self.label = label
        self.start, self.end = start, end if end > start else start + 1.0
        self.lo, self.hi = lo, hi if hi > lo else lo + 1.0
        self.points = 0
        self._parts: list[str] = []

    def x(self, t: float) -> float:
        """The x coordinate of time ``t``, kept inside the plot."""
        return LEFT + _PLOT_W * min(1.0, max(0.0, (t - self.start) / (self.end - self.start)))

    def y(self, value: float) -> float:
        """The y coordinate of ``value``, kept inside the plot."""
        return TOP + _PLOT_H * (1.0 - fraction(value, self.lo, self.hi))

    def line(self, points: Sequence[Sequence[float]], css: str, gap: float) -> None:
        """A polyline per run of points no further than ``gap`` seconds apart (a gap is drawn as one)."""
        # The loop of the page's cost: the transform inlined, times kept in the plot, values clamped to it.
        x0, sx = LEFT - self.start * _PLOT_W / (self.end - self.start), _PLOT_W / (self.end - self.start)
        y0, sy = TOP + self.hi * _PLOT_H / (self.hi - self.lo), _PLOT_H / (self.hi - self.lo)
        top, bottom, left, right = TOP, TOP + _PLOT_H, LEFT, LEFT + _PLOT_W
        runs: list[list[str]] = []
        previous = None
        for t, value in points:
            if previous is None or t - previous > gap:
                runs.append([])
            x, y = x0 + sx * t, y0 - sy * value
            x = left if x < left else right if x > right else x
            y = top if y < top else bottom if y > bottom else y
            runs[-1].append(f"{x:.1f},{y:.1f}")
            previous = t
        for run in runs:
            self.points += len(run)
            if len(run) == 1:
                x_text, y_text = run[0].split(",")
                self._parts.append(f'<circle class="{css}" cx="{x_text}" cy="{y_text}" r="1.5"/>')
            else:
                self._parts.append(f'<polyline class="{css}" points="{" ".join(run)}"/>')

    def hline(self, value: float, css: str, text: str) -> None:
        """A horizontal mark (a limit, the capacity) with its label just under it, at the left."""
        y = self.y(value)
        self._parts.append(f'<line class="{css}" x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}"/>'
                           f'<text class="mark" x="{LEFT + 3}" y="{y + 9:.1f}">{escape(text)}</text>')

    def vline(self, t: float, css: str, text: str) -> None:
        """A vertical mark (now) with its label at the bottom."""
        x = self.x(t)
        self._parts.append(f'<line class="{css}" x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + _PLOT_H}"/>'
                           f'<text class="mark" x="{x - 2:.1f}" y="{TOP + _PLOT_H - 3}" text-anchor="end">'
                           f'{escape(text)}</text>')

    def corner(self, lines: Sequence[str], css: str) -> None:
        """Lines of text in the bottom right corner of the plot (above the "now" label)."""
        bottom = TOP + _PLOT_H - 14
        for k, text in enumerate(reversed(lines)):
            self._parts.append(f'<text class="{css}" x="{WIDTH - RIGHT - 3}" y="{bottom - 11 * k:.1f}" '
                               f'text-anchor="end">{escape(text)}</text>')

    def svg(self, y_text: Callable[[float], str], x_texts: tuple[str, str]) -> str:
        """The whole ``<svg>`` element: frame, axis labels, what was added; "no data yet" when nothing was."""
        frame = (f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{_PLOT_W}" height="{_PLOT_H}"/>'
                 f'<text class="axis" x="{LEFT - 3}" y="{TOP + 8}" text-anchor="end">{escape(y_text(self.hi))}</text>'
                 f'<text class="axis" x="{LEFT - 3}" y="{TOP + _PLOT_H}" text-anchor="end">'
                 f'{escape(y_text(self.lo))}</text>'
                 f'<text class="axis" x="{LEFT}" y="{HEIGHT - 3}">{escape(x_texts[0])}</text>'
                 f'<text class="axis" x="{WIDTH - RIGHT}" y="{HEIGHT - 3}" text-anchor="end">'
                 f'{escape(x_texts[1])}</text>')
        empty = "" if self.points else (f'<text class="empty" x="{LEFT + _PLOT_W / 2}" y="{TOP + _PLOT_H / 2}" '
                                        'text-anchor="middle">no data yet</text>')
        label = escape(self.label)
        return (f'<svg class="plot" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{label}" '
                f'data-series="{escape(self.series)}" data-points="{self.points}"><title>{label}</title>'
                f'{frame}{"".join(self._parts)}{empty}</svg>')


def bars(runs: Sequence[tuple[str, float | None, str]], slots: int) -> str:
    """Canary runs as bars, oldest left: (status, seconds or None, tooltip); height is the run's latency."""
    width = (WIDTH - LEFT - RIGHT) / max(1, slots)
    longest = max((seconds for _, seconds, _ in runs if seconds), default=0.0)
    parts = []
    for k, (status, seconds, tip) in enumerate(runs):
        height = 6.0 + 40.0 * (seconds / longest if seconds and longest else 0.0)
        x = LEFT + k * width
        parts.append(f'<rect class="run c-{escape(status)}" x="{x + 1:.1f}" y="{52 - height:.1f}" '
                     f'width="{max(1.0, width - 2):.1f}" height="{height:.1f}"><title>{escape(tip)}</title></rect>')
    scale = latency(longest) if longest else ""
    return (f'<svg class="runs" viewBox="0 0 {WIDTH} 60" role="img" aria-label="canary runs" '
            f'data-runs="{len(runs)}"><title>canary runs, oldest left; height: latency</title>'
            f'<text class="axis" x="{LEFT - 3}" y="14" text-anchor="end">{scale}</text>'
            f'<line class="frame" x1="{LEFT}" y1="52.5" x2="{WIDTH - RIGHT}" y2="52.5"/>{"".join(parts)}</svg>')
