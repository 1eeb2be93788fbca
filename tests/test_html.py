"""``memscope report --html``: a self-contained page, checked in text and as headless Chromium
lays it out at 1,400 and 600 px (over the DevTools protocol: tests/cdp.py): elements, tooltips,
nothing wider than the window, and screenshots decoded by the small PNG reader below."""

from __future__ import annotations

import html
import json
from html.parser import HTMLParser
import os
import re
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from cdp import Browser, Page, chromium
from conftest import cli, memscope
from shared_runs import shared_ddp
from test_leaks import example_40_steps
from memscope.analysis.run_timeline import run_timeline
from memscope.analysis.summary import summarize
from memscope.analysis.timeline import memory_timeline
from memscope.report.html_charts import CATEGORY_COLORS, LEAK_COLORS, OOM_COLOR, PALETTE
from memscope.store.reader import RunReader
from memscope.units import human_bytes


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
    """Nothing to fetch: no URL, no external script, stylesheet, image or font; one inline script
    (the tooltips)."""
    assert "://" not in text
    assert not re.search(r"<(link|img|iframe)\b", text) and not re.search(r"<script[^>]*\bsrc", text)
    assert text.count("<script>") == 1
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
    (poly,) = re.findall(r'<polyline class="series" stroke="[^"]+" points="([^"]+)"', text)
    assert len(poly.split()) == len(points) > 3
    assert 'class="oom"' in text and 'class="peak"' in text
    assert "Out of memory" in text and "step 3, forward, expand" in text
    assert "a shape bug" in text and "3072.00 TiB" in text
    # hotspots: the modules the analysis ranks, in its order
    with RunReader(oom_run) as reader:
        spots = [h.module or "(model)" for h in summarize(reader).hotspots]
    hot = text.split("<h2>Hotspots")[1].split("<h2>")[0]
    assert spots and [html.unescape(m) for m in re.findall(r'<span class="name">([^<]+) <small>', hot)] == spots[:15]
    assert "<h2>Leaks</h2>" in text and "<h2>Suggestions</h2>" in text


def test_html_with_json_prints_json(oom_run: Path, tmp_path: Path) -> None:
    _, stdout = write_html(oom_run, tmp_path, "--json")
    assert stdout.lstrip().startswith("{") and '"schema": "memscope.report/1"' in stdout


def test_html_without_samples_draws_no_line(tmp_path: Path, browser: Browser) -> None:
    """The negative control: a run whose script never imported torch has no samples; the page
    says so and draws no line."""
    script = tmp_path / "plain.py"
    script.write_text("print('no torch here')\n")
    db = tmp_path / "run.db"
    out = memscope("attach", "--headless", "--db", str(db), str(script))
    assert out.returncode == 0, out.stderr
    page, _ = write_html(db, tmp_path)
    text = page.read_text()
    assert "no memory samples in this run" in text and "<polyline" not in text
    shown = browser.page(page.resolve().as_uri(), 600, 700)
    assert shown.js("document.querySelectorAll('polyline').length") == 0
    assert "no memory samples in this run" in shown.js("document.querySelector('#timeline').textContent")


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
    (facts,) = [t for t in parser.tables if any(row[:1] == ["held by"] for row in t)]
    cells = {row[0]: row[1] for row in facts}
    assert list(cells) == ["per step", "tensors/step", "steps", "held by", "site", "module", "created at", "fix"]
    assert (cells["held by"], cells["site"], cells["module"]) == (held_by, site, module)
    assert f"memscope leaks {db}" in html.unescape(text)  # the hint names this very file


# -- in a browser: 1,400 and 600 px wide -------------------------------------------------------

UNIT = re.compile(r"^\d+(\.\d+)? (B|KiB|MiB|GiB|TiB)$")
# every element the layout made wider than the window (a table that scrolls in its own box: its box)
OVERFLOW = """[...document.querySelectorAll('body *')].filter(e => {const r = e.getBoundingClientRect();
  return r.width > 0 && (r.right > innerWidth + 0.5 || r.left < -0.5) && !e.parentElement.closest('.wide')
    && !e.closest('.tip')})
  .map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Any:
    exe = chromium()
    if exe is None:
        pytest.fail("no chromium binary: the page is checked in a real browser (apt-get install chromium; "
                    "make test installs it)")
    b = Browser(exe, tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


@pytest.fixture(scope="module")
def leaky_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """tests/test_leaks.py's 40-step examples/leaky.py run (made once per session) and its page."""
    db, out = example_40_steps(tmp_path_factory, "leaky")
    assert out.returncode == 0, out.stderr
    page = tmp_path_factory.mktemp("leaky-page") / "report.html"
    assert cli("report", str(db), "--html", str(page)).returncode == 0
    return db, page


def hover(page: Page, selector: str, index: int = -1) -> dict[str, Any]:
    """Move the pointer onto the middle of a chart column; the tooltip's state then."""
    box = page.js(f"""(() => {{const all = document.querySelectorAll({json.dumps(selector)});
        const e = all[{index} < 0 ? all.length + {index} : {index}]; e.scrollIntoView({{block: 'center'}});
        const r = e.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2];}})()""")
    page.hover(*box)
    return page.js("""(() => {const t = document.querySelector('.tip'), r = t.getBoundingClientRect();
        return {hidden: t.hidden, text: t.textContent, children: t.children.length,
                left: r.left, right: r.right, top: r.top, bottom: r.bottom};})()""")


