"""Benchmarks of the control plane: scripts, run from the repository root as `python -m bench.NAME`.

They start real daemons on loopback ports, drive a bounded load and stop by themselves; see
docs/BENCHMARKS.md for the commands and the numbers.
"""
