"""Experiments: benchmark data, baselines, runners and reports that measure the library."""
