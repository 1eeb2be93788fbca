"""``memscope report --html``: a self-contained page, checked in text and as headless Chromium
draws it (a screenshot, decoded by the small PNG reader below)."""

from __future__ import annotations

import html
from html.parser import HTMLParser
import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from conftest import cli, memscope
from shared_runs import shared_ddp
from test_leaks import example_40_steps
from memscope.analysis.summary import summarize
from memscope.analysis.timeline import memory_timeline
from memscope.report.html import CHART_H, CHART_W, OOM_COLOR, PAD_L, PAD_R, PALETTE
from memscope.store.reader import RunReader

# The page puts the chart right under a 64 px header, 16 px from the left (html.CSS)
CHART_BOX = (16, 64, 16 + CHART_W, 64 + CHART_H)  # x0, y0, x1, y1 in the 1200x900 screenshot


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


# -- a minimal PNG reader: 8-bit RGB/RGBA, non-interlaced (what Chromium writes) --------------


def read_png(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for r in range(height):
        ftype = raw[r * (stride + 1)]
        line = bytearray(raw[r * (stride + 1) + 1:(r + 1) * (stride + 1)])
        if ftype == 1:  # Sub
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif ftype == 2:  # Up
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif ftype == 3:  # Average
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:  # Paeth
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b = prev[i]
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        else:
            assert ftype == 0, f"bad PNG filter {ftype}"
        prev = line
        rgb = bytes(line) if bpp == 3 else bytes(b for i, b in enumerate(line) if i % 4 != 3)
        rows.append(rgb)
    return width, height, rows


def hex_rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def pixels_near(rows: list[bytes], box: tuple[int, int, int, int], color: tuple[int, int, int],
                tol: int = 12) -> list[tuple[int, int]]:
    x0, y0, x1, y1 = box
    out = []
    for y in range(y0, y1):
        row = rows[y]
        for x in range(x0, x1):
            r, g, b = row[3 * x:3 * x + 3]
            if abs(r - color[0]) <= tol and abs(g - color[1]) <= tol and abs(b - color[2]) <= tol:
                out.append((x, y))
    return out


def screenshot(page: Path, tmp_path: Path) -> list[bytes]:
    exe = chromium()
    if exe is None:
        pytest.skip("no chromium binary (apt-get install chromium; make test installs it)")
    png = tmp_path / f"{page.stem}.png"
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--screenshot={png}",
                    "--window-size=1200,900", page.resolve().as_uri()],
                   capture_output=True, timeout=120, check=False)
    assert png.exists(), "chromium wrote no screenshot"
    width, height, rows = read_png(png)
    assert (width, height) == (1200, 900)
    return rows


# -- runs ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def oom_run(oom_example_run: Path) -> Path:
    """examples/oom.py failing in the forward of step 3, the run the export and dashboard tests
    read too (made once per session: tests/conftest.py); the page only reads it."""
    return oom_example_run


def write_html(db: Path, tmp_path: Path, *extra: str) -> tuple[Path, str]:
    page = tmp_path / "report.html"
    out = cli("report", str(db), "--html", str(page), *extra)
    assert out.returncode == 0, out.stderr
    assert f"wrote {page}" in out.stderr
    return page, out.stdout


def assert_self_contained(text: str) -> None:
    """Nothing to fetch: no URL, no external script, stylesheet, image or font."""
    assert "://" not in text
    assert not re.search(r"<(script|link|img|iframe)\b", text)
    assert "@import" not in text and "url(" not in text


def test_html_report_content(oom_run: Path, tmp_path: Path) -> None:
    page, stdout = write_html(oom_run, tmp_path)
    assert stdout == ""  # --html alone prints no text report
    text = page.read_text()
    assert_self_contained(text)
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    # the drawn series is the timeline the analysis computes, point for point
    with RunReader(oom_run) as reader:
        points = memory_timeline(reader, 600).primary.points  # type: ignore[union-attr]
    (poly,) = re.findall(r'<polyline class="series"[^>]* points="([^"]+)"', text)
    assert len(poly.split()) == len(points) > 3
    assert 'class="oom"' in text and 'class="peak"' in text
    assert "Out of memory" in text and "step 3, forward, expand" in text
    assert "a shape bug" in text and "3072.00 TiB" in text
    # hotspots: the modules the analysis ranks, in its order
    with RunReader(oom_run) as reader:
        spots = [h.module or "(model)" for h in summarize(reader).hotspots]
    hot = text.split("<h2>Hotspots")[1].split("<h2>")[0]
    assert spots and [html.unescape(m) for m in re.findall(r"<tr><td>([^<]+)</td>", hot)] == spots[:15]
    assert "<h2>Leaks</h2>" in text and "<h2>Suggestions</h2>" in text


def test_html_with_json_prints_json(oom_run: Path, tmp_path: Path) -> None:
    _, stdout = write_html(oom_run, tmp_path, "--json")
    assert stdout.lstrip().startswith("{") and '"schema": "memscope.report/1"' in stdout


