"""The few pieces of a SparkSession the native path reads without a JVM, for the drivers
and models that run the real grouped-epoch code over a stand-in for Spark's writer."""

from __future__ import annotations

from collections.abc import Mapping


class StandInConf:
    """``spark.conf``: what ``write_parquet`` sets and puts back around a write."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.values.pop(key, None)


class StandInContext:
    """``spark.sparkContext``: the local properties Spark sets on a stream's thread
    (query id, batch id)."""

    applicationId = "stand-in"

    def __init__(self, properties: Mapping[str, str] | None = None) -> None:
        self.properties = dict(properties or {})

    def getLocalProperty(self, key: str) -> str | None:
        return self.properties.get(key)


class StandInWriter:
    """``df.write`` as the native path calls it: ``mode("errorifexists")``, options,
    then ``parquet(path)``, which each driver writes as its Spark would."""

    def __init__(self) -> None:
        self.opts: dict[str, str] = {}

    def mode(self, mode: str) -> StandInWriter:
        assert mode == "errorifexists"
        return self

    def options(self, **opts: str) -> StandInWriter:
        self.opts.update(opts)
        return self

    def parquet(self, path: str) -> None:
        raise NotImplementedError


class StandInSession:
    def __init__(self, properties: Mapping[str, str] | None = None) -> None:
        self.conf = StandInConf()
        self.sparkContext = StandInContext(properties)
