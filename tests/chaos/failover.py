"""Failover faults on a three-node Kafka cluster: the ``kafka-cluster`` chaos target.

The chaos driver (:mod:`tests.chaos.driver`) writes its epochs to a
:class:`~txsink_kafka.local_cluster.LocalKafkaCluster` while brokers fail under it:

* ``coordinator-kill-prepared``: SIGKILL of the broker that coordinates a participant's
  transactional id after every participant of the epoch prepared, before it is
  committed (at ``before-decide`` or ``after-decide``); in one of four, the driver is
  SIGKILLed right after it too, so a new driver commits through the new coordinator;
* ``coordinator-kill-endtxn``: SIGKILL of the coordinator while the driver's
  ``EndTxn(commit)`` for a participant is in flight (0-15 ms after it is sent;
  each fault records whether the kill landed before the answer);
* ``leader-kill-writing``: SIGKILL of the leader of an output partition in the middle
  of a writer task: half its rows produced, the other half after the kill;
* ``controller-kill``: SIGKILL of the active KRaft controller at a protocol point;
* ``rolling-restart``: every node restarted in turn (controlled shutdown, start, all
  partitions back in sync) while the driver goes on writing and committing;
* ``broker-pause``: SIGSTOP of a participant's coordinator (at ``after-decide``) or of
  a partition leader (mid-write) until the controller has fenced it (past
  ``broker.session.timeout.ms``), then SIGCONT.

Who does what: the driver decides *when* (txsink's fault-injection points, see
:mod:`txsink.faults`, and the middle of a task) and SIGKILLs nodes itself, by the pids
the runner publishes; pauses and rolling restarts it asks the runner for, which owns
the node processes (:class:`Supervisor`). The runner restarts killed nodes, resumes
paused ones, and says when the cluster is whole again; the driver injects a fault only
on a whole cluster (one node away at a time: with ``min.insync.replicas=2`` and three
replicas, that is what the cluster is built to survive). Both sides append to one log,
``failover.jsonl`` in the run's state directory, which the runner's fault table is
counted from.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

LOG = "failover.jsonl"
WHOLE = "whole.json"
KINDS = ("coordinator-kill-prepared", "coordinator-kill-endtxn", "leader-kill-writing",
         "controller-kill", "rolling-restart", "broker-pause")
#: How long the driver waits for the cluster to be whole before it gives up a fault.
WHOLE_WAIT_S = 300.0
#: Longest pause: a node not fenced by then is resumed anyway (and the fault noted).
PAUSE_LIMIT_S = 45.0
#: While a rolling restart runs, the driver waits this long before each epoch, so its
#: remaining epochs spread over the restart.
ROLLING_PACE_S = 3.0


@dataclass(frozen=True)
class Fault:
    """One planned failover fault."""

    kind: str
    epoch: int
    #: Coordinator point it fires at (txsink.faults), or "task" (mid-write).
    point: str
    #: The task it fires in (task faults), else -1.
    partition: int = -1
    #: coordinator-kill-prepared: also SIGKILL the driver; broker-pause: "leader" or
    #: "coordinator"; endtxn: the kill delay in ms.
    variant: str = ""

    @property
    def key(self) -> str:
        return f"{self.kind}@{self.epoch}"


def plan(rng: random.Random, faults: int, epochs: int, partitions: int,
         *, cycle: list[str]) -> list[Fault]:
    """``faults`` faults on distinct epochs of a run. Kinds come from ``cycle`` (the
    caller refills it with a shuffled copy of :data:`KINDS`), so every kind is drawn as
    often as the others, and a short run of six sees each once."""
    from txsink.faults import AFTER_DECIDE, AFTER_FIRST_COMMIT, BEFORE_DECIDE

    chosen = sorted(rng.sample(range(epochs), min(faults, epochs)))
    out = []
    for epoch in chosen:
        if not cycle:
            cycle.extend(rng.sample(KINDS, len(KINDS)))
        kind = cycle.pop()
        if kind == "coordinator-kill-prepared":
            out.append(Fault(kind, epoch, rng.choice([BEFORE_DECIDE, AFTER_DECIDE]),
                             variant="driver-too" if rng.random() < 0.25 else ""))
        elif kind == "coordinator-kill-endtxn":
            # after-decide: the first participant's EndTxn; after-first-commit: another's.
            out.append(Fault(kind, epoch, rng.choice([AFTER_DECIDE, AFTER_FIRST_COMMIT]),
                             variant=str(rng.randrange(16))))
        elif kind == "leader-kill-writing":
            out.append(Fault(kind, epoch, "task", rng.randrange(partitions)))
        elif kind == "controller-kill":
            out.append(Fault(kind, epoch, rng.choice(
                [BEFORE_DECIDE, AFTER_DECIDE, AFTER_FIRST_COMMIT])))
        elif kind == "rolling-restart":
            out.append(Fault(kind, epoch, "epoch-start"))
        else:
            where = rng.choice(["coordinator", "leader"])
            out.append(Fault(kind, epoch, AFTER_DECIDE if where == "coordinator" else "task",
                             rng.randrange(partitions) if where == "leader" else -1,
                             variant=where))
    return out


# -- the shared log ----------------------------------------------------------------------


def append(state: Path, entry: dict[str, Any]) -> None:
    """One line of ``failover.jsonl`` (O_APPEND: driver, tasks and runner write to it)."""
    line = (json.dumps({**entry, "t": round(time.time(), 3)}) + "\n").encode()
    fd = os.open(state / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def entries(state: Path) -> list[dict[str, Any]]:
    try:
        text = (state / LOG).read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def fired_faults(state: Path) -> list[dict[str, Any]]:
    """The faults that happened: kills by the driver, pauses and restarts by the runner."""
    return [e for e in entries(state) if e.get("status") == "done"]


def recovery_times(state: Path) -> list[tuple[str, float]]:
    """(kind, seconds from the fault until the cluster was whole again) per fault."""
    out = []
    log = entries(state)
    for i, e in enumerate(log):
        if e.get("status") != "done":
            continue
        whole = next((w for w in log[i + 1:] if w.get("status") == "whole"), None)
        if whole is not None:
            out.append((str(e["kind"]), float(whole["t"]) - float(e["t"])))
    return out


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


# -- the runner's side ---------------------------------------------------------------------


class Supervisor:
    """Keeps the cluster whole around a driver: restarts killed nodes, carries out the
    pauses and rolling restarts the driver asks for, and publishes the nodes' pids and
    when the cluster was last whole (``whole.json``)."""

    def __init__(self, cluster: Any, state: Path) -> None:
        self.cluster = cluster
        self.state = state
        self.notes: list[str] = []
        self.whole: bool | None = None
        self._checked = 0.0

    def publish(self, whole_after: int) -> None:
        _write_json(self.state / WHOLE, {"after": whole_after, "pids": self.cluster.pids()})

    def tick(self) -> None:
        """One round: act on requests, restart what died, publish if whole."""
        seen = entries(self.state)
        done = {e["id"] for e in seen if e.get("status") in ("done", "acked")}
        for e in seen:
            if e.get("status") == "request" and e["id"] not in done:
                self._carry_out(e)
        if any(not k.running for k in self.cluster.nodes.values()):
            self.whole = False
            started = time.monotonic()
            ended = self.cluster.restart_dead()
            append(self.state, {"kind": "node-restart", "status": "restarted",
                                "nodes": sorted(ended), "exit": list(ended.values()),
                                "seconds": round(time.monotonic() - started, 1)})
            self._note_exits(ended)
        if time.monotonic() - self._checked < 0.25:
            return
        self._checked = time.monotonic()
        if self.cluster.out_of_sync():
            self.whole = False
            return
        if self.whole is False:  # whole again after a fault: when, for the table's notes
            append(self.state, {"kind": "whole", "status": "whole"})
        self.whole = True
        self.publish(len(entries(self.state)))

    def _note_exits(self, ended: dict[int, int | None]) -> None:
        """A node that ended other than by a SIGKILL (ours) exited on its own: say so."""
        for node, code in ended.items():
            if code not in (None, -signal.SIGKILL):
                self.notes.append(f"node {node} exited with status {code} by itself: "
                                  f"{self.cluster.output_tail(node, 3)!r}")

    def settle(self, timeout_s: float = 300.0) -> None:
        """After a driver run: every node up, running and in sync."""
        self._note_exits({n: k.proc.returncode for n, k in self.cluster.nodes.items()
                          if k.proc is not None and not k.running})
        self.cluster.heal(timeout_s)
        if self.whole is False:
            append(self.state, {"kind": "whole", "status": "whole"})
        self.whole = True
        self.publish(len(entries(self.state)))

    def _carry_out(self, request: dict[str, Any]) -> None:
        kind = request["kind"]
        if kind == "broker-pause":
            self._pause(request)
        elif kind == "rolling-restart":
            append(self.state, {**request, "status": "acked"})
            started = time.monotonic()
            self.cluster.rolling_restart()
            append(self.state, {**request, "status": "done",
                                "seconds": round(time.monotonic() - started, 1)})
        else:  # pragma: no cover - a planning bug
            raise ValueError(f"unknown failover request {request}")

    def _pause(self, request: dict[str, Any]) -> None:
        node = int(request["node"])
        cluster = self.cluster
        cluster.pause(node)
        append(self.state, {**request, "status": "acked"})
        started = time.monotonic()
        others = [n for n in cluster.nodes if n != node]
        fenced = False
        while time.monotonic() - started < PAUSE_LIMIT_S:
            try:  # the controller fences a node that missed its session timeout
                fenced = all(node not in cluster.view_of(n)[0] for n in others)
            except Exception:
                fenced = False
            if fenced:
                break
            time.sleep(0.25)
        if fenced:
            time.sleep(1.0)  # a moment past the fence: leaderships move, clients notice
        cluster.resume(node)
        append(self.state, {**request, "status": "done", "fenced": fenced,
                            "seconds": round(time.monotonic() - started, 1)})
        if not fenced:
            self.notes.append(f"node {node} paused {PAUSE_LIMIT_S:.0f}s without being fenced")


# -- the driver's side ---------------------------------------------------------------------


class Injector:
    """The driver's half: fires the planned faults at txsink's fault-injection points
    (a :class:`~txsink.faults.FaultInjector` callback), in writer tasks, and around the
    committer's ``EndTxn``."""

    def __init__(self, spec: dict[str, Any], state: Path) -> None:
        self.state = state
        self.bootstrap = str(spec["options"]["kafka.bootstrap.servers"])
        self.topic = str(spec["options"]["topic"])
        self.faults = [Fault(**f) for f in spec.get("failover", [])]
        self.messages: Sequence[Any] = ()
        self._armed: Fault | None = None
        self._armed_pids: dict[int, int] = {}
        self._txn: Any = None
        self._patch_end_txn()

    # -- bookkeeping

    def _fired(self) -> set[str]:
        return {e["key"] for e in entries(self.state) if "key" in e}

    def _pending(self, epoch: int, point: str) -> list[Fault]:
        fired = self._fired()
        return [f for f in self.faults if f.epoch == epoch and f.point == point
                and f.key not in fired]

    def task_fault(self, epoch: int, partition: int) -> Fault | None:
        return next((f for f in self._pending(epoch, "task") if f.partition == partition),
                    None)

    def wait_whole(self) -> dict[str, int] | None:
        """The nodes' pids once the runner says the cluster is whole after every fault
        so far; ``None`` (fault given up) if it is not within :data:`WHOLE_WAIT_S`."""
        deadline = time.monotonic() + WHOLE_WAIT_S
        while time.monotonic() < deadline:
            needed = len(entries(self.state))
            try:
                whole = json.loads((self.state / WHOLE).read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                whole = {"after": -1}
            if whole["after"] >= needed:
                return {int(n): int(p) for n, p in whole["pids"].items()}
            time.sleep(0.05)
        return None

    def _log(self, fault: Fault, status: str, **detail: Any) -> None:
        append(self.state, {"key": fault.key, "id": uuid.uuid4().hex[:8], **asdict(fault),
                            "status": status, **detail})

    def _kill(self, fault: Fault, node: int, pids: dict[int, int], **detail: Any) -> None:
        os.kill(pids[node], signal.SIGKILL)
        self._log(fault, "done", node=node, **detail)

    def _request(self, fault: Fault, *, wait: bool, **detail: Any) -> str:
        rid = uuid.uuid4().hex[:8]
        append(self.state, {"key": fault.key, "id": rid, **asdict(fault), "status": "request",
                            **detail})
        if wait:
            self._wait_for(rid, "acked")
        return rid

    def _wait_for(self, rid: str, status: str, limit_s: float = WHOLE_WAIT_S) -> bool:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if any(e.get("id") == rid and e.get("status") == status
                   for e in entries(self.state)):
                return True
            time.sleep(0.02)
        return False

    def _give_up(self, fault: Fault) -> None:
        self._log(fault, "skipped", why=f"the cluster was not whole within {WHOLE_WAIT_S}s")

    # -- who is who

    def txn_client(self) -> Any:
        from txsink_kafka.txn_protocol import TxnCoordinatorClient

        if self._txn is None:
            self._txn = TxnCoordinatorClient({"bootstrap.servers": self.bootstrap},
                                             timeout_s=30.0)
        return self._txn

    def coordinator_of(self, transactional_id: str) -> int:
        node: int = self.txn_client().find_coordinator(transactional_id, refresh=True)
        return node

    def active_controller(self) -> int:
        from txsink_kafka.txn_protocol import _kafka

        admin = _kafka().KafkaAdminClient(bootstrap_servers=self.bootstrap,
                                          request_timeout_ms=10_000, client_id="chaos")
        try:
            quorum = admin.describe_metadata_quorum()
        finally:
            admin.close()
        return int(quorum["topics"][0]["partitions"][0]["leader_id"])

    def leader_of(self, partition: int) -> int:
        """Leader of an output partition, asked by a fresh client (tasks are forked)."""
        import confluent_kafka.admin as kadmin

        admin = kadmin.AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + 60
        while True:
            md = admin.list_topics(self.topic, timeout=10)
            leader = int(md.topics[self.topic].partitions[partition].leader)
            if leader >= 0 or time.monotonic() > deadline:
                return leader
            time.sleep(0.1)

    def _participant_ids(self) -> list[str]:
        return [str(c.payload["transactional_id"]) for c in self.messages]

    # -- at the protocol's points

    def epoch_starting(self, epoch: int) -> None:
        for fault in self._pending(epoch, "epoch-start"):
            if self.wait_whole() is None:
                self._give_up(fault)
                continue
            self._request(fault, wait=True)
        self._pace()

    def _pace(self) -> None:
        """While a rolling restart runs, wait before each epoch (bounded)."""
        seen = entries(self.state)
        rolling = {e["id"] for e in seen if e["kind"] == "rolling-restart"
                   and e.get("status") == "acked"}
        rolling -= {e["id"] for e in seen if e.get("status") == "done"}
        if rolling:
            time.sleep(ROLLING_PACE_S)

    def at_point(self, point: str, epoch: int | None) -> None:
        """The :class:`~txsink.faults.FaultInjector` callback."""
        if epoch is None:
            return
        for fault in self._pending(epoch, point):
            pids = self.wait_whole()
            if pids is None:
                self._give_up(fault)
                continue
            rng = random.Random(fault.key)
            ids = self._participant_ids()
            if fault.kind == "coordinator-kill-prepared":
                tid = rng.choice(ids)
                self._kill(fault, self.coordinator_of(tid), pids, transactional_id=tid)
                if fault.variant == "driver-too":
                    os.kill(os.getpid(), signal.SIGKILL)
            elif fault.kind == "coordinator-kill-endtxn":
                self._armed = fault
                self._armed_pids = pids
            elif fault.kind == "controller-kill":
                self._kill(fault, self.active_controller(), pids)
            elif fault.kind == "broker-pause":
                tid = rng.choice(ids)
                self._request(fault, wait=True, node=self.coordinator_of(tid),
                              transactional_id=tid)

    # -- in a writer task (a forked process)

    def in_task(self, fault: Fault) -> None:
        """Between the two halves of a task's rows: kill or pause a partition's leader."""
        pids = self.wait_whole()
        if pids is None:
            self._give_up(fault)
            return
        partition = random.Random(fault.key).randrange(_partitions(self.bootstrap,
                                                                    self.topic))
        node = self.leader_of(partition)
        if fault.kind == "leader-kill-writing":
            self._kill(fault, node, pids, leader_of=f"{self.topic}[{partition}]")
        else:
            self._request(fault, wait=True, node=node, leader_of=f"{self.topic}[{partition}]")

    # -- around EndTxn

    def _patch_end_txn(self) -> None:
        """Wrap the committer's EndTxn: when a ``coordinator-kill-endtxn`` fault is armed,
        the coordinator the request goes to is SIGKILLed a few ms after it is sent."""
        from txsink_kafka.txn_protocol import TxnCoordinatorClient

        original = TxnCoordinatorClient.end_txn
        injector = self

        def end_txn(client: Any, transactional_id: str, identity: Any, *,
                    commit: bool) -> Any:
            fault = injector._armed
            if fault is None or not commit:
                return original(client, transactional_id, identity, commit=commit)
            injector._armed = None
            node = client.find_coordinator(transactional_id)  # where it is sent
            pid = injector._armed_pids[node]
            delay_s = int(fault.variant or 0) / 1000
            killed_at: list[float] = []

            def kill() -> None:
                time.sleep(delay_s)
                os.kill(pid, signal.SIGKILL)
                killed_at.append(time.monotonic())

            killer = threading.Thread(target=kill, daemon=True)
            sent = time.monotonic()
            killer.start()
            try:
                result = original(client, transactional_id, identity, commit=commit)
                outcome = getattr(result, "value", str(result))
            except Exception as exc:
                outcome = type(exc).__name__
                raise
            finally:
                answered = time.monotonic()
                killer.join()
                inflight = bool(killed_at) and killed_at[0] <= answered
                injector._log(fault, "done", node=node, transactional_id=transactional_id,
                              inflight=inflight, endtxn=outcome,
                              endtxn_ms=round((answered - sent) * 1000, 1))
            return result

        TxnCoordinatorClient.end_txn = end_txn  # type: ignore[method-assign]


def _partitions(bootstrap: str, topic: str) -> int:
    import confluent_kafka.admin as kadmin

    md = kadmin.AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return len(md.topics[topic].partitions)


def halves(batch: Any) -> Iterator[Any]:
    """A record batch in two halves (a task fault fires between them)."""
    middle = batch.num_rows // 2
    yield batch.slice(0, middle)
    yield batch.slice(middle)


__all__ = ["KINDS", "Fault", "Injector", "Supervisor", "append", "entries", "fired_faults",
           "halves", "plan", "recovery_times"]
