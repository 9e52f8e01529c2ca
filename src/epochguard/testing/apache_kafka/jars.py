"""Apache Kafka jars from Maven Central, resolved once into a cache outside the source tree.

``python -m epochguard.testing.apache_kafka.jars`` (what ``make kafka-jars`` runs) resolves them
ahead of the tests. The cache folder is ``$EPOCHGUARD_KAFKA_CACHE`` or
``~/.cache/epochguard``; each Kafka version gets ``kafka-<version>/lib`` plus a ``.resolved``
marker written only after Maven finished, so an interrupted resolution is redone.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import attrs

from epochguard._log import get_logger

log = get_logger("epochguard.testing.apache_kafka")

#: Newest Apache Kafka 4.x whose whole dependency closure is on Maven Central. (4.4.0 is listed
#: in kafka-clients' and kafka_2.13's maven-metadata.xml, but kafka-tools-api 4.4.0, a runtime
#: dependency of kafka_2.13, and kafka-tools 4.4.0 are missing, so 4.4.0 cannot run.)
DEFAULT_KAFKA_VERSION = "4.3.1"
CACHE_ENV = "EPOCHGUARD_KAFKA_CACHE"
VERSION_ENV = "EPOCHGUARD_KAFKA_VERSION"
REQUIRE_ENV = "EPOCHGUARD_REQUIRE_REAL_KAFKA"
MARKER = ".resolved"
#: The reference Java programs, compiled together (one digest over all of them): the
#: single-partition truncation probe, the consumer-group member and the broker-side KIP-714
#: telemetry receiver (a metrics reporter plugin the brokers load).
PROBE_SOURCES = ("TruncationProbe.java", "GroupMemberProbe.java", "TelemetryReceiverPlugin.java")
PROBE_JAR = "probes.jar"


class KafkaUnavailableError(RuntimeError):
    """Java or Maven is missing, or Maven could not resolve the Kafka jars."""


@attrs.frozen
class KafkaJars:
    """A resolved Kafka runtime: the version and the folder holding every jar it needs."""

    version: str
    home: Path

    @property
    def lib_dir(self) -> Path:
        return self.home / "lib"

    @property
    def classpath(self) -> str:
        # A wildcard entry keeps the command line short; the JVM expands it itself.
        return str(self.lib_dir / "*")

    @property
    def clients_jar(self) -> Path:
        return self.lib_dir / f"kafka-clients-{self.version}.jar"


def real_kafka_required() -> bool:
    """In CI the real-Kafka tests must fail, not skip, when Java or Maven is missing."""
    return os.environ.get(REQUIRE_ENV) == "1" or os.environ.get("CI", "").lower() == "true"


def missing_tools() -> list[str]:
    """Names of the programs real-Kafka tests need and this machine lacks."""
    return [tool for tool in ("java", "javac", "mvn") if shutil.which(tool) is None]


def kafka_version() -> str:
    return os.environ.get(VERSION_ENV) or DEFAULT_KAFKA_VERSION


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "epochguard"


def _pom_text() -> str:
    return resources.files(__package__).joinpath("pom.xml").read_text(encoding="utf-8")


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    """Serialise resolution and compilation between test processes sharing the cache."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _pom_digest() -> str:
    return hashlib.sha256(_pom_text().encode()).hexdigest()


def _is_resolved(jars: KafkaJars) -> bool:
    marker = jars.home / MARKER
    return (
        marker.is_file()
        and marker.read_text().strip() == _pom_digest()
        and jars.clients_jar.is_file()
    )


def ensure_kafka_jars(version: str | None = None, root: Path | None = None) -> KafkaJars:
    """Return the cached jars of ``version``, running Maven first when they are not cached."""
    version = version or kafka_version()
    jars = KafkaJars(version=version, home=(root or cache_root()) / f"kafka-{version}")
    if _is_resolved(jars):
        return jars
    missing = [t for t in missing_tools() if t != "javac"]
    if missing:
        raise KafkaUnavailableError(
            f"cannot resolve Apache Kafka jars: {', '.join(missing)} not found"
        )
    with _locked(jars.home):
        if not _is_resolved(jars):
            _resolve(jars)
    return jars