def box_of(page: Page, selector: str) -> tuple[int, int, int, int]:
    """The element's box in page coordinates (a full-page screenshot's pixels)."""
    r = page.js(f"""(() => {{const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();
        return [r.left, r.top + scrollY, r.right, r.bottom + scrollY];}})()""")
    return int(r[0]), int(r[1]), int(r[2]), int(r[3])


@pytest.mark.parametrize("width", [1400, 600])
def test_charts_in_a_browser(browser: Browser, leaky_page: tuple[Path, Path], tmp_path: Path, width: int) -> None:
    db, html_file = leaky_page
    with RunReader(db) as reader:
        s = summarize(reader)
        tl = run_timeline(reader, s)
    page = browser.page(html_file.resolve().as_uri(), width, 900)
    # nothing wider than the window; each chart as wide as its column
    assert page.js("document.documentElement.scrollWidth") <= width
    assert page.js(OVERFLOW) == []
    charts = page.js("[...document.querySelectorAll('svg.plot')].map(s => [s.closest('figure').id, "
                     "s.getBoundingClientRect().width])")
    assert [c[0] for c in charts] == ["timeline", "categories", "leak-1"]
    assert all(w >= 0.85 * (width - 32 - 64) for _, w in charts), charts
    for chart in ("timeline", "categories", "leak-1"):  # y labels in memory units, from 0
        labels = page.js(f"[...document.querySelectorAll('#{chart} .ylab span')].map(s => s.textContent)")
        assert labels[0] == "0 B" and len(labels) >= 3 and all(UNIT.match(x) for x in labels), labels
    # the category stack's last column: the step, its time, every category, the leak
    last = tl.categories.points[-1]
    tip = hover(page, "#categories rect.hit")
    assert not tip["hidden"] and tip["children"] == 0, tip  # text, never markup
    lines = tip["text"].splitlines()
    assert lines[0] == f"step {last.step} ({last.t:.2f} s), at its end", lines
    assert f"parameters: {human_bytes(last.parts['parameters'])}" in lines
    assert f"leak 1: {human_bytes(last.parts['leak:0'])}" in lines and last.parts["leak:0"] > 0
    assert lines[-1].startswith(f"other: {human_bytes(last.parts['other'])} (of host RSS ")
    assert 0 <= tip["left"] and tip["right"] <= width and 0 <= tip["top"] and tip["bottom"] <= 900  # on screen
    # the timeline: time, step, each series
    tip = hover(page, "#timeline rect.hit", len(tl.memory.primary.points) // 2)  # type: ignore[union-attr]
    assert re.match(r"^\d+\.\d\d s( · step \d+)?$", tip["text"].splitlines()[0]), tip["text"]
    assert "host RSS: " in tip["text"]
    # the leak's growth, with the verdict's rate where it grew
    lk = s.leaks[0]
    tip = hover(page, "#leak-1 rect.hit")
    assert f"(+{human_bytes(lk.bytes_per_step)}/step)" in tip["text"] and tip["text"].startswith("step ")
    # drawn: a screenshot, its pixels in the charts' colours
    shot = page.screenshot(tmp_path / f"leaky-{width}.png")
    w, _, rows = read_png(shot)
    assert w == width
    assert len(pixels_near(rows, box_of(page, "#timeline svg"), hex_rgb(PALETTE[0]))) > 100
    cats = box_of(page, "#categories svg")
    for color in (LEAK_COLORS[0], CATEGORY_COLORS["parameters"], CATEGORY_COLORS["optimizer_state"]):
        assert len(pixels_near(rows, cats, hex_rgb(color))) > 50, color
    assert len(pixels_near(rows, box_of(page, "#leak-1 svg"), hex_rgb(LEAK_COLORS[0]))) > 50


def test_oom_page_at_600(browser: Browser, oom_run: Path, tmp_path: Path) -> None:
    """The OOM line and its flag stay inside a narrow window; the hints name the run file."""
    page_file, _ = write_html(oom_run, tmp_path)
    text = html.unescape(page_file.read_text())
    assert f"memscope oom {oom_run}" in text and f"memscope layers {oom_run}" in text and "RUN.db" not in text
    page = browser.page(page_file.resolve().as_uri(), 600, 900)
    assert page.js(OVERFLOW) == [] and page.js("document.documentElement.scrollWidth") <= 600
    flag = page.js("(() => {const r = document.querySelector('#timeline .flag').getBoundingClientRect();"
                   "return [document.querySelector('#timeline .flag').textContent, r.left, r.right];})()")
    assert flag[0] == "OOM" and 0 <= flag[1] and flag[2] <= 600, flag
    _, _, rows = read_png(page.screenshot(tmp_path / "oom-600.png"))
    assert pixels_near(rows, box_of(page, "#timeline svg"), hex_rgb(OOM_COLOR)), "no OOM line drawn"
