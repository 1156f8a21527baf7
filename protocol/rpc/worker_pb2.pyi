from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "logprobs", "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_p", "structured")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: int
    ignore_eos: bool
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logit_bias: _containers.RepeatedCompositeFieldContainer[LogitBias]
    min_p: float
    structured: StructuredOutput
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[int] = ..., ignore_eos: _Optional[bool] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., logit_bias: _Optional[_Iterable[_Union[LogitBias, _Mapping]]] = ..., min_p: _Optional[float] = ..., structured: _Optional[_Union[StructuredOutput, _Mapping]] = ...) -> None: ...

class LogitBias(_message.Message):
    __slots__ = ("token_id", "bias")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    bias: float
    def __init__(self, token_id: _Optional[int] = ..., bias: _Optional[float] = ...) -> None: ...

class StructuredOutput(_message.Message):
    __slots__ = ("kind", "spec")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    kind: str
    spec: str
    def __init__(self, kind: _Optional[str] = ..., spec: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "tenant", "key_id", "kind", "messages_json", "prompt", "tools_json", "assistant_prefix", "params", "agent_killed", "history")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_JSON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    ASSISTANT_PREFIX_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    AGENT_KILLED_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    key_id: str
    kind: str
    messages_json: str
    prompt: str
    tools_json: str
    assistant_prefix: str
    params: SamplingParams
    agent_killed: bool
    history: _containers.RepeatedCompositeFieldContainer[StateBlob]
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., key_id: _Optional[str] = ..., kind: _Optional[str] = ..., messages_json: _Optional[str] = ..., prompt: _Optional[str] = ..., tools_json: _Optional[str] = ..., assistant_prefix: _Optional[str] = ..., params: _Optional[_Union[SamplingParams, _Mapping]] = ..., agent_killed: _Optional[bool] = ..., history: _Optional[_Iterable[_Union[StateBlob, _Mapping]]] = ...) -> None: ...

class StateBlob(_message.Message):
    __slots__ = ("id", "blob")
    ID_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    id: str
    blob: bytes
    def __init__(self, id: _Optional[str] = ..., blob: _Optional[bytes] = ...) -> None: ...

class SealStateRequest(_message.Message):
    __slots__ = ("tenant", "key_id", "id", "document_json")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key_id: str
    id: str
    document_json: str
    def __init__(self, tenant: _Optional[str] = ..., key_id: _Optional[str] = ..., id: _Optional[str] = ..., document_json: _Optional[str] = ...) -> None: ...

class SealStateReply(_message.Message):
    __slots__ = ("blob", "version")
    BLOB_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    blob: bytes
    version: str
    def __init__(self, blob: _Optional[bytes] = ..., version: _Optional[str] = ...) -> None: ...

class OpenStateRequest(_message.Message):
    __slots__ = ("tenant", "key_id", "state")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key_id: str
    state: StateBlob
    def __init__(self, tenant: _Optional[str] = ..., key_id: _Optional[str] = ..., state: _Optional[_Union[StateBlob, _Mapping]] = ...) -> None: ...

class OpenStateReply(_message.Message):
    __slots__ = ("document_json",)
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    document_json: str
    def __init__(self, document_json: _Optional[str] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token", "logprob", "token_bytes")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BYTES_FIELD_NUMBER: _ClassVar[int]
    token: str
    logprob: float
    token_bytes: bytes
    def __init__(self, token: _Optional[str] = ..., logprob: _Optional[float] = ..., token_bytes: _Optional[bytes] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token", "logprob", "token_bytes", "top")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token: str
    logprob: float
    token_bytes: bytes
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token: _Optional[str] = ..., logprob: _Optional[float] = ..., token_bytes: _Optional[bytes] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class UsageRecord(_message.Message):
    __slots__ = ("payload", "signature", "public_key")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    signature: bytes
    public_key: bytes
    def __init__(self, payload: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., public_key: _Optional[bytes] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "prompt_tokens", "completion_tokens", "logprobs", "usage")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    usage: UsageRecord
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., usage: _Optional[_Union[UsageRecord, _Mapping]] = ...) -> None: ...

class SealedRequest(_message.Message):
    __slots__ = ("request_id", "tenant", "key_id", "model", "endpoint", "worker_key_id", "body", "agent_killed", "history", "store_id", "file_id", "store_base")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    WORKER_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    AGENT_KILLED_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    STORE_ID_FIELD_NUMBER: _ClassVar[int]
    FILE_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_BASE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    key_id: str
    model: str
    endpoint: str
    worker_key_id: str
    body: bytes
    agent_killed: bool
    history: _containers.RepeatedCompositeFieldContainer[StateBlob]
    store_id: str
    file_id: str
    store_base: StoreSnapshotRef
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., key_id: _Optional[str] = ..., model: _Optional[str] = ..., endpoint: _Optional[str] = ..., worker_key_id: _Optional[str] = ..., body: _Optional[bytes] = ..., agent_killed: _Optional[bool] = ..., history: _Optional[_Iterable[_Union[StateBlob, _Mapping]]] = ..., store_id: _Optional[str] = ..., file_id: _Optional[str] = ..., store_base: _Optional[_Union[StoreSnapshotRef, _Mapping]] = ...) -> None: ...

