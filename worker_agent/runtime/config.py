"""What one worker process is told to do: the JSON file the node agent writes for it.

Imports no torch, so the agent can build and validate configurations cheaply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from jigsaw.jobspec import Hyperparameters, PipelineConfig, TargetMetric


class WorkerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: int
    attempt: int = Field(
        default=0,
        ge=0,
        description="The run's fence (the scheduler's placement number): a worker whose "
        "attempt is older than the one recorded in checkpoint_dir writes no checkpoint "
        "and stops.",
    )
    workload: str = Field(description="A built-in workload name or `package.module:Class`.")
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    master_addr: str = Field(default="127.0.0.1", description="Rank 0's host for rendezvous.")
    master_port: int = Field(ge=1, le=65535)
    backend: Literal["gloo", "nccl"] | None = Field(
        default=None, description="Collective backend; None picks nccl on CUDA, gloo otherwise."
    )
    device: str = Field(default="cpu", description="`cpu` or `cuda:N`.")
    seed: int = 0
    max_iterations: int | None = Field(default=None, ge=1)
    target_metric: TargetMetric | None = None
    eval_every: int = Field(default=100, ge=1, description="Iterations between evaluations.")
    checkpoint_dir: Path | None = Field(
        default=None,
        description="Where rank 0 writes checkpoints and every rank reads them on start; "
        "must be shared storage when ranks span nodes. None disables suspend/resume.",
    )
    checkpoint_every: int | None = Field(
        default=None,
        ge=1,
        description="Iterations between periodic checkpoints, so a job whose node dies "
        "resumes near where it was; None checkpoints only on suspend and success.",
    )
    data_dir: Path | None = Field(default=None, description="A cache for trials' data.")
    code_dir: Path | None = Field(
        default=None,
        description="The job's uploaded code, unpacked: put first on the import path "
        "before the workload is imported (None: the job has none).",
    )
    torch_threads: int | None = Field(
        default=None,
        ge=1,
        description="CPU threads of this rank (torch.set_num_threads): the slot's, divided "
        "among the jobs sharing it.",
    )
    memory_cap_bytes: int | None = Field(
        default=None,
        ge=1,
        description="The memory this rank may use on its device (its share of the slot); "
        "on CUDA torch's per-process memory fraction, on CPU the process's peak resident "
        "memory, checked at every iteration. Over it the rank fails alone with "
        "'memory cap exceeded'. None: no cap.",
    )
    spb_enabled: bool = Field(
        default=False,
        description="Exchange gradients per stage among their contributors (structured "
        "partial backprop) instead of DDP's all-reduce; set for jobs whose spec's spb is "
        "not `off`, which the scheduler may reconfigure.",
    )
    spb: dict[str, Any] = Field(
        default_factory=dict,
        description="The SPB configuration at launch (`{}`: every worker trains every "
        "stage); later ones arrive at iteration boundaries.",
    )
    spb_stages: int | None = Field(
        default=None, ge=1, description="Cut the model into this many stages (else the trial's)."
    )
    profile: bool = Field(
        default=False,
        description="Rank 0 measures the model's per-stage costs before the first iteration "
        "and reports them as the workload's model profile.",
    )
    backprop: Literal["standard", "ooo"] = Field(
        default="standard", description="The job spec's backward schedule."
    )
    ooo_first_k: int | None = Field(
        default=None,
        ge=1,
        description="The job spec's k of reverse first-k (None: chosen at start from rank "
        "0's profile of the model and the link measured on the gang).",
    )
    pipeline: PipelineConfig | None = Field(
        default=None,
        description="The job spec's pipeline: rank r trains stage r (None: data parallel).",
    )
    max_micro_batch: int | None = Field(
        default=None,
        ge=1,
        description="For an elastic or adaptive-batch job: the most samples a rank computes "
        "at once; the global batch (`hyperparameters.batch_size`) is split over the ranks "
        "and accumulated micro-batches of at most this, and a checkpoint of another world "
        "size resumes (None: each rank takes its share in one pass, at one world size).",
    )
    base_batch: int | None = Field(
        default=None,
        ge=1,
        description="For an adaptive batch: the global batch the learning rate was set "
        "for (the spec's); the rate follows AdaScale's rule from it (None: not adaptive).",
    )
    report_every_iterations: int = Field(default=10, ge=1)
    report_every_seconds: float = Field(default=1.0, gt=0)
    collective_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        description="How long a rank waits on its peers before failing (a peer has died).",
    )

    @model_validator(mode="after")
    def _rank_in_world(self) -> WorkerConfig:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not below world_size {self.world_size}")
        if self.pipeline is not None and self.pipeline.stages != self.world_size:
            raise ValueError(
                f"{self.pipeline.stages} pipeline stages on {self.world_size} ranks: "
                "one stage per rank"
            )
        if self.base_batch is not None and self.max_micro_batch is None:
            raise ValueError("an adaptive batch (base_batch) needs max_micro_batch")
        return self

    @property
    def resolved_backend(self) -> Literal["gloo", "nccl"]:
        if self.backend is not None:
            return self.backend
        return "nccl" if self.device.startswith("cuda") else "gloo"
