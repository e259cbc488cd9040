from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_NONE: _ClassVar[Tier]
    TIER_GPU: _ClassVar[Tier]
    TIER_MEMORY: _ClassVar[Tier]
    TIER_DISK: _ClassVar[Tier]
TIER_UNSPECIFIED: Tier
TIER_NONE: Tier
TIER_GPU: Tier
TIER_MEMORY: Tier
TIER_DISK: Tier

class PutRequest(_message.Message):
    __slots__ = ("namespace", "hash", "size", "data")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    hash: bytes
    size: int
    data: bytes
    def __init__(self, namespace: _Optional[str] = ..., hash: _Optional[bytes] = ..., size: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("already_present",)
    ALREADY_PRESENT_FIELD_NUMBER: _ClassVar[int]
    already_present: bool
    def __init__(self, already_present: _Optional[bool] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("namespace", "hash")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    hash: bytes
    def __init__(self, namespace: _Optional[str] = ..., hash: _Optional[bytes] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("size", "data", "shm_offset", "shm_lease", "device_handle")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SHM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SHM_LEASE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_HANDLE_FIELD_NUMBER: _ClassVar[int]
    size: int
    data: bytes
    shm_offset: int
    shm_lease: int
    device_handle: bytes
    def __init__(self, size: _Optional[int] = ..., data: _Optional[bytes] = ..., shm_offset: _Optional[int] = ..., shm_lease: _Optional[int] = ..., device_handle: _Optional[bytes] = ...) -> None: ...

class BatchGetRequest(_message.Message):
    __slots__ = ("namespace", "hashes")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace: _Optional[str] = ..., hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class BatchGetResponse(_message.Message):
    __slots__ = ("index", "found", "size", "data")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    index: int
    found: bool
    size: int
    data: bytes
    def __init__(self, index: _Optional[int] = ..., found: _Optional[bool] = ..., size: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class BatchLeaseResponse(_message.Message):
    __slots__ = ("blocks",)
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[LeasedBlock]
    def __init__(self, blocks: _Optional[_Iterable[_Union[LeasedBlock, _Mapping]]] = ...) -> None: ...

class LeasedBlock(_message.Message):
    __slots__ = ("found", "size", "shm_offset", "shm_lease")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SHM_LEASE_FIELD_NUMBER: _ClassVar[int]
    found: bool
    size: int
    shm_offset: int
    shm_lease: int
    def __init__(self, found: _Optional[bool] = ..., size: _Optional[int] = ..., shm_offset: _Optional[int] = ..., shm_lease: _Optional[int] = ...) -> None: ...

class ExistsRequest(_message.Message):
    __slots__ = ("namespace", "hash")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    hash: bytes
    def __init__(self, namespace: _Optional[str] = ..., hash: _Optional[bytes] = ...) -> None: ...

class ExistsResponse(_message.Message):
    __slots__ = ("exists", "tier")
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    exists: bool
    tier: Tier
    def __init__(self, exists: _Optional[bool] = ..., tier: _Optional[_Union[Tier, str]] = ...) -> None: ...

class BatchExistsRequest(_message.Message):
    __slots__ = ("namespace", "hashes")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace: _Optional[str] = ..., hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class BatchExistsResponse(_message.Message):
    __slots__ = ("exists",)
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    exists: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, exists: _Optional[_Iterable[bool]] = ...) -> None: ...

class MatchPrefixRequest(_message.Message):
    __slots__ = ("namespace", "hashes")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace: _Optional[str] = ..., hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class MatchPrefixResponse(_message.Message):
    __slots__ = ("matched",)
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    matched: int
    def __init__(self, matched: _Optional[int] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("namespace", "hashes")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace: _Optional[str] = ..., hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class RemoveResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    def __init__(self, removed: _Optional[int] = ...) -> None: ...

class PrefetchRequest(_message.Message):
    __slots__ = ("namespace", "hashes")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace: _Optional[str] = ..., hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class PrefetchResponse(_message.Message):
    __slots__ = ("staged", "already_fast", "missing")
    STAGED_FIELD_NUMBER: _ClassVar[int]
    ALREADY_FAST_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    staged: int
    already_fast: int
    missing: int
    def __init__(self, staged: _Optional[int] = ..., already_fast: _Optional[int] = ..., missing: _Optional[int] = ...) -> None: ...

class EstimateLoadRequest(_message.Message):
    __slots__ = ("namespace", "hashes", "block_bytes")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    hashes: _containers.RepeatedScalarFieldContainer[bytes]
    block_bytes: int
    def __init__(self, namespace: _Optional[str] = ..., hashes: _Optional[_Iterable[bytes]] = ..., block_bytes: _Optional[int] = ...) -> None: ...

class BlockLoad(_message.Message):
    __slots__ = ("tier", "load_us")
    TIER_FIELD_NUMBER: _ClassVar[int]
    LOAD_US_FIELD_NUMBER: _ClassVar[int]
    tier: Tier
    load_us: float
    def __init__(self, tier: _Optional[_Union[Tier, str]] = ..., load_us: _Optional[float] = ...) -> None: ...

class EstimateLoadResponse(_message.Message):
    __slots__ = ("blocks", "matched", "total_us")
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_US_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[BlockLoad]
    matched: int
    total_us: float
    def __init__(self, blocks: _Optional[_Iterable[_Union[BlockLoad, _Mapping]]] = ..., matched: _Optional[int] = ..., total_us: _Optional[float] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ("version", "api", "max_block_bytes")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    API_FIELD_NUMBER: _ClassVar[int]
    MAX_BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    version: str
    api: str
    max_block_bytes: int
    def __init__(self, version: _Optional[str] = ..., api: _Optional[str] = ..., max_block_bytes: _Optional[int] = ...) -> None: ...