class SealedChunk(_message.Message):
    __slots__ = ("data", "usage", "stored_state", "state_version", "conversation_state", "sealed_file")
    DATA_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    STORED_STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_STATE_FIELD_NUMBER: _ClassVar[int]
    SEALED_FILE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    usage: UsageRecord
    stored_state: StateBlob
    state_version: str
    conversation_state: StateBlob
    sealed_file: SealedFile
    def __init__(self, data: _Optional[bytes] = ..., usage: _Optional[_Union[UsageRecord, _Mapping]] = ..., stored_state: _Optional[_Union[StateBlob, _Mapping]] = ..., state_version: _Optional[str] = ..., conversation_state: _Optional[_Union[StateBlob, _Mapping]] = ..., sealed_file: _Optional[_Union[SealedFile, _Mapping]] = ...) -> None: ...

class SealedFile(_message.Message):
    __slots__ = ("file_id", "blob", "key_version", "filename", "purpose", "bytes")
    FILE_ID_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    KEY_VERSION_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    file_id: str
    blob: bytes
    key_version: str
    filename: str
    purpose: str
    bytes: int
    def __init__(self, file_id: _Optional[str] = ..., blob: _Optional[bytes] = ..., key_version: _Optional[str] = ..., filename: _Optional[str] = ..., purpose: _Optional[str] = ..., bytes: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("status", "worker_status")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WORKER_STATUS_FIELD_NUMBER: _ClassVar[int]
    status: str
    worker_status: str
    def __init__(self, status: _Optional[str] = ..., worker_status: _Optional[str] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("tenant", "key_id", "kind", "messages_json", "prompt", "tools_json", "add_generation_prompt", "return_token_strs")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_JSON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    RETURN_TOKEN_STRS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key_id: str
    kind: str
    messages_json: str
    prompt: str
    tools_json: str
    add_generation_prompt: bool
    return_token_strs: bool
    def __init__(self, tenant: _Optional[str] = ..., key_id: _Optional[str] = ..., kind: _Optional[str] = ..., messages_json: _Optional[str] = ..., prompt: _Optional[str] = ..., tools_json: _Optional[str] = ..., add_generation_prompt: _Optional[bool] = ..., return_token_strs: _Optional[bool] = ...) -> None: ...

class TokenizeReply(_message.Message):
    __slots__ = ("tokens", "token_strs", "max_model_len")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_STRS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    token_strs: _containers.RepeatedScalarFieldContainer[str]
    max_model_len: int
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., token_strs: _Optional[_Iterable[str]] = ..., max_model_len: _Optional[int] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("tenant", "key_id", "tokens")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key_id: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tenant: _Optional[str] = ..., key_id: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeReply(_message.Message):
    __slots__ = ("prompt",)
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    def __init__(self, prompt: _Optional[str] = ...) -> None: ...

class EmbedInput(_message.Message):
    __slots__ = ("text", "token_ids")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("request_id", "tenant", "key_id", "model", "inputs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    key_id: str
    model: str
    inputs: _containers.RepeatedCompositeFieldContainer[EmbedInput]
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., key_id: _Optional[str] = ..., model: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[EmbedInput, _Mapping]]] = ...) -> None: ...

class EmbedReply(_message.Message):
    __slots__ = ("vectors", "dimensions", "prompt_tokens", "usage")
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    vectors: bytes
    dimensions: int
    prompt_tokens: int
    usage: UsageRecord
    def __init__(self, vectors: _Optional[bytes] = ..., dimensions: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., usage: _Optional[_Union[UsageRecord, _Mapping]] = ...) -> None: ...

