"""Micro-benchmarks (``make bench``); results land in ``benchmarks/results/*.json``."""
