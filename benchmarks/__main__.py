"""Run every ``benchmarks/bench_*.py`` module's ``run() -> dict`` and store the results."""

from __future__ import annotations

import importlib
import json
import pkgutil
import platform
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str]) -> int:
    wanted = set(argv)
    RESULTS.mkdir(exist_ok=True)
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        if not info.name.startswith("bench_"):
            continue
        name = info.name.removeprefix("bench_")
        if wanted and name not in wanted:
            continue
        module = importlib.import_module(f"benchmarks.{info.name}")
        result = module.run()
        result["python"] = platform.python_version()
        result["machine"] = platform.machine()
        (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        print(f"{name}: {json.dumps(result, sort_keys=True)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
