"""The campaign side of an evaluation: write the request, start the runner in a process group of its own,
wait with a deadline (the whole group is killed past it), read the result.

`runner_argv` is what the policy gate is shown (the command a user would type); `run_evaluation` starts the
same module with this interpreter.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.kernel.errors import KernelRunnerError
from harness.kernel.protocol import EvalRequest

__all__ = ["runner_argv", "runner_env", "run_evaluation"]

_ROOT = Path(__file__).resolve().parents[2]      # the folder holding harness/: the runner imports it from here
REQUEST, RESULT, LOG = "request.json", "result.json", "runner.log"


def runner_argv(work_dir: Path) -> list[str]:
    return ["python", "-m", "harness.kernel.runner", str(work_dir / REQUEST), str(work_dir / RESULT)]


def runner_env(*, interpret: bool) -> dict[str, str]:
    """The variables the runner gets on top of this process's environment (the gate sees these)."""
    return {"TRITON_INTERPRET": "1"} if interpret else {}


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_evaluation(request: EvalRequest, work_dir: Path, *, timeout_s: float, interpret: bool) -> dict[str, Any]:
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / REQUEST).write_text(request.model_dump_json(indent=1))
    (work_dir / RESULT).unlink(missing_ok=True)
    env = dict(os.environ, **runner_env(interpret=interpret))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
    argv = [sys.executable, *runner_argv(work_dir)[1:]]
    with (work_dir / LOG).open("wb") as log:
        proc = subprocess.Popen(argv, cwd=work_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise KernelRunnerError(f"kernel runner timed out after {timeout_s:.0f} s (raise runner_timeout_s, or "
                                    f"fewer shapes/rounds); last lines of {work_dir / LOG}:\n{_tail(work_dir / LOG)}"
                                    ) from None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    if rc != 0 or not (work_dir / RESULT).is_file():
        raise KernelRunnerError(f"kernel runner exited with {rc}; last lines of {work_dir / LOG}:\n"
                                f"{_tail(work_dir / LOG)}")
    data: dict[str, Any] = json.loads((work_dir / RESULT).read_text())
    return data