def _resolve(jars: KafkaJars) -> None:
    seconds = resolve_with_maven(
        jars.home, _pom_text(), {"kafka.version": jars.version}, f"Apache Kafka {jars.version}"
    )
    log.info(
        "kafka_jars_resolved",
        version=jars.version,
        lib_dir=str(jars.lib_dir),
        seconds=seconds,
    )


def resolve_with_maven(home: Path, pom_text: str, properties: dict[str, str], what: str) -> float:
    """Copy the runtime dependency closure of ``pom_text`` into ``home/lib`` with Maven (call
    it under :func:`_locked`). The jars land in a staging folder that is renamed into place
    and the pom's digest is written last, so an interrupted run is redone, never half used.
    Returns the seconds it took."""
    staging = home / "lib.partial"
    shutil.rmtree(staging, ignore_errors=True)
    (home / "pom.xml").write_text(pom_text, encoding="utf-8")
    started = time.monotonic()
    proc = subprocess.run(
        [
            "mvn",
            "-q",
            "-B",
            "-f",
            str(home / "pom.xml"),
            "dependency:copy-dependencies",
            *(f"-D{key}={value}" for key, value in properties.items()),
            f"-DoutputDirectory={staging}",
            "-DincludeScope=runtime",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        raise KafkaUnavailableError(
            f"mvn could not resolve {what}:\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
        )
    shutil.rmtree(home / "lib", ignore_errors=True)
    staging.rename(home / "lib")
    (home / MARKER).write_text(hashlib.sha256(pom_text.encode()).hexdigest() + "\n")
    return round(time.monotonic() - started, 2)


def ensure_probe_classes(jars: KafkaJars) -> Path:
    """Compile the reference Java clients against the same kafka-clients jar, once per source;
    returns the jar that holds their classes (a jar, not a folder of classes, so a JVM can
    keep them in a class-data-sharing archive)."""
    package = resources.files(__package__)
    sources = {name: package.joinpath(name).read_text(encoding="utf-8") for name in PROBE_SOURCES}
    digest = hashlib.sha256("\0".join(sources[n] for n in PROBE_SOURCES).encode()).hexdigest()
    out = jars.home / "probe" / digest[:16]
    if _compiled(out):
        return out / PROBE_JAR
    if shutil.which("javac") is None:
        raise KafkaUnavailableError("cannot compile the Java probes: javac not found")
    with _locked(jars.home):
        if not _compiled(out):
            _compile_probes(jars, sources, out)
    return out / PROBE_JAR


def _compiled(out: Path) -> bool:
    return (out / PROBE_JAR).is_file()


def _compile_probes(jars: KafkaJars, sources: dict[str, str], out: Path) -> None:
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    classes = staging / "classes"
    classes.mkdir(parents=True)
    files = []
    for name, text in sources.items():
        (staging / name).write_text(text, encoding="utf-8")
        files.append(str(staging / name))
    proc = subprocess.run(
        ["javac", "-nowarn", "-cp", str(jars.clients_jar), "-d", str(classes), *files],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise KafkaUnavailableError(f"javac failed on {', '.join(sources)}:\n{proc.stderr}")
    with zipfile.ZipFile(staging / PROBE_JAR, "w") as jar:
        for path in sorted(classes.rglob("*.class")):
            jar.write(path, path.relative_to(classes).as_posix())
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)


def main(argv: list[str] | None = None) -> int:
    """Resolve the jars, compile the probes and dump the class archives ahead of the tests;
    see ``make kafka-jars``."""
    del argv
    missing = missing_tools()
    if missing:
        message = f"real Apache Kafka tests need {', '.join(missing)}, which is not installed"
        if real_kafka_required():
            print(f"error: {message}", file=sys.stderr)
            return 1
        print(f"skipping Kafka jar resolution: {message}", file=sys.stderr)
        return 0
    started = time.monotonic()
    try:
        jars = ensure_kafka_jars()
        ensure_probe_classes(jars)
    except KafkaUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    # Imported here: making the archives starts a cluster, which needs this module.
    from epochguard.testing.apache_kafka.class_archive import ensure_class_archives

    try:
        ensure_class_archives(jars)
    except Exception as exc:
        # The archives only speed JVMs up: every JVM runs without them, and the test that
        # checks they are mapped says why they are missing.
        print(f"warning: no class archives, JVMs start without them: {exc!r}", file=sys.stderr)
    elapsed = time.monotonic() - started
    print(f"Apache Kafka {jars.version} jars in {jars.lib_dir} ({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
