"""The screenshots in the docs, made again from the fixed real run files: ``make screenshots``.

    docs/images/dashboard-80x24-overview.svg   the dashboard at 80x24 (Textual's own SVG export)
    docs/images/dashboard-80x24-leaks.svg
    docs/images/dashboard-160x48-overview.svg
    docs/images/dashboard-160x48-breakdown.svg
    docs/images/report-1400.png                the HTML page (memscope report --html) in headless
    docs/images/report-600.png                 Chromium, 1,400 and 600 px wide (its first 1,600 px)

The run is tests/tui/data/leaky.sqlite (examples/leaky.py, 16 steps: a leak), so the pictures
change only when what memscope draws changes."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tui"), str(ROOT / "tests")]

from cdp import Browser, chromium  # noqa: E402

RUN = ROOT / "tests" / "tui" / "data" / "leaky.sqlite"
OUT = ROOT / "docs" / "images"
SCREENS = [((80, 24), "1", "overview"), ((80, 24), "3", "leaks"), ((160, 48), "1", "overview"),
           ((160, 48), "4", "breakdown")]


async def dashboard(size: tuple[int, int], key: str, name: str) -> Path:
    from memscope_tui.app import MemscopeApp

    app = MemscopeApp(str(RUN), now=lambda: 0.0)
    async with app.run_test(size=size) as pilot:
        for _ in range(400):
            if app.loads >= 1:
                break
            await pilot.pause(0.05)
        await pilot.press(key)
        await pilot.pause(0.3)
        path = OUT / f"dashboard-{size[0]}x{size[1]}-{name}.svg"
        app.save_screenshot(filename=path.name, path=str(OUT))
    return path


def report(width: int, page: Path, profile: Path) -> Path:
    exe = chromium()
    if exe is None:
        raise SystemExit("screenshots: no chromium binary (apt-get install chromium)")
    browser = Browser(exe, profile)
    try:
        shown = browser.page(page.resolve().as_uri(), width, 1600)
        return shown.screenshot(OUT / f"report-{width}.png", full=False)
    finally:
        browser.close()


def main() -> int:
    from memscope.report.html import render_html
    from memscope.store.reader import RunReader

    OUT.mkdir(parents=True, exist_ok=True)
    for size, key, name in SCREENS:
        print(asyncio.run(dashboard(size, key, name)).relative_to(ROOT))
    # chromium's helper processes may still write to the profile as the main one exits: a file
    # left behind there is no failure of the screenshots
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        page = Path(tmp) / "report.html"
        with RunReader(RUN) as reader:
            page.write_text(render_html(reader), encoding="utf-8")
        for width in (1400, 600):
            print(report(width, page, Path(tmp) / f"profile-{width}").relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
