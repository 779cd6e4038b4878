"""A small line-chart writer that emits PNG bytes using only the standard library (zlib, struct, math).

Used to chart benchmark sweeps (throughput or latency against concurrency) without matplotlib:
``line_chart({"sglang": [(1, 120.0), (2, 230.0)]}, log_x=True)`` returns PNG bytes; ``write_png`` writes raw RGB.
Output is deterministic: the same input gives the same bytes.
"""
from __future__ import annotations

import math
import struct
import zlib

# Okabe-Ito colour-blind friendly palette, cycled per series in insertion order.
PALETTE = [(0, 114, 178), (213, 94, 0), (0, 158, 115), (230, 159, 0),
           (204, 121, 167), (86, 180, 233), (240, 228, 66), (0, 0, 0)]
BACKGROUND, GRID, AXIS, TEXT, MARK = (255, 255, 255), (224, 224, 224), (64, 64, 64), (34, 34, 34), (110, 110, 110)

# 5x7 bitmap font for ASCII 32..126: one hex token per character, one byte per row, bit 4 = leftmost;
# g j p q y have two extra descender rows.
_FONT = """
    00000000000000 04040404040004 0a0a0a00000000 0a0a1f0a1f0a0a 040f140e051e04 18190204081303 0c12140815120d
    04040800000000 02040808080402 08040202020408 0004150e150400 0004041f040400 000000000c0408 0000001f000000
    00000000000c0c 00010204081000 0e11131519110e 040c040404040e 0e11010204081f 1f02040201110e 02060a121f0202
    1f101e0101110e 0608101e11110e 1f010204080808 0e11110e11110e 0e11110f01020c 000c0c000c0c00 000c0c000c0408
    02040810080402 00001f001f0000 08040201020408 0e110102040004 0e11010d15150e 0e11111f111111 1e11111e11111e
    0e11101010110e 1c12111111121c 1f10101e10101f 1f10101e101010 0e11101711110f 1111111f111111 0e04040404040e
    0702020202120c 11121418141211 1010101010101f 111b1515111111 11111915131111 0e11111111110e 1e11111e101010
    0e11111115120d 1e11111e141211 0f10100e01011e 1f040404040404 1111111111110e 11111111110a04 1111111515150a
    11110a040a1111 1111110a040404 1f01020408101f 0e08080808080e 00100804020100 0e02020202020e 040a1100000000
    0000000000001f 08040200000000 00000e010f110f 1010161911111e 00000e1010110e 01010d1311110f 00000e111f100e
    0609081c080808 00000f1111110f010e 10101619111111 04000c0404040e 02000602020202120c 10101214181412 0c04040404040e
    00001a15151111 00001619111111 00000e1111110e 00001e1111111e1010 00000f1111110f0101 00001619101010 00000e100e011e
    08081c08080906 0000111111130d 00001111110a04 0000111115150a 0000110a040a11 0000111111110f010e 00001f0204081f
    02040408040402 04040404040404 08040402040408 00000815020000
"""
_GLYPHS = {chr(32 + i): bytes.fromhex(tok) for i, tok in enumerate(_FONT.split())}


def write_png(path, pixels_rgb: list[bytearray] | bytes, width, height) -> bytes:
    """Encode 8-bit RGB pixels (rows of width*3 bytes, or one flat buffer) as PNG; write to path unless None."""
    stride = width * 3
    if isinstance(pixels_rgb, (bytes, bytearray, memoryview)):
        flat = bytes(pixels_rgb)
        rows = [flat[i * stride:(i + 1) * stride] for i in range(height)]
        ok = len(flat) == stride * height
    else:
        rows = list(pixels_rgb)
        ok = len(rows) == height and all(len(r) == stride for r in rows)
    if not ok or width <= 0 or height <= 0:
        raise ValueError(f"pixels do not match {width}x{height} RGB")
    raw = b"".join(b"\x00" + bytes(r) for r in rows)  # filter type 0 (None) on every row

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    if path is not None:
        with open(path, "wb") as f:
            f.write(png)
    return png


