"""epochguard: a Kafka consumer SDK that detects log truncation (KIP-320) instead of hiding it."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
