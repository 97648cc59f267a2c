"""Render a report page with headless Chromium: its DOM as the browser parsed it, and a PNG screenshot.

For tests and for the screenshots under experiments/results/ (`python -m audit.render LOG_DIR OUT.png`); the
report itself needs no browser. Chromium runs with no network access to fetch anything (the page is one file).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["RenderError", "chromium", "dump_dom", "screenshot"]

_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class RenderError(Exception):
    pass


def chromium() -> str:
    for name in _NAMES:
        if path := shutil.which(name):
            return path
    raise RenderError("no Chromium found (apt-get install chromium; ./setup.sh test installs it)")


def _run(page: Path, *flags: str, timeout: float = 120) -> str:
    with tempfile.TemporaryDirectory(prefix="ratchet-chromium-") as profile:
        argv = [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                "--no-first-run", f"--user-data-dir={profile}", "--proxy-server=127.0.0.1:9",  # nothing to fetch
                *flags, page.resolve().as_uri()]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RenderError(f"chromium exited {done.returncode}: {done.stderr[-1500:]}")
    return done.stdout


def dump_dom(page: Path) -> str:
    return _run(page, "--dump-dom")


def screenshot(page: Path, png: Path, *, width: int = 1200, height: int = 2000) -> Path:
    _run(page, f"--window-size={width},{height}", f"--screenshot={png.resolve()}")
    if not png.is_file():
        raise RenderError(f"chromium wrote no screenshot to {png}")
    return png


if __name__ == "__main__":
    from audit import write_report

    log_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    with tempfile.TemporaryDirectory() as tmp:
        html, _ = write_report(log_dir, out_dir=Path(tmp))
        print(screenshot(html, out))
