"""Benchmarks, run on demand (`make bench`), never in the test suite."""
