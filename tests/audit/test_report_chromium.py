"""The report page as a reviewer sees it: rendered by headless Chromium, the headline, the final table, an
accepted diff and the isolation are on the page, in that order, and the screenshot is a real picture."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image, ImageStat

from audit import write_report
from audit.render import dump_dom, screenshot
from tests.audit.conftest import unpack_run1


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("render")
    html, _ = write_report(unpack_run1(out), out_dir=out / "report")
    return html


def test_chromium_shows_what_a_reviewer_must_see(page: Path) -> None:
    dom = dump_dom(page)
    wanted = ["(isolation: local)", "Verdict: improved", "best vs stock 1.367× [1.281, 1.459] (parity ok)",
              "log verified: 48 records", "Final comparison: best vs stock", "in1024/out64", "1.464×",
              "Iteration 3:", "<details open=\"\"><summary>Diff", "+enforce_eager: false"]
    positions = [dom.find(text) for text in wanted]
    assert -1 not in positions, [t for t, p in zip(wanted, positions, strict=True) if p == -1]
    assert positions == sorted(positions)
    assert dom.count("<svg") == 3


def test_the_screenshot_is_a_rendered_page(page: Path, tmp_path: Path) -> None:
    png = screenshot(page, tmp_path / "report.png", width=1200, height=1600)
    with Image.open(png) as image:
        assert image.size == (1200, 1600)
        # a blank or error page is nearly one colour; a rendered report has text, plots and tables
        assert max(ImageStat.Stat(image.convert("L")).stddev) > 20
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20) or []
        assert len(colours) > 200
