"""operations.reporting.plot: the PNG it writes is valid and the chart puts things where they belong."""
import struct
import zlib

import pytest

from operations.reporting import plot
from operations.reporting.plot import AXIS, MARK, PALETTE, TEXT, line_chart, write_png


def decode(png: bytes):
    """A minimal PNG reader for what plot writes (8-bit RGB, filter 0); checks the signature and every CRC."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(png):
        (n,) = struct.unpack(">I", png[pos:pos + 4])
        tag, data = png[pos + 4:pos + 8], png[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", png[pos + 8 + n:pos + 12 + n])
        assert crc == zlib.crc32(tag + data) & 0xFFFFFFFF, tag
        chunks.append((tag, data))
        pos += 12 + n
    assert pos == len(png)
    assert chunks[0][0] == b"IHDR" and chunks[-1] == (b"IEND", b"")
    w, h, depth, ctype, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, ctype, comp, filt, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(b"".join(d for t, d in chunks if t == b"IDAT"))
    stride = w * 3 + 1
    assert len(raw) == h * stride
    rows = [raw[y * stride:(y + 1) * stride] for y in range(h)]
    assert all(r[0] == 0 for r in rows)
    return w, h, [r[1:] for r in rows]


class Image:
    def __init__(self, png: bytes):
        self.w, self.h, self.rows = decode(png)
        self.where: dict[tuple, list[tuple[int, int]]] = {}
        for y, row in enumerate(self.rows):
            for x in range(self.w):
                self.where.setdefault(tuple(row[3 * x:3 * x + 3]), []).append((x, y))

    def box(self):
        """The plot area (x0, y0, x1, y1), found from the axis lines: the y axis is the column with the most axis
        pixels, the x axis the row with the most."""
        pts = self.where[AXIS]
        cols, rows = {}, {}
        for x, y in pts:
            cols[x] = cols.get(x, 0) + 1
            rows[y] = rows.get(y, 0) + 1
        x0, y1 = max(cols, key=cols.get), max(rows, key=rows.get)
        return x0, min(y for x, y in pts if x == x0), max(x for x, y in pts if y == y1), y1

    def inside(self, colour):
        """Pixels of colour in the plot area (so not the legend's swatches)."""
        x0, y0, x1, y1 = self.box()
        return [(x, y) for x, y in self.where.get(colour, []) if x0 <= x <= x1 and y <= y1 + 6]

    def centre(self, colour):
        pts = self.inside(colour)
        return sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)


def runs(values):
    """Number of runs of consecutive integers in values."""
    v = sorted(set(values))
    return sum(1 for i, x in enumerate(v) if i == 0 or x != v[i - 1] + 1)


def test_valid_png_of_the_requested_size():
    png = line_chart({"a": [(1, 1), (2, 3)]}, title="T", x_label="x", y_label="y", width=640, height=420)
    img = Image(png)
    assert (img.w, img.h) == (640, 420)
    assert TEXT in img.where and AXIS in img.where


def test_write_png_round_trips_rows_and_flat_buffers(tmp_path):
    w, h = 3, 2
    rows = [bytearray(range(0, 9)), bytearray(range(100, 109))]
    png = write_png(tmp_path / "p.png", rows, w, h)
    assert (tmp_path / "p.png").read_bytes() == png
    assert decode(png) == (w, h, [bytes(r) for r in rows])
    assert write_png(None, b"".join(rows), w, h) == png
    with pytest.raises(ValueError):
        write_png(None, b"\x00" * 5, w, h)


def test_every_series_colour_is_drawn():
    series = {f"s{i}": [(1, i), (2, i + 1), (3, i)] for i in range(len(PALETTE))}
    img = Image(line_chart(series, width=700, height=400))
    for colour in PALETTE:
        assert img.inside(colour), colour


def test_higher_values_are_drawn_higher_and_y_starts_at_zero():
    img = Image(line_chart({"up": [(1, 10), (2, 20)]}, width=600, height=400))
    pts = img.inside(PALETTE[0])
    left_x, right_x = min(x for x, _ in pts), max(x for x, _ in pts)
    left_y = sum(y for x, y in pts if x == left_x) / sum(1 for x, _ in pts if x == left_x)
    right_y = sum(y for x, y in pts if x == right_x) / sum(1 for x, _ in pts if x == right_x)
    assert right_y < left_y - 50
    axis_row = img.box()[3]  # y = 0 is the x axis, so 10 sits halfway between it and 20
    assert abs((axis_row - left_y) * 2 - (axis_row - right_y)) <= 4


