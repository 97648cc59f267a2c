"""Each server start is an action the policy sees: a free port from the policy's range, and the command line a
user would type for it."""

from __future__ import annotations

from collections.abc import Iterable

from agent.gatekeeper import Gatekeeper
from agent.spec import CampaignSpec
from harness.engine_args import engine_argv
from harness.server import port_is_free, port_is_leased

__all__ = ["gate_server", "gate_servers", "parity_server_alongside", "pick_port", "SERVER_PORTS"]

# The ports the default policy lets servers listen on; each start takes a free one.
SERVER_PORTS = tuple(range(8000, 8016))


def pick_port(exclude: Iterable[int] = ()) -> int:
    """A free port from SERVER_PORTS, not leased by another ratchet server on this host; when none is, the
    first (serve() then names the culprit)."""
    taken = set(exclude)
    return next((p for p in SERVER_PORTS if p not in taken and port_is_free(p) and not port_is_leased(p)),
                SERVER_PORTS[0])


def gate_server(gate: Gatekeeper, spec: CampaignSpec, engine_args: dict[str, object], iteration: int,
                *, exclude: tuple[int, ...] = ()) -> int:
    """Each server start is an action: pick a free port, let the policy see the command line a user would
    type, and return the port."""
    port = pick_port(exclude)
    argv = ["vllm", "serve", str(spec.server.model), "--host", "127.0.0.1", "--port", str(port),
            *engine_argv(engine_args)]
    gate.require({"kind": "start_server", "argv": argv, "env": dict(spec.server.env), "host": "127.0.0.1",
                  "port": port}, iteration=iteration)
    return port


def gate_servers(gate: Gatekeeper, spec: CampaignSpec, builds: Iterable[tuple[str, dict[str, object]]],
                 iteration: int, *, exclude: Iterable[int] = ()) -> dict[str, int]:
    """Gate the servers of one A/B (tag, engine args), each on its own port, none of them in `exclude`."""
    taken = tuple(exclude)
    ports: dict[str, int] = {}
    for tag, engine_args in builds:
        ports[tag] = gate_server(gate, spec, engine_args, iteration, exclude=(*taken, *ports.values()))
    return ports


def parity_server_alongside(spec: CampaignSpec) -> bool:
    """Whether a build's parity server (on `parity.model`) starts beside its speed server, and so needs a gated
    port of its own (harness.measure: `ports["<tag>-parity"]`)."""
    return spec.parity.model is not None and spec.server.start_together
