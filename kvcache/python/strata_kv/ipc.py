"""Device handles of the daemon's GPU tier (``gds/src/ipc.rs``): parsing the wire form,
and opening a CUDA handle in this process.

A Get asked with ``device=True`` (see :meth:`strata_kv.KvClient.get_view`) of a block
resident in the GPU tier is answered with a handle and a lease instead of the bytes:

- an *emulated* device's handle names the daemon's device memory (a memfd the client
  received over the side socket beside the arena) and an offset: the block is read in
  place there, like an arena lease;
- a *CUDA* handle is a ``cuIpcGetMemHandle`` of the block's allocation: it is opened
  with ``cuIpcOpenMemHandle`` (the driver library, through ctypes; no extra package)
  and exposed as a CUDA ``torch`` tensor that the engine copies device-to-device into
  its KV cache. CUDA IPC needs the same GPU (or peer access) and another process.

The lease keeps the block's device memory alive until released, even if the key is
evicted meanwhile.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from typing import Optional

MAGIC = b"SGIP"
KIND_EMULATED, KIND_CUDA = 0, 1


@dataclass(frozen=True)
class IpcHandle:
    kind: int
    length: int
    crc: int
    offset: int
    token: bytes

    @property
    def kind_name(self) -> str:
        return {KIND_EMULATED: "emulated", KIND_CUDA: "cuda"}.get(self.kind, "unknown")


def parse_handle(b: bytes) -> IpcHandle:
    """Reads the wire form (versions 1 and 2); ``ValueError`` if malformed."""
    if len(b) < 22 or b[:4] != MAGIC:
        raise ValueError("bad device handle: too short or wrong magic")
    version, kind = b[4], b[5]
    if version not in (1, 2) or kind not in (KIND_EMULATED, KIND_CUDA):
        raise ValueError(f"bad device handle: version {version}, kind {kind}")
    length, crc, tlen = struct.unpack_from(">QII", b, 6)
    tail = 0 if version == 1 else 8
    if len(b) != 22 + tlen + tail:
        raise ValueError("bad device handle: length")
    token = bytes(b[22 : 22 + tlen])
    offset = 0 if version == 1 else struct.unpack_from(">Q", b, 22 + tlen)[0]
    return IpcHandle(kind, length, crc, offset, token)


class _CuIpcMemHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


_libcuda = None


def _cuda():
    global _libcuda
    if _libcuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), _CuIpcMemHandle, ctypes.c_uint]
        lib.cuIpcCloseMemHandle.argtypes = [ctypes.c_uint64]
        _libcuda = lib
    return _libcuda


class _CudaArray:
    """A device pointer in the ``__cuda_array_interface__`` shape torch understands."""

    def __init__(self, ptr: int, n: int):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, True),
                                         "version": 3, "strides": None}


class CudaMapping:
    """An opened CUDA handle: ``tensor`` is a uint8 CUDA tensor over the block (only
    read from); :meth:`close` unmaps it (call before releasing the lease)."""

    def __init__(self, handle: IpcHandle, device: Optional[int] = None):
        import torch

        if handle.kind != KIND_CUDA or len(handle.token) != 64:
            raise ValueError("not a CUDA IPC handle")
        torch.cuda.init()  # the primary context current on this thread
        if device is not None:
            torch.cuda.set_device(device)
        torch.cuda.current_stream().synchronize()
        raw = _CuIpcMemHandle()
        raw.reserved = handle.token
        base = ctypes.c_uint64(0)
        lazy_peer = 1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        rc = _cuda().cuIpcOpenMemHandle_v2(ctypes.byref(base), raw, lazy_peer)
        if rc != 0:
            raise OSError(f"cuIpcOpenMemHandle failed: CUresult {rc}")
        self._base = base.value
        self.tensor = torch.as_tensor(_CudaArray(self._base + handle.offset, handle.length), device="cuda")

    def close(self) -> None:
        if self._base:
            import torch

            torch.cuda.current_stream().synchronize()  # copies out of it are done
            self.tensor = None
            _cuda().cuIpcCloseMemHandle(self._base)
            self._base = 0