def test_log_x_spaces_powers_of_two_evenly():
    series = {f"x{x}": [(x, 1.0)] for x in (1, 2, 4, 8)}
    img = Image(line_chart(series, log_x=True, width=600, height=400))
    xs = [img.centre(PALETTE[i])[0] for i in range(4)]
    gaps = [b - a for a, b in zip(xs, xs[1:])]
    assert min(gaps) > 50 and max(gaps) - min(gaps) <= 2, xs
    lin = Image(line_chart(series, width=600, height=400))
    xs = [lin.centre(PALETTE[i])[0] for i in range(4)]
    assert xs[3] - xs[2] > 2 * (xs[1] - xs[0])


def test_none_breaks_the_line():
    def column_runs(points):
        return runs(x for x, _ in Image(line_chart({"s": points}, width=600, height=400)).inside(PALETTE[0]))
    assert column_runs([(1, 5), (2, 5), (3, 5), (4, 5)]) == 1
    assert column_runs([(1, 5), (2, None), (3, 5), (4, 5)]) == 2


def test_mark_draws_a_dashed_vertical_line_at_its_x():
    img = Image(line_chart({"a": [(2, 1)], "b": [(6, 1)]}, marks=[(4, "cross")], width=600, height=400))
    x0, y0, x1, y1 = img.box()
    cols = {}
    for x, y in img.inside(MARK):
        cols.setdefault(x, []).append(y)
    col = max(cols, key=lambda c: len(cols[c]))
    assert len(cols[col]) > (y1 - y0) / 3
    assert runs(cols[col]) >= 5  # dashes, not a solid line
    mid = (img.centre(PALETTE[0])[0] + img.centre(PALETTE[1])[0]) / 2
    assert abs(col - mid) <= 2
    assert len(img.where[MARK]) > len(cols[col])  # plus its label


def test_deterministic():
    args = ({"a": [(1, 2.5), (2, 3.5)], "b": [(1, 1), (2, None), (4, 9)]},)
    kw = dict(title="t", log_x=True, marks=[(2, "m")])
    assert line_chart(*args, **kw) == line_chart(*args, **kw)
    assert line_chart(*args, **kw) != line_chart(*args, **{**kw, "title": "u"})


def test_empty_input_draws_axes_and_no_data():
    img = Image(line_chart({}, width=500, height=320))
    assert (img.w, img.h) == (500, 320)
    x0, y0, x1, y1 = img.box()
    assert x1 - x0 > 200 and y1 - y0 > 150
    assert any(x0 < x < x1 and y0 < y < y1 for x, y in img.where[TEXT])  # "no data"
    assert not any(c in img.where for c in PALETTE)


@pytest.mark.parametrize("series, kw", [
    ({"one": [(8, 3.0)]}, {}),
    ({"one": [(8, 3.0)]}, {"log_x": True}),
    ({"same x": [(4, 1), (4, 2), (4, 3)]}, {"log_x": True}),
    ({"all none": [(1, None), (2, None)], "zeros": [(1, 0), (2, 0)]}, {}),
    ({"big": [(1, 12_000), (2, 2_500_000)], "neg": [(1, -5e5), (3, 1e5)]}, {"marks": [(100, "off to the right")]}),
    ({"a very long series name that cannot fit on the right": [(1, 1), (2, 2)], "b": [(1, 2)]}, {"x_label": "x"}),
    ({"tiny": [(0.001, 1e-6), (0.002, 3e-6)]}, {"width": 300, "height": 200, "title": "small chart ±"}),
])
def test_edge_cases_render(series, kw):
    img = Image(line_chart(series, **kw))
    assert (img.w, img.h) == (kw.get("width", 800), kw.get("height", 500))
    drawn = [c for c in PALETTE[:len(series)] if c in img.where]
    assert drawn  # at least the legend swatches


def test_tick_labels_for_large_values():
    assert [plot._fmt(v) for v in (0, 0.25, 500, 12_000, 1_200_000, 2.5e9)] == ["0", "0.25", "500", "12k", "1.2M",
                                                                                  "2.5G"]
    lo, hi, ticks = plot._ticks(0, 2300)
    assert (lo, hi) == (0, 2500) and ticks[1] == 500