class SealFileRequest(_message.Message):
    __slots__ = ("tenant", "key_id", "file_id", "content")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    FILE_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key_id: str
    file_id: str
    content: bytes
    def __init__(self, tenant: _Optional[str] = ..., key_id: _Optional[str] = ..., file_id: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...

class SealedBlob(_message.Message):
    __slots__ = ("blob", "version", "key_version", "made")
    BLOB_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KEY_VERSION_FIELD_NUMBER: _ClassVar[int]
    MADE_FIELD_NUMBER: _ClassVar[int]
    blob: bytes
    version: int
    key_version: str
    made: StoreSnapshotRef
    def __init__(self, blob: _Optional[bytes] = ..., version: _Optional[int] = ..., key_version: _Optional[str] = ..., made: _Optional[_Union[StoreSnapshotRef, _Mapping]] = ...) -> None: ...

class IngestFileRequest(_message.Message):
    __slots__ = ("tenant", "key_id", "store_id", "snapshot", "file_id", "filename", "file_blob", "attributes_json", "chunking_json", "base")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    FILE_ID_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    FILE_BLOB_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_JSON_FIELD_NUMBER: _ClassVar[int]
    CHUNKING_JSON_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key_id: str
    store_id: str
    snapshot: bytes
    file_id: str
    filename: str
    file_blob: bytes
    attributes_json: str
    chunking_json: str
    base: StoreSnapshotRef
    def __init__(self, tenant: _Optional[str] = ..., key_id: _Optional[str] = ..., store_id: _Optional[str] = ..., snapshot: _Optional[bytes] = ..., file_id: _Optional[str] = ..., filename: _Optional[str] = ..., file_blob: _Optional[bytes] = ..., attributes_json: _Optional[str] = ..., chunking_json: _Optional[str] = ..., base: _Optional[_Union[StoreSnapshotRef, _Mapping]] = ...) -> None: ...

class IngestFileReply(_message.Message):
    __slots__ = ("snapshot", "usage_bytes", "chunking_json", "error_code", "error_message", "made")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    USAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKING_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MADE_FIELD_NUMBER: _ClassVar[int]
    snapshot: SealedBlob
    usage_bytes: int
    chunking_json: str
    error_code: str
    error_message: str
    made: StoreSnapshotRef
    def __init__(self, snapshot: _Optional[_Union[SealedBlob, _Mapping]] = ..., usage_bytes: _Optional[int] = ..., chunking_json: _Optional[str] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., made: _Optional[_Union[StoreSnapshotRef, _Mapping]] = ...) -> None: ...

class SearchStoreRequest(_message.Message):
    __slots__ = ("tenant", "key_id", "store_id", "snapshot", "query", "max_num_results", "filters_json", "has_score_threshold", "score_threshold", "rewrite_query", "caller", "base")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_RESULTS_FIELD_NUMBER: _ClassVar[int]
    FILTERS_JSON_FIELD_NUMBER: _ClassVar[int]
    HAS_SCORE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    SCORE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    REWRITE_QUERY_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key_id: str
    store_id: str
    snapshot: bytes
    query: str
    max_num_results: int
    filters_json: str
    has_score_threshold: bool
    score_threshold: float
    rewrite_query: bool
    caller: str
    base: StoreSnapshotRef
    def __init__(self, tenant: _Optional[str] = ..., key_id: _Optional[str] = ..., store_id: _Optional[str] = ..., snapshot: _Optional[bytes] = ..., query: _Optional[str] = ..., max_num_results: _Optional[int] = ..., filters_json: _Optional[str] = ..., has_score_threshold: _Optional[bool] = ..., score_threshold: _Optional[float] = ..., rewrite_query: _Optional[bool] = ..., caller: _Optional[str] = ..., base: _Optional[_Union[StoreSnapshotRef, _Mapping]] = ...) -> None: ...

class SearchStoreReply(_message.Message):
    __slots__ = ("results_json", "file_ids")
    RESULTS_JSON_FIELD_NUMBER: _ClassVar[int]
    FILE_IDS_FIELD_NUMBER: _ClassVar[int]
    results_json: str
    file_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, results_json: _Optional[str] = ..., file_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteStoreFileRequest(_message.Message):
    __slots__ = ("tenant", "key_id", "store_id", "snapshot", "file_id", "base")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    FILE_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key_id: str
    store_id: str
    snapshot: bytes
    file_id: str
    base: StoreSnapshotRef
    def __init__(self, tenant: _Optional[str] = ..., key_id: _Optional[str] = ..., store_id: _Optional[str] = ..., snapshot: _Optional[bytes] = ..., file_id: _Optional[str] = ..., base: _Optional[_Union[StoreSnapshotRef, _Mapping]] = ...) -> None: ...

class StoreSnapshotRef(_message.Message):
    __slots__ = ("store_id", "version", "sha256")
    STORE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    store_id: str
    version: int
    sha256: bytes
    def __init__(self, store_id: _Optional[str] = ..., version: _Optional[int] = ..., sha256: _Optional[bytes] = ...) -> None: ...

class StoreSnapshotSegment(_message.Message):
    __slots__ = ("tenant", "ref", "index", "count", "total_bytes", "data")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    ref: StoreSnapshotRef
    index: int
    count: int
    total_bytes: int
    data: bytes
    def __init__(self, tenant: _Optional[str] = ..., ref: _Optional[_Union[StoreSnapshotRef, _Mapping]] = ..., index: _Optional[int] = ..., count: _Optional[int] = ..., total_bytes: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class StoreSnapshotAck(_message.Message):
    __slots__ = ("ref",)
    REF_FIELD_NUMBER: _ClassVar[int]
    ref: StoreSnapshotRef
    def __init__(self, ref: _Optional[_Union[StoreSnapshotRef, _Mapping]] = ...) -> None: ...

class ReadStoreSnapshotRequest(_message.Message):
    __slots__ = ("tenant", "ref")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    ref: StoreSnapshotRef
    def __init__(self, tenant: _Optional[str] = ..., ref: _Optional[_Union[StoreSnapshotRef, _Mapping]] = ...) -> None: ...
