"""``python -m epochguard.testing.franzgo``: build the franz-go probe (``make go-probe``)."""

from __future__ import annotations

from epochguard.testing.franzgo import main

raise SystemExit(main())