class _Canvas:
    """An RGB raster with clipped drawing primitives."""

    def __init__(self, w: int, h: int):
        self.w, self.h = w, h
        self.buf = bytearray(bytes(BACKGROUND) * (w * h))

    def rect(self, x0, y0, x1, y1, c):
        x0, x1 = max(0, min(x0, x1)), min(self.w - 1, max(x0, x1))
        c = bytes(c) * (x1 - x0 + 1)
        for y in range(max(0, min(y0, y1)), min(self.h - 1, max(y0, y1)) + 1):
            if x1 >= x0:
                i = (y * self.w + x0) * 3
                self.buf[i:i + len(c)] = c

    def line(self, x0, y0, x1, y1, c, thick=2, dash=None):
        """Bresenham line drawn with a thick x thick pen; dash=(on, off) in steps."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err, n = dx + dy, 0
        while True:
            if dash is None or n % (dash[0] + dash[1]) < dash[0]:
                self.rect(x0, y0, x0 + thick - 1, y0 + thick - 1, c)
            if x0 == x1 and y0 == y1:
                return
            e2, n = 2 * err, n + 1
            if e2 >= dy:
                err, x0 = err + dy, x0 + sx
            if e2 <= dx:
                err, y0 = err + dx, y0 + sy

    def disc(self, cx, cy, r, c):
        for dy in range(-r, r + 1):
            half = int(math.sqrt(r * r - dy * dy))
            self.rect(cx - half, cy + dy, cx + half, cy + dy, c)

    def text(self, x, y, s, scale, c):
        """Draw s with its top-left at (x, y); characters outside printable ASCII render as '?'."""
        for k, ch in enumerate(s):
            for row, bits in enumerate(_GLYPHS.get(ch, _GLYPHS["?"])):
                for col in range(5):
                    if bits & (0x10 >> col):
                        px, py = x + (k * 6 + col) * scale, y + row * scale
                        self.rect(px, py, px + scale - 1, py + scale - 1, c)


def _text_w(s: str, scale: int) -> int:
    return max(0, len(s) * 6 - 1) * scale


def _fmt(v: float) -> str:
    """Tick label: 4 significant digits, k/M/G suffixes for large magnitudes (12000 -> 12k, 1.2e6 -> 1.2M)."""
    v = float(f"{v:.4g}")
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.4g}{suffix}"
    return "0" if v == 0 else f"{v:.4g}"


def _nice(x: float) -> float:
    """x rounded to 1, 2 or 5 times a power of ten."""
    f = x / 10 ** math.floor(math.log10(x))
    return (1 if f < 1.5 else 2 if f < 3 else 5 if f < 7 else 10) * 10 ** math.floor(math.log10(x))


def _ticks(lo: float, hi: float, n: int = 6) -> tuple[float, float, list[float]]:
    """'Nice' ticks covering [lo, hi]: returns (axis_lo, axis_hi, ticks)."""
    if hi <= lo:
        lo, hi = (0.0, 1.0) if lo == 0 else (lo - abs(lo) * 0.5, hi + abs(hi) * 0.5)
    step = _nice((hi - lo) / (n - 1))
    k0, k1 = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    ticks = [float(f"{k * step:.12g}") + 0.0 for k in range(k0, k1 + 1)]
    return ticks[0], ticks[-1], ticks


def _num(v) -> float | None:
    """v as a finite float, else None."""
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def line_chart(series: dict[str, list[tuple[float, float]]], *, title: str = "", x_label: str = "", y_label: str = "",
               width: int = 800, height: int = 500, log_x: bool = False,
               marks: list[tuple[float, str]] | None = None) -> bytes:
    """PNG bytes: one coloured polyline with point markers per series (insertion order = legend order), axes with
    'nice' tick values and labels, a legend, title, axis labels; log_x puts x on a log2 scale (ticks at the data's x
    values when there are <= 12 distinct ones). marks: vertical dashed lines at x with a short text label (used to
    mark a crossover concurrency)."""
    marks = list(marks or [])

    def xval(x):
        x = _num(x)
        return None if x is None or (log_x and x <= 0) else (math.log2(x) if log_x else x)

    # Points in data space (log2 applied); None marks a break in the line.
    pts: dict[str, list[tuple[float, float] | None]] = {}
    for name, data in series.items():
        pts[str(name)] = [(x, y) if x is not None and y is not None else None
                          for x, y in ((xval(p[0]), _num(p[1])) for p in data)]
    valid = [p for ps in pts.values() for p in ps if p is not None]
    mark_xs = [(xval(mx), str(label)) for mx, label in marks]
    mark_xs = [(mx, label) for mx, label in mark_xs if mx is not None]

    ys = [p[1] for p in valid]
    ylo, yhi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    ylo = 0.0 if ylo >= 0 else ylo
    ylo, yhi, yticks = _ticks(ylo, yhi)
    xs = [p[0] for p in valid] + [mx for mx, _ in mark_xs]
    xlo, xhi = (min(xs), max(xs)) if xs else ((0.0, 3.0) if log_x else (0.0, 1.0))
    if log_x:
        xlo, xhi = (xlo - 1, xhi + 1) if xlo == xhi else (xlo, xhi)
        distinct = sorted({p[0] for p in valid})
        if 0 < len(distinct) <= 12:
            xticks = distinct
        else:
            k0, k1 = math.ceil(xlo - 1e-9), math.floor(xhi + 1e-9)
            xticks = list(range(k0, k1 + 1, max(1, math.ceil((k1 - k0 + 1) / 10))))
        xtick_labels = [_fmt(2 ** t) for t in xticks]
    else:
        xlo, xhi, xticks = _ticks(xlo, xhi)
        xtick_labels = [_fmt(t) for t in xticks]
    ytick_labels = [_fmt(t) for t in yticks]

    # Layout: title and y label above the plot, tick labels and x label below, legend right (or below if wide).
    s = 2 if width >= 480 and height >= 300 else 1
    cw, ch, pad = 6 * s, 7 * s, 10
    ts = next((k for k in (s + 1, s, 1) if _text_w(title, k) <= width - 2 * pad), 1)
    cursor = pad
    title_y = cursor
    cursor += 7 * ts + 8 if title else 0
    ylabel_y = cursor
    cursor += ch + 6 if y_label else 0
    top = max(cursor + ch // 2 + 2, pad + ch)
    left = pad + max(_text_w(t, s) for t in ytick_labels) + 9
    names = list(pts)
    entry_w = [28 + _text_w(n, s) for n in names]
    legend_right = not names or max(entry_w) <= width * 0.3
    right = (max(entry_w) + 2 * pad + 10) if names and legend_right else pad + 3 * cw
    bottom = pad + 8 + ch + (8 + ch if x_label else 0)
    rows: list[list[int]] = []
    if not legend_right:  # flow entries into rows under the x label
        for i, w in enumerate(entry_w):
            if not rows or sum(entry_w[j] + 16 for j in rows[-1]) + w > width - 2 * pad:
                rows.append([])
            rows[-1].append(i)
        bottom += 8 + len(rows) * (ch + 8)
    x0, y0 = left, top
    x1, y1 = max(width - right, x0 + 20), max(height - bottom, y0 + 20)
    xpad = 10

    def X(v: float) -> int:
        return round(x0 + xpad + (v - xlo) / (xhi - xlo) * (x1 - x0 - 2 * xpad))

    def Y(v: float) -> int:
        return round(y1 - (v - ylo) / (yhi - ylo) * (y1 - y0))

    cv = _Canvas(width, height)
    for t in xticks:
        cv.rect(X(t), y0, X(t), y1, GRID)
    for t in yticks:
        cv.rect(x0, Y(t), x1, Y(t), GRID)
    cv.rect(x0, y0, x0, y1, AXIS)
    cv.rect(x0, y1, x1, y1, AXIS)
    last_right = -10 ** 9
    for t, label in zip(xticks, xtick_labels):
        cv.rect(X(t), y1, X(t), y1 + 5, AXIS)
        lx = X(t) - _text_w(label, s) // 2
        if lx > last_right + cw:  # skip labels that would overlap their left neighbour
            cv.text(lx, y1 + 8, label, s, TEXT)
            last_right = lx + _text_w(label, s)
    for t, label in zip(yticks, ytick_labels):
        cv.rect(x0 - 5, Y(t), x0, Y(t), AXIS)
        cv.text(x0 - 8 - _text_w(label, s), Y(t) - ch // 2, label, s, TEXT)
    if title:
        cv.text((width - _text_w(title, ts)) // 2, title_y, title, ts, TEXT)
    if y_label:
        cv.text(pad, ylabel_y, y_label, s, TEXT)
    if x_label:
        cv.text((x0 + x1 - _text_w(x_label, s)) // 2, y1 + 16 + ch, x_label, s, TEXT)
    for i, (mx, label) in enumerate(mark_xs):
        px = X(mx)
        cv.line(px, y0, px, y1, MARK, thick=1, dash=(6, 4))
        lx, ly = px + 5, y0 + 2 + i * (ch + 4)
        cv.text(lx if lx + _text_w(label, s) <= x1 else px - 4 - _text_w(label, s), ly, label, s, MARK)

    r = 2 + s
    colours = [PALETTE[i % len(PALETTE)] for i in range(len(names))]
    for name, colour in zip(names, colours):
        prev = None
        for p in pts[name]:
            if p is not None and prev is not None:
                cv.line(X(prev[0]), Y(prev[1]), X(p[0]), Y(p[1]), colour)
            prev = p
        for p in pts[name]:
            if p is not None:
                cv.disc(X(p[0]), Y(p[1]), r, colour)
    if not valid:
        cv.text((x0 + x1 - _text_w("no data", s)) // 2, (y0 + y1 - ch) // 2, "no data", s, TEXT)

    def legend_entry(i: int, lx: int, ly: int):  # ly: the row's vertical centre
        cv.line(lx, ly, lx + 21, ly, colours[i])
        cv.disc(lx + 11, ly, r, colours[i])
        cv.text(lx + 28, ly - ch // 2, names[i], s, TEXT)

    if legend_right:
        for i in range(len(names)):
            legend_entry(i, x1 + 20, y0 + ch // 2 + i * (ch + 8))
    else:
        ly = y1 + 8 + ch + (8 + ch if x_label else 0) + 8 + ch // 2 + 4
        for row in rows:
            lx = pad
            for i in row:
                legend_entry(i, lx, ly)
                lx += entry_w[i] + 16
            ly += ch + 8
    return write_png(None, cv.buf, width, height)
