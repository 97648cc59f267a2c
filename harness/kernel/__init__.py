"""The kernel harness: correctness checks, timing and roofline for one kernel file (see README.md)."""
