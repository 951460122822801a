"""Benchmarks on real models (never run by the tests)."""
