"""Spark's own Kafka source (``spark-sql-kafka-0-10``) from Maven Central, for side-by-side runs.

``python -m epochguard.testing.apache_kafka.spark_kafka`` (what ``make spark-jars`` runs)
resolves it ahead of the tests into the same cache as the Kafka jars
(``$EPOCHGUARD_KAFKA_CACHE`` or ``~/.cache/epochguard``), as ``spark-kafka-<version>/lib``
plus a ``.resolved`` marker written only after Maven finished.

The connector's version is the newest on Maven Central that is not newer than the installed
pyspark: 4.3.0 is not published there, and 4.2.0 runs on the 4.3.0 runtime
(``$EPOCHGUARD_SPARK_KAFKA_VERSION`` overrides it).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import sys
import time
from importlib import resources
from pathlib import Path

import attrs

from epochguard._log import get_logger
from epochguard.testing.apache_kafka.jars import (
    MARKER,
    KafkaUnavailableError,
    _locked,
    cache_root,
    real_kafka_required,
    resolve_with_maven,
)

log = get_logger("epochguard.testing.apache_kafka")

DEFAULT_SPARK_KAFKA_VERSION = "4.2.0"
VERSION_ENV = "EPOCHGUARD_SPARK_KAFKA_VERSION"
POM = "spark-kafka-pom.xml"
CONNECTOR = "spark-sql-kafka-0-10_2.13"

# "kafka-clients-3.9.2.jar" -> "kafka-clients"; "zstd-jni-1.5.7-7.jar" -> "zstd-jni". A version
# has a dot, so digits inside a name ("spark-sql-kafka-0-10_2.13") are not taken for one.
_ARTIFACT = re.compile(r"^(?P<name>.+?)-\d+(?:\.\d+)+(?:-[A-Za-z0-9.]+)?\.jar$")


@attrs.frozen
class SparkKafkaJars:
    """The resolved connector: every jar of its closure, and those Spark must be given."""

    version: str
    home: Path
    #: The jars to pass with ``spark.jars``: the closure minus artifacts pyspark already ships.
    extra: tuple[Path, ...]

    @property
    def lib_dir(self) -> Path:
        return self.home / "lib"

    @property
    def spark_jars(self) -> str:
        """The value of ``spark.jars`` (comma-separated paths)."""
        return ",".join(str(p) for p in self.extra)


def spark_kafka_version() -> str:
    return os.environ.get(VERSION_ENV) or DEFAULT_SPARK_KAFKA_VERSION


def pyspark_jars_dir() -> Path:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise KafkaUnavailableError("pyspark is not installed (the `spark` extra)")
    return Path(next(iter(spec.submodule_search_locations))) / "jars"


def artifact_name(jar: Path) -> str:
    match = _ARTIFACT.match(jar.name)
    return match.group("name") if match else jar.stem


def jars_to_add(closure: list[Path], shipped: list[Path]) -> tuple[Path, ...]:
    """The closure's jars whose artifact pyspark does not ship already.

    Two versions of one artifact on a classpath (scala-library, slf4j-api, lz4-java...) make
    the JVM pick either; the runtime's own must win, so only artifacts it lacks are added.
    """
    have = {artifact_name(p) for p in shipped}
    return tuple(sorted(p for p in closure if artifact_name(p) not in have))


def _pom_text() -> str:
    return resources.files(__package__).joinpath(POM).read_text(encoding="utf-8")


def _is_resolved(home: Path, version: str) -> bool:
    marker = home / MARKER
    return (
        marker.is_file()
        and marker.read_text().strip() == _pom_text_digest()
        and (home / "lib" / f"{CONNECTOR}-{version}.jar").is_file()
    )


def _pom_text_digest() -> str:
    return hashlib.sha256(_pom_text().encode()).hexdigest()


def _check_not_newer_than_runtime(version: str) -> None:
    try:
        installed = importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError as exc:
        raise KafkaUnavailableError("pyspark is not installed (the `spark` extra)") from exc

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", v)[:3])

    if key(version) > key(installed):
        raise KafkaUnavailableError(
            f"{CONNECTOR} {version} is newer than the installed pyspark {installed}; "
            f"set {VERSION_ENV} to a version not newer than the runtime"
        )


def ensure_spark_kafka_jars(version: str | None = None, root: Path | None = None) -> SparkKafkaJars:
    """Return the cached connector jars, running Maven first when they are not cached."""
    version = version or spark_kafka_version()
    _check_not_newer_than_runtime(version)
    home = (root or cache_root()) / f"spark-kafka-{version}"
    if not _is_resolved(home, version):
        if shutil.which("mvn") is None:
            raise KafkaUnavailableError(f"cannot resolve {CONNECTOR}: mvn not found")
        with _locked(home):
            if not _is_resolved(home, version):
                _resolve(home, version)
    closure = sorted((home / "lib").glob("*.jar"))
    shipped = sorted(pyspark_jars_dir().glob("*.jar"))
    return SparkKafkaJars(version=version, home=home, extra=jars_to_add(closure, shipped))


def _resolve(home: Path, version: str) -> None:
    seconds = resolve_with_maven(
        home, _pom_text(), {"spark.kafka.version": version}, f"{CONNECTOR} {version}"
    )
    log.info(
        "spark_kafka_jars_resolved",
        version=version,
        lib_dir=str(home / "lib"),
        seconds=seconds,
    )


def main(argv: list[str] | None = None) -> int:
    """Resolve the connector ahead of the tests; see ``make spark-jars``."""
    del argv
    if importlib.util.find_spec("pyspark") is None or shutil.which("mvn") is None:
        message = "Spark's Kafka source needs pyspark and mvn"
        if real_kafka_required():
            print(f"error: {message}", file=sys.stderr)
            return 1
        print(f"skipping Spark's Kafka source: {message}", file=sys.stderr)
        return 0
    started = time.monotonic()
    try:
        jars = ensure_spark_kafka_jars()
    except KafkaUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    elapsed = time.monotonic() - started
    names = ", ".join(p.name for p in jars.extra)
    print(f"{CONNECTOR} {jars.version} in {jars.lib_dir} ({elapsed:.1f} s): {names}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
