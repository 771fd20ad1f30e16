"""Benchmarks (see docs/performance.md)."""
