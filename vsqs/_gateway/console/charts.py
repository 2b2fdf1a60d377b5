"""Charts drawn as SVG on the server: numbers in, coordinates out.

The templates turn these into ``<svg>`` elements (no script, no inline
style: colours come from the console's stylesheet by class), so a chart
needs no library in the browser and works with no network. Only numbers
reach the SVG: nothing that came from a queue or a message is drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vsqs._gateway.console import humane

SPARK_WIDTH, SPARK_HEIGHT = 120, 28
CHART_WIDTH, CHART_HEIGHT = 640, 180
_CHART_PAD_LEFT, _CHART_PAD_BOTTOM, _CHART_PAD_TOP = 44, 20, 8
STATES = (("ready", 0), ("in_flight", 1), ("delayed", 2), ("dead_lettered", 3))


def _points(times: list[float], values: list[float], x0: float, width: float, height: float,
            start: float, span: float, top: float, y0: float = 0) -> str:
    """``"x,y x,y ..."`` of ``values`` at ``times`` in a box ``width`` x ``height`` at (x0, y0)."""
    coords = []
    for at, value in zip(times, values, strict=True):
        x = x0 + (at - start) / span * width if span > 0 else x0 + width
        y = y0 + height - (value / top * height if top > 0 else 0)
        coords.append(f"{x:.1f},{y:.1f}")
    return " ".join(coords)


def sparkline(series: list[tuple[float, tuple[float, ...]]], now: float, hour: float = 3600.0) -> str:
    """The points of a queue's depth (ready + in flight + delayed) over the last
    hour, in a SPARK_WIDTH x SPARK_HEIGHT box; "" with fewer than two samples.
    With less than an hour of history (after a restart) the line spans the box
    from the first sample, as the depth chart does, not a sliver at its right."""
    recent = [(at, sum(values[:3])) for at, values in series if at >= now - hour]
    if len(recent) < 2:
        return ""
    top = max(value for _, value in recent) or 1
    start = max(recent[0][0], now - hour)
    return _points([at for at, _ in recent], [value for _, value in recent], 0, SPARK_WIDTH,
                   SPARK_HEIGHT - 4, start, now - start, top, 2)


@dataclass
class Chart:
    """A chart of depth by state: one line per state, a scale, time labels."""

    lines: list[tuple[str, str]] = field(default_factory=list)  # (state, points)
    top: float = 0
    top_label: str = "0"
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT
    left: int = _CHART_PAD_LEFT
    plot_height: int = CHART_HEIGHT - _CHART_PAD_BOTTOM
    start_label: str = ""
    empty: bool = True


def depth_chart(series: list[tuple[float, tuple[float, ...]]], now: float, span: float = 3600.0) -> Chart:
    """The lines of ready, in flight, delayed and dead-lettered over the last ``span`` seconds."""
    recent = [(at, values) for at, values in series if at >= now - span]
    chart = Chart()
    if len(recent) < 2:
        return chart
    times = [at for at, _ in recent]
    top = max(max(values[:4]) for _, values in recent) or 1
    chart.top, chart.top_label, chart.empty = top, humane.count(top), False
    start = max(times[0], now - span)
    chart.start_label = f"{humane.duration(now - start)} ago"
    plot_width = CHART_WIDTH - _CHART_PAD_LEFT - 8
    for state, index in STATES:
        chart.lines.append((state, _points(times, [values[index] for _, values in recent], _CHART_PAD_LEFT,
                                           plot_width, chart.plot_height - _CHART_PAD_TOP, start, now - start, top,
                                           _CHART_PAD_TOP)))
    return chart
