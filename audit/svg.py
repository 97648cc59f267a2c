"""Tiny inline-SVG charts for report.html (no JS, no network): line/points, bars, horizontal bars."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

__all__ = ["Point", "bars", "hbars", "points"]

W, H, PAD = 640, 240, 44


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    color: str = "#3366cc"
    label: str = ""


def _frame(title: str, body: str, height: int = H) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
        f'viewBox="0 0 {W} {height}" role="img" aria-label="{escape(title)}">'
        f'<text x="{W / 2}" y="16" text-anchor="middle" font-size="13" font-weight="bold">'
        f"{escape(title)}</text>"
        f"{body}</svg>"
    )


def _empty(title: str) -> str:
    return _frame(title, f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle" fill="#888">no data</text>')


def points(title: str, data: list[Point], *, y_label: str = "", baseline: float | None = None) -> str:
    """Points joined by a line, x = iteration; an optional dashed horizontal baseline."""
    if not data:
        return _empty(title)
    xs = [p.x for p in data]
    ys = [p.y for p in data] + ([baseline] if baseline is not None else [])
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(ys), max(ys)
    span = (y1 - y0) or abs(y1) or 1.0
    y0, y1 = y0 - 0.08 * span, y1 + 0.08 * span

    def sx(x: float) -> float:
        return PAD + (x - x0) / (x1 - x0) * (W - 2 * PAD)

    def sy(y: float) -> float:
        return H - PAD + 10 - (y - y0) / (y1 - y0) * (H - 2 * PAD)

    path = " ".join(f"{sx(p.x):.1f},{sy(p.y):.1f}" for p in data)
    parts = [
        f'<line x1="{PAD}" y1="{H - PAD + 10}" x2="{W - PAD}" y2="{H - PAD + 10}" stroke="#999"/>',
        f'<line x1="{PAD}" y1="{PAD - 4}" x2="{PAD}" y2="{H - PAD + 10}" stroke="#999"/>',
        f'<text x="4" y="{PAD - 8}" font-size="10">{escape(y_label)}</text>',
        f'<text x="{PAD - 4}" y="{sy(y1) + 4:.1f}" font-size="10" text-anchor="end">{y1:.3g}</text>',
        f'<text x="{PAD - 4}" y="{sy(y0):.1f}" font-size="10" text-anchor="end">{y0:.3g}</text>',
        f'<text x="{W / 2}" y="{H - 6}" font-size="10" text-anchor="middle">iteration</text>',
        f'<polyline points="{path}" fill="none" stroke="#bbb"/>',
    ]
    if baseline is not None:
        parts.append(
            f'<line x1="{PAD}" y1="{sy(baseline):.1f}" x2="{W - PAD}" y2="{sy(baseline):.1f}" '
            f'stroke="#888" stroke-dasharray="4 3"/>'
        )
    for p in data:
        tip = f"<title>{escape(p.label)}</title>" if p.label else ""
        parts.append(f'<circle cx="{sx(p.x):.1f}" cy="{sy(p.y):.1f}" r="4" fill="{p.color}">{tip}</circle>')
    return _frame(title, "".join(parts))


def bars(title: str, data: list[tuple[str, float, str]]) -> str:
    """Vertical bars: (label, value, color)."""
    if not data:
        return _empty(title)
    top = max(value for _, value, _ in data) or 1.0
    width = (W - 2 * PAD) / len(data)
    parts = [f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#999"/>']
    for i, (label, value, color) in enumerate(data):
        height = value / top * (H - 2 * PAD - 10)
        x = PAD + i * width + width * 0.15
        parts.append(
            f'<rect x="{x:.1f}" y="{H - PAD - height:.1f}" width="{width * 0.7:.1f}" height="{height:.1f}" '
            f'fill="{color}"><title>{escape(label)}: {value:g}</title></rect>'
            f'<text x="{x + width * 0.35:.1f}" y="{H - PAD - height - 4:.1f}" font-size="11" '
            f'text-anchor="middle">{value:g}</text>'
            f'<text x="{x + width * 0.35:.1f}" y="{H - PAD + 14}" font-size="11" '
            f'text-anchor="middle">{escape(label)}</text>'
        )
    return _frame(title, "".join(parts))


def hbars(title: str, data: list[tuple[str, float, str]]) -> str:
    """Horizontal bars, one row per label: (label, value, color)."""
    if not data:
        return _empty(title)
    row = 20
    height = 30 + row * len(data) + 10
    top = max(value for _, value, _ in data) or 1.0
    left = 220
    parts = []
    for i, (label, value, color) in enumerate(data):
        y = 30 + i * row
        length = value / top * (W - left - 60)
        parts.append(
            f'<text x="{left - 6}" y="{y + 13}" font-size="11" text-anchor="end">{escape(label[:34])}</text>'
            f'<rect x="{left}" y="{y + 3}" width="{length:.1f}" height="{row - 6}" fill="{color}">'
            f"<title>{escape(label)}: {value:g}</title></rect>"
            f'<text x="{left + length + 4:.1f}" y="{y + 13}" font-size="11">{value:g}</text>'
        )
    return _frame(title, "".join(parts), height)
