"""Packing on a live cluster: the same mix of jobs under FIFO and under JigSaw.

Each policy gets its own real `jigsaw up` (SQLite) and one `jigsaw agent` whose GPU
slots each take up to `MAX_JOBS_PER_GPU` jobs: virtual GPUs (CPU processes) with
`--device cpu`, the node's CUDA devices with `--device cuda`. The whole mix, small and
large built-in jobs at several batch sizes, is submitted at once: `--mix idle` (the
default), jobs that each leave the device mostly idle, or `--mix saturating`, jobs that
each keep it busy, where packing can only lose (the model should say so). FIFO places every
job on GPUs of its own (exclusive); JigSaw may pack a job beside another where the
interference model predicts a gain. Reported per policy, from what the database
recorded (jobs, allocations): makespan and mean JCT (and both over FIFO's, measured in
the same run), `packings` (placements onto a GPU another job held at that moment),
`lost_jobs` (never SUCCEEDED with every iteration) and `duplicate_launches` (a rank of
a job allocated while an earlier allocation of that rank was still held: two live
incarnations). Besides, what the model predicted for this mix on this device: every
job's solo utilization as measured in the FIFO run, and the best pair's combined
throughput under the fitted interference model (1 = no better than one after the
other).

    python -m benchmarks.packing [--device cpu|cuda] [--mix idle|saturating] [--json | --markdown]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from api.client import JigsawClient
from benchmarks.harness import add_output_options, emit
from benchmarks.live import alive_gpus, lost, makespan_and_mean_jct, timestamp, wait
from jigsaw import spb
from scheduler.core.interference import fitted
from tests.cluster import cluster
from tests.servers import JIGSAW, TERMINAL

Device = Literal["cpu", "cuda"]
Mix = Literal["idle", "saturating"]

POLICIES = ("fifo", "jigsaw")
NODE = "packing-0"
VIRTUAL_GPUS = 2  # --device cpu: one agent's virtual slots
MAX_JOBS_PER_GPU = 4
LEASE_ITERATIONS = 20


# "idle": small jobs (an MLP, small batches) and larger ones (convolutions, larger
# batches); on CUDA the synthetic ResNet and transformer besides, at batches that leave a
# large GPU mostly idle alone (the mix of jobs that each leave it half idle).
# "saturating": ResNet-18 at the largest batches its synthetic data holds, to keep the
# device as busy alone as a built-in can (79% of an H100 at batch 1024 in bf16 by
# ../shared/measurements/h100; 53-65% of an H200 at 1024-2048 in the runtime's fp32,
# docs/results/packing-gpu.md), where a pair gains little and slows each host a lot.
MIXES: dict[Mix, dict[Device, list[tuple[str, int]]]] = {
    "idle": {
        "cpu": [
            ("digits-mlp", 16),
            ("digits-mlp", 64),
            ("digits-mlp", 256),
            ("digits-cnn", 64),
            ("digits-cnn", 256),
            ("transformer-synthetic", 32),
        ],
        "cuda": [
            ("resnet-synthetic", 32),
            ("resnet-synthetic", 128),
            ("resnet-synthetic", 512),
            ("transformer-synthetic", 32),
            ("transformer-synthetic", 256),
            ("digits-cnn", 256),
        ],
    },
    "saturating": {
        "cpu": [("resnet18-synthetic", 4), ("resnet18-synthetic", 8), ("resnet18-synthetic", 16)],
        "cuda": [
            ("resnet18-synthetic", 1024),
            ("resnet18-synthetic", 1536),
            ("resnet18-synthetic", 2048),
        ],
    },
}
# Each job's length: about this many seconds of its profiled step alone (the runtime's
# own time per iteration comes on top), in whole leases, so that a mix takes about as
# long on any device.
PROFILED_SECONDS: dict[Device, float] = {"cpu": 4.0, "cuda": 10.0}
# The fewest and most iterations a job is given: the runtime's own time per iteration
# dwarfs a small model's step on a large GPU.
ITERATIONS: dict[Device, tuple[int, int]] = {
    "cpu": (2 * LEASE_ITERATIONS, 1000),
    "cuda": (2 * LEASE_ITERATIONS, 400),
}


def job_spec(workload: str, batch: int, step_seconds: float, device: Device) -> dict[str, Any]:
    """A one-GPU job of `workload` at `batch`, `PROFILED_SECONDS` of `step_seconds` long."""
    leases = round(PROFILED_SECONDS[device] / step_seconds / LEASE_ITERATIONS)
    fewest, most = ITERATIONS[device]
    iterations = min(max(leases * LEASE_ITERATIONS, fewest), most)
    return {
        "name": f"{workload}-b{batch}",
        "workload": workload,
        "hyperparameters": {"batch_size": batch, "learning_rate": 0.05},
        "max_iterations": iterations,
    }


def measured_profile(workload: str, batch: int, device: Device) -> dict[str, Any]:
    """`jigsaw profile --json` of one worker of `workload` at `batch` on `device`: the
    stages' costs, the device's kind, utilization and peak memory, which JigSaw packs a
    job by before it reports."""
    command = [*JIGSAW, "profile", workload, "--workers", "1", "--batch-size", str(batch)]
    command += ["--device", device, "--repeats", "5", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"profiling {workload} at batch {batch} failed: {done.stderr[-2000:]}")
    profile: dict[str, Any] = json.loads(done.stdout)
    return profile


@dataclass(frozen=True)
class Hold:
    """One rank's allocation of one GPU, from its creation to its release."""

    job_id: int
    gpu_id: int
    rank: int
    start: float
    end: float  # math.inf: still held


