"""S3 backend option parsing and key layout: no server needed."""

from __future__ import annotations

import hashlib

import pytest
from txsink.errors import ConfigError
from txsink.model import TransactionContext
from txsink_s3 import keys
from txsink_s3.backend import S3Backend, multipart_etag


def test_defaults_and_size_units() -> None:
    b = S3Backend.from_options({"bucket": "my-bucket", "part_size": "8MiB"})
    assert (b.format, b.part_size, b.prefix, b.row_group_bytes) == (
        "parquet", 8 * 2**20, "", 2 * 2**20)
    assert S3Backend.from_options({"bucket": "abc", "part_size": "5242880"}).part_size == 5 * 2**20
    assert S3Backend.from_options({"bucket": "abc", "part_size": "1g"}).part_size == 2**30


@pytest.mark.promise("s3-bad-options-without-io", "backend")
@pytest.mark.parametrize(("options", "field", "message"), [
    ({}, "bucket", "required"),
    ({"bucket": "s3://x/y"}, "bucket", "not a valid bucket name"),
    ({"bucket": "ab"}, "bucket", "not a valid bucket name"),
    ({"bucket": "abc", "part_size": "1MiB"}, "part_size", "at least 5 MiB"),
    ({"bucket": "abc", "part_size": "lots"}, "part_size", "size in bytes"),
    ({"bucket": "abc", "format": "xml"}, "format", "parquet, jsonl, csv"),
    ({"bucket": "abc", "format": "csv", "compression": "zstd"}, "compression", "parquet only"),
    ({"bucket": "abc", "format": "jsonl", "parquet_dictionary": "all"}, "parquet_dictionary",
     "parquet only"),
    ({"bucket": "abc", "upload_concurrency": "0"}, "upload_concurrency", "at least 1"),
    ({"bucket": "abc", "endpoint_url": "localhost:9000"}, "endpoint_url", "http://"),
    ({"bucket": "abc", "endpoint_url": "http://u:pw@h:1"}, "endpoint_url", "credentials"),
    ({"bucket": "abc", "access_key_id": "AK"}, "secret_access_key", "required"),
    ({"bucket": "abc", "secret_access_key": "s3cr3t-value"}, "access_key_id", "required"),
    ({"bucket": "abc", "prefix": "a/../b"}, "prefix", "'..'"),
    ({"bucket": "abc", "part_sise": "8MiB"}, "part_sise", "unknown option"),
])
def test_bad_options_are_named(options: dict[str, str], field: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        S3Backend.from_options(options)
    assert info.value.field == field


def test_secret_is_never_echoed() -> None:
    b = S3Backend.from_options({"bucket": "abc", "access_key_id": "AK",
                                "secret_access_key": "very-secret-value"})
    assert b.secret_values() == ["very-secret-value"]
    assert "very-secret-value" not in repr(vars(b)) + b.describe()
    assert "secret_access_key" not in b.safe_options({"secret_access_key": "x", "bucket": "a"})


def test_keys_round_trip_and_stay_under_the_sink_prefix() -> None:
    base = keys.sink_base("/exports//orders/", "sink-1")
    assert base == "exports/orders/sink-1"
    ctx = TransactionContext("sink-1", 12, 4, 2)
    key = keys.data_key(base, ctx, "parquet")
    assert key == "exports/orders/sink-1/epoch=12/part-00004-a2.parquet"
    assert keys.parse_data_key(base, "sink-1", key) == ctx
    assert keys.parse_data_key(keys.sink_base("exports/orders", "sink"), "sink", key) is None
    assert keys.parse_data_key(base, "sink-1", keys.manifest_key(base, 12)) is None


def test_multipart_etag_matches_the_s3_rule() -> None:
    parts = [b"a" * 10, b"b" * 3]
    md5s = [hashlib.md5(p).hexdigest() for p in parts]
    expected = hashlib.md5(b"".join(bytes.fromhex(m) for m in md5s)).hexdigest() + "-2"
    assert multipart_etag([f'"{m}"' for m in md5s]) == expected
    assert multipart_etag(["not-an-md5"]) is None


def test_auto_dictionary_skips_nearly_unique_columns() -> None:
    import pyarrow as pa
    from txsink.columnar import dictionary_columns

    ids = range(5000)
    batch = pa.record_batch({"id": pa.array(ids), "city": [f"c{i % 20}" for i in ids],
                             "note": [f"note {i}" for i in ids]})
    assert dictionary_columns(batch, "auto") == ["city"]
    assert dictionary_columns(batch, "all") is True
    assert dictionary_columns(batch, "none") is False
    assert dictionary_columns(batch.slice(0, 10), "auto") is True  # too small to judge


def test_writer_spark_takes_the_native_path_for_parquet_only() -> None:
    """``writer: spark`` (Spark's own Parquet writer): what it takes and what it refuses,
    without I/O; the write options it hands Spark."""
    from txsink_s3 import native

    assert S3Backend.native_parquet_for({"bucket": "abc", "writer": "spark"})
    assert not S3Backend.native_parquet_for({"bucket": "abc"})
    b = S3Backend.from_options({"bucket": "abc", "writer": "spark", "compression": "lz4",
                                "parquet_dictionary": "none", "prefix": "odd dir/#1/ünï"})
    assert b.writer == "spark" and "writer=spark" in b.describe()
    assert b.native_write_options() == {
        "txsink.s3.native": "true", "maxRecordsPerFile": "0", "compression": "lz4_raw",
        "fs.s3a.committer.abort.pending.uploads": "false", "parquet.enable.dictionary": "false"}
    ctx = TransactionContext("s1", 7, 0, 123)
    path, dirname = b.native_staging(ctx)
    assert path == f"s3a://abc/odd dir/#1/ünï/s1/_txsink/native/epoch=7/{dirname}"
    assert native._epoch_of(f"_txsink/native/epoch=7/{dirname}/job.json") == 7
    assert native._epoch_of(f"__magic_job-{dirname}/job-x/00/tasks/a/x.pending") == 7
    assert native._epoch_of("epoch=7/part-00000-a1.parquet") is None
    # A change of writer is no move of the output.
    assert S3Backend.destination({"bucket": "abc", "writer": "spark"}) == \
        S3Backend.destination({"bucket": "abc"})
    for options, field, words in (
            ({"format": "jsonl"}, "writer", "format parquet only"),
            ({"prefix": "a%20b"}, "prefix", "'%'"),
            ({"prefix": "a:b"}, "prefix", "':'"),
            ({"writer": "jvm"}, "writer", "txsink, spark")):
        with pytest.raises(ConfigError, match=words) as info:
            S3Backend.from_options({"bucket": "abc", "writer": "spark", **options})
        assert info.value.field == field


def test_writer_spark_is_kept_for_exactly_once_and_a_jvm(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """As docs/backends/s3.md says: a pipeline file's S3 sink with ``writer: spark`` takes
    Spark's writer for exactly-once; at-least-once and Spark Connect keep txsink's."""
    from txsink.config import parse_pipeline
    from txsink.spark.frames import native_targets
    from txsink.spark.group import takes_native
    from txsink.targets import TargetSpec

    def pipeline(**sink: object) -> object:
        return parse_pipeline({
            "name": "p", "source": {"type": "rate"}, "checkpoint": str(tmp_path / "chk"),
            "sink": {"backend": "s3", "sink_id": "p1",
                     "options": {"bucket": "abc", "writer": "spark"}, **sink}})

    native = native_targets(pipeline(), {}, stream=False)  # type: ignore[arg-type]
    assert native is not None and native.single
    assert native_targets(pipeline(guarantee="at_least_once"), {},  # type: ignore[arg-type]
                           stream=False) is None
    spec = TargetSpec("p1", "s3", {"bucket": "abc", "writer": "spark"})

    class ConnectFrame:
        pass

    ConnectFrame.__module__ = "pyspark.sql.connect.dataframe"
    assert takes_native(spec) and not takes_native(spec, ConnectFrame())  # type: ignore[arg-type]
