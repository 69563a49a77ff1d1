"""``examples/dev_servers.py`` takes every port it listens on from an option or a
variable, so it can run beside other servers.

Before: only PostgreSQL's, the S3 endpoint's and Kafka's listener port could be set;
SeaweedFS's master, volume server and filer (each also on its port + 10000) and Kafka's
controller took ports of their own choosing.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "dev_servers.py"


@pytest.fixture(scope="module")
def dev_servers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dev_servers_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ALL = {"pg-port": 15432, "s3-port": 18333, "s3-master-port": 19333, "s3-volume-port": 18080,
       "s3-filer-port": 18888, "kafka-port": 19092, "kafka-controller-port": 19093}


def test_every_port_the_servers_listen_on_can_be_set(dev_servers: ModuleType,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert {option for option, _, _ in dev_servers.PORTS} == set(ALL)
    for option in ALL:
        monkeypatch.delenv(dev_servers.port_variable(option), raising=False)
    argv = ["start"] + [a for option, port in ALL.items() for a in (f"--{option}", str(port))]
    args = dev_servers.parse_args(argv)
    assert {o: getattr(args, o.replace("-", "_")) for o in ALL} == ALL


def test_ports_come_from_variables_and_options_win(dev_servers: ModuleType,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for option, port in ALL.items():
        monkeypatch.setenv(dev_servers.port_variable(option), str(port))
    monkeypatch.setenv("TXSINK_DEV_KAFKA_CONTROLLER_PORT", "19093")
    args = dev_servers.parse_args(["start", "--kafka-port", "29092"])
    assert args.kafka_port == 29092
    assert args.kafka_controller_port == 19093
    assert args.s3_filer_port == 18888
    assert dev_servers.port_variable("s3-master-port") == "TXSINK_DEV_S3_MASTER_PORT"


@pytest.mark.parametrize(("argv", "env", "said"), [
    (["--kafka-port", "19092", "--kafka-controller-port", "19092"], {},
     "port 19092 is asked for twice: --kafka-port and --kafka-controller-port"),
    (["--s3-master-port", "19333", "--kafka-port", "29333"], {},
     "port 29333 is asked for twice: --s3-master-port + 10000 (SeaweedFS's gRPC) and "
     "--kafka-port"),
    ([], {"TXSINK_DEV_S3_FILER_PORT": "60000"},
     "TXSINK_DEV_S3_FILER_PORT: 60000 is not a port from 1 to 55535 (SeaweedFS also "
     "listens on PORT + 10000)"),
    ([], {"TXSINK_DEV_PG_PORT": "five"}, "TXSINK_DEV_PG_PORT: 'five' is not a number"),
])
def test_a_port_that_cannot_work_is_refused_before_anything_starts(
        dev_servers: ModuleType, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], argv: list[str], env: dict[str, str],
        said: str) -> None:
    for option in ALL:
        monkeypatch.delenv(dev_servers.port_variable(option), raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exit_:
        dev_servers.parse_args(["start", *argv])
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err
