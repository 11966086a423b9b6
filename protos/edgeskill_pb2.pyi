from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Envelope(_message.Message):
    __slots__ = ("id", "device_id", "sent_at_ms", "correlation_id", "register", "welcome", "heartbeat", "desired", "reported", "telemetry", "ack", "error", "signed_desired", "security_event", "drift_samples", "metadata")
    ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_MS_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    REPORTED_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SIGNED_DESIRED_FIELD_NUMBER: _ClassVar[int]
    SECURITY_EVENT_FIELD_NUMBER: _ClassVar[int]
    DRIFT_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    id: str
    device_id: str
    sent_at_ms: int
    correlation_id: str
    register: Register
    welcome: Welcome
    heartbeat: Heartbeat
    desired: DesiredState
    reported: ReportedState
    telemetry: Telemetry
    ack: Ack
    error: Error
    signed_desired: SignedDesired
    security_event: SecurityEvent
    drift_samples: DriftSamples
    metadata: MetadataOffer
    def __init__(self, id: _Optional[str] = ..., device_id: _Optional[str] = ..., sent_at_ms: _Optional[int] = ..., correlation_id: _Optional[str] = ..., register: _Optional[_Union[Register, _Mapping]] = ..., welcome: _Optional[_Union[Welcome, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., desired: _Optional[_Union[DesiredState, _Mapping]] = ..., reported: _Optional[_Union[ReportedState, _Mapping]] = ..., telemetry: _Optional[_Union[Telemetry, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., signed_desired: _Optional[_Union[SignedDesired, _Mapping]] = ..., security_event: _Optional[_Union[SecurityEvent, _Mapping]] = ..., drift_samples: _Optional[_Union[DriftSamples, _Mapping]] = ..., metadata: _Optional[_Union[MetadataOffer, _Mapping]] = ...) -> None: ...

class HardwareProfile(_message.Message):
    __slots__ = ("arch", "accelerator", "board", "targets", "cpu_count", "memory_bytes")
    ARCH_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    BOARD_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    arch: str
    accelerator: str
    board: str
    targets: _containers.RepeatedScalarFieldContainer[str]
    cpu_count: int
    memory_bytes: int
    def __init__(self, arch: _Optional[str] = ..., accelerator: _Optional[str] = ..., board: _Optional[str] = ..., targets: _Optional[_Iterable[str]] = ..., cpu_count: _Optional[int] = ..., memory_bytes: _Optional[int] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("labels", "profile", "agent_version", "installed_generation")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    INSTALLED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.ScalarMap[str, str]
    profile: HardwareProfile
    agent_version: str
    installed_generation: int
    def __init__(self, labels: _Optional[_Mapping[str, str]] = ..., profile: _Optional[_Union[HardwareProfile, _Mapping]] = ..., agent_version: _Optional[str] = ..., installed_generation: _Optional[int] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("heartbeat_s",)
    HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    heartbeat_s: int
    def __init__(self, heartbeat_s: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("uptime_s",)
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    uptime_s: int
    def __init__(self, uptime_s: _Optional[int] = ...) -> None: ...

class SkillSpec(_message.Message):
    __slots__ = ("name", "version", "target_name", "config")
    class ConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGET_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    target_name: str
    config: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., target_name: _Optional[str] = ..., config: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DesiredState(_message.Message):
    __slots__ = ("generation", "skills")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    SKILLS_FIELD_NUMBER: _ClassVar[int]
    generation: int
    skills: _containers.RepeatedCompositeFieldContainer[SkillSpec]
    def __init__(self, generation: _Optional[int] = ..., skills: _Optional[_Iterable[_Union[SkillSpec, _Mapping]]] = ...) -> None: ...

class SignedDesired(_message.Message):
    __slots__ = ("instruction",)
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    instruction: bytes
    def __init__(self, instruction: _Optional[bytes] = ...) -> None: ...

class MetadataFile(_message.Message):
    __slots__ = ("path", "data")
    PATH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    path: str
    data: bytes
    def __init__(self, path: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class MetadataOffer(_message.Message):
    __slots__ = ("root_version", "files")
    ROOT_VERSION_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    root_version: int
    files: _containers.RepeatedCompositeFieldContainer[MetadataFile]
    def __init__(self, root_version: _Optional[int] = ..., files: _Optional[_Iterable[_Union[MetadataFile, _Mapping]]] = ...) -> None: ...

class SecurityEvent(_message.Message):
    __slots__ = ("kind", "reason", "detail", "count", "subject")
    KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    kind: str
    reason: str
    detail: str
    count: int
    subject: str
    def __init__(self, kind: _Optional[str] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ..., count: _Optional[int] = ..., subject: _Optional[str] = ...) -> None: ...

class SkillStatus(_message.Message):
    __slots__ = ("name", "version", "state", "error", "desired_version", "previous_version", "variant")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DESIRED_VERSION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_VERSION_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    state: str
    error: str
    desired_version: str
    previous_version: str
    variant: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., state: _Optional[str] = ..., error: _Optional[str] = ..., desired_version: _Optional[str] = ..., previous_version: _Optional[str] = ..., variant: _Optional[str] = ...) -> None: ...

class ReportedState(_message.Message):
    __slots__ = ("generation", "skills")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    SKILLS_FIELD_NUMBER: _ClassVar[int]
    generation: int
    skills: _containers.RepeatedCompositeFieldContainer[SkillStatus]
    def __init__(self, generation: _Optional[int] = ..., skills: _Optional[_Iterable[_Union[SkillStatus, _Mapping]]] = ...) -> None: ...

class Telemetry(_message.Message):
    __slots__ = ("skill", "version", "inferences", "labelled", "correct", "latency_p50_ms", "latency_p99_ms", "window_start_ms", "window_end_ms", "dropped_messages", "metrics", "latency_p95_ms", "errors")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SKILL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INFERENCES_FIELD_NUMBER: _ClassVar[int]
    LABELLED_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P50_MS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P99_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_END_MS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P95_MS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    skill: str
    version: str
    inferences: int
    labelled: int
    correct: int
    latency_p50_ms: float
    latency_p99_ms: float
    window_start_ms: int
    window_end_ms: int
    dropped_messages: int
    metrics: _containers.ScalarMap[str, float]
    latency_p95_ms: float
    errors: int
    def __init__(self, skill: _Optional[str] = ..., version: _Optional[str] = ..., inferences: _Optional[int] = ..., labelled: _Optional[int] = ..., correct: _Optional[int] = ..., latency_p50_ms: _Optional[float] = ..., latency_p99_ms: _Optional[float] = ..., window_start_ms: _Optional[int] = ..., window_end_ms: _Optional[int] = ..., dropped_messages: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., latency_p95_ms: _Optional[float] = ..., errors: _Optional[int] = ...) -> None: ...

class DriftSample(_message.Message):
    __slots__ = ("input", "predicted", "confidence", "label", "seen_at_ms")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SEEN_AT_MS_FIELD_NUMBER: _ClassVar[int]
    input: TensorProto
    predicted: int
    confidence: float
    label: int
    seen_at_ms: int
    def __init__(self, input: _Optional[_Union[TensorProto, _Mapping]] = ..., predicted: _Optional[int] = ..., confidence: _Optional[float] = ..., label: _Optional[int] = ..., seen_at_ms: _Optional[int] = ...) -> None: ...

class DriftSamples(_message.Message):
    __slots__ = ("skill", "version", "samples")
    SKILL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    skill: str
    version: str
    samples: _containers.RepeatedCompositeFieldContainer[DriftSample]
    def __init__(self, skill: _Optional[str] = ..., version: _Optional[str] = ..., samples: _Optional[_Iterable[_Union[DriftSample, _Mapping]]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("device_id", "path", "offset", "max_bytes")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    path: str
    offset: int
    max_bytes: int
    def __init__(self, device_id: _Optional[str] = ..., path: _Optional[str] = ..., offset: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class FetchChunk(_message.Message):
    __slots__ = ("offset", "data", "total_size", "last")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    total_size: int
    last: bool
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., total_size: _Optional[int] = ..., last: _Optional[bool] = ...) -> None: ...

class TensorProto(_message.Message):
    __slots__ = ("dtype", "shape", "data", "name", "scale", "zero_point")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    ZERO_POINT_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    name: str
    scale: float
    zero_point: int
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., name: _Optional[str] = ..., scale: _Optional[float] = ..., zero_point: _Optional[int] = ...) -> None: ...

class InferRequest(_message.Message):
    __slots__ = ("device_id", "model", "split", "inputs", "skill", "version", "request_id", "deadline_ms")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    SKILL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    model: str
    split: str
    inputs: _containers.RepeatedCompositeFieldContainer[TensorProto]
    skill: str
    version: str
    request_id: str
    deadline_ms: int
    def __init__(self, device_id: _Optional[str] = ..., model: _Optional[str] = ..., split: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[TensorProto, _Mapping]]] = ..., skill: _Optional[str] = ..., version: _Optional[str] = ..., request_id: _Optional[str] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class InferResponse(_message.Message):
    __slots__ = ("outputs", "hub_ms", "queue_ms", "request_id")
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    HUB_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.RepeatedCompositeFieldContainer[TensorProto]
    hub_ms: float
    queue_ms: float
    request_id: str
    def __init__(self, outputs: _Optional[_Iterable[_Union[TensorProto, _Mapping]]] = ..., hub_ms: _Optional[float] = ..., queue_ms: _Optional[float] = ..., request_id: _Optional[str] = ...) -> None: ...

class EnrollRequest(_message.Message):
    __slots__ = ("claim_token", "csr_pem")
    CLAIM_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    claim_token: str
    csr_pem: bytes
    def __init__(self, claim_token: _Optional[str] = ..., csr_pem: _Optional[bytes] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("csr_pem",)
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    csr_pem: bytes
    def __init__(self, csr_pem: _Optional[bytes] = ...) -> None: ...

class EnrollResponse(_message.Message):
    __slots__ = ("certificate_pem", "ca_pem", "director_public_pem", "not_after_ms", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    DIRECTOR_PUBLIC_PEM_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    certificate_pem: bytes
    ca_pem: bytes
    director_public_pem: bytes
    not_after_ms: int
    labels: _containers.ScalarMap[str, str]
    def __init__(self, certificate_pem: _Optional[bytes] = ..., ca_pem: _Optional[bytes] = ..., director_public_pem: _Optional[bytes] = ..., not_after_ms: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...
