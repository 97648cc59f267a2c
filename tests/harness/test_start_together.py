"""harness.server.start_together and the rotation of an interleaved comparison, without vLLM: start-ups are
context managers that wait (as serve() waits for /health) until they are ready, fail, or are cancelled."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.bench import job_argv
from harness.config import BenchmarkConfig, Cell
from harness.errors import ServerCrashed, StartCancelled
from harness.measure import _jobs
from harness.server import Server, ServerStart, start_together


class _Running:
    def __init__(self) -> None:
        self.stopped = False


def _start(log: list[str], tag: str, *, ready_after: float = 0.0, fail_after: float | None = None) -> ServerStart:
    @contextlib.contextmanager
    def start(cancel: threading.Event) -> Iterator[Server]:
        t0 = time.monotonic()
        while True:
            if cancel.is_set():
                log.append(f"{tag} cancelled")
                raise StartCancelled(f"{tag} cancelled")
            if fail_after is not None and time.monotonic() - t0 >= fail_after:
                log.append(f"{tag} crashed")
                raise ServerCrashed(f"{tag}: server exited with code 1 during start-up")
            if fail_after is None and time.monotonic() - t0 >= ready_after:
                break
            time.sleep(0.01)
        log.append(f"{tag} up")
        try:
            yield Server(base_url=f"http://{tag}", model_name=tag, startup_s=time.monotonic() - t0, evidence={},
                         log_path=Path(f"{tag}.log"), running=_Running())  # type: ignore[arg-type]
        finally:
            log.append(f"{tag} stopped")
    return start


def test_servers_start_at_once_and_are_all_stopped_by_the_stack() -> None:
    log: list[str] = []
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        servers, failed = start_together(stack, {t: _start(log, t, ready_after=0.3) for t in "ABC"},
                                         cancel={t: threading.Event() for t in "ABC"})
        assert sorted(servers) == ["A", "B", "C"] and not failed
        assert time.monotonic() - t0 < 0.8          # overlapped: not 3 × 0.3 s one after the other
    assert sorted(log) == ["A stopped", "A up", "B stopped", "B up", "C stopped", "C up"]


def test_a_failed_start_ends_the_others_waiting_and_is_raised() -> None:
    log: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(ServerCrashed, match="B: server exited"), contextlib.ExitStack() as stack:
        start_together(stack, {"A": _start(log, "A", ready_after=0.05), "B": _start(log, "B", fail_after=0.1),
                               "C": _start(log, "C", ready_after=30)},
                       cancel={t: threading.Event() for t in "ABC"})
    assert time.monotonic() - t0 < 5                # C did not wait its 30 s
    assert "C cancelled" in log and "A stopped" in log and "B crashed" in log


def test_a_tolerated_failure_is_returned_and_an_outside_cancel_drops_only_its_server() -> None:
    log: list[str] = []
    cancel = {t: threading.Event() for t in "ABC"}
    threading.Timer(0.1, cancel["C"].set).start()     # C's candidate broke parity meanwhile
    with contextlib.ExitStack() as stack:
        servers, failed = start_together(
            stack, {"A": _start(log, "A", ready_after=0.3), "B": _start(log, "B", fail_after=0.05),
                    "C": _start(log, "C", ready_after=30)},
            cancel=cancel, tolerate=frozenset({"B", "C"}))
        assert list(servers) == ["A"] and isinstance(failed["B"], ServerCrashed) and "C" not in failed
    assert "A stopped" in log and "C cancelled" in log


def test_the_interleaving_rotates_so_no_build_always_runs_first() -> None:
    servers = [(t, Server(base_url=t, model_name=t, startup_s=0, evidence={}, log_path=Path(t),
                          running=None)) for t in ("A", "B1", "B2")]  # type: ignore[arg-type]
    jobs = _jobs([Cell(input_len=64, output_len=8), Cell(input_len=128, output_len=8)], servers, Path("tok"), repeats=3)
    firsts = [jobs[k].tag for k in range(0, len(jobs), 3)]
    assert firsts == ["A", "B1", "B1", "B2", "B2", "A"]
    assert all(sorted(j.tag for j in jobs[k:k + 3]) == ["A", "B1", "B2"] for k in range(0, len(jobs), 3))
    # two builds: AB, BA, AB, BA, as before there were more
    two = _jobs([Cell(input_len=64, output_len=8)], servers[:2], Path("tok"), repeats=4)
    assert [j.tag for j in two] == ["A", "B1", "B1", "A", "A", "B1", "B1", "A"]


@pytest.mark.parametrize("warm_up", ["every_run", "first_run_per_cell"])
def test_warm_ups_go_before_each_servers_first_run_of_a_cell_or_before_every_run(warm_up: str) -> None:
    servers = [(t, Server(base_url=t, model_name=t, startup_s=0, evidence={}, log_path=Path(t),
                          running=None)) for t in ("A", "B")]  # type: ignore[arg-type]
    cells = [Cell(input_len=64, output_len=8), Cell(input_len=128, output_len=8)]
    config = BenchmarkConfig(input_lens=[64, 128], output_lens=[8], num_warmups=3, warm_up=warm_up)
    jobs = _jobs(cells, servers, Path("tok"), repeats=3)
    sent = {}
    for job in jobs:
        argv = job_argv(job, config, Path("out"), "x.json")
        sent.setdefault((job.tag, job.cell.input_len), []).append(int(argv[argv.index("--num-warmups") + 1]))
    assert len(sent) == 4
    if warm_up == "every_run":
        assert all(counts == [3, 3, 3] for counts in sent.values())
    else:   # each (server, cell): warmed once, on its first run; the same for every build
        assert all(counts == [3, 0, 0] for counts in sent.values())