def packings(holds: Sequence[Hold]) -> int:
    """Placements (a job's allocations made at one moment) with a GPU that another
    job held then."""
    packed = {
        (mine.job_id, mine.start)
        for mine in holds
        for other in holds
        if other.gpu_id == mine.gpu_id
        and other.job_id != mine.job_id
        and other.start <= mine.start < other.end
    }
    return len(packed)


def duplicate_launches(holds: Sequence[Hold]) -> int:
    """Allocations of a job's rank made while an earlier one of that rank was held."""
    by_rank: dict[tuple[int, int], list[Hold]] = {}
    for hold in holds:
        by_rank.setdefault((hold.job_id, hold.rank), []).append(hold)
    duplicates = 0
    for same in by_rank.values():
        same.sort(key=lambda hold: hold.start)
        duplicates += sum(
            1 for i, later in enumerate(same) if any(later.start < e.end for e in same[:i])
        )
    return duplicates


def holds_of(client: JigsawClient, job_ids: Iterable[int]) -> list[Hold]:
    return [
        Hold(
            job_id,
            item["gpu_id"],
            item["rank"],
            timestamp(item["created_at"]),
            timestamp(item["released_at"]) if item["released_at"] else float("inf"),
        )
        for job_id in job_ids
        for item in client.allocations(job_id)["items"]
    ]


def policy_suspensions(client: JigsawClient, job_id: int) -> int:
    """How often the policy took the job's GPUs while it ran (each costs a restart)."""
    return sum(
        1
        for event in client.events(job_id)["items"]
        if event["kind"] == "transition"
        and event["from_state"] == "RUNNING"
        and event["to_state"] == "SUSPENDED"
    )


def step_seconds(profile: Mapping[str, Any]) -> float:
    """One full-backprop step of the profiled worker."""
    return spb.job_cost(spb.SPBProfile.from_json(profile), None, 1).iteration_compute_seconds


def solo_utilization(client: JigsawClient, job_id: int) -> float | None:
    """The mean utilization the job reported (0-1 per torch thread on a virtual GPU:
    gloo's threads can take it past 1)."""
    reported = [
        point["utilization"]
        for point in client.metrics(job_id)["points"]
        if point["utilization"] is not None
    ]
    return statistics.mean(reported) if reported else None


