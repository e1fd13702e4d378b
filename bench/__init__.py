"""OmniRT's benchmarks: scripts, run from the repository root as `python -m bench.NAME`.

`python -m bench.suite` runs every scenario (overhead, control plane, batching, Ray Serve as a
peer, cold vs warm, dispatch at scale), prints one table, writes bench/results/suite.json and
regenerates docs/BENCHMARKS.md; `python -m bench.gpu` is the GPU variant. Each scenario starts
real daemons on loopback, drives a bounded load and stops by itself.
"""
