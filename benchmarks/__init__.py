"""Benchmarks: each module measures one thing and writes JSON and markdown under `benchmarks/results/`."""
