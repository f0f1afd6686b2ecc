from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Sharing(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHARING_UNSPECIFIED: _ClassVar[Sharing]
    SHARING_TIME_SLICED: _ClassVar[Sharing]
    SHARING_MPS: _ClassVar[Sharing]

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_SUCCEEDED: _ClassVar[Outcome]
    OUTCOME_FAILED: _ClassVar[Outcome]
    OUTCOME_SUSPENDED: _ClassVar[Outcome]
    OUTCOME_STOPPED: _ClassVar[Outcome]
    OUTCOME_REFUSED: _ClassVar[Outcome]

class Optimizer(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPTIMIZER_UNSPECIFIED: _ClassVar[Optimizer]
    OPTIMIZER_SGD: _ClassVar[Optimizer]
    OPTIMIZER_ADAM: _ClassVar[Optimizer]
    OPTIMIZER_KFAC: _ClassVar[Optimizer]

class TargetMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TARGET_MODE_UNSPECIFIED: _ClassVar[TargetMode]
    TARGET_MODE_MAX: _ClassVar[TargetMode]
    TARGET_MODE_MIN: _ClassVar[TargetMode]

class SPBMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPB_MODE_UNSPECIFIED: _ClassVar[SPBMode]
    SPB_MODE_OFF: _ClassVar[SPBMode]
    SPB_MODE_AUTO: _ClassVar[SPBMode]

class Backprop(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BACKPROP_UNSPECIFIED: _ClassVar[Backprop]
    BACKPROP_STANDARD: _ClassVar[Backprop]
    BACKPROP_OOO: _ClassVar[Backprop]

class PipelineSchedule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PIPELINE_SCHEDULE_UNSPECIFIED: _ClassVar[PipelineSchedule]
    PIPELINE_SCHEDULE_GPIPE: _ClassVar[PipelineSchedule]
    PIPELINE_SCHEDULE_1F1B: _ClassVar[PipelineSchedule]
    PIPELINE_SCHEDULE_ZERO_BUBBLE: _ClassVar[PipelineSchedule]
SHARING_UNSPECIFIED: Sharing
SHARING_TIME_SLICED: Sharing
SHARING_MPS: Sharing
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_SUCCEEDED: Outcome
OUTCOME_FAILED: Outcome
OUTCOME_SUSPENDED: Outcome
OUTCOME_STOPPED: Outcome
OUTCOME_REFUSED: Outcome
OPTIMIZER_UNSPECIFIED: Optimizer
OPTIMIZER_SGD: Optimizer
OPTIMIZER_ADAM: Optimizer
OPTIMIZER_KFAC: Optimizer
TARGET_MODE_UNSPECIFIED: TargetMode
TARGET_MODE_MAX: TargetMode
TARGET_MODE_MIN: TargetMode
SPB_MODE_UNSPECIFIED: SPBMode
SPB_MODE_OFF: SPBMode
SPB_MODE_AUTO: SPBMode
BACKPROP_UNSPECIFIED: Backprop
BACKPROP_STANDARD: Backprop
BACKPROP_OOO: Backprop
PIPELINE_SCHEDULE_UNSPECIFIED: PipelineSchedule
PIPELINE_SCHEDULE_GPIPE: PipelineSchedule
PIPELINE_SCHEDULE_1F1B: PipelineSchedule
PIPELINE_SCHEDULE_ZERO_BUBBLE: PipelineSchedule

class CodeRequest(_message.Message):
    __slots__ = ("node_name", "instance", "job_id", "digest")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    instance: str
    job_id: int
    digest: str
    def __init__(self, node_name: _Optional[str] = ..., instance: _Optional[str] = ..., job_id: _Optional[int] = ..., digest: _Optional[str] = ...) -> None: ...

class CodeChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "kind", "memory_bytes", "virtual", "sharing", "max_jobs")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    VIRTUAL_FIELD_NUMBER: _ClassVar[int]
    SHARING_FIELD_NUMBER: _ClassVar[int]
    MAX_JOBS_FIELD_NUMBER: _ClassVar[int]
    index: int
    kind: str
    memory_bytes: int
    virtual: bool
    sharing: Sharing
    max_jobs: int
    def __init__(self, index: _Optional[int] = ..., kind: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., virtual: _Optional[bool] = ..., sharing: _Optional[_Union[Sharing, str]] = ..., max_jobs: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("hello", "heartbeat", "reports", "exit", "log", "evaluation", "profile", "shrunk")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    EXIT_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    SHRUNK_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    heartbeat: Heartbeat
    reports: IterationReports
    exit: JobExit
    log: LogTail
    evaluation: Evaluation
    profile: ModelProfileReport
    shrunk: JobShrunk
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., reports: _Optional[_Union[IterationReports, _Mapping]] = ..., exit: _Optional[_Union[JobExit, _Mapping]] = ..., log: _Optional[_Union[LogTail, _Mapping]] = ..., evaluation: _Optional[_Union[Evaluation, _Mapping]] = ..., profile: _Optional[_Union[ModelProfileReport, _Mapping]] = ..., shrunk: _Optional[_Union[JobShrunk, _Mapping]] = ...) -> None: ...

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
    __slots__ = ("job_id", "ranks", "attempt", "rendezvous_ports")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_PORTS_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    ranks: _containers.RepeatedCompositeFieldContainer[RankAssignment]
    attempt: int
    rendezvous_ports: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, job_id: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[RankAssignment, _Mapping]]] = ..., attempt: _Optional[int] = ..., rendezvous_ports: _Optional[_Iterable[int]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IterationRecord(_message.Message):
    __slots__ = ("iteration", "step_seconds", "compute_seconds", "comm_seconds", "samples_per_second", "loss", "utilization", "peak_memory_bytes", "bytes_communicated", "spb_depth", "grad_sqr", "grad_var", "batch_size", "learning_rate", "co_runners", "workers", "progress")
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
    GRAD_SQR_FIELD_NUMBER: _ClassVar[int]
    GRAD_VAR_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    CO_RUNNERS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
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
    grad_sqr: float
    grad_var: float
    batch_size: int
    learning_rate: float
    co_runners: int
    workers: int
    progress: float
    def __init__(self, iteration: _Optional[int] = ..., step_seconds: _Optional[float] = ..., compute_seconds: _Optional[float] = ..., comm_seconds: _Optional[float] = ..., samples_per_second: _Optional[float] = ..., loss: _Optional[float] = ..., utilization: _Optional[float] = ..., peak_memory_bytes: _Optional[int] = ..., bytes_communicated: _Optional[int] = ..., spb_depth: _Optional[float] = ..., grad_sqr: _Optional[float] = ..., grad_var: _Optional[float] = ..., batch_size: _Optional[int] = ..., learning_rate: _Optional[float] = ..., co_runners: _Optional[int] = ..., workers: _Optional[int] = ..., progress: _Optional[float] = ...) -> None: ...

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
    __slots__ = ("job_id", "workload", "device_kind", "profile", "utilization")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    DEVICE_KIND_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    workload: str
    device_kind: str
    profile: ModelProfile
    utilization: float
    def __init__(self, job_id: _Optional[int] = ..., workload: _Optional[str] = ..., device_kind: _Optional[str] = ..., profile: _Optional[_Union[ModelProfile, _Mapping]] = ..., utilization: _Optional[float] = ...) -> None: ...

class ModelProfile(_message.Message):
    __slots__ = ("workload", "per_worker_batch", "stages", "steps_ratio")
    class StepsRatioEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    PER_WORKER_BATCH_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    STEPS_RATIO_FIELD_NUMBER: _ClassVar[int]
    workload: str
    per_worker_batch: int
    stages: _containers.RepeatedCompositeFieldContainer[StageProfile]
    steps_ratio: _containers.ScalarMap[str, float]
    def __init__(self, workload: _Optional[str] = ..., per_worker_batch: _Optional[int] = ..., stages: _Optional[_Iterable[_Union[StageProfile, _Mapping]]] = ..., steps_ratio: _Optional[_Mapping[str, float]] = ...) -> None: ...

class StageProfile(_message.Message):
    __slots__ = ("forward_seconds", "backward_input_seconds", "backward_weight_seconds", "activation_bytes", "parameter_bytes")
    FORWARD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BACKWARD_INPUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BACKWARD_WEIGHT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_BYTES_FIELD_NUMBER: _ClassVar[int]
    forward_seconds: float
    backward_input_seconds: float
    backward_weight_seconds: float
    activation_bytes: int
    parameter_bytes: int
    def __init__(self, forward_seconds: _Optional[float] = ..., backward_input_seconds: _Optional[float] = ..., backward_weight_seconds: _Optional[float] = ..., activation_bytes: _Optional[int] = ..., parameter_bytes: _Optional[int] = ...) -> None: ...

class SchedulerMessage(_message.Message):
    __slots__ = ("launch", "stop", "suspend", "resume", "reconfigure", "cap", "shrink")
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    RECONFIGURE_FIELD_NUMBER: _ClassVar[int]
    CAP_FIELD_NUMBER: _ClassVar[int]
    SHRINK_FIELD_NUMBER: _ClassVar[int]
    launch: LaunchCommand
    stop: StopCommand
    suspend: SuspendCommand
    resume: LaunchCommand
    reconfigure: ReconfigureCommand
    cap: CapCommand
    shrink: ShrinkCommand
    def __init__(self, launch: _Optional[_Union[LaunchCommand, _Mapping]] = ..., stop: _Optional[_Union[StopCommand, _Mapping]] = ..., suspend: _Optional[_Union[SuspendCommand, _Mapping]] = ..., resume: _Optional[_Union[LaunchCommand, _Mapping]] = ..., reconfigure: _Optional[_Union[ReconfigureCommand, _Mapping]] = ..., cap: _Optional[_Union[CapCommand, _Mapping]] = ..., shrink: _Optional[_Union[ShrinkCommand, _Mapping]] = ...) -> None: ...

class RankAssignment(_message.Message):
    __slots__ = ("rank", "gpu_index")
    RANK_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    rank: int
    gpu_index: int
    def __init__(self, rank: _Optional[int] = ..., gpu_index: _Optional[int] = ...) -> None: ...

class LaunchCommand(_message.Message):
    __slots__ = ("job_id", "spec", "ranks", "world_size", "master_addr", "master_port", "start_iteration", "lease_iterations", "spb", "config_version", "checkpoint_dir", "checkpoint_every", "attempt", "global_batch", "memory_bytes")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    START_ITERATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    SPB_FIELD_NUMBER: _ClassVar[int]
    CONFIG_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    spec: JobSpec
    ranks: _containers.RepeatedCompositeFieldContainer[RankAssignment]
    world_size: int
    master_addr: str
    master_port: int
    start_iteration: int
    lease_iterations: int
    spb: SPBConfig
    config_version: int
    checkpoint_dir: str
    checkpoint_every: int
    attempt: int
    global_batch: int
    memory_bytes: int
    def __init__(self, job_id: _Optional[int] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., ranks: _Optional[_Iterable[_Union[RankAssignment, _Mapping]]] = ..., world_size: _Optional[int] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., start_iteration: _Optional[int] = ..., lease_iterations: _Optional[int] = ..., spb: _Optional[_Union[SPBConfig, _Mapping]] = ..., config_version: _Optional[int] = ..., checkpoint_dir: _Optional[str] = ..., checkpoint_every: _Optional[int] = ..., attempt: _Optional[int] = ..., global_batch: _Optional[int] = ..., memory_bytes: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("job_id", "config_version", "spb")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_VERSION_FIELD_NUMBER: _ClassVar[int]
    SPB_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    config_version: int
    spb: SPBConfig
    def __init__(self, job_id: _Optional[int] = ..., config_version: _Optional[int] = ..., spb: _Optional[_Union[SPBConfig, _Mapping]] = ...) -> None: ...

class CapCommand(_message.Message):
    __slots__ = ("job_id", "memory_bytes")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    memory_bytes: int
    def __init__(self, job_id: _Optional[int] = ..., memory_bytes: _Optional[int] = ...) -> None: ...

class ShrinkCommand(_message.Message):
    __slots__ = ("launch",)
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    launch: LaunchCommand
    def __init__(self, launch: _Optional[_Union[LaunchCommand, _Mapping]] = ...) -> None: ...

class JobShrunk(_message.Message):
    __slots__ = ("job_id", "attempt", "iteration", "ranks")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    attempt: int
    iteration: int
    ranks: _containers.RepeatedCompositeFieldContainer[RankAssignment]
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., iteration: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[RankAssignment, _Mapping]]] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "workload", "hyperparameters", "workers", "max_iterations", "target_metric", "priority", "queue", "spb", "backprop", "ooo_first_k", "pipeline", "max_retries", "eval_every", "code", "elastic", "batch")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    TARGET_METRIC_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SPB_FIELD_NUMBER: _ClassVar[int]
    BACKPROP_FIELD_NUMBER: _ClassVar[int]
    OOO_FIRST_K_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    EVAL_EVERY_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    name: str
    workload: str
    hyperparameters: Hyperparameters
    workers: int
    max_iterations: int
    target_metric: TargetMetric
    priority: int
    queue: str
    spb: SPBSetting
    backprop: Backprop
    ooo_first_k: int
    pipeline: Pipeline
    max_retries: int
    eval_every: int
    code: str
    elastic: Elastic
    batch: BatchPolicy
    def __init__(self, name: _Optional[str] = ..., workload: _Optional[str] = ..., hyperparameters: _Optional[_Union[Hyperparameters, _Mapping]] = ..., workers: _Optional[int] = ..., max_iterations: _Optional[int] = ..., target_metric: _Optional[_Union[TargetMetric, _Mapping]] = ..., priority: _Optional[int] = ..., queue: _Optional[str] = ..., spb: _Optional[_Union[SPBSetting, _Mapping]] = ..., backprop: _Optional[_Union[Backprop, str]] = ..., ooo_first_k: _Optional[int] = ..., pipeline: _Optional[_Union[Pipeline, _Mapping]] = ..., max_retries: _Optional[int] = ..., eval_every: _Optional[int] = ..., code: _Optional[str] = ..., elastic: _Optional[_Union[Elastic, _Mapping]] = ..., batch: _Optional[_Union[BatchPolicy, _Mapping]] = ...) -> None: ...

