"""kafka-python's package ``__init__`` modules run on first use of one of their names.

Importing any ``kafka.*`` module runs ``kafka/__init__.py`` first, and that imports the admin
client, the producer and the consumer: most of kafka-python, none of which this library
uses (``kafka.consumer``'s ``__init__`` likewise imports ``KafkaConsumer`` and its group
coordinator; this library needs ``kafka.consumer.subscription_state`` only). Every Spark
query pays those imports in each of its Python processes (source runner, planner,
executors). :func:`defer_kafka_init` puts the packages in place without running their
``__init__``; the first name looked up on one (``kafka.KafkaProducer``, ``from kafka import
KafkaConsumer``) runs it then, so code that uses those names works as before.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from typing import Any

__all__ = ["defer_kafka_init"]


def defer_kafka_init() -> None:
    """Install ``kafka`` and ``kafka.consumer`` without running their ``__init__`` (each a
    no-op once imported)."""
    _defer_package_init("kafka")
    _defer_package_init("kafka.consumer")


def _defer_package_init(name: str) -> None:
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
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

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__") and attr not in ("__version__", "__all__"):
            raise AttributeError(attr)
        run_init()
        try:
            return package.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {spec.name!r} has no attribute {attr!r}") from None

    def __dir__() -> list[str]:
        run_init()
        return sorted(package.__dict__)

    package.__getattr__ = __getattr__  # type: ignore[method-assign]
    package.__dir__ = __dir__  # type: ignore[method-assign]
    sys.modules[name] = package
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, package)
