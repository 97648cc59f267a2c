"""Tables and progress shared by the measurement commands."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agent.commands._common import err_console
from harness.measure import ABResult

__all__ = ["grid_table", "ab_table", "progress_bar"]

_COLUMNS = (
    ("total tok/s", "total_token_throughput", "{:,.0f}"),
    ("out tok/s", "output_throughput", "{:,.0f}"),
    ("prefill tok/s", "prefill_tok_s", "{:,.0f}"),
    ("req/s", "request_throughput", "{:.2f}"),
    ("TTFT mean/med/p99 ms", ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms"), "{:.1f}"),
    ("TPOT mean/med/p99 ms", ("mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms"), "{:.2f}"),
    ("ITL med/p99 ms", ("median_itl_ms", "p99_itl_ms"), "{:.2f}"),
    ("E2EL med/p99 ms", ("median_e2el_ms", "p99_e2el_ms"), "{:.0f}"),
    ("CV", "cv_headline", "{:.1%}"),
)


def _fmt(row: dict[str, object], key: str | tuple[str, ...], fmt: str) -> str:
    keys = (key,) if isinstance(key, str) else key
    values = [row.get(k) for k in keys]
    return "/".join(fmt.format(v) if isinstance(v, (int, float)) else "-" for v in values)


def grid_table(rows: list[dict[str, object]], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("cell")
    for name, _, _ in _COLUMNS:
        table.add_column(name, justify="right")
    for row in rows:
        prefill = row.get("output_len") == 1
        cells = []
        for name, key, fmt in _COLUMNS:
            if prefill and name.startswith(("TPOT", "ITL", "out")) or not prefill and name.startswith("prefill"):
                cells.append("-")
            else:
                cells.append(_fmt(row, key, fmt))
        table.add_row(str(row["cell"]) + (" (prefill)" if prefill else ""), *cells)
    return table


def ab_table(result: ABResult, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("cell", "headline metric", "speedup [95% CI]", "TTFT speedup", "TPOT speedup", "A CV", "B CV"):
        table.add_column(col, justify="left" if col == "cell" else "right")
    rows_a = {r["cell"]: r for r in result.a.table(_cells(result))}
    rows_b = {r["cell"]: r for r in result.b.table(_cells(result))}
    for label, per in result.cells.items():
        metric = "prefill tok/s" if "prefill_tok_s" in per and label.split("/")[1] == "out1" else "total tok/s"
        table.add_row(label, metric, str(per["headline"]), str(per.get("mean_ttft_ms", "-")),
                      str(per.get("mean_tpot_ms", "-")) if label.split("/")[1] != "out1" else "-",
                      f"{rows_a[label]['cv_headline']:.1%}", f"{rows_b[label]['cv_headline']:.1%}")
    if result.images is not None:
        table.add_row("[bold]text cells (geo-mean)[/bold]", "", f"[bold]{result.overall}[/bold]", "", "", "", "")
        table.add_row("[bold]image cells (geo-mean)[/bold]", "", f"[bold]{result.images}[/bold]", "", "", "", "")
    else:
        table.add_row("[bold]overall (geo-mean)[/bold]", "", f"[bold]{result.overall}[/bold]", "", "", "", "")
    return table


def _cells(result: ABResult) -> list:  # type: ignore[type-arg]
    seen = []
    for run in result.a.runs:
        if run.job.cell not in seen:
            seen.append(run.job.cell)
    return seen


@contextlib.contextmanager
def progress_bar(total: int, description: str) -> Iterator[tuple[Progress, object]]:
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err_console, transient=False)
    with progress:
        task = progress.add_task(description, total=total)
        yield progress, task