class Elastic(_message.Message):
    __slots__ = ("min_workers", "max_workers")
    MIN_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_WORKERS_FIELD_NUMBER: _ClassVar[int]
    min_workers: int
    max_workers: int
    def __init__(self, min_workers: _Optional[int] = ..., max_workers: _Optional[int] = ...) -> None: ...

class BatchPolicy(_message.Message):
    __slots__ = ("global_batch", "min", "max", "adaptive")
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    ADAPTIVE_FIELD_NUMBER: _ClassVar[int]
    global_batch: int
    min: int
    max: int
    adaptive: bool
    def __init__(self, global_batch: _Optional[int] = ..., min: _Optional[int] = ..., max: _Optional[int] = ..., adaptive: _Optional[bool] = ...) -> None: ...

class Hyperparameters(_message.Message):
    __slots__ = ("batch_size", "learning_rate", "optimizer", "trial_json")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    TRIAL_JSON_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    learning_rate: float
    optimizer: Optimizer
    trial_json: str
    def __init__(self, batch_size: _Optional[int] = ..., learning_rate: _Optional[float] = ..., optimizer: _Optional[_Union[Optimizer, str]] = ..., trial_json: _Optional[str] = ...) -> None: ...

class TargetMetric(_message.Message):
    __slots__ = ("name", "value", "mode")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: float
    mode: TargetMode
    def __init__(self, name: _Optional[str] = ..., value: _Optional[float] = ..., mode: _Optional[_Union[TargetMode, str]] = ...) -> None: ...

