"""Shared fixtures. Markers (vllm, docker, gpu, slow) are declared in pyproject.toml."""
