"""Settings of the worker agent, read from `JIGSAW_AGENT_*` environment variables."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveInt, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from jigsaw.home import HomeSettings
from worker_agent.code import CacheBounds


def default_work_dir() -> Path:
    return HomeSettings().home / "agent"


class WorkerSettings(BaseSettings):
    """How the agent isolates the training processes it starts (see worker_agent.isolation).

    Its own class so that `jigsaw up` reads the same settings for its local agents
    without needing an agent's token.
    """

    model_config = SettingsConfigDict(env_prefix="JIGSAW_AGENT_", extra="ignore")

    worker_user: str = Field(
        default="nobody",
        min_length=1,
        description="User (name or uid) that training processes run as when the agent runs "
        "as root, so that trial code cannot read the agent's token or the control plane's "
        "files. Needs read access to the Python installation and search access to the "
        "work and checkpoint directories. `root` keeps them root (trusted code only). "
        "Ignored when the agent is not root: workers then run as the agent's user.",
    )
    worker_env: list[str] = Field(
        default_factory=list,
        description="Extra environment variables (names or fnmatch patterns such as "
        "`HF_*`; JSON list) passed on to training processes, beyond the built-in "
        "allow-list (PATH, locale, PYTHONPATH, CUDA_*, NCCL_*, TORCH_*, ...). Names that "
        "look like secrets (TOKEN, SECRET, PASSWORD, KEY) and JIGSAW_* never pass.",
    )


class AgentSettings(WorkerSettings):
    model_config = SettingsConfigDict(env_prefix="JIGSAW_AGENT_", extra="ignore")

    scheduler: str = Field(
        default="127.0.0.1:8266",
        description="host:port of the scheduler's gRPC endpoint for agents (JIGSAW_GRPC_*).",
    )
    token: SecretStr | None = Field(
        default=None,
        description="The cluster token (agent scope), sent as `authorization: Bearer` on "
        "every call. Set this or token_file.",
    )
    token_file: Path | None = Field(
        default=None,
        description="A file holding the cluster token (e.g. a mounted Kubernetes secret); "
        "read again at every (re)registration, so a rotated token is picked up.",
    )
    node_name: str = Field(
        default_factory=socket.gethostname,
        min_length=1,
        description="This node's unique name in the cluster; the host name by default.",
    )
    address: str = Field(
        default="127.0.0.1",
        description="Host or IP other nodes use to reach this node for torch.distributed "
        "rendezvous; the default only works for single-node clusters.",
    )
    gpus: Literal["auto"] | PositiveInt = Field(
        default="auto",
        description="`auto`: this node's CUDA devices, or up to 4 virtual CPU slots without "
        "CUDA (see worker_agent.gpus); N: N virtual CPU slots.",
    )
    work_dir: Path = Field(
        default_factory=default_work_dir,
        description="Per-node directory for worker config files and per-rank log files "
        "(`job-<id>/`); `$JIGSAW_HOME/agent` by default.",
    )
    code_cache_max_bytes: int = Field(
        default=CacheBounds().max_bytes,
        ge=0,
        description="Largest total size of the jobs' code archives cached in work_dir/"
        "code-cache; past it the least recently launched go (never the one a launch "
        "is using). A job whose archive went fetches it again if it is resumed here.",
    )
    code_cache_max_idle_seconds: float = Field(
        default=CacheBounds().max_idle_seconds,
        gt=0,
        description="A cached code archive no launch on this node used for this long is "
        "deleted (checked at every launch and when the agent starts).",
    )
    torch_threads: PositiveInt = Field(
        default=1, description="CPU threads each training process uses (torch, OpenMP, MKL)."
    )
    tls_ca: Path | None = Field(
        default=None,
        description="PEM CA bundle that signed the scheduler's certificate; set alone for "
        "server-verified TLS. Unset dials in plaintext.",
    )
    tls_cert: Path | None = Field(
        default=None,
        description="PEM client certificate chain for mutual TLS (with tls_key and tls_ca).",
    )
    tls_key: Path | None = Field(default=None, description="PEM private key of tls_cert.")
    reconnect_max_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Cap of the randomized exponential backoff between reconnection attempts "
        "while the scheduler is unreachable (the jobs keep running meanwhile); a restarted "
        "scheduler hears from the agent within about twice this, which must stay under its "
        "agent timeout (30 s by default) or it requeues the agent's jobs.",
    )
    stop_grace_seconds: float = Field(
        default=10.0,
        ge=0,
        description="Time between SIGTERM and SIGKILL when stopping a job's processes.",
    )
    max_jobs_per_gpu: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Jobs whose processes may share one GPU slot at a time (co-location); "
        "1 makes every slot exclusive. Reported at registration: the scheduler places no "
        "more on a slot. A launch beyond it, or whose memory caps with those of the jobs "
        "on the slot exceed the slot's memory, is refused and the job queued again. "
        "Co-located jobs on a virtual slot share its torch threads.",
    )
    mps: Literal["auto", "off"] = Field(
        default="auto",
        description="CUDA MPS for co-located jobs: `auto` starts and supervises the daemon "
        "(`nvidia-cuda-mps-control`, pipe and log directories under work_dir/mps) when "
        "it is on PATH and the slots are CUDA devices, and stops it on exit; `off` leaves "
        "co-located jobs time sliced by the driver. The mode is reported per GPU.",
    )
    warm_workers: int = Field(
        default=0,
        ge=0,
        description="Worker processes kept pre-started with torch and the runtime imported "
        "(the warm pool), so that a launch skips those seconds of imports; a rank starts "
        "cold when the pool is empty, and the pool refills in the background. Each idle one "
        "holds the memory of an imported torch (a few hundred MB), hence off by default; "
        "the number of GPU slots is the useful most.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> AgentSettings:
        if (self.token is None) == (self.token_file is None):
            raise ValueError(
                "set exactly one of JIGSAW_AGENT_TOKEN and JIGSAW_AGENT_TOKEN_FILE "
                "(the cluster token the scheduler accepts from agents)"
            )
        if self.token is not None and not self.token.get_secret_value().strip():
            raise ValueError("JIGSAW_AGENT_TOKEN is empty")
        if self.token_file is not None and not self.token_file.is_file():
            raise ValueError(f"token_file {self.token_file} is not a readable file")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("set both tls_cert and tls_key, or neither")
        if self.tls_cert is not None and self.tls_ca is None:
            raise ValueError("mutual TLS (tls_cert, tls_key) needs tls_ca to verify the scheduler")
        for name in ("tls_ca", "tls_cert", "tls_key"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name} {path} is not a readable file")
        return self

    def bearer_token(self) -> str:
        """The cluster token, read from token_file each call so rotations apply."""
        if self.token is not None:
            return self.token.get_secret_value()
        assert self.token_file is not None  # the validator guarantees one of them
        token = self.token_file.read_text().strip()
        if not token:
            raise ValueError(f"token_file {self.token_file} is empty")
        return token
