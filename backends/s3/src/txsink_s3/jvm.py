"""The JVM half of the native S3 path: a small commit protocol for Spark's own writer.

Spark's Parquet writer prepares an S3 target's participants through
``txsink.spark.s3.NativeCommitProtocol`` (sources in ``backends/s3/jvm/``): S3A's magic
committer uploads each task's file as a multipart upload that nothing completes, and
job commit lists them in ``job.json`` for txsink's driver. The classes are compiled
here, with the JDK's ``javac`` and ``jar``, against the installed PySpark's own jars and
hadoop-aws matching its Hadoop (resolved by Maven into ``~/.m2``, see
:mod:`txsink.testing.s3a`), into ``txsink_s3/jars/txsink-s3-spark.jar``. A wheel built
afterwards carries the jar.

    python -m txsink_s3.jvm build     # compile if the sources or PySpark changed
    python -m txsink_s3.jvm path      # where the jar is (for spark.jars / extraClassPath)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: The class Spark's ``spark.sql.sources.commitProtocolClass`` names for native writes.
PROTOCOL_CLASS = "txsink.spark.s3.NativeCommitProtocol"
JAR_NAME = "txsink-s3-spark.jar"
JARS_DIR = Path(__file__).resolve().parent / "jars"
#: The Java sources, in the source tree (a wheel has the jar, not the sources).
SOURCES = Path(__file__).resolve().parents[2] / "jvm" / "src" / "main" / "java"


class JarUnavailable(RuntimeError):
    """The native path's jar is neither built nor buildable here."""


def jar_path() -> Path:
    """The built jar; :class:`JarUnavailable` saying how to build it when it is missing."""
    jar = JARS_DIR / JAR_NAME
    if not jar.is_file():
        raise JarUnavailable(
            f"{jar} is missing: build it with `python -m txsink_s3.jvm build` (needs a JDK "
            "and Maven, which fetches hadoop-aws once) and put it on Spark's class path")
    return jar


def _sources() -> list[Path]:
    return sorted(SOURCES.rglob("*.java"))


def _fingerprint(classpath: list[str]) -> str:
    digest = hashlib.sha256()
    for source in _sources():
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    for jar in classpath:
        digest.update(Path(jar).name.encode())
    return digest.hexdigest()[:16]


def _compile_classpath() -> list[str]:
    from txsink.testing.s3a import s3a_classpath
    from txsink.testing.spark_cluster import spark_home

    return sorted(str(p) for p in (spark_home() / "jars").glob("*.jar")) + s3a_classpath()


def build(*, force: bool = False) -> Path:
    """Compile the protocol into :data:`JARS_DIR` unless an up-to-date jar is there."""
    if not _sources():
        return jar_path()  # an installed wheel: the jar came with it
    javac, jar_tool = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar_tool is None:
        raise JarUnavailable("building the native S3 path's jar needs a JDK (javac, jar)")
    classpath = _compile_classpath()
    stamp = JARS_DIR / (JAR_NAME + ".stamp")
    fingerprint = _fingerprint(classpath)
    target = JARS_DIR / JAR_NAME
    if not force and target.is_file() and stamp.is_file() \
            and stamp.read_text().strip() == fingerprint:
        return target
    JARS_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="txsink-s3-jvm-") as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        done = subprocess.run(
            [javac, "--release", "17", "-nowarn", "-encoding", "UTF-8",
             "-cp", os.pathsep.join(classpath), "-d", str(classes),
             *map(str, _sources())], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise JarUnavailable(f"javac failed:\n{done.stdout}{done.stderr}")
        built = Path(tmp) / JAR_NAME
        done = subprocess.run([jar_tool, "--create", "--file", str(built), "-C",
                               str(classes), "."], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise JarUnavailable(f"jar failed:\n{done.stdout}{done.stderr}")
        os.replace(built, target)  # never a half-written jar on a class path
    stamp.write_text(fingerprint + "\n")
    return target


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "build"
    try:
        if command == "build":
            print(build(force="--force" in argv))
        elif command == "path":
            print(jar_path())
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except JarUnavailable as exc:
        print(f"txsink-s3: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
