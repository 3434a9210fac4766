"""Benchmarks and studies: each compares things side by side in one run and prints ratios.
Run from the repository root as `python3 -m bench.NAME` (e.g. `python3 -m bench.throughput`)."""
