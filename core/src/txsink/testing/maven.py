"""JVM jars for tests and benchmarks, resolved with Maven into ``~/.m2`` once.

A dependency may name a classifier (``test-fixtures``, ``tests``) and may be taken
without its own dependencies (``alone``): Iceberg's REST catalog server lives in
test-fixture jars whose POMs declare nothing, and cloud modules it only names. The
jar list of each set is cached under ``~/.cache/txsink/jars/<name>``; a cached list is
used while every jar on it is still in the local repository, and Maven runs offline
first, so only a first run needs the network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape


class JarsUnavailable(RuntimeError):
    """Maven is missing, or could not resolve a set of jars (no network on a first run)."""


@dataclass(frozen=True)
class Jar:
    """One Maven artifact."""

    group: str
    artifact: str
    version: str
    classifier: str | None = None
    #: Without the artifact's own dependencies.
    alone: bool = False

    def coordinates(self) -> str:
        tail = f":{self.classifier}" if self.classifier else ""
        return f"{self.group}:{self.artifact}:{self.version}{tail}"

    def xml(self) -> str:
        parts = [f"<groupId>{escape(self.group)}</groupId>",
                 f"<artifactId>{escape(self.artifact)}</artifactId>",
                 f"<version>{escape(self.version)}</version>"]
        if self.classifier:
            parts.append(f"<classifier>{escape(self.classifier)}</classifier>")
        if self.alone:
            parts.append("<exclusions><exclusion><groupId>*</groupId><artifactId>*"
                         "</artifactId></exclusion></exclusions>")
        return f"<dependency>{''.join(parts)}</dependency>"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "txsink" / "jars"


def resolve(name: str, jars: Sequence[Jar], *, timeout_s: float = 1800.0) -> list[str]:
    """Local paths of ``jars`` and their runtime dependencies (cached under ``name``)."""
    folder = cache_dir() / name
    listing = folder / "classpath.txt"
    if listing.exists():
        found = [p for p in listing.read_text().strip().split(os.pathsep) if p]
        if found and all(Path(p).exists() for p in found):
            return found
    mvn = shutil.which("mvn")
    wanted = ", ".join(j.coordinates() for j in jars)
    if mvn is None:
        raise JarsUnavailable(f"{wanted}: Maven (mvn) must be on PATH to fetch the jars "
                              "once from Maven Central")
    folder.mkdir(parents=True, exist_ok=True)
    pom = folder / "pom.xml"
    pom.write_text('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0'
                   f'</modelVersion><groupId>txsink.testing</groupId><artifactId>{name}'
                   '</artifactId><version>0</version><dependencies>'
                   + "".join(j.xml() for j in jars) + "</dependencies></project>\n")
    out = folder / f"classpath.{os.getpid()}.tmp"
    errors = []
    for offline in (True, False):
        cmd = [mvn, "-B", *(["-o"] if offline else []), "-f", str(pom),
               "dependency:build-classpath", "-Dmdep.includeScope=runtime",
               f"-Dmdep.outputFile={out}"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            errors.append(f"{'offline' if offline else 'online'}: over {timeout_s:.0f} s")
            continue
        said = done.stdout + done.stderr
        # Offline, an artifact whose POM is not in ~/.m2 resolves without its
        # dependencies (a warning, exit 0): go online for it.
        whole = "no dependency information available" not in said
        if done.returncode == 0 and out.exists() and whole:
            out.replace(listing)
            return [p for p in listing.read_text().strip().split(os.pathsep) if p]
        tail = [ln for ln in said.strip().splitlines() if "ERROR" in ln or "WARN" in ln][-6:]
        errors.append(f"{'offline' if offline else 'online'}: {' / '.join(tail)}")
    raise JarsUnavailable(f"Maven could not resolve {wanted}: " + " | ".join(errors))


def without_shipped(jars: Sequence[str], shipped_dir: Path) -> list[str]:
    """``jars`` less those whose artifact a distribution already ships in
    ``shipped_dir`` (PySpark's ``jars/``): never two versions of one class."""
    import re

    def artifact(name: str) -> str:
        m = re.match(r"(.+?)-\d", name)
        return m[1] if m else name

    shipped = {artifact(p.name) for p in shipped_dir.glob("*.jar")}
    return [j for j in jars if artifact(Path(j).name) not in shipped]
