"""A stand-in `vllm` package for sandbox tests: harness.server's preamble imports it like the real one."""
__version__ = "0.0.0+fake"
