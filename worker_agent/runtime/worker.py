"""The worker process the node agent spawns, one per GPU slot:

    python -m worker_agent.runtime.worker --config FILE.json --control ADDRESS --authkey-env VAR
    python -m worker_agent.runtime.worker --pool --control ADDRESS --authkey-env VAR

FILE.json is a `WorkerConfig`. ADDRESS is the agent's Listener, `host:port` or a Unix
socket path; the authkey is read from the environment variable VAR, never from argv,
which every user of the machine can read. With `--pool` the process is a warm spare: it
imports everything training needs (torch, torch.distributed, the built-in workloads: what
`main` imports once the process is bound to die with its agent, and what torch imports
lazily on a first optimizer step), says "idle" to the agent and waits for the
configuration of the rank it is given (`protocol`); from then on it is a worker like any
other. The agent closing the connection first means it is no longer needed (exit 0).

The workload is resolved here, first thing after the configuration: a user trial's
module is imported in this process only (never in the agent or the scheduler), from the
job's uploaded code (`code_dir`, first on the import path) or what the node has
installed, and a reference that does not name a Trial subclass ends the rank with that
one-line reason (the traceback goes to the job's log).

Exit codes (`protocol.EXIT_CODES`): 0 succeeded, 3 suspended, 4 stopped, 5 left (an
in-place shrink dropped the rank), 1 failed (the `exit` message carries the traceback
tail); argparse exits 2 on a usage error.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from multiprocessing.connection import Client
from pathlib import Path
from typing import TYPE_CHECKING

from worker_agent.runtime.lifeline import OrphanedError, die_with_agent
from worker_agent.runtime.protocol import (
    EXIT_CODES,
    ExitStatus,
    Outcome,
    assigned_config,
    idle_message,
    parse_address,
)

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from worker_agent.runtime.config import WorkerConfig
    from worker_agent.runtime.control import Controller

logger = logging.getLogger("worker_agent.runtime.worker")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker_agent.runtime.worker")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="WorkerConfig JSON file")
    source.add_argument(
        "--pool", action="store_true", help="wait idle for the agent to assign a rank"
    )
    parser.add_argument("--control", required=True, help="the agent's host:port or socket path")
    parser.add_argument(
        "--authkey-env", required=True, help="environment variable holding the agent's authkey"
    )
    args = parser.parse_args(argv)
    try:
        die_with_agent()
    except OrphanedError as exc:
        logger.error("%s: exiting", exc)
        return EXIT_CODES[Outcome.FAILED]
    # Only now torch and the runtime, seconds of imports: a worker whose agent dies
    # meanwhile is already bound to die with it, and never trains beside its successor.
    from worker_agent.runtime.config import WorkerConfig
    from worker_agent.runtime.control import ConnectionController
    from worker_agent.runtime.loop import run_worker

    authkey = os.environ.get(args.authkey_env)
    if authkey is None:
        parser.error(f"environment variable {args.authkey_env} (the authkey) is not set")
    if args.pool:
        _warm_up()
        connection = Client(parse_address(args.control), authkey=authkey.encode())
        config = _await_assignment(connection)
        if config is None:
            return EXIT_CODES[Outcome.SUCCEEDED]
        _configure_logging(config)
        controller = ConnectionController(connection, config.job_id, config.rank)
    else:
        config = WorkerConfig.model_validate_json(args.config.read_text())
        _configure_logging(config)
        controller = ConnectionController.connect(
            args.control, authkey.encode(), config.job_id, config.rank
        )
    if not _workload_loads(config, controller):
        return EXIT_CODES[Outcome.FAILED]
    try:
        return run_worker(config, controller).exit_code
    except Exception:
        logger.exception("training failed")
        return EXIT_CODES[Outcome.FAILED]


def _workload_loads(config: WorkerConfig, controller: Controller) -> bool:
    """Import the job's Trial class, from its uploaded code first; if it is not one,
    say why and end the rank."""
    from worker_agent.runtime.workloads import WorkloadError, load_trial

    if config.code_dir is not None:
        sys.path.insert(0, str(config.code_dir))
    try:
        load_trial(config.workload)
    except WorkloadError as exc:
        logger.error("%s", exc, exc_info=exc.__cause__)
        controller.exit(ExitStatus(Outcome.FAILED, 0, error_tail=str(exc)))
        return False
    return True


def _warm_up() -> None:
    """One throwaway optimizer step on a tiny model, before the pooled worker is idle.

    torch imports much lazily at first use: the first optimizer alone pulls in
    torch._dynamo, over a second here. Paid now, it is not paid after the assignment.
    """
    import torch

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.zeros(1, 2)).sum().backward()
    optimizer.step()


def _await_assignment(connection: Connection) -> WorkerConfig | None:
    """The configuration the agent assigns, or None once it closes the connection."""
    try:
        connection.send(idle_message(os.getpid()))
        message = connection.recv()
    except (EOFError, ConnectionError):
        connection.close()
        return None
    from worker_agent.runtime.config import WorkerConfig

    return WorkerConfig.model_validate(assigned_config(message))


def _configure_logging(config: WorkerConfig) -> None:
    # Only once the rank is known: every line names its job and rank.
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s job {config.job_id} rank {config.rank} %(name)s "
        "%(levelname)s %(message)s",
    )


if __name__ == "__main__":
    sys.exit(main())