def test_html_chart_drawn_in_chromium(oom_run: Path, tmp_path: Path) -> None:
    page, _ = write_html(oom_run, tmp_path)
    rows = screenshot(page, tmp_path)
    x0, y0, x1, y1 = CHART_BOX
    line = pixels_near(rows, CHART_BOX, hex_rgb(PALETTE[0]))
    # the RSS line runs across the plot: many pixels of its colour, left edge to right edge
    assert len(line) > 300, len(line)
    xs = [x for x, _ in line]
    plot_w = CHART_W - PAD_L - PAD_R
    assert max(xs) - min(xs) > 0.9 * plot_w, (min(xs), max(xs))
    assert pixels_near(rows, CHART_BOX, hex_rgb(OOM_COLOR)), "no OOM marker drawn"
    # and the region is not blank: plenty of pixels differ from the white page
    background = (255, 255, 255)
    busy = sum(1 for y in range(y0, y1) for x in range(x0, x1)
               if tuple(rows[y][3 * x:3 * x + 3]) != background)
    assert busy > 0.3 * (x1 - x0) * (y1 - y0), busy


def test_html_without_samples_draws_no_line(tmp_path: Path) -> None:
    """The negative control: a run whose script never imported torch has no samples; the page
    says so and the chart region holds none of the line's pixels."""
    script = tmp_path / "plain.py"
    script.write_text("print('no torch here')\n")
    db = tmp_path / "run.db"
    out = memscope("attach", "--headless", "--db", str(db), str(script))
    assert out.returncode == 0, out.stderr
    page, _ = write_html(db, tmp_path)
    text = page.read_text()
    assert "no memory samples in this run" in text and "<polyline" not in text
    rows = screenshot(page, tmp_path)
    assert pixels_near(rows, CHART_BOX, hex_rgb(PALETTE[0])) == []


def test_html_leak_and_fix(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    db, out = example_40_steps(tmp_path_factory, "leaky")  # tests/test_leaks.py's run
    assert out.returncode == 0, out.stderr
    text = write_html(db, tmp_path)[0].read_text()
    assert_self_contained(text)
    assert "__main__.loss_history" in text  # the leak's holder, in the leaks table
    assert "fix_leak" in text and "loss.item()" in text  # and the fix, as a suggestion
    assert 'class="oom"' not in text


def test_html_ranks(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    # two ranks, 3 steps (rank 1 holds 64 MiB more): the dashboard's run, made once per session
    db, out = shared_ddp(tmp_path_factory, "--steps", "3", "--heavy-rank", "1", "--heavy-mb", "64")
    assert out.returncode == 0, out.stderr
    text = write_html(db, tmp_path)[0].read_text()
    titles = re.findall(r'<polyline class="series"[^>]*><title>([^<]+)</title>', text)
    assert titles == ["rank 0 host RSS", "rank 1 host RSS"]
    assert "<h2>Ranks</h2>" in text
    ranks_table = text.split("<h2>Ranks</h2>")[1]
    assert re.search(r"<tr><td>0</td>.*?<td class=num>3</td>", ranks_table)
    assert re.search(r"<tr><td>1</td>.*?<td class=num>3</td>", ranks_table)


@pytest.mark.parametrize("target, message", [
    ("/no/such/dir/r.html", "directory /no/such/dir does not exist"),
    (".", "is a directory"),
])
def test_html_bad_target(oom_run: Path, target: str, message: str) -> None:
    out = memscope("report", str(oom_run), "--html", target)  # the real process's line and status
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr


def test_html_not_a_run_file(tmp_path: Path) -> None:
    bogus = tmp_path / "x.db"
    bogus.write_bytes(os.urandom(4096))
    out = memscope("report", str(bogus), "--html", str(tmp_path / "r.html"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "r.html").exists()


class _Tables(HTMLParser):
    """Every <table> of a page as rows of cell texts (entities decoded, as a browser shows them)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


@pytest.mark.parametrize("example, held_by, site, module", [
    ("local_list", "__main__.train.<locals>.history", "examples/leaks/local_list.py:27", "(model)"),
    ("hook_cache", "__main__.model.2.cache", "examples/leaks/hook_cache.py:16", "2"),
])
def test_html_leaks_table_has_site_and_module(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                              example: str, held_by: str, site: str, module: str) -> None:
    """The leaks table says where the leaked tensors were stored and which module's forward made
    them, as `memscope leaks` does; a holder's <locals> is text on the page, not a tag. The runs
    (40 steps at default options) are tests/test_leaks.py's, made once per session."""
    db, out = example_40_steps(tmp_path_factory, example)
    assert out.returncode == 0, out.stderr
    text = write_html(db, tmp_path)[0].read_text()
    assert "<locals>" not in text  # escaped wherever it appears
    parser = _Tables()
    parser.feed(text)
    (leaks,) = [t for t in parser.tables if t and "held by" in t[0]]
    head, *rows = leaks
    assert head == ["group", "per step", "tensors/step", "steps", "held by", "site", "module", "fix"]
    (row,) = rows
    cells = dict(zip(head, row))
    assert (cells["held by"], cells["site"], cells["module"]) == (held_by, site, module)
