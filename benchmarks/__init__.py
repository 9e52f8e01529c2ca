"""Benchmarks: ``python -m benchmarks [name ...]`` runs them and writes results/<name>.json."""
