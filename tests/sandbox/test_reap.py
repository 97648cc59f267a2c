"""A local server's working directory is an empty folder outside the log folder, and the reaper still finds
a dead campaign's servers by it (the owner record lies beside the folder, where the server cannot write)."""

from __future__ import annotations

from pathlib import Path

import psutil

from harness.config import ServerConfig
from harness.server import serve
from sandbox.local import SERVER_CWD_ROOT, LocalBackend
from sandbox.reap import owned_server_cwds, reap_under


def test_the_server_cwd_is_outside_the_log_folder_and_reaped_by_it(fake_tree: Path, fake_model: Path,
                                                                   tmp_path: Path) -> None:
    runs = tmp_path / "campaign" / "runs"
    log = runs / "iteration-1" / "server-B.log"
    with serve(LocalBackend(), tree=fake_tree, config=ServerConfig(model=fake_model, startup_timeout_s=60),
               engine_args={}, log_path=log, cache_dir=tmp_path / "cache") as server:
        proc = psutil.Process(server.running.process.pid)
        cwd = Path(proc.cwd())
        assert cwd.is_relative_to(SERVER_CWD_ROOT) and not cwd.is_relative_to(tmp_path)
        assert list(cwd.iterdir()) == []
        assert owned_server_cwds(runs) == [cwd]
        assert owned_server_cwds(tmp_path / "elsewhere") == []
        assert reap_under(runs) == [proc.pid]        # as a resumed campaign would, for a dead run's server
        proc.wait(timeout=10)
