"""kafka-python's package ``__init__`` modules, run on first use of one of their names.

Importing any ``kafka.*`` module runs ``kafka/__init__.py`` first, which imports the admin
client, the producer and the consumer: most of kafka-python. This library uses its protocol,
network and record modules (``kafka.consumer``'s ``__init__`` likewise imports
``KafkaConsumer`` and its group coordinator, where this library needs
``kafka.consumer.subscription_state``). A process that needs only ``kafka.structs`` (Spark's
planner processes, which create the data source and pickle its readers) paid for all of it.

:func:`defer_kafka_init` puts those packages in ``sys.modules`` without running their
``__init__``: submodules import as usual (they need only the package's ``__path__``), and
the first lookup of any other name on a package (``kafka.KafkaProducer``, ``from kafka
import KafkaConsumer``, ``kafka.__version__``, ``dir(kafka)``) runs its ``__init__`` then,
in the same module object, so code that uses those names works as before. A package
imported before epochguard is left as it is.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
from typing import Any

__all__ = ["defer_kafka_init"]


def defer_kafka_init() -> None:
    """Install ``kafka`` and ``kafka.consumer`` without running their ``__init__`` (a no-op
    for a package imported already)."""
    if _defer_package_init("kafka"):
        # What kafka/__init__.py does first: kafka-python's records go nowhere unless the
        # application configures logging (without it, Python's last-resort handler would
        # print its warnings).
        logging.getLogger("kafka").addHandler(logging.NullHandler())
    _defer_package_init("kafka.consumer")


def _defer_package_init(name: str) -> bool:
    if name in sys.modules:
        return False
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return False
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader
    lock = threading.RLock()
    started = False

    def run_init() -> None:
        nonlocal started
        with lock:
            if started:
                return
            started = True
            loader.exec_module(package)
            # From now on the package's names are plain attributes. (Another thread that
            # looks one up while __init__ runs waits on the lock above.)
            for hook, ours in (("__getattr__", __getattr__), ("__dir__", __dir__)):
                if package.__dict__.get(hook) is ours:
                    del package.__dict__[hook]

    def __getattr__(attr: str) -> Any:
        run_init()
        try:
            return package.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

    def __dir__() -> list[str]:
        run_init()
        return sorted(package.__dict__)

    package.__getattr__ = __getattr__  # type: ignore[method-assign]
    package.__dir__ = __dir__  # type: ignore[method-assign]
    sys.modules[name] = package
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, package)
    return True
