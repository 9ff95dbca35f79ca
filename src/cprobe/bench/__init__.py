"""Shared data for benchmarks and reference comparisons (not used by the studies themselves)."""
