"""Job submissions over HTTP against the trivial endpoint of the same server.

For each database (SQLite embedded default, PostgreSQL), start `jigsaw up`, then with
32 concurrent clients send N submissions (POST /v1/jobs) and N requests to /healthz,
in the same run, and report rate, p50/p99 latency and errors. Target: submissions reach
at least half the trivial endpoint's rate with zero errors.

    python -m benchmarks.api_submit [--requests 5000] [--clients 32] [--json | --markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import add_output_options, emit, percentile
from tests.servers import jigsaw_up, scratch_postgres

POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


async def _drive(
    base_url: str,
    token: str,
    requests: int,
    clients: int,
    make: Callable[[httpx.AsyncClient, int], Any],
) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    counter = iter(range(requests))
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, limits=limits) as client:

        async def worker() -> None:
            nonlocal errors
            for i in counter:
                start = time.perf_counter()
                try:
                    response = await make(client, i)
                    ok = response.status_code < 300
                except httpx.HTTPError:
                    ok = False
                latencies.append(time.perf_counter() - start)
                errors += 0 if ok else 1

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "per_s": requests / elapsed,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "errors": float(errors),
    }


def _submit(client: httpx.AsyncClient, i: int) -> Any:
    spec = {"name": f"bench-{i}", "workload": "digits-mlp", "max_iterations": 10}
    return client.post("/v1/jobs", json=spec)


def _trivial(client: httpx.AsyncClient, _i: int) -> Any:
    return client.get("/healthz")


def measure(database: str, url: str | None, requests: int, clients: int) -> list[dict[str, Any]]:
    # The scheduler runs at its default period, as in a real `jigsaw up`.
    env = {"JIGSAW_SCHEDULER_ROUND_SECONDS": "1.0"}
    if url:
        env["JIGSAW_DATABASE_URL"] = url
    with tempfile.TemporaryDirectory() as home, jigsaw_up(Path(home), **env) as server:
        token = server.token()
        # Warm both paths (connection pools, imports) before timing.
        asyncio.run(_drive(server.url, token, 200, clients, _submit))
        asyncio.run(_drive(server.url, token, 200, clients, _trivial))
        trivial = asyncio.run(_drive(server.url, token, requests, clients, _trivial))
        submit = asyncio.run(_drive(server.url, token, requests, clients, _submit))
    ratio = submit["per_s"] / trivial["per_s"]
    return [
        {"case": f"{database} GET /healthz", **trivial, "ratio": 1.0},
        {"case": f"{database} POST /v1/jobs", **submit, "ratio": ratio},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--postgres", default=POSTGRES, help="server URL to create a DB on")
    parser.add_argument("--only", choices=("sqlite", "postgres"), help="one database only")
    add_output_options(parser)
    args = parser.parse_args()
    rows = []
    if args.only != "postgres":
        rows += measure("sqlite", None, args.requests, args.clients)
    if args.only != "sqlite":
        with scratch_postgres(args.postgres, prefix="jigsaw_bench") as url:
            rows += measure("postgres", url, args.requests, args.clients)
    emit(rows, f"{args.requests} requests, {args.clients} concurrent clients", args.output)


if __name__ == "__main__":
    main()
