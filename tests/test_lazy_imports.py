"""What importing epochguard (and the Spark source) loads: the asyncio consumer (and aiokafka,
when installed) only when used. Each check runs in a fresh interpreter: this one has imported
everything."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ["aiokafka", "epochguard.consumer.aio"]

PROGRAM = """
import json, sys
import {module}
loaded = [m for m in {heavy!r} if m in sys.modules]
import kafka
from kafka import KafkaProducer
from kafka.consumer import KafkaConsumer
from epochguard import AIOEpochConsumer
from epochguard.consumer import AIOEpochConsumer as Same
print(json.dumps({{
    "loaded_by_import": loaded,
    "version": kafka.__version__,
    "producer": KafkaProducer.__name__,
    "consumer": KafkaConsumer.__name__,
    "same_consumer": KafkaConsumer is kafka.KafkaConsumer,
    "aio": AIOEpochConsumer is Same,
    "in_dir": "KafkaAdminClient" in dir(kafka),
}}))
"""


@pytest.mark.parametrize("module", ["epochguard", "epochguard.spark_connector.datasource"])
def test_importing_loads_no_asyncio_consumer_and_the_names_still_work(module: str) -> None:
    out = subprocess.run(
        [sys.executable, "-P", "-c", PROGRAM.format(module=module, heavy=HEAVY)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["loaded_by_import"] == []
    assert result["version"].count(".") >= 1
    assert result["producer"] == "KafkaProducer" and result["consumer"] == "KafkaConsumer"
    assert result["same_consumer"] and result["aio"] and result["in_dir"]


@pytest.mark.parametrize(
    ("module", "not_loaded"),
    [
        # Neither the consumer nor the test clusters: the package's consumer names are
        # imported on first use (a missing C decoder is still said at import).
        (
            "epochguard",
            ["epochguard.testing", "epochguard.consumer", "epochguard.consumer.aio", "aiokafka"],
        ),
        # cluster-ctl, the control port's client: no cluster.
        (
            "epochguard.testing.control",
            ["epochguard.testing.embedded.cluster", "epochguard.testing.apache_kafka"],
        ),
    ],
)
def test_package_roots_load_their_parts_on_first_use(module: str, not_loaded: list[str]) -> None:
    program = (
        f"import json, sys, {module}\n"
        f"print(json.dumps([m for m in {not_loaded!r} if m in sys.modules]))\n"
        "from epochguard import EpochConsumer, LogTruncationError\n"
        "from epochguard.testing import EmbeddedCluster, wait_until\n"
        "import epochguard.testing as t\n"
        "names = [EpochConsumer.__name__, LogTruncationError.__name__, EmbeddedCluster.__name__]\n"
        "print(json.dumps([*names, 'wait_until' in dir(t), 'EpochConsumer' in dir(epochguard)]))\n"
    )
    out = (
        subprocess.run(
            [
                sys.executable,
                "-P",
                "-c",
                "import epochguard\n" + program if module != "epochguard" else program,
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        .stdout.strip()
        .splitlines()
    )
    assert json.loads(out[0]) == []
    assert json.loads(out[1]) == [
        "EpochConsumer",
        "LogTruncationError",
        "EmbeddedCluster",
        True,
        True,
    ]


def fresh(program: str) -> str:
    return subprocess.run(
        [sys.executable, "-P", "-c", program],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.strip()


def test_the_spark_source_module_loads_no_consumer_arrow_or_unused_kafka_python() -> None:
    # Spark's planner processes import it only to create the source and pickle its
    # readers: the driver's and the executors' parts are imported on their first call.
    heavy = [
        "epochguard.consumer",
        "epochguard.spark_connector.driver",
        "epochguard.spark_connector.executor",
        "pyarrow",
        "kafka.admin",
        "kafka.producer",
        "kafka.consumer.group",
    ]
    program = (
        "import json, sys, epochguard.spark_connector.datasource\n"
        f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))\n"
    )
    assert json.loads(fresh(program)) == []


def test_kafka_python_logs_nowhere_before_its_package_init_runs() -> None:
    # kafka/__init__.py gives the "kafka" logger a NullHandler; deferred, epochguard does.
    program = (
        "import logging, sys, epochguard, kafka.structs\n"
        "print('kafka.admin' in sys.modules, logging.getLogger('kafka').handlers)\n"
    )
    assert fresh(program) == "False [<NullHandler (NOTSET)>]"


def test_a_kafka_imported_first_is_left_as_it_is() -> None:
    program = "import kafka, sys; e = kafka.__dict__.get('KafkaProducer'); import epochguard; "
    program += "print(e is not None and sys.modules['kafka'] is kafka)"
    assert fresh(program) == "True"


def test_threads_looking_up_kafka_names_during_its_init_all_get_them() -> None:
    program = """
import threading, epochguard, kafka
names = ["KafkaConsumer", "KafkaProducer", "KafkaAdminClient", "OffsetAndMetadata"] * 4
got, start = [], threading.Barrier(len(names))
def look(name):
    start.wait()
    got.append(getattr(kafka, name).__name__)
threads = [threading.Thread(target=look, args=(n,)) for n in names]
for t in threads: t.start()
for t in threads: t.join()
print(sorted(got) == sorted(names))
"""
    assert fresh(program) == "True"
