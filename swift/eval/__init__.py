"""Benchmark evaluation for `swift eval` (and the sampler of `swift sample`)."""
