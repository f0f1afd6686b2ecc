"""Settings for every JigSaw process, read from `JIGSAW_*` environment variables.

Each section is its own settings class with its own prefix, so the variable names read
naturally (`JIGSAW_DATABASE_URL`, `JIGSAW_SCHEDULER_ROUND_SECONDS`) and a section can be
built alone in tests.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from jigsaw.codearchive import MAX_BYTES_CEILING
from jigsaw.home import HomeSettings
from scheduler.policies.jigsaw.params import JigsawParams


class DatabaseSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JIGSAW_DATABASE_", extra="ignore")

    url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the database. Unset means the embedded SQLite file "
        "`$JIGSAW_HOME/jigsaw.db`; production uses `postgresql+psycopg://user@host/db`.",
    )
    busy_timeout_ms: int = Field(
        default=30_000,
        ge=0,
        description="How long an SQLite writer waits for the write lock before failing.",
    )
    pool_size: int = Field(
        default=10, ge=1, description="Connections kept open per process (PostgreSQL)."
    )
    max_overflow: int = Field(
        default=20, ge=0, description="Extra connections allowed above pool_size (PostgreSQL)."
    )
    echo: bool = Field(default=False, description="Log every SQL statement (debugging only).")

    @field_validator("url")
    @classmethod
    def _known_backend(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("sqlite", "postgresql")):
            raise ValueError("only sqlite:// and postgresql+psycopg:// URLs are supported")
        return url


class APISettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JIGSAW_API_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="Address the HTTP API binds to.")
    port: int = Field(default=8265, ge=0, le=65535, description="Port the HTTP API binds to.")
    url: str | None = Field(
        default=None,
        description="Base URL the CLI talks to; unset means the one `jigsaw up` recorded "
        "under JIGSAW_HOME, else http://127.0.0.1:8265.",
    )
    token: str | None = Field(
        default=None,
        description="Bearer token the CLI sends; unset means the one `jigsaw up` stored.",
    )
    page_size_max: int = Field(
        default=500, ge=1, le=10_000, description="Largest `limit` GET /v1/jobs accepts."
    )
    auth_cache_seconds: float = Field(
        default=5.0,
        ge=0,
        description="How long a verified token is trusted without asking the database "
        "again: a token revoked on another replica stops working (HTTP and agents' gRPC "
        "streams) within this time, on the revoking replica at once (0 = check every "
        "request).",
    )
    max_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="Largest request body the API reads; a larger one gets 413 unread.",
    )
    max_code_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        le=MAX_BYTES_CEILING,
        description="Largest code archive `POST /v1/code` (`jigsaw submit --code`) takes; "
        "a larger one gets 413 unread. Only that route reads bodies beyond max_body_bytes.",
    )
    refuse_unplaceable: bool = Field(
        default=True,
        description="Refuse (422) a job asking for more GPUs than the cluster has ever "
        "registered; when false it is queued and carries a pending reason until the "
        "capacity comes.",
    )


class JigsawSettings(BaseSettings, JigsawParams):
    """The JigSaw policy's tuning (`JIGSAW_SCHEDULER_JIGSAW_STICKINESS=0.8`; tuples and
    SPB configurations as JSON); every field is documented in `JigsawParams`."""

    model_config = SettingsConfigDict(
        env_prefix="JIGSAW_SCHEDULER_JIGSAW_", extra="ignore", frozen=True
    )


class SchedulerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JIGSAW_SCHEDULER_", extra="ignore")

    round_seconds: float = Field(
        default=1.0, gt=0, description="Period of the scheduling round loop."
    )
    policy: str = Field(
        default="jigsaw",
        description="Scheduling policy the loop calls: jigsaw (the default), fifo, srtf, "
        "tiresias, gandiva, fifo-elastic or pollux.",
    )
    lease_iterations: int = Field(
        default=100,
        ge=1,
        description="Iterations a job may run before its lease must be renewed at a boundary.",
    )
    resize_in_place: bool = Field(
        default=True,
        description="Shrink an elastic job in place where its gang is on one node and keeps "
        "its rank 0's GPU (the ranks that stay go on in their processes); false: every "
        "resize is a checkpoint-restart.",
    )
    agent_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="An agent silent for this long is considered dead and loses its GPUs.",
    )
    checkpoint_every: int = Field(
        default=50,
        ge=0,
        description="Iterations between a job's periodic checkpoints (0: only on suspend "
        "and success); a job whose node dies resumes from its last one.",
    )
    rounds_kept: int = Field(
        default=10_000,
        ge=0,
        description="Recent rounds (latency and decisions) kept in the database for the "
        "dashboard's scheduler view; 0 stores none.",
    )
    code_retention_seconds: float = Field(
        default=7 * 24 * 3600.0,
        ge=0,
        description="How long a code archive is kept after the last job that names it "
        "ended (or after its upload, when no job names it).",
    )
    leader_retry_seconds: float = Field(
        default=2.0,
        gt=0,
        description="How often a replica that is not the scheduler leader tries to take "
        "the leader lock, so it takes over soon after the leader dies.",
    )
    jigsaw: JigsawSettings = Field(
        default_factory=JigsawSettings, description="The JigSaw policy's tuning."
    )

    def policy_params(self, name: str) -> BaseModel | None:
        """The tuning of policy `name` from its settings section (None: it has none)."""
        return {"jigsaw": self.jigsaw}.get(name)


class GrpcSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JIGSAW_GRPC_", extra="ignore")

    host: str = Field(
        default="127.0.0.1",
        description="Address the agents' gRPC endpoint binds to (agents dial the scheduler); "
        "0.0.0.0 to accept agents on other machines.",
    )
    port: int = Field(
        default=8266, ge=0, le=65535, description="Port of the agents' gRPC endpoint."
    )
    tls_cert: Path | None = Field(
        default=None,
        description="PEM certificate chain the gRPC endpoint presents; unset serves "
        "plaintext (set together with tls_key).",
    )
    tls_key: Path | None = Field(default=None, description="PEM private key of tls_cert.")
    tls_ca: Path | None = Field(
        default=None,
        description="PEM CA bundle; when set, agents must present a client certificate "
        "it signed (mutual TLS), on top of the cluster token.",
    )
    max_connections: int = Field(
        default=256,
        ge=1,
        description="Concurrent agent calls served; each connected agent holds one.",
    )
    rendezvous_port_min: int = Field(
        default=29500,
        ge=1024,
        le=65535,
        description="Lowest port rank 0 of a job may listen on for torch.distributed.",
    )
    rendezvous_port_max: int = Field(
        default=29999,
        ge=1024,
        le=65535,
        description="Highest port rank 0 of a job may listen on for torch.distributed.",
    )
    checkpoint_dir: Path | None = Field(
        default=None,
        description="Directory under which each job checkpoints (`job-<id>/`); it must be "
        "the same shared storage on every node. Unset means `$JIGSAW_HOME/checkpoints`.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> GrpcSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("set both tls_cert and tls_key, or neither")
        if self.tls_ca is not None and self.tls_cert is None:
            raise ValueError("tls_ca (client certificates) needs tls_cert and tls_key")
        if self.rendezvous_port_min > self.rendezvous_port_max:
            raise ValueError("rendezvous_port_min is above rendezvous_port_max")
        return self


class KubernetesSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JIGSAW_KUBERNETES_", extra="ignore")

    enabled: bool = Field(
        default=False,
        description="Have the scheduler leader read the node inventory from the Kubernetes "
        "API: cordoned, not Ready or tainted nodes take no new jobs (needs the `kubernetes` "
        "extra and RBAC to list nodes).",
    )
    kubeconfig: Path | None = Field(
        default=None,
        description="Kubeconfig file to use; unset means the in-cluster service account.",
    )
    node_selector: str = Field(
        default="",
        description="Label selector of the nodes JigSaw agents run on, e.g. "
        "`nvidia.com/gpu.present=true`; empty lists every node.",
    )
    tolerated_taints: list[str] = Field(
        default_factory=lambda: ["nvidia.com/gpu"],
        description="Taint keys the agents tolerate (a JSON list); any other NoSchedule or "
        "NoExecute taint makes a node unschedulable.",
    )
    sync_seconds: float = Field(
        default=15.0, gt=0, description="How often the node inventory is read."
    )


class LogSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="JIGSAW_LOG_", extra="ignore")

    format: Literal["text", "json"] = Field(
        default="text",
        description="`text`: readable lines; `json`: one JSON object per line with the "
        "job and agent ids as fields (for log collectors).",
    )


class Settings(BaseSettings):
    """All settings; sections are read independently from their own prefixes."""

    model_config = SettingsConfigDict(env_prefix="JIGSAW_", extra="ignore")

    home: Path = Field(
        default_factory=lambda: HomeSettings().home,
        description="Directory for all local state (see HomeSettings).",
    )
    database: DatabaseSettings = Field(
        default_factory=DatabaseSettings, description="Database connection."
    )
    api: APISettings = Field(default_factory=APISettings, description="HTTP API and CLI.")
    scheduler: SchedulerSettings = Field(
        default_factory=SchedulerSettings, description="Scheduling round loop."
    )
    grpc: GrpcSettings = Field(
        default_factory=GrpcSettings, description="The endpoint worker agents dial."
    )
    kubernetes: KubernetesSettings = Field(
        default_factory=KubernetesSettings, description="Kubernetes node inventory."
    )
    log: LogSettings = Field(default_factory=LogSettings, description="Log output.")

    @property
    def checkpoint_dir(self) -> Path:
        return self.grpc.checkpoint_dir or self.home / "checkpoints"

    @property
    def database_url(self) -> str:
        if self.database.url:
            return self.database.url
        return f"sqlite:///{self.home / 'jigsaw.db'}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
