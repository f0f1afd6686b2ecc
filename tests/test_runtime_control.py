"""The worker side of the agent protocol, against a stand-in agent on a real Listener."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any

from tests.cluster import wait_for
from tests.runtime_helpers import worker_configs
from worker_agent.runtime.control import ConnectionController
from worker_agent.runtime.protocol import (
    EXIT_CODES,
    Action,
    Decision,
    ExitStatus,
    IterationRecord,
    Outcome,
    parse_address,
)

AUTHKEY = b"test-authkey"


class StandInAgent:
    """Accepts one worker; `decide(message)` on every message it sends says whether to
    send the worker a decision: the reply to its check, or a change pushed unasked."""

    def __init__(self, decide: Callable[[dict[str, Any]], Decision | None]) -> None:
        self.listener = Listener(("127.0.0.1", 0), authkey=AUTHKEY)
        host, port = self.listener.address
        self.address = f"{host}:{port}"
        self.messages: list[dict[str, Any]] = []
        self._decide = decide
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with self.listener.accept() as connection:
            while True:
                message = connection.recv()
                self.messages.append(message)
                decision = self._decide(message)
                if decision is not None:
                    connection.send(decision.to_message())
                if message["type"] == "exit":
                    return

    def join(self) -> list[dict[str, Any]]:
        self._thread.join(timeout=60)
        self.listener.close()
        return self.messages


def _suspend_after_report(of_iteration: int) -> Callable[[dict[str, Any]], Decision | None]:
    """Continue at the check; push a suspension (and a new configuration) once a report
    reaches `of_iteration`."""

    def decide(message: dict[str, Any]) -> Decision | None:
        if message["type"] == "check":
            return Decision()
        if message["type"] == "report" and message["records"][-1]["iteration"] >= of_iteration:
            return Decision(Action.SUSPEND, 1, {"full_fraction": 0.5})
        return None

    return decide


def test_addresses_are_tcp_or_unix_sockets() -> None:
    assert parse_address("10.0.0.2:7070") == ("10.0.0.2", 7070)
    assert parse_address("/run/jigsaw/agent.sock") == "/run/jigsaw/agent.sock"


def test_only_the_first_boundary_asks_then_changes_arrive_unasked() -> None:
    agent = StandInAgent(_suspend_after_report(1))
    controller = ConnectionController.connect(agent.address, AUTHKEY, job_id=9, rank=0)
    first = [controller.check(iteration) for iteration in range(3)]
    record = IterationRecord(1, 0.1, 0.08, 0.02, 640.0, 2.3, 0.9, 1 << 20, 4096)
    controller.report([record])
    wait_for(lambda: controller.check(3).action is Action.SUSPEND, "the pushed suspension", 30)
    pushed = controller.check(4)
    controller.exit(ExitStatus(Outcome.SUSPENDED, 4))
    messages = agent.join()
    # Every boundary renews the decision for exactly one boundary: the peers agree at each.
    assert [(d.action, d.lease_until) for d in first] == [
        (Action.CONTINUE, b + 1) for b in range(3)
    ]
    assert (pushed.action, pushed.config_version, pushed.config, pushed.lease_until) == (
        Action.SUSPEND,
        1,
        {"full_fraction": 0.5},
        5,
    )
    assert messages[0] == {"type": "hello", "job_id": 9, "rank": 0, "pid": os.getpid()}
    assert [m for m in messages if m["type"] == "check"] == [{"type": "check", "iteration": 0}]
    assert {"type": "report", "records": [record.to_message()]} in messages
    assert messages[-1] == {
        "type": "exit",
        "status": "suspended",
        "iteration": 4,
        "error_tail": None,
    }


def test_the_worker_entry_point_obeys_the_agent(tmp_path: Path) -> None:
    agent = StandInAgent(_suspend_after_report(2))
    (config,) = worker_configs(
        1, workload="digits-mlp", max_iterations=50, eval_every=2, checkpoint_dir=tmp_path
    )
    config_file = tmp_path / "worker.json"
    config_file.write_text(config.model_dump_json())
    command = [sys.executable, "-m", "worker_agent.runtime.worker", "--config", str(config_file)]
    command += ["--control", agent.address, "--authkey-env", "JIGSAW_TEST_AUTHKEY"]
    env = {**os.environ, "JIGSAW_TEST_AUTHKEY": AUTHKEY.decode()}
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == EXIT_CODES[Outcome.SUSPENDED] == 3, completed.stderr
    messages = agent.join()
    kinds = {m["type"] for m in messages}
    assert {"hello", "check", "report", "evaluation", "exit"} <= kinds
    assert [m["iteration"] for m in messages if m["type"] == "check"] == [0]
    # The suspension was pushed after iteration 2's report; the worker stopped at the
    # first boundary after it arrived, having reported every iteration up to there.
    end = messages[-1]
    assert end["type"] == "exit" and end["status"] == "suspended"
    assert 2 < end["iteration"] < 50
    reported = [r["iteration"] for m in messages if m["type"] == "report" for r in m["records"]]
    assert reported == list(range(1, end["iteration"] + 1))
