"""The worker side of the agent protocol, against a stand-in agent on a real Listener."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any

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
    """Accepts one worker and answers its checks with `decide(iteration)`."""

    def __init__(self, decide: Any) -> None:
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
                if message["type"] == "check":
                    connection.send(self._decide(message["iteration"]).to_message())
                if message["type"] == "exit":
                    return

    def join(self) -> list[dict[str, Any]]:
        self._thread.join(timeout=60)
        self.listener.close()
        return self.messages


def test_addresses_are_tcp_or_unix_sockets() -> None:
    assert parse_address("10.0.0.2:7070") == ("10.0.0.2", 7070)
    assert parse_address("/run/jigsaw/agent.sock") == "/run/jigsaw/agent.sock"


def test_a_lease_saves_round_trips_until_it_expires() -> None:
    agent = StandInAgent(lambda iteration: Decision(lease_until=iteration + 3))
    controller = ConnectionController.connect(agent.address, AUTHKEY, job_id=9, rank=0)
    decisions = [controller.check(iteration) for iteration in range(7)]
    record = IterationRecord(1, 0.1, 0.08, 0.02, 640.0, 2.3, 0.9, 1 << 20, 4096)
    controller.report([record])
    controller.exit(ExitStatus(Outcome.SUCCEEDED, 7))
    messages = agent.join()
    assert all(d.action is Action.CONTINUE for d in decisions)
    assert messages[0] == {"type": "hello", "job_id": 9, "rank": 0, "pid": os.getpid()}
    assert [m["iteration"] for m in messages if m["type"] == "check"] == [0, 3, 6]
    assert {"type": "report", "records": [record.to_message()]} in messages
    assert messages[-1] == {
        "type": "exit",
        "status": "succeeded",
        "iteration": 7,
        "error_tail": None,
    }


def test_the_worker_entry_point_obeys_the_agent(tmp_path: Path) -> None:
    agent = StandInAgent(
        lambda iteration: Decision(
            Action.SUSPEND if iteration == 4 else Action.CONTINUE, lease_until=iteration + 1
        )
    )
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
    assert [m["iteration"] for m in messages if m["type"] == "check"] == [0, 1, 2, 3, 4]
    reported = [r["iteration"] for m in messages if m["type"] == "report" for r in m["records"]]
    assert reported == [1, 2, 3, 4]
    assert messages[-1]["type"] == "exit" and messages[-1]["status"] == "suspended"
