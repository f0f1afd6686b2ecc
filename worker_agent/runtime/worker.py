"""The worker process the node agent spawns, one per GPU slot:

    python -m worker_agent.runtime.worker --config FILE.json --control ADDRESS --authkey-env VAR

FILE.json is a `WorkerConfig`. ADDRESS is the agent's Listener, `host:port` or a Unix
socket path; the authkey is read from the environment variable VAR, never from argv,
which every user of the machine can read. Exit codes (`protocol.EXIT_CODES`): 0
succeeded, 3 suspended, 4 stopped, 1 failed (the `exit` message carries the traceback
tail); argparse exits 2 on a usage error.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.control import ConnectionController
from worker_agent.runtime.loop import run_worker
from worker_agent.runtime.protocol import EXIT_CODES, Outcome

logger = logging.getLogger("worker_agent.runtime.worker")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker_agent.runtime.worker")
    parser.add_argument("--config", type=Path, required=True, help="WorkerConfig JSON file")
    parser.add_argument("--control", required=True, help="the agent's host:port or socket path")
    parser.add_argument(
        "--authkey-env", required=True, help="environment variable holding the agent's authkey"
    )
    args = parser.parse_args(argv)
    config = WorkerConfig.model_validate_json(args.config.read_text())
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s job {config.job_id} rank {config.rank} %(name)s "
        "%(levelname)s %(message)s",
    )
    authkey = os.environ.get(args.authkey_env)
    if authkey is None:
        parser.error(f"environment variable {args.authkey_env} (the authkey) is not set")
    controller = ConnectionController.connect(
        args.control, authkey.encode(), config.job_id, config.rank
    )
    try:
        return run_worker(config, controller).exit_code
    except Exception:
        logger.exception("training failed")
        return EXIT_CODES[Outcome.FAILED]


if __name__ == "__main__":
    sys.exit(main())