class SPBSetting(_message.Message):
    __slots__ = ("mode", "fixed")
    MODE_FIELD_NUMBER: _ClassVar[int]
    FIXED_FIELD_NUMBER: _ClassVar[int]
    mode: SPBMode
    fixed: SPBConfig
    def __init__(self, mode: _Optional[_Union[SPBMode, str]] = ..., fixed: _Optional[_Union[SPBConfig, _Mapping]] = ...) -> None: ...

class SPBConfig(_message.Message):
    __slots__ = ("full_fraction", "partial_depth", "rotation_period", "stages")
    FULL_FRACTION_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_DEPTH_FIELD_NUMBER: _ClassVar[int]
    ROTATION_PERIOD_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    full_fraction: float
    partial_depth: float
    rotation_period: int
    stages: int
    def __init__(self, full_fraction: _Optional[float] = ..., partial_depth: _Optional[float] = ..., rotation_period: _Optional[int] = ..., stages: _Optional[int] = ...) -> None: ...

class Pipeline(_message.Message):
    __slots__ = ("stages", "schedule", "microbatches")
    STAGES_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    stages: int
    schedule: PipelineSchedule
    microbatches: int
    def __init__(self, stages: _Optional[int] = ..., schedule: _Optional[_Union[PipelineSchedule, str]] = ..., microbatches: _Optional[int] = ...) -> None: ...
