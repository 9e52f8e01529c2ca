"""``python -m epochguard.testing.apache_kafka``: resolve the Kafka jars and compile the probe."""

from __future__ import annotations

from epochguard.testing.apache_kafka.jars import main

raise SystemExit(main())
