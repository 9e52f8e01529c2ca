"""Run benchmark modules and write their results as JSON.

Every module ``benchmarks/<name>.py`` (not starting with ``_``) that defines
``run() -> dict`` is a benchmark. ``python -m benchmarks`` runs them all;
``python -m benchmarks embedded_fetch`` runs the ones named. Each result goes to
``benchmarks/results/<name>.json`` with the time and host details added. The epochguard
package's modules are compiled first, as an installed wheel's are (see
:func:`benchmarks._common.compile_package`).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
import time
from pathlib import Path

from benchmarks._common import compile_package, write_record

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def discover() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules([str(HERE)]) if not m.name.startswith("_"))


def main(argv: list[str]) -> int:
    names = argv or discover()
    unknown = sorted(set(names) - set(discover()))
    if unknown:
        print(
            f"unknown benchmarks: {', '.join(unknown)}; have: {', '.join(discover())}",
            file=sys.stderr,
        )
        return 2
    RESULTS.mkdir(exist_ok=True)
    compile_package()
    failed = 0
    for name in names:
        module = importlib.import_module(f"benchmarks.{name}")
        run = getattr(module, "run", None)
        if run is None:
            continue
        print(f"== {name}", flush=True)
        started = time.time()
        try:
            result = run()
        except Exception as e:  # one broken benchmark must not hide the others
            failed += 1
            print(f"{name} failed: {e!r}", file=sys.stderr)
            continue
        write_record(RESULTS, name, started, result)
        print(json.dumps(result, indent=2), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
