"""SIGTERM and SIGINT stop a ratchet command the way Ctrl-C does (KeyboardInterrupt: servers stopped, the
audit log checkpointed), also when it was started as a background job with SIGINT ignored."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

WAITER = """
from agent.cli import _stop_on_terminate
import time
_stop_on_terminate()
try:  # "ready" inside the try: a signal that lands right after it must still be caught here
    print("ready", flush=True)
    time.sleep(60)
except KeyboardInterrupt as exc:
    print("interrupted", exc, flush=True)
    raise SystemExit(130)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_becomes_keyboard_interrupt_even_when_sigint_was_ignored(sig: signal.Signals) -> None:
    # What a non-interactive shell does to `cmd &`: SIGINT ignored in the child.
    proc = subprocess.Popen([sys.executable, "-c", WAITER], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    started = time.monotonic()
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130 and time.monotonic() - started < 10
    assert out.startswith("interrupted")
