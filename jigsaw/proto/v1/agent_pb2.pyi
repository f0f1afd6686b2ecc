from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_SUCCEEDED: _ClassVar[Outcome]
    OUTCOME_FAILED: _ClassVar[Outcome]
    OUTCOME_SUSPENDED: _ClassVar[Outcome]
    OUTCOME_STOPPED: _ClassVar[Outcome]
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_SUCCEEDED: Outcome
OUTCOME_FAILED: Outcome
OUTCOME_SUSPENDED: Outcome
OUTCOME_STOPPED: Outcome

class Gpu(_message.Message):
    __slots__ = ("index", "kind", "memory_bytes", "virtual")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    VIRTUAL_FIELD_NUMBER: _ClassVar[int]
    index: int
    kind: str
    memory_bytes: int
    virtual: bool
    def __init__(self, index: _Optional[int] = ..., kind: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., virtual: _Optional[bool] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("node_name", "gpus", "agent_version", "address", "instance")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    agent_version: str
    address: str
    instance: str
    def __init__(self, node_name: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., agent_version: _Optional[str] = ..., address: _Optional[str] = ..., instance: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("agent_id", "node_id", "heartbeat_interval_seconds")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    agent_id: int
    node_id: int
    heartbeat_interval_seconds: float
    def __init__(self, agent_id: _Optional[int] = ..., node_id: _Optional[int] = ..., heartbeat_interval_seconds: _Optional[float] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("hello", "heartbeat", "reports", "exit", "log", "evaluation", "profile")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    EXIT_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    heartbeat: Heartbeat
    reports: IterationReports
    exit: JobExit
    log: LogTail
    evaluation: Evaluation
    profile: ModelProfileReport
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., reports: _Optional[_Union[IterationReports, _Mapping]] = ..., exit: _Optional[_Union[JobExit, _Mapping]] = ..., log: _Optional[_Union[LogTail, _Mapping]] = ..., evaluation: _Optional[_Union[Evaluation, _Mapping]] = ..., profile: _Optional[_Union[ModelProfileReport, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("node_name", "running", "exits", "instance")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    EXITS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    running: _containers.RepeatedCompositeFieldContainer[RunningJob]
    exits: _containers.RepeatedCompositeFieldContainer[JobExit]
    instance: str
    def __init__(self, node_name: _Optional[str] = ..., running: _Optional[_Iterable[_Union[RunningJob, _Mapping]]] = ..., exits: _Optional[_Iterable[_Union[JobExit, _Mapping]]] = ..., instance: _Optional[str] = ...) -> None: ...

class RunningJob(_message.Message):
    __slots__ = ("job_id", "ranks", "attempt")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    ranks: _containers.RepeatedCompositeFieldContainer[RankAssignment]
    attempt: int
    def __init__(self, job_id: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[RankAssignment, _Mapping]]] = ..., attempt: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IterationRecord(_message.Message):
    __slots__ = ("iteration", "step_seconds", "compute_seconds", "comm_seconds", "samples_per_second", "loss", "utilization", "peak_memory_bytes", "bytes_communicated", "spb_depth")
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COMM_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_COMMUNICATED_FIELD_NUMBER: _ClassVar[int]
    SPB_DEPTH_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    step_seconds: float
    compute_seconds: float
    comm_seconds: float
    samples_per_second: float
    loss: float
    utilization: float
    peak_memory_bytes: int
    bytes_communicated: int
    spb_depth: float
    def __init__(self, iteration: _Optional[int] = ..., step_seconds: _Optional[float] = ..., compute_seconds: _Optional[float] = ..., comm_seconds: _Optional[float] = ..., samples_per_second: _Optional[float] = ..., loss: _Optional[float] = ..., utilization: _Optional[float] = ..., peak_memory_bytes: _Optional[int] = ..., bytes_communicated: _Optional[int] = ..., spb_depth: _Optional[float] = ...) -> None: ...

class JobIterations(_message.Message):
    __slots__ = ("job_id", "records", "replayed")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    records: _containers.RepeatedCompositeFieldContainer[IterationRecord]
    replayed: bool
    def __init__(self, job_id: _Optional[int] = ..., records: _Optional[_Iterable[_Union[IterationRecord, _Mapping]]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class IterationReports(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobIterations]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobIterations, _Mapping]]] = ...) -> None: ...

class JobExit(_message.Message):
    __slots__ = ("job_id", "outcome", "exit_code", "iteration", "error_tail", "metrics", "attempt")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ERROR_TAIL_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    outcome: Outcome
    exit_code: int
    iteration: int
    error_tail: str
    metrics: _containers.ScalarMap[str, float]
    attempt: int
    def __init__(self, job_id: _Optional[int] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., exit_code: _Optional[int] = ..., iteration: _Optional[int] = ..., error_tail: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., attempt: _Optional[int] = ...) -> None: ...

class LogTail(_message.Message):
    __slots__ = ("job_id", "rank", "level", "message")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    rank: int
    level: str
    message: str
    def __init__(self, job_id: _Optional[int] = ..., rank: _Optional[int] = ..., level: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Evaluation(_message.Message):
    __slots__ = ("job_id", "iteration", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    iteration: int
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, job_id: _Optional[int] = ..., iteration: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ModelProfileReport(_message.Message):
    __slots__ = ("job_id", "workload", "device_kind", "profile_json")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    DEVICE_KIND_FIELD_NUMBER: _ClassVar[int]
    PROFILE_JSON_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    workload: str
    device_kind: str
    profile_json: str
    def __init__(self, job_id: _Optional[int] = ..., workload: _Optional[str] = ..., device_kind: _Optional[str] = ..., profile_json: _Optional[str] = ...) -> None: ...

class SchedulerMessage(_message.Message):
    __slots__ = ("launch", "stop", "suspend", "resume", "reconfigure")
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    RECONFIGURE_FIELD_NUMBER: _ClassVar[int]
    launch: LaunchCommand
    stop: StopCommand
    suspend: SuspendCommand
    resume: LaunchCommand
    reconfigure: ReconfigureCommand
    def __init__(self, launch: _Optional[_Union[LaunchCommand, _Mapping]] = ..., stop: _Optional[_Union[StopCommand, _Mapping]] = ..., suspend: _Optional[_Union[SuspendCommand, _Mapping]] = ..., resume: _Optional[_Union[LaunchCommand, _Mapping]] = ..., reconfigure: _Optional[_Union[ReconfigureCommand, _Mapping]] = ...) -> None: ...

class RankAssignment(_message.Message):
    __slots__ = ("rank", "gpu_index")
    RANK_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    rank: int
    gpu_index: int
    def __init__(self, rank: _Optional[int] = ..., gpu_index: _Optional[int] = ...) -> None: ...

class LaunchCommand(_message.Message):
    __slots__ = ("job_id", "spec_json", "ranks", "world_size", "master_addr", "master_port", "start_iteration", "lease_iterations", "spb_json", "config_version", "checkpoint_dir", "checkpoint_every", "attempt")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    START_ITERATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    SPB_JSON_FIELD_NUMBER: _ClassVar[int]
    CONFIG_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    spec_json: str
    ranks: _containers.RepeatedCompositeFieldContainer[RankAssignment]
    world_size: int
    master_addr: str
    master_port: int
    start_iteration: int
    lease_iterations: int
    spb_json: str
    config_version: int
    checkpoint_dir: str
    checkpoint_every: int
    attempt: int
    def __init__(self, job_id: _Optional[int] = ..., spec_json: _Optional[str] = ..., ranks: _Optional[_Iterable[_Union[RankAssignment, _Mapping]]] = ..., world_size: _Optional[int] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., start_iteration: _Optional[int] = ..., lease_iterations: _Optional[int] = ..., spb_json: _Optional[str] = ..., config_version: _Optional[int] = ..., checkpoint_dir: _Optional[str] = ..., checkpoint_every: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class StopCommand(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    reason: str
    def __init__(self, job_id: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class SuspendCommand(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    def __init__(self, job_id: _Optional[int] = ...) -> None: ...

class ReconfigureCommand(_message.Message):
    __slots__ = ("job_id", "config_version", "config_json")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    config_version: int
    config_json: str
    def __init__(self, job_id: _Optional[int] = ..., config_version: _Optional[int] = ..., config_json: _Optional[str] = ...) -> None: ...