def run_policy(
    policy: str, device: Device, mix: Mix, home: Path, profiles: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The policy's row, and each job's solo utilization by name (meaningful under
    FIFO, where no job shares a GPU). `profiles`: each job's, stored before it is
    submitted."""
    specs = [
        job_spec(profile["workload"], profile["per_worker_batch"], step_seconds(profile), device)
        for profile in profiles
    ]
    settings = {
        "JIGSAW_SCHEDULER_POLICY": policy,
        "JIGSAW_SCHEDULER_LEASE_ITERATIONS": str(LEASE_ITERATIONS),
        # The shared machine is slow at times: a silent agent is not a lost one here.
        "JIGSAW_SCHEDULER_AGENT_TIMEOUT_SECONDS": "60",
    }
    gpus = str(VIRTUAL_GPUS) if device == "cpu" else "auto"
    with cluster(home, **settings) as running:
        running.start_agent(
            NODE,
            gpus,
            JIGSAW_AGENT_MAX_JOBS_PER_GPU=str(MAX_JOBS_PER_GPU),
            # Time slicing, the mode the interference fits of every generation have.
            JIGSAW_AGENT_MPS="off",
        )
        with running.client() as client:
            wait(lambda: alive_gpus(client) > 0, "the agent's GPUs")
            for profile in profiles:
                client.put_profile(
                    profile["workload"], {k: v for k, v in profile.items() if k != "workload"}
                )
            ids = [client.submit(spec)["id"] for spec in specs]
            wait(lambda: all(client.get_job(i)["state"] in TERMINAL for i in ids), "the jobs")
            jobs = [client.get_job(i) for i in ids]
            holds = holds_of(client, ids)
            suspended = sum(policy_suspensions(client, i) for i in ids)
            utilization = {
                spec["name"]: solo_utilization(client, i)
                for spec, i in zip(specs, ids, strict=True)
            }
    makespan, mean_jct = makespan_and_mean_jct(jobs)
    row = {
        "policy": policy,
        "device": device,
        "mix": mix,
        "gpu": profiles[0]["device_kind"],
        "jobs": len(jobs),
        "makespan_s": makespan,
        "mean_jct_s": mean_jct,
        "packings": packings(holds),
        "lost_jobs": len(lost(jobs, specs)),
        "duplicate_launches": duplicate_launches(holds),
        "suspensions": suspended,
    }
    return row, utilization


def predictions(utilization: Mapping[str, float | None], gpu_kind: str) -> list[dict[str, Any]]:
    """Each job's best partner by the interference model of `gpu_kind`: the pair's
    combined throughput (the sum of both speeds as fractions of alone), and how much
    the job itself slows. A utilization past 1 (CPU threads beside torch's) is taken
    as 1, a saturated GPU."""
    model = fitted().for_device(gpu_kind)
    known = {name: min(1.0, u) for name, u in utilization.items() if u is not None}
    rows = []
    for name, own in known.items():
        pairs = [
            (sum(model.speeds((own, theirs))), model.speeds((own, theirs))[0], other)
            for other, theirs in known.items()
            if other != name
        ]
        combined, speed, partner = max(pairs) if pairs else (float("nan"), float("nan"), "")
        rows.append(
            {
                "job": name,
                "solo_utilization": utilization[name],
                "best_partner": partner,
                "pair_throughput": combined,
                "own_speed": speed,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--mix",
        choices=tuple(MIXES),
        default="idle",
        help="jobs that leave the device mostly idle, or that each keep it busy",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="keep each policy's cluster home (logs, database) under DIR",
    )
    add_output_options(parser)
    args = parser.parse_args()
    device: Device = args.device
    mix: Mix = args.mix
    profiles = [measured_profile(workload, batch, device) for workload, batch in MIXES[mix][device]]
    with tempfile.TemporaryDirectory(prefix="jigsaw-packing-") as scratch:
        home = args.keep or Path(scratch)
        results = {
            policy: run_policy(policy, device, mix, home / policy, profiles) for policy in POLICIES
        }
    fifo = results["fifo"][0]
    # Solo utilizations from the FIFO run, where every job had its GPU to itself.
    # Every profile names the kind the node's slots register as (virtual-cpu on CPU).
    predicted = predictions(results["fifo"][1], profiles[0]["device_kind"])
    best = max((row["pair_throughput"] for row in predicted), default=float("nan"))
    rows = [
        {
            **row,
            "makespan_vs_fifo": row["makespan_s"] / fifo["makespan_s"],
            "jct_vs_fifo": row["mean_jct_s"] / fifo["mean_jct_s"],
            "predicted_best_pair": best,
        }
        for row, _ in results.values()
    ]
    if args.output == "markdown":
        sys.stdout.write(MARKDOWN_HEAD + "\n")
    emit(
        rows,
        f"FIFO vs JigSaw on a live cluster ({device}, {mix} mix)",
        args.output,
        {"makespan_vs_fifo": "{:.2f}x", "jct_vs_fifo": "{:.2f}x", "predicted_best_pair": "{:.2f}"},
    )
    if args.output == "json":
        return  # one object per policy
    if args.output == "markdown":
        sys.stdout.write(MODEL_HEAD + "\n")
    emit(
        predicted,
        "What the interference model predicts for each job's best pair",
        args.output,
        {"pair_throughput": "{:.2f}", "own_speed": "{:.2f}"},
    )
    if args.output == "markdown":
        sys.stdout.write(MARKDOWN_TAIL)


MARKDOWN_HEAD = """# Packing on a live cluster: FIFO and JigSaw, same jobs

Generated by `python -m benchmarks.packing --markdown > docs/results/packing-live.md` on
the shared 2-core CPU machine (virtual GPUs are CPU processes; other work ran beside
it), so the ratios to FIFO, measured in the same run, carry over, not the seconds. The
simulator's ablation is [packing.md](packing.md); on a GPU, [packing-gpu.md](packing-gpu.md).

**The run.** Each job's workload is first profiled at its batch on the device
(`jigsaw profile --workers 1 --device cpu --json`: stage times, the device's utilization
and peak memory), and each job is given about 4 s of its profiled step in whole leases
(40 to 1,000 iterations). Per policy, a real `jigsaw up` (SQLite) with those profiles
stored and one `jigsaw agent` with 2 virtual GPUs, each slot taking up to 4 jobs
(`JIGSAW_AGENT_MAX_JOBS_PER_GPU`), leases of 20 iterations; six one-GPU jobs submitted
at once: `digits-mlp` at batches 16, 64 and 256, `digits-cnn` at 64 and 256,
`transformer-synthetic` at 32 (`--mix saturating`: three, `resnet18-synthetic` at 4, 8
and 16; the job names say which). FIFO gives every job GPUs of its
own; JigSaw (the default policy, default parameters) may pack, from the profiles before
a job has run. From the stored jobs, allocations and events: `packings` (placements onto
a GPU another job held then), `lost_jobs` (not SUCCEEDED with every iteration),
`duplicate_launches` (a rank allocated again while its earlier allocation was held),
`suspensions` (running jobs the policy suspended), and `predicted_best_pair` (below).
"""

MODEL_HEAD = """## What the model predicted

Each job's solo utilization is the mean its iterations reported in the FIFO run (alone
on its slot). On a virtual GPU that is the process's CPU time over wall time per torch
thread (`worker_agent/runtime/timing.py`). The virtual slot has no interference fit of
its own and takes the most pessimistic one (capacity 0.80, the older GPUs').
`pair_throughput` is the sum of both jobs' speeds beside each other as fractions of
alone, for the job's best partner (1: no better than one after the other); `own_speed`
is the job's own.
"""

MARKDOWN_TAIL = """
**Reading.** `lost_jobs` and `duplicate_launches` say whether co-location, refusals and
requeues cost a job or ran one twice; `suspensions` what JigSaw paid that FIFO did not
(each a restart: seconds, for jobs of seconds).

On two cores shared with other work a CPU slot is busy whenever its process runs: the
profiles and the jobs' reports read most of a core each, the pessimistic fit predicts
little for a pair, and JigSaw packs little or nothing, as it should; a pair here could
gain only by taking CPU time from that other work. What the model was fitted to is
NVML's utilization on a GPU, where these small jobs leave most of it idle
([packing-gpu.md](packing-gpu.md)).
"""


if __name__ == "__main__":
    main()
