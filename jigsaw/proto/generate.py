"""Regenerate the gRPC Python modules from `agent.proto` (the protocol's version 2).

    python -m jigsaw.proto.generate

Run from anywhere; it works from the repository root so the generated imports read
`jigsaw.proto.v2.agent_pb2`. CI runs it and then `git diff --exit-code`, so
the committed modules always match the .proto. Version 1 has no generated code: the
scheduler only refuses its calls, by method name (`scheduler.agents.server`).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from grpc_tools import protoc

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
PROTO = Path("jigsaw/proto/v2/agent.proto")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # grpc_tools bundles the well-known types; include them for imports such as Empty.
    well_known = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{well_known}",
        f"--python_out={ROOT}",
        f"--grpc_python_out={ROOT}",
        f"--pyi_out={ROOT}",
        str(ROOT / PROTO),
    ]
    code = protoc.main(args)
    if code != 0:
        logger.error("protoc failed with exit code %d", code)
        return int(code)
    logger.info("generated Python for %s", PROTO)
    return 0


if __name__ == "__main__":
    sys.exit(main())
