"""Which files beside the log a campaign's verdicts rest on, bound to the log (audit.append_evidence: one `evidence`
record per measured step, written once the step's files are complete and before the record that uses them), so
that `ratchet audit verify` names any of them that was changed, removed or swapped for a symlink afterwards.

A measured step's folder (harness.measure's layout) holds each server's log (`server-<tag>.log`, a parity server's
`server-<tag>-parity.log`) and the benchmark client's folder (`bench/` for an A/B, `bench-<tag>/` for one build's
grid): the raw results `job*.json`, the prompt files `prompts-*.jsonl` the harness wrote, `client.log`,
`timings.jsonl` and the client's argument list. All of it is bound; the trees checked out beside it (`tree-*`) are
not (they are removed after the step, and a commit names them). A kernel runner's folder holds its request, result
and log. The baseline's parity reference is bound with the baseline's folder. Profiles and `try_patch` trials are
hints for the proposer, not evidence of a verdict, and are not bound.

A step that runs again after a resume (the baseline, a kernel campaign's prelude, a final comparison, a serving
stage: each is re-run when its result was not recorded) writes to a new folder (`fresh`): the files an earlier run
bound, or left half-written when it was killed, stay as they were.
"""

from __future__ import annotations

from pathlib import Path

from audit import Appended, AuditWriter, append_evidence
from harness.kernel.evaluate import LOG, REQUEST, RESULT

__all__ = ["bind_kernel_run", "bind_step", "fresh", "kernel_files", "step_files"]


def step_files(log_dir: Path, folder: Path) -> list[str]:
    """A measured step's evidence under `folder`, as paths relative to `log_dir`: every server log directly in it and
    every file below its benchmark folders (bench*/). Symlinks are listed too, so that binding them is refused."""
    found = [p for p in folder.glob("server-*.log") if p.is_file() or p.is_symlink()]
    for bench in sorted(folder.glob("bench*")):
        found += [p for p in bench.rglob("*") if p.is_file() or p.is_symlink()] if bench.is_dir() else [bench]
    return sorted(p.relative_to(log_dir).as_posix() for p in found)


def kernel_files(log_dir: Path, folder: Path) -> list[str]:
    """A kernel runner's request, result and log (harness.kernel.evaluate), as paths relative to `log_dir`."""
    return sorted((folder / name).relative_to(log_dir).as_posix() for name in (REQUEST, RESULT, LOG)
                  if (folder / name).is_file() or (folder / name).is_symlink())


def bind_step(writer: AuditWriter, folder: Path, *, step: str, iteration: int | None = None,
              iterations: list[int] | None = None, extra: tuple[str, ...] = ()) -> Appended | None:
    """One evidence record for a measured step: the files of `folder` (step_files) and `extra` (paths relative to
    the log's folder, e.g. the parity reference). Nothing is written when there is nothing to bind."""
    log_dir = writer.directory
    fields: dict[str, object] = {"folder": folder.relative_to(log_dir).as_posix()}
    if iterations:
        fields["iterations"] = iterations
    return append_evidence(writer, [*step_files(log_dir, folder), *extra], step=step, iteration=iteration, **fields)


def bind_kernel_run(writer: AuditWriter, folder: Path, *, step: str, iteration: int | None) -> Appended | None:
    """One evidence record for a kernel runner's evaluation."""
    log_dir = writer.directory
    return append_evidence(writer, kernel_files(log_dir, folder), step=step, iteration=iteration,
                           folder=folder.relative_to(log_dir).as_posix())


def fresh(path: Path) -> Path:
    """`path` when nothing is there yet, else the first free `<stem>-2<suffix>`, `-3`, ...: where a step that runs
    again after a resume writes, so that what an earlier run wrote (and perhaps bound) is left as it was."""
    if not path.exists() and not path.is_symlink():
        return path
    n = 2
    while True:
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
        if not candidate.exists() and not candidate.is_symlink():
            return candidate
        n += 1
