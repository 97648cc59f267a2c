"""Exceptions the harness raises on purpose. Each message says what failed and what to do next.

    HarnessError
     ├── PortInUse            the requested port is taken
     ├── ServerNotReady       /health did not answer within the start-up timeout
 │    └── StartCancelled   a start-up stopped waiting because a server started with it failed
     ├── ServerCrashed        the server process exited (during start-up or a benchmark)
     ├── WrongTreeLoaded      the server imported vLLM from somewhere other than the workspace
     ├── BenchmarkFailed      the benchmark client failed or requests failed
     ├── MalformedBenchResult the client's --save-result JSON is missing fields or is not JSON
     ├── ParityError          parity prompts or references are unusable
     ├── EngineArgRejected    a serving-config key or value is not on the allowlist
     ├── EngineDefaultsUnknown vLLM could not say which engine args it resolves (callers go on without)
     ├── MeasurementTampered  the pristine client, the harness or the interpreter changed during an A/B
     ├── RooflineUnavailable  a model config the served roofline cannot count (it is omitted, never guessed)
 │    └── UnknownArchitecture  not an architecture it counts (named in the message)
     ├── CeilingsUnavailable  this host's matmul rate and bandwidth could not be measured
     └── TraceUnusable        a profiler trace with nothing to cut into engine steps (empty, or no steps/kernels)
"""

from __future__ import annotations

__all__ = [
    "HarnessError",
    "PortInUse",
    "ServerNotReady",
    "StartCancelled",
    "ServerCrashed",
    "WrongTreeLoaded",
    "BenchmarkFailed",
    "MalformedBenchResult",
    "ParityError",
    "EngineArgRejected",
    "EngineDefaultsUnknown",
    "MeasurementTampered",
    "RooflineUnavailable",
    "UnknownArchitecture",
    "CeilingsUnavailable",
    "TraceUnusable",
]


class HarnessError(Exception):
    """Base for failures the harness raises on purpose."""


class PortInUse(HarnessError):
    pass


class ServerNotReady(HarnessError):
    pass


class StartCancelled(ServerNotReady):
    pass


class ServerCrashed(HarnessError):
    pass


class WrongTreeLoaded(HarnessError):
    pass


class BenchmarkFailed(HarnessError):
    pass


class MalformedBenchResult(HarnessError):
    pass


class ParityError(HarnessError):
    pass


class EngineArgRejected(HarnessError):
    pass


class EngineDefaultsUnknown(HarnessError):
    pass


class MeasurementTampered(HarnessError):
    """A file of the measurement path changed between the start of a comparison and its end."""


class RooflineUnavailable(HarnessError):
    """The served roofline cannot count this model (harness/roofline.py): it is omitted, with this reason."""


class UnknownArchitecture(RooflineUnavailable):
    pass


class CeilingsUnavailable(HarnessError):
    """This host's ceilings (matmul rate, memory bandwidth) could not be measured (harness/ceilings.py)."""


class TraceUnusable(HarnessError):
    """A profiler trace that cannot be cut into engine steps (harness/trace_steps.py); top ops are still read."""
