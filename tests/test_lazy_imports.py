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


def test_the_core_and_the_spark_planner_import_no_kafka_python() -> None:
    # kafka-python's package imports its consumer, producer and admin client (about a third of
    # a second of CPU): a Spark query's planner processes, which import only the data source,
    # and programs that use only the sans-IO core pay for none of it.
    program = (
        "import json, sys, epochguard, epochguard.offsets, epochguard.spark_connector.datasource\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'kafka')\n"
        "from epochguard import TopicPartition\n"
        "from epochguard.offsets import TopicPartition as Core\n"
        "import kafka\n"
        "print(json.dumps([loaded, TopicPartition is kafka.TopicPartition is Core]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", program],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [[], True]
