"""The one warning a process gets when the C record decoder is missing.

``import epochguard`` checks for the extension module without importing the consumer (so the
package stays cheap to import), and the record decoder checks again when it loads; whichever
finds it missing first logs ``record_decoder_fallback``, once per process.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path

from epochguard._log import get_logger

#: Set (to anything but ``0``) to use the pure-Python decoder even when the C one is built.
PURE_PYTHON_ENV = "EPOCHGUARD_PURE_PYTHON"

#: What the warning tells a user whose install has no C decoder.
C_DECODER_REMEDY = (
    "install a wheel built for this Python, or rebuild from the sdist with a C compiler "
    "(gcc or clang) and this Python's headers (python3-dev): pip install --force-reinstall "
    "--no-deps --no-binary epochguard epochguard"
)

_MODULE = "epochguard.consumer._crecords"
_warned = False


def pure_python_chosen() -> bool:
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


def missing_reason() -> str | None:
    """Why the C decoder cannot load, found without importing it or the consumer package;
    None when its module is there (whether it then imports is the decoder's to find out)."""
    if _MODULE in sys.modules:
        if sys.modules[_MODULE] is None:
            return f"C extension not importable: {_MODULE} is blocked in sys.modules"
        return None
    where = str(Path(__file__).with_name("consumer"))
    if importlib.machinery.PathFinder.find_spec("_crecords", [where]) is None:
        return f"C extension not importable: no {_MODULE} built for this Python in {where}"
    return None


def warn_once(reason: str) -> None:
    """Log ``record_decoder_fallback`` unless it was logged already in this process or the
    pure-Python decoder was chosen on purpose: it is correct but slower, and a compiler-less
    install falls back to it without a word from pip."""
    global _warned
    if _warned or pure_python_chosen():
        return
    _warned = True
    get_logger("epochguard.consumer").warning(
        "record_decoder_fallback", decoder="python", reason=reason, remedy=C_DECODER_REMEDY
    )
