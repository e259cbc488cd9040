"""``KvClient``: Strata's KV service in the shape of an LMCache remote connector
(``exists``, ``batched_contains``, ``get``, ``put``, batched forms, ``close``).

Keys are the block hashes (bytes, 1..64) a client derives, e.g. with
:func:`strata_kv.chain_hashes_v1`; every call works in the client's namespace (model +
tenant) unless given another. Errors are :class:`KvError` with the gRPC status code; a
missing block is ``None``, not an error.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import math
import mmap
import os
import pickle
import socket
import struct
import sys
import threading
import time
import urllib.parse
import warnings
import weakref
from typing import Dict, Iterator, List, Optional, Sequence, Union

import grpc

from ._gen import kv_pb2, kv_pb2_grpc
from .ipc import KIND_CUDA, KIND_EMULATED, CudaMapping, IpcHandle, parse_handle
from .keys import IDENTITY_METADATA, ModelIdentity

#: Size of the messages a put is cut into: the server's default chunk (1 MiB); the
#: server refuses single messages over 4 MiB.
CHUNK_BYTES = 1 << 20
#: The most keys the server takes in one lookup (kvcache/src/server: MAX_BATCH_KEYS)...
MAX_KEYS_PER_CALL = 1 << 16
#: Longest key (hash) the service takes (kvcache/src/blocks.rs).
MAX_KEY_BYTES = 64
#: ...and the key bytes one message may carry under its 4 MiB bound, with room for
#: each key's field header and the namespace.
MAX_KEY_BYTES_PER_CALL = 3 << 20
#: The longest namespace the server takes (bytes of UTF-8).
MAX_NAMESPACE_BYTES = 128
#: The most Get streams :meth:`KvClient.get_views` keeps open at once (when it cannot
#: lease the batch in one call).
GETS_IN_FLIGHT = 128


def key_batches(keys: Sequence[bytes]) -> Iterator[Sequence[bytes]]:
    """``keys`` cut into runs the server takes in one call (at most
    :data:`MAX_KEYS_PER_CALL` keys and :data:`MAX_KEY_BYTES_PER_CALL` bytes): a long
    prompt's lookup is several calls, not one the server refuses (black-box finding: a
    32-layer model's layer keys passed 65,536 at ~33k tokens, and every such prompt
    missed, its saves never found again)."""
    start, size = 0, 0
    for i, k in enumerate(keys):
        n = len(k) + 3
        if i > start and (i - start >= MAX_KEYS_PER_CALL or size + n > MAX_KEY_BYTES_PER_CALL):
            yield keys[start:i]
            start, size = i, 0
        size += n
    if start < len(keys) or not keys:
        yield keys[start:]


def _is_control(c: str) -> bool:
    """A control character, as the server's check sees one (Rust's `char::is_control`)."""
    return ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0


def _namespace_text(namespace) -> str:
    """``namespace`` if it is text UTF-8 can carry, else a clear ``TypeError`` or
    ``ValueError`` (black-box finding: a per-call ``namespace=7``, or a lone surrogate as a
    non-UTF-8 path decodes to, failed ``put`` as UNKNOWN "Exception iterating requests!"
    and ``get`` as a bare ``UnicodeEncodeError``)."""
    if not isinstance(namespace, str):
        raise TypeError(f"a namespace is a str, not {type(namespace).__name__}")
    try:
        namespace.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"namespace {namespace!r} is not valid Unicode (a lone surrogate, "
                         "as undecodable bytes of a path or environment variable become)") from None
    return namespace


def check_namespace(namespace: str) -> str:
    """``namespace`` if the server takes it, else ``ValueError`` saying why (a client
    built with one it refuses would fail every call)."""
    n = len(_namespace_text(namespace).encode("utf-8"))
    if not 1 <= n <= MAX_NAMESPACE_BYTES:
        raise ValueError(f"namespace must be 1..={MAX_NAMESPACE_BYTES} bytes of UTF-8, "
                         f"got {n}: {namespace[:60]!r}...")
    if any(map(_is_control, namespace)):
        raise ValueError(f"namespace {namespace!r} contains control characters")
    return namespace


def config_flag(name: str, value: object) -> bool:
    """An on/off option from an engine's extra config, which may come as a string from
    a template, an environment variable or a shell (black-box finding: ``"false"`` was
    read as on, since ``bool("false")`` is True). Anything else is a ``ValueError``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("true", "1", "yes", "on"):
            return True
        if v in ("false", "0", "no", "off", ""):
            return False
    raise ValueError(f"option {name!r} must be true or false, got {value!r}")


def namespace_from_name(name: str) -> str:
    """A namespace for a model named ``name`` (a hub id, or a local path, which may be
    long: a Hugging Face snapshot path is ~136 bytes): ``name`` when the server takes
    it, else its last 80 bytes or so and a digest of the whole, so two long names never
    share one."""
    name = "".join("_" if _is_control(c) else c for c in name) or "default"
    if len(name.encode("utf-8")) <= MAX_NAMESPACE_BYTES:
        return name
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]
    tail = name.encode("utf-8")[-80:].decode("utf-8", "ignore").lstrip("/")
    return f"{tail}#{digest}"

_TIERS = {
    kv_pb2.TIER_GPU: "gpu",
    kv_pb2.TIER_MEMORY: "memory",
    kv_pb2.TIER_DISK: "disk",
}


class KvError(Exception):
    """An error status from the server (``code`` is a ``grpc.StatusCode``)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class BatchPutError(KvError):
    """A Put of :meth:`KvClient.batched_put` failed: ``index`` is its position, the
    entries before it were stored (``stored``: per key, whether it was already cached),
    the ones after it were not sent."""

    def __init__(self, cause: KvError, index: int, stored: List[bool]):
        super().__init__(cause.code, f"put {index} of the batch failed ({cause.message}); "
                                     f"the {len(stored)} before it were stored, the rest not sent")
        self.index = index
        self.stored = stored


#: What the daemon (tonic) answers, as CANCELLED, to a call whose deadline passed on its
#: side before it answered: the call's deadline, reported as gRPC's DEADLINE_EXCEEDED so
#: callers (the connectors' back-off) see one code for it (black-box finding).
_SERVER_DEADLINE = "Timeout expired"


def _wrap(e: grpc.RpcError) -> KvError:
    code, details = e.code(), e.details() or ""
    if code == grpc.StatusCode.CANCELLED and details == _SERVER_DEADLINE:
        code = grpc.StatusCode.DEADLINE_EXCEEDED
    return KvError(code, details)


def _closed(e: ValueError) -> KvError:
    """A call on a client after :meth:`KvClient.close` (grpc raises ValueError)."""
    return KvError(grpc.StatusCode.CANCELLED, f"the client is closed ({e})")


#: gRPC metadata naming a shared-memory session (kvcache/src/shm.rs).
SHM_SESSION_METADATA = "strata-shm-session"
#: What the daemon answers (FAILED_PRECONDITION) to a call naming a session it does not
#: hold: it restarted, or closed the side connection (kvcache/src/shm.rs).
SHM_SESSION_ENDED = "the shared-memory session has ended"
#: gRPC metadata numbering a leasing call, so its leases can be given up if its answer
#: never comes (kvcache/src/shm.rs: SHM_REQUEST_METADATA, ABANDON_BIT).
SHM_REQUEST_METADATA = "strata-shm-request"
_ABANDON_BIT = 1 << 63


def _call_number() -> int:
    return int.from_bytes(os.urandom(8), "little") & (_ABANDON_BIT - 1)


def _left(deadline: Optional[float]) -> Optional[float]:
    """The time left to ``deadline`` (a ``time.monotonic()``; None: no bound)."""
    return None if deadline is None else max(deadline - time.monotonic(), 0.001)


#: How long past a call's deadline the client waits for gRPC to end the call before it
#: ends it itself (cancels it and raises ``DEADLINE_EXCEEDED``). gRPC's own deadline
#: does not fire while the request's write is stuck: a request larger than the socket
#: buffer (a put of >= 512 KiB, a lookup of >= ~10,000 keys) to a stopped or hung daemon
#: waited until the daemon resumed (black-box finding: put(1 MiB, timeout=3) still
#: blocked after 80 s).
_DEADLINE_GRACE = 0.25


def _deadline_exceeded(bound: Optional[float]) -> KvError:
    """What a call whose ``bound`` (seconds) passed raises: the KvError gRPC's deadline
    gives, saying why."""
    return KvError(grpc.StatusCode.DEADLINE_EXCEEDED,
                   f"Deadline Exceeded (no answer within {bound:.3g} s: the daemon is stopped, hung or "
                   "overloaded)" if bound is not None else "Deadline Exceeded")


class _Bound:
    """The deadline of a call whose answer is a stream (or of a batch of them): the
    streams added are cancelled once it passes (plus :data:`_DEADLINE_GRACE`), by the
    :class:`_Watchdog`, as gRPC does not end them while the request's write is stuck.
    ``expired``: it passed, so a CANCELLED stream of it is a DEADLINE_EXCEEDED one."""

    __slots__ = ("at", "bound", "streams", "expired")

    def __init__(self, at: float, bound: float):
        self.at, self.bound = at, bound
        #: The streams open (id -> stream): one read to its end is dropped, so a batch
        #: of many Gets does not keep every finished call alive.
        self.streams: Dict[int, object] = {}
        self.expired = False

    def add(self, stream) -> None:
        self.streams[id(stream)] = stream
        if self.expired:
            stream.cancel()  # started after it passed (the watchdog cancelled the others)

    def drop(self, stream) -> None:
        self.streams.pop(id(stream), None)

    def expire(self) -> None:
        self.expired = True
        for stream in list(self.streams.values()):
            try:
                stream.cancel()
            except Exception:
                pass

    def error(self, e: grpc.RpcError) -> KvError:
        """``e``, raised by a stream of this bound, as the KvError to raise."""
        if self.expired and e.code() == grpc.StatusCode.CANCELLED:
            return _deadline_exceeded(self.bound)
        return _wrap(e)


class _Watchdog:
    """One thread per process that cancels the response streams of the :class:`_Bound`
    watched when they pass: a call registers (one dict entry under a lock) and
    unregisters; the thread wakes at the earliest deadline registered, not per call."""

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._bounds: Dict[int, _Bound] = {}
        self._wake_at = float("inf")
        self._thread: Optional[threading.Thread] = None

    def watch(self, deadline: Optional[float]) -> Optional[_Bound]:
        """A bound ending ``deadline`` (a ``time.monotonic()``; None: no bound, None)."""
        if deadline is None:
            return None
        b = _Bound(deadline + _DEADLINE_GRACE, deadline - time.monotonic())
        with self._cond:
            self._bounds[id(b)] = b
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="strata-kv-deadlines", daemon=True)
                self._thread.start()
            if b.at < self._wake_at:
                self._wake_at = b.at
                self._cond.notify()
        return b

    def unwatch(self, b: Optional[_Bound]) -> None:
        if b is not None:
            with self._cond:
                self._bounds.pop(id(b), None)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                expired = [b for b in self._bounds.values() if b.at <= now]
                for b in expired:
                    del self._bounds[id(b)]
                self._wake_at = min((b.at for b in self._bounds.values()), default=float("inf"))
                if expired:
                    self._cond.release()
                    try:
                        for b in expired:
                            b.expire()
                    finally:
                        self._cond.acquire()
                    continue
                self._cond.wait(None if self._wake_at == float("inf") else self._wake_at - now)


_WATCHDOG = _Watchdog()


def _keys_of(keys: Sequence) -> List[bytes]:
    """Each of ``keys`` as bytes (see :func:`_key_of`)."""
    return [_key_of(k) for k in keys]


#: Bounds from here on are no bound: gRPC's deadline arithmetic overflows a little past
#: 1e11 s; 1e9 s is over 30 years.
_NO_BOUND_S = 1e9


def _timeout_of(timeout: Optional[float]) -> Optional[float]:
    """A bound in seconds: None, ``inf`` or one past gRPC's deadlines (about 30 years)
    is None (the client's: no bound; a call's: the client's); NaN or not above zero is a
    ``ValueError`` (black-box finding: ``timeout=inf``, NaN or 1e12 made every call fail
    DEADLINE_EXCEEDED at once, and the connectors read ``"timeout_s": "inf"`` with
    ``float()``)."""
    if timeout is None:
        return None
    t = float(timeout)
    if math.isnan(t) or t <= 0:
        raise ValueError(f"a timeout is a number of seconds above 0 (or None for none), got {timeout!r}")
    return None if t >= _NO_BOUND_S else t


def _key_of(key) -> bytes:
    """``key`` as bytes, else a clear ``TypeError`` (black-box finding: a str key to
    ``put`` failed inside the request stream as UNKNOWN "Exception iterating requests!")."""
    if isinstance(key, bytes):
        return key
    if isinstance(key, (bytearray, memoryview)):
        return bytes(key)
    raise TypeError(f"a key is bytes (a block hash of 1..={MAX_KEY_BYTES} bytes), not {type(key).__name__}")


def _bytes_of(value) -> memoryview:
    """``value``'s bytes as a flat memoryview of bytes, without a copy (black-box
    finding: ``len()`` of a float16 or 2-D array counts elements or rows, so a 4 KiB
    block was declared as 64 bytes or 2 KiB and refused with a size the caller never
    had). A strided buffer is a ``ValueError``: its bytes are not one run."""
    try:
        view = memoryview(value)
    except TypeError:
        raise TypeError(f"a value is a bytes-like object (bytes, bytearray, a contiguous numpy array or "
                        f"tensor.numpy()), not {type(value).__name__}") from None
    if view.ndim == 1 and view.itemsize == 1 and view.c_contiguous:
        return view
    if not view.c_contiguous:
        raise ValueError(f"a value must be C-contiguous (shape {view.shape}, strides {view.strides}): "
                         "copy it first, e.g. numpy.ascontiguousarray() or tensor.contiguous()")
    return pickle.PickleBuffer(view).raw()  # any format, any shape: its bytes, in order


#: gRPC metadata asking for a device handle of a GPU-tier block (kvcache/src/shm.rs).
DEVICE_IPC_METADATA = "strata-device-ipc"
#: The side socket's hello: session (16), arena size (8), device memory size (8), then
#: the device memory's id (16) when it is not 0.
_HELLO, _HELLO_DEVICE = 32, 48
#: What the daemon sends instead of a hello when every session holds leases.
_REFUSED_SESSIONS_FULL = b"strata-shm refused: sessions full"
#: A lease id (or an abandon) as the side socket takes it.
_pack_u64 = struct.Struct("<Q").pack
#: Sends on the side socket never wait (and a closed peer is an error, not SIGPIPE);
#: an int once, not an enum operation per lease.
_SEND_FLAGS = int(socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)


#: What a released view's ``data`` is: reading it raises ValueError.
_RELEASED = memoryview(b"")
_RELEASED.release()

#: Arenas some lease of which a view (or a buffer made from one) still holds: a module
#: global, so the cyclic GC never collects one (ending its session) while a buffer over
#: its memory lives.
_HELD_ARENAS: set = set()
#: Every arena of this process, so a forked child can close its copies of their sockets.
_ARENAS: "weakref.WeakSet[_ShmArena]" = weakref.WeakSet()
#: Serializes a client's switch to a channel of its own in a forked child; new in the
#: child (a thread of the parent may have held it at the fork).
_fork_lock = threading.Lock()
#: The parent's channels, kept for good in a forked child: never closed or collected
#: there (gRPC's fork caveats: the child must not tear down the parent's connection).
_INHERITED: list = []


def _after_fork_in_child() -> None:
    global _fork_lock, _WATCHDOG
    _fork_lock = threading.Lock()
    _WATCHDOG = _Watchdog()  # the parent's thread is not here (and its lock may be held)
    for arena in list(_ARENAS):
        arena._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _attach_error(e: OSError, path: str, timeout: Optional[float]) -> OSError:
    """``e``, a failed attach to the side socket ``path``, as an error of the same type
    naming the path and the likely cause (black-box finding: a bare "[Errno 2] No such
    file or directory" left a user guessing which socket, and why). The same type: the
    connectors fall back to bytes on any OSError."""
    if isinstance(e, TimeoutError):
        why = (f"no hello within {timeout:.3g} s: the daemon accepted the connection but does not "
               "answer (stopped or overloaded)")
    elif isinstance(e, FileNotFoundError):
        why = ("no such socket: no daemon serves there, or it runs without a shared-memory arena "
               "([kv] shm = \"0\", or off because [[kv.tenants]] are configured); use shm=False")
    elif isinstance(e, PermissionError):
        why = ("permission denied: the side socket is only for the daemon's own user (mode 0600); "
               "run as that user, or use shm=False")
    elif isinstance(e, ConnectionRefusedError):
        why = "nothing listens there: the daemon that made it is gone (a stale socket)"
    else:
        why = e.strerror or str(e)
    msg = f"shared-memory side socket {path}: {why}"
    return type(e)(msg) if e.errno is None else type(e)(e.errno, msg)


class _ShmArena:
    """The daemon's shared-memory arena, attached over its side socket: the memfd comes
    with SCM_RIGHTS and is mapped read-only; lease ids go back on the socket.
    ``timeout`` bounds the attach (a stopped daemon accepts the connection but never
    says hello): past it, ``TimeoutError``.

    Only the process that attached uses it: in a forked child it sends nothing (its
    socket is the parent's session: a child's release would end the parent's lease)."""

    def __init__(self, path: str, timeout: Optional[float] = None):
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.device_view: Optional[memoryview] = None
        self.device_id = b""
        try:
            end = None if timeout is None else time.monotonic() + timeout
            try:
                self._sock.settimeout(timeout)
                self._sock.connect(path)
                # One bound for connect and hello together.
                self._sock.settimeout(_left(end))
                msg, fds, _flags, _addr = socket.recv_fds(self._sock, _HELLO_DEVICE, 2)
            except OSError as e:
                raise _attach_error(e, path, timeout) from None
            # Never waits from here on: a stopped daemon fills the socket's buffer, and a
            # release must not block the engine (black-box finding: the 279th release of
            # a batch blocked until the daemon resumed).
            self._sock.setblocking(False)
            if not fds and msg.startswith(_REFUSED_SESSIONS_FULL):
                raise ConnectionRefusedError(
                    f"{path}: the daemon refused a shared-memory session: all its sessions "
                    "hold leases; use the socket"
                )
            if len(msg) < _HELLO or not fds:
                raise ConnectionError(f"bad hello from {path}: {len(msg)} bytes, {len(fds)} descriptors")
            try:
                size, device_size = struct.unpack_from("<QQ", msg, 16)
                self._map = mmap.mmap(fds[0], size, mmap.MAP_SHARED, mmap.PROT_READ)
                if device_size and len(msg) == _HELLO_DEVICE and len(fds) > 1:
                    # The daemon's emulated GPU memory: its device handles open here.
                    self._device_map = mmap.mmap(fds[1], device_size, mmap.MAP_SHARED, mmap.PROT_READ)
                    self.device_view = memoryview(self._device_map)
                    self.device_id = bytes(msg[32:48])
            finally:
                for fd in fds:
                    os.close(fd)
        except BaseException:
            self._sock.close()
            raise
        self.size = size
        self.session = f"{int.from_bytes(msg[:16], 'little'):032x}"
        self.view = memoryview(self._map)
        self._pid = os.getpid()
        # Reentrant: a view collected while this thread sends gives its lease back here.
        self._lock = threading.RLock()
        #: Lease ids (and abandons) the socket did not take yet: at most one per lease
        #: handed out, sent with the next send or flush.
        self._out = bytearray()
        #: Leases held by views (or buffers made from them), and those riding on a
        #: view's bytes: id of a weakref to the bytes -> (the weakref, lease).
        self._held = 0
        self._pins: Dict[int, tuple] = {}
        self._closing = False
        _ARENAS.add(self)

    def _forked(self) -> None:
        """In a forked child (at the fork): close this process's copy of the socket. The
        parent's session is unaffected (it ends when every copy is closed), and no
        longer outlives the parent's close() while the child lives."""
        try:
            self._sock.close()
        except OSError:
            pass

    def _send(self, word: int) -> None:
        """Queues ``word`` and sends what the socket takes now, without waiting (under
        ``_lock``)."""
        self._out += _pack_u64(word)
        self._flush()

    def _flush(self) -> None:
        while self._out:
            try:
                n = self._sock.send(self._out, _SEND_FLAGS)
            except (BlockingIOError, InterruptedError):
                return  # the daemon is not reading (stopped, busy): later
            except OSError:
                self._out.clear()  # the session is gone; the daemon released its leases already
                return
            del self._out[:n]

    def flush(self) -> None:
        """Sends the lease ids still queued, without waiting: before a leasing call, so
        the daemon counts the leases given back against the session's share."""
        if self._pid == os.getpid() and self._out:
            with self._lock:
                self._flush()

    def release(self, lease: int) -> None:
        """Gives back a lease no view holds."""
        if self._pid == os.getpid():
            with self._lock:
                self._send(lease)

    def abandon(self, call: int) -> None:
        """Gives up the leases that answered the leasing call ``call`` (numbered by
        :data:`SHM_REQUEST_METADATA`): its answer never came (a timeout, a cancel), so its
        lease ids are unknown here and could not be released one by one."""
        if self._pid == os.getpid():
            with self._lock:
                self._send(call | _ABANDON_BIT)

    def hold(self) -> None:
        """Counts one more lease held by a view: the session stays until it is given back."""
        with self._lock:
            if self._held == 0:
                _HELD_ARENAS.add(self)
            self._held += 1

    def pin(self, lease: int, base: memoryview, offset: int, size: int) -> memoryview:
        """``base[offset:offset+size]`` (a range of the arena or of the device memory) as
        a memoryview of its own, whose ``lease`` goes back when it and every buffer made
        from it are gone: a slice of it or ``np.frombuffer`` of it hold the range, not the
        view, so releasing the view alone would let them show another block's bytes once
        the daemon reuses the range (black-box finding)."""
        part = base[offset : offset + size]
        self.hold()
        # Keyed by the weakref's id: weakrefs hash and compare as their referents, and
        # memoryviews as their bytes (two blocks alike would be one entry).
        ref = weakref.ref(part, self._unpinned)
        self._pins[id(ref)] = (ref, lease)
        # PickleBuffer forwards to `part`: a new buffer whose every export holds `part`.
        return memoryview(pickle.PickleBuffer(part))

    def _unpinned(self, ref: weakref.ref) -> None:
        entry = self._pins.pop(id(ref), None)
        if entry is not None:
            try:
                self.give_back(entry[1])
            except Exception:
                pass  # at interpreter exit: the session ends with the process

    def give_back(self, lease: int) -> None:
        """Gives back a lease a view held (:meth:`hold`)."""
        if self._pid != os.getpid():
            return  # a forked child's copy: the lease is the parent's
        with self._lock:
            self._send(lease)
            self._held -= 1
            if self._held == 0:
                _HELD_ARENAS.discard(self)
                if self._closing:
                    self._sock.close()

    def ended(self) -> bool:
        """Whether the daemon closed the side socket (it restarted or dropped the
        session): it sends nothing after its hello, so a readable socket is an ended one.
        One non-blocking peek."""
        try:
            return self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def close(self) -> None:
        """Ends the session (the daemon releases what is left) once no view holds a lease
        of it: until then its ranges stay the views' blocks (black-box finding: a view
        read after its client's close showed another block's bytes)."""
        if self._pid != os.getpid():
            return
        with self._lock:
            self._closing = True
            if self._held == 0:
                self._sock.close()
        # The mapping goes when the last view into it does.


class BlockView:
    """A fetched block: ``data`` is a read-only memoryview, in place in the daemon's
    shared-memory arena when ``shared`` (valid until :meth:`release`, or the end of a
    ``with`` block), else over inline bytes.

    Buffers made from a shared ``data`` (``data[:n]``, ``np.frombuffer(data)``,
    ``torch.frombuffer(data)``, ``data`` itself kept elsewhere) keep the block's lease
    until they are gone, so they never show another block's bytes; only ``data`` of the
    view reads as released. Such a buffer kept long keeps its range of the arena (the
    session's share is a quarter of it): copy out what you keep.

    Served by device handle (``device`` is "emulated" or "cuda", ``handle`` the parsed
    :class:`strata_kv.ipc.IpcHandle`): for an emulated device ``data`` is the block in
    place in the daemon's device memory; for CUDA ``data`` is None and
    :meth:`cuda_tensor` opens the handle (a uint8 CUDA tensor over the block; the
    tensor is not kept past :meth:`release`: copy from it before).

    In a forked child a view of the parent's is inert: releasing it sends nothing."""

    def __init__(self, data, arena: Optional[_ShmArena] = None, lease: int = 0,
                 handle: Optional[IpcHandle] = None, pinned: bool = False):
        self.data = data
        self.shared = arena is not None
        self._arena, self._lease = arena, lease
        # Whether the lease rides on `data` (_ShmArena.pin) rather than on this view.
        self._pinned = pinned
        self.handle = handle
        self.device = handle.kind_name if handle is not None else None
        self._cuda: Optional[CudaMapping] = None

    def cuda_tensor(self, device: Optional[int] = None):
        """The block as a CUDA tensor (a CUDA handle only; opened once, closed on release)."""
        if self.handle is None or self.handle.kind != KIND_CUDA:
            raise ValueError("not served by a CUDA handle")
        if self._cuda is None:
            self._cuda = CudaMapping(self.handle, device)
        return self._cuda.tensor

    def release(self) -> None:
        """Gives the block back: ``data`` reads as released from here on. Never waits
        for the daemon (a stopped one gets the lease id when it reads again)."""
        if self._cuda is not None:
            if self._arena is None or self._arena._pid == os.getpid():
                self._cuda.close()  # a forked child's copy is not its mapping
            self._cuda = None
        arena, self._arena = self._arena, None
        if arena is None:
            return
        if not self._pinned:
            arena.give_back(self._lease)
            return
        data, self.data = self.data, _RELEASED
        # Held only here (this local and getrefcount's argument): release it, and the
        # lease goes back unless a slice or array made from it lives. Held elsewhere too
        # (torch.frombuffer keeps the memoryview object, not a buffer of it): it and the
        # lease go when that holder lets go.
        if sys.getrefcount(data) <= 2:
            try:
                data.release()
            except BufferError:
                pass  # a consumer holds a buffer of it: the lease goes when it lets go

    def __enter__(self) -> "BlockView":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass


def _lease_view(arena: _ShmArena, lease: int, base: Optional[memoryview], offset: int = 0,
                size: int = 0, handle: Optional[IpcHandle] = None) -> BlockView:
    """A view holding ``lease``: over ``base[offset:offset+size]`` (the lease goes with
    those bytes, see :meth:`_ShmArena.pin`), or without bytes (``base`` None: a CUDA
    handle; the lease goes on release)."""
    if base is None:
        arena.hold()
        return BlockView(None, arena, lease, handle)
    return BlockView(arena.pin(lease, base, offset, size), arena, lease, handle, pinned=True)


class KvClient:
    """A connection to a Strata KV service.

    ``addr``: ``unix:///path/kv.sock`` (the path as the daemon prints it, not
    percent-encoded), ``host:port`` (plaintext) or, with
    ``root_certificates`` (PEM bytes), a TLS connection to ``host:port``. ``token`` is
    sent as ``authorization: Bearer <token>``. ``identity`` (a :class:`ModelIdentity` or
    its digest) is sent with every call: the service binds each namespace to the first
    identity it sees and refuses calls with another (``FAILED_PRECONDITION``), so blocks
    of another model revision are never served even if a key collides by mistake.
    ``shm``: on the daemon's host, attach to its shared-memory arena (True: the
    ``kv-shm.sock`` beside a ``unix://`` address; or the side socket's path): Gets are
    then answered with ranges of the arena read in place (:meth:`get_view`); attaching
    waits at most ``timeout`` (``TimeoutError``, an ``OSError``; any attach failure is an
    ``OSError`` naming the side socket and the likely cause). ``timeout`` also bounds
    each call; :meth:`put` and :meth:`get_view` take a shorter one per call. After
    ``os.fork()`` the child's first call opens a channel and a session of its own.
    """

    def __init__(
        self,
        addr: str = "127.0.0.1:7070",
        namespace: str = "default",
        token: Optional[str] = None,
        root_certificates: Optional[bytes] = None,
        timeout: Optional[float] = 60.0,
        identity: Optional[Union[ModelIdentity, bytes]] = None,
        shm: Union[bool, str] = False,
    ):
        timeout = _timeout_of(timeout)
        options = [
            ("grpc.max_receive_message_length", 16 << 20),
            ("grpc.max_send_message_length", 16 << 20),
            # A daemon back after a restart is reached within a second: gRPC's default
            # reconnect backoff (1 s growing 1.6x to 120 s) kept a client that called
            # through a 45 s outage failing UNAVAILABLE for 19-26 s after the daemon
            # listened again (black-box finding), and up to 2 minutes after longer ones.
            # (Not `min_reconnect_backoff_ms`: that is each attempt's connect timeout,
            # and a daemon slow to answer, a frozen one included, must get the call's.)
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            # A connection of its own: gRPC core otherwise shares one among every
            # channel to the same address in the process, and a put waiting for the
            # server's put budget holds part of that connection's HTTP/2 window, which
            # stalled the other clients' puts that had their budget (black-box finding:
            # 8 clients' concurrent 64 MiB puts, 4 refused after 10 s).
            ("grpc.use_local_subchannel_pool", 1),
        ]
        unix_path = None
        target = addr
        if addr.startswith("unix:"):
            # gRPC core sends the socket path as :authority, which HTTP/2 servers such as
            # hyper (the Rust service) refuse as malformed; any valid host name will do.
            options.append(("grpc.default_authority", "localhost"))
            # unix:///run/kv.sock -> /run/kv.sock; unix:run/kv.sock (gRPC: relative to
            # the working directory) -> run/kv.sock, not /run/kv.sock.
            rest = addr[len("unix:"):]
            unix_path = "/" + rest.lstrip("/") if rest.startswith("/") else rest
            if "," in unix_path:
                # gRPC takes a comma in a unix: address as a list of sockets, escaped or
                # not: the calls would go to another path than the shared-memory
                # session's (black-box finding).
                raise ValueError(f"{unix_path}: gRPC cannot address a unix socket whose path "
                                 "holds a comma; use a path without one")
            # The path is taken as is, but gRPC parses the address as a URI: escaped, so
            # '%', '#', '?' or a space in it reach that path, not another (black-box
            # finding: .../pct%41x/kv.sock connected to .../pctAx/kv.sock).
            quoted = urllib.parse.quote(unix_path, safe="/")
            target = "unix://" + quoted if unix_path.startswith("/") else "unix:" + quoted
        self._addr, self._options = target, options
        self._creds = (grpc.ssl_channel_credentials(root_certificates=root_certificates)
                       if root_certificates is not None else None)
        #: The process the channel (and the arena) belong to: a forked child opens its own.
        self._pid = os.getpid()
        self._closed = False
        self._channel = self._open_channel()
        self._grpc_stub = kv_pb2_grpc.KvCacheStub(self._channel)
        try:
            self.namespace = check_namespace(namespace)
        except ValueError:
            self._channel.close()
            raise
        md = []
        if token:
            md.append(("authorization", f"Bearer {token}"))
        if identity is not None:
            digest = identity.digest() if isinstance(identity, ModelIdentity) else bytes(identity)
            if len(digest) != 32:
                raise ValueError(f"identity digest must be 32 bytes, got {len(digest)}")
            md.append((IDENTITY_METADATA, digest.hex()))
        self._arena: Optional[_ShmArena] = None
        if shm:
            if shm is True:
                if not addr.startswith("unix:"):
                    self._channel.close()
                    raise ValueError("shm=True needs a unix:// address (or pass the side socket's path)")
                shm = os.path.join(os.path.dirname(unix_path), "kv-shm.sock")
            try:
                self._arena = _ShmArena(shm, timeout)
            except ConnectionRefusedError as e:
                # The daemon is there but has no session to spare (every one holds
                # leases): Gets come as bytes, as after a session ended.
                warnings.warn(f"strata_kv: {e}; blocks come as bytes")
                self._arena = None
            except BaseException:
                self._channel.close()
                raise
        self._shm_path = shm or None
        self._metadata = tuple(md) or None
        self._timeout = timeout
        self._attach_lock = threading.Lock()
        #: When to try attaching again after a failed attach (a daemon not back yet).
        self._next_attach = 0.0
        self._use_arena(self._arena)
        # Whether the daemon answers BatchLease (one call for a batch of arena leases);
        # cleared the first time one answers UNIMPLEMENTED.
        self._batch_lease = True

    @property
    def device_memory(self) -> Optional[str]:
        """"emulated" when attached to a daemon whose GPU tier is the emulated device
        (its memory was received: its handles read in place here), else None (a CUDA
        tier's handles need nothing received; ask with ``device=True`` to find out)."""
        self._check_fork()
        if self._arena is not None and self._arena.device_view is not None:
            return "emulated"
        return None

    # -- plumbing ---------------------------------------------------------------------

    def _open_channel(self) -> grpc.Channel:
        if self._creds is not None:
            return grpc.secure_channel(self._addr, self._creds, options=self._options)
        return grpc.insecure_channel(self._addr, options=self._options)

    @property
    def _stub(self) -> kv_pb2_grpc.KvCacheStub:
        self._check_fork()
        return self._grpc_stub

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            self._after_fork()

    def _after_fork(self) -> None:
        """In a forked child, at its first call: a channel and a shared-memory session of
        its own. The parent's are not this process's (black-box finding: a child's leases
        landed in the parent's session, and a child killed holding them took the parent's
        share for good; a child that merely exited released the parent's views). The
        parent's channel is kept, never closed here (gRPC's fork caveats); its views
        here are inert."""
        with _fork_lock:
            if self._pid == os.getpid():
                return  # another thread of the child did it
            _INHERITED.append(self._channel)
            self._channel = self._open_channel()
            self._grpc_stub = kv_pb2_grpc.KvCacheStub(self._channel)
            self._attach_lock = threading.Lock()
            self._use_arena(None)
            self._pid = os.getpid()
            if self._closed:
                self._channel.close()
            elif self._shm_path:
                self._reattach(None)
                if self._arena is None:
                    warnings.warn(f"strata_kv: attaching to {self._shm_path} in forked process "
                                  f"{self._pid} failed; blocks come as bytes until it succeeds")

    def _use_arena(self, arena: Optional[_ShmArena]) -> None:
        """Gets name ``arena``'s session (None: no arena, blocks come as bytes)."""
        self._arena = arena

    def _session_md(self, arena: Optional[_ShmArena], device: bool = False, call: Optional[int] = None):
        """Metadata of a Get naming ``arena``'s session (None: as bytes), numbered ``call``
        (so its leases can be abandoned). Made from the arena the call uses, so the
        session named and the arena its leases are read in never differ."""
        if arena is None:
            return self._metadata
        md = (self._metadata or ()) + ((SHM_SESSION_METADATA, arena.session),)
        if device:
            md += ((DEVICE_IPC_METADATA, "1"),)
        if call is not None:
            md += ((SHM_REQUEST_METADATA, str(call)),)
        return md

    def _reattach(self, ended: Optional[_ShmArena], deadline: Optional[float] = None) -> None:
        """The daemon no longer holds ``ended``'s session (it restarted): attach again at
        the same side socket, once for all threads that saw it (``ended`` None: no arena
        now, after a failed attach). Views into the old arena stay readable (their
        mapping is their own). When attaching fails (the daemon now runs without an
        arena, or is not back yet), Gets go on as bytes, and attaching is tried again
        at a Get 5 s later. ``deadline``: the calling Get's; waiting for another
        thread's attach and the attach itself end by it (black-box finding: a
        get_views(timeout=2) took the client's whole 60 s timeout against a daemon
        frozen after a restart, and held every other thread's Gets as long)."""
        left = _left(deadline)
        if not self._attach_lock.acquire(timeout=-1 if left is None else left):
            return  # the call's time is up: it goes on (and fails) with what there is
        try:
            if self._arena is not ended:
                return  # another thread attached already
            try:
                # A later try waits at most 2 s for the hello: it runs inside a Get.
                bound = self._timeout if ended is not None else min(self._timeout or 2.0, 2.0)
                if deadline is not None:
                    left = _left(deadline)
                    bound = left if bound is None else min(bound, left)
                arena = _ShmArena(self._shm_path, bound)
            except (OSError, ValueError) as e:
                if ended is not None:
                    warnings.warn(f"strata_kv: the shared-memory session ended and attaching again "
                                  f"at {self._shm_path} failed ({e}); blocks come as bytes until it "
                                  "succeeds")
                self._next_attach = time.monotonic() + 5.0
                arena = None
            self._use_arena(arena)
            if ended is not None:
                ended.close()
        finally:
            self._attach_lock.release()

    def _call(self, method, request, timeout: Optional[float] = None, metadata=None):
        """Every call answered by one message (Put's request stream too), bounded by
        ``timeout`` (default: the client's) whatever gRPC does: past it (and
        :data:`_DEADLINE_GRACE`) the call is cancelled and ``KvError``
        ``DEADLINE_EXCEEDED`` raised, as gRPC's deadline does. gRPC's blocking form waits
        behind a request write stuck on a full socket, and its deadline then never fires
        (black-box finding: a put of 1 MiB, or a lookup of 10,000 keys, to a stopped
        daemon waited until the daemon resumed). ``metadata``: default the client's."""
        bound = self._timeout if timeout is None else timeout
        try:
            future = method.future(request, timeout=bound,
                                   metadata=self._metadata if metadata is None else metadata)
            try:
                return future.result(timeout=None if bound is None else bound + _DEADLINE_GRACE)
            except grpc.FutureTimeoutError:
                future.cancel()
                raise _deadline_exceeded(bound) from None
            except grpc.FutureCancelledError:
                raise KvError(grpc.StatusCode.CANCELLED, "the call was cancelled") from None
            except grpc.RpcError:
                raise
            except BaseException:
                future.cancel()  # e.g. KeyboardInterrupt: the call does not go on alone
                raise
        except grpc.RpcError as e:
            raise _wrap(e) from None
        except ValueError as e:  # grpc's "Cannot invoke RPC: Channel closed!"
            raise _closed(e) from None

    def _open_stream(self, method, request, bound: Optional[_Bound], metadata):
        """Starts a call answered by a stream (Get, BatchGet), bounded by ``bound`` (None:
        no bound): gRPC's deadline is its, and the :class:`_Watchdog` cancels it once
        ``bound`` passes (see :meth:`_call`). Errors of its messages: ``bound.error``."""
        try:
            stream = method(request, timeout=None if bound is None else _left(bound.at - _DEADLINE_GRACE),
                            metadata=metadata)
        except grpc.RpcError as e:
            raise _wrap(e) from None
        except ValueError as e:
            raise _closed(e) from None
        if bound is not None:
            bound.add(stream)
        return stream

    def _ns(self, namespace: Optional[str]) -> str:
        return self.namespace if namespace is None else _namespace_text(namespace)

    # -- connector API ----------------------------------------------------------------

    def ping(self) -> Dict[str, object]:
        r = self._call(self._stub.Ping, kv_pb2.PingRequest())
        return {"version": r.version, "api": r.api, "max_block_bytes": r.max_block_bytes}

    def exists(self, key: bytes, namespace: Optional[str] = None) -> bool:
        r = self._call(self._stub.Exists, kv_pb2.ExistsRequest(namespace=self._ns(namespace), hash=_key_of(key)))
        return r.exists

    def locate(self, key: bytes, namespace: Optional[str] = None) -> Optional[str]:
        """The tier holding ``key`` ("memory", "disk", "gpu") or None."""
        r = self._call(self._stub.Exists, kv_pb2.ExistsRequest(namespace=self._ns(namespace), hash=_key_of(key)))
        return _TIERS.get(r.tier)

    def batch_exists(self, keys: Sequence[bytes], namespace: Optional[str] = None) -> List[bool]:
        ns, out = self._ns(namespace), []
        for run in key_batches(_keys_of(keys)):
            req = kv_pb2.BatchExistsRequest(namespace=ns, hashes=list(run))
            out.extend(self._call(self._stub.BatchExists, req).exists)
        return out

    def match_prefix(self, keys: Sequence[bytes], namespace: Optional[str] = None) -> int:
        """Number of leading keys of the chain that are cached (stops at the first miss)."""
        ns, matched = self._ns(namespace), 0
        for run in key_batches(_keys_of(keys)):
            req = kv_pb2.MatchPrefixRequest(namespace=ns, hashes=list(run))
            m = self._call(self._stub.MatchPrefix, req).matched
            matched += m
            if m < len(run):
                break
        return matched

    def batched_contains(self, keys: Sequence[bytes], namespace: Optional[str] = None) -> int:
        """LMCache's name for :meth:`match_prefix`."""
        return self.match_prefix(keys, namespace)

    def get(self, key: bytes, namespace: Optional[str] = None) -> Optional[bytes]:
        view = self.get_view(key, namespace)
        if view is None:
            return None
        if not view.shared:
            return view.data.obj
        with view:
            return bytes(view.data)  # owned bytes wanted: one copy out of the arena

    def get_view(self, key: bytes, namespace: Optional[str] = None, device: bool = False,
                 timeout: Optional[float] = None) -> Optional[BlockView]:
        """A block without a copy when attached to the arena (see :class:`BlockView`).
        ``device``: a block resident in the daemon's GPU tier comes by device handle
        (for a caller whose buffers are on that device; other blocks as usual).
        ``timeout``: this call's bound (default: the client's)."""
        return self.get_views([key], namespace, device, timeout)[0]

    def get_views(self, keys: Sequence[bytes], namespace: Optional[str] = None, device: bool = False,
                  timeout: Optional[float] = None) -> List[Optional[BlockView]]:
        """:meth:`get_view` of each key, in order: attached to the arena, the batch leased
        in one BatchLease call per run of :func:`key_batches` (as :meth:`batched_get`
        cuts it); else the Gets sent together on the connection (at most
        :data:`GETS_IN_FLIGHT` at once) and then collected: one round trip for the batch
        rather than one per key (a page-by-page load of 16 pages over the arena took 22
        ms against 4 ms for one batched Get over TCP). ``timeout`` bounds the whole
        batch. A failure releases the views already taken and raises."""
        self._check_fork()
        ns = self._ns(namespace)
        keys = _keys_of(keys)
        call_bound = _timeout_of(timeout)
        bound = self._timeout if call_bound is None else call_bound
        deadline = None if bound is None else time.monotonic() + bound
        if self._arena is not None and self._arena.ended():
            # The daemon restarted: a Get naming the old session is answered with bytes,
            # not refused, so the device-handle path (per-key Gets) never learnt of it
            # (black-box finding: zero-copy lost for the engine's lifetime).
            self._reattach(self._arena, deadline)
        elif self._arena is None and self._shm_path and time.monotonic() >= self._next_attach:
            self._reattach(None, deadline)
        views: List[Optional[BlockView]] = []
        try:
            if self._arena is not None and not device and self._batch_lease and keys:
                for run in key_batches(keys):
                    leased = self._leased_views(run, ns, deadline)
                    if leased is None:
                        break  # no BatchLease (or no arena now): the rest by Get
                    views.extend(leased)
            if len(views) < len(keys):
                views.extend(self._got_views(keys[len(views):], ns, device, deadline, self._arena))
        except BaseException:
            for v in views:
                if v is not None:
                    v.release()
            raise
        return views

    def _got_views(self, keys: Sequence[bytes], ns: str, device: bool,
                   deadline: Optional[float], arena: Optional[_ShmArena]) -> List[Optional[BlockView]]:
        """One Get stream per key, at most :data:`GETS_IN_FLIGHT` open at once (black-box
        finding: a batch of 20,000 opened as many streams at once), naming ``arena``'s
        session (None: as bytes). All numbered by one call, abandoned if any fails."""
        call = _call_number()
        md = self._session_md(arena, device, call)
        if arena is not None:
            arena.flush()
        stub = self._stub
        bound = _WATCHDOG.watch(deadline)

        def start(k: bytes):
            return self._open_stream(stub.Get, kv_pb2.GetRequest(namespace=ns, hash=k), bound, md)

        views: List[Optional[BlockView]] = []
        streams: collections.deque = collections.deque()
        todo = iter(keys)
        try:
            for k in itertools.islice(todo, GETS_IN_FLIGHT):
                streams.append(start(k))
            while streams:
                views.append(self._view_of(streams[0], arena, bound))
                done = streams.popleft()
                if bound is not None:
                    bound.drop(done)
                for k in itertools.islice(todo, 1):
                    streams.append(start(k))
        except BaseException:
            _WATCHDOG.unwatch(bound)
            for v in views:
                if v is not None:
                    v.release()
            for stream in streams:
                stream.cancel()
            if arena is not None:
                arena.abandon(call)  # leases answered to Gets whose answer never came
            raise
        _WATCHDOG.unwatch(bound)
        return views

    def _leased_views(self, keys: Sequence[bytes], ns: str,
                      deadline: Optional[float]) -> Optional[List[Optional[BlockView]]]:
        """The batch leased in one BatchLease call (blocks the arena could not lease then
        by Get, as bytes). None when the daemon predates BatchLease (the caller falls back
        to one Get per key)."""
        for attempt in (0, 1):
            arena = self._arena
            if arena is None:
                return None  # attaching again failed: Gets as bytes
            # Leases given back but not sent yet go first: they count against the
            # session's share.
            arena.flush()
            call = _call_number()
            md = self._session_md(arena, call=call)
            try:
                answer = self._call(self._stub.BatchLease, kv_pb2.BatchGetRequest(namespace=ns, hashes=list(keys)),
                                    _left(deadline), md)
                break
            except KvError as e:
                if e.code == grpc.StatusCode.UNIMPLEMENTED:
                    self._batch_lease = False
                    return None
                if (attempt == 0 and e.code == grpc.StatusCode.FAILED_PRECONDITION
                        and SHM_SESSION_ENDED in e.message):
                    self._reattach(arena, deadline)
                    continue
                # The answer may have been built after we gave up: its leases go back.
                arena.abandon(call)
                raise
            except BaseException:
                arena.abandon(call)
                raise
        views: List[Optional[BlockView]] = []
        try:
            if len(answer.blocks) != len(keys):
                raise KvError(grpc.StatusCode.INTERNAL,
                              f"BatchLease answered {len(answer.blocks)} entries for {len(keys)} keys")
            for b in answer.blocks:
                if not (b.found and b.shm_lease):
                    views.append(None)
                elif b.shm_offset + b.size > arena.size:
                    raise KvError(grpc.StatusCode.INTERNAL, f"bad shared-memory lease {b.shm_offset}+{b.size}")
                else:
                    views.append(_lease_view(arena, b.shm_lease, arena.view, b.shm_offset, b.size))
            # Blocks the arena could not lease then, by Get (leased if the share allows
            # now), numbered as a call of their own: one that times out has its lease
            # abandoned (black-box finding: unnumbered, such leases were lost for good,
            # and a client with short deadlines ended with no zero-copy share at all).
            rest = [i for i, b in enumerate(answer.blocks) if b.found and not b.shm_lease]
            if rest:
                for i, v in zip(rest, self._got_views([keys[i] for i in rest], ns, False, deadline, arena)):
                    views[i] = v
        except BaseException:
            for v in views:
                if v is not None:
                    v.release()
            for b in answer.blocks[len(views):]:
                if b.found and b.shm_lease:
                    arena.release(b.shm_lease)  # leases no view took
            raise
        return views

    def _view_of(self, stream, arena: Optional[_ShmArena], bound: Optional[_Bound] = None) -> Optional[BlockView]:
        """The view one Get stream answers (None: the block is not held); ``arena``: the
        one whose session the Get named; ``bound``: the one it was opened with."""
        try:
            msgs = list(stream)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND and e.details() == "block not found":
                return None
            raise (_wrap(e) if bound is None else bound.error(e)) from None
        except ValueError as e:
            raise _closed(e) from None
        if msgs and msgs[0].device_handle:
            return self._device_view(msgs[0], arena)
        if msgs and msgs[0].shm_lease:
            m = msgs[0]
            if arena is None or m.shm_offset + m.size > arena.size:
                if arena is not None:
                    arena.release(m.shm_lease)
                raise KvError(grpc.StatusCode.INTERNAL, f"bad shared-memory lease {m.shm_offset}+{m.size}")
            return _lease_view(arena, m.shm_lease, arena.view, m.shm_offset, m.size)
        parts = [m.data for m in msgs]
        return BlockView(memoryview(parts[0] if len(parts) == 1 else b"".join(parts)))

    def _device_view(self, m, arena: Optional[_ShmArena]) -> BlockView:
        if arena is None:
            raise KvError(grpc.StatusCode.INTERNAL, "a device handle unasked")
        try:
            h = parse_handle(m.device_handle)
            if h.length != m.size:
                raise ValueError(f"handle of {h.length} bytes for a block of {m.size}")
            if h.kind == KIND_EMULATED:
                dv = arena.device_view
                if dv is None or h.token != arena.device_id or h.offset + h.length > len(dv):
                    raise ValueError("handle outside the device memory the daemon sent")
                return _lease_view(arena, m.shm_lease, dv, h.offset, h.length, h)
            return _lease_view(arena, m.shm_lease, None, handle=h)
        except ValueError as e:
            arena.release(m.shm_lease)
            raise KvError(grpc.StatusCode.INTERNAL, str(e)) from None

    def batched_get(self, keys: Sequence[bytes], namespace: Optional[str] = None) -> List[Optional[bytes]]:
        ns = self._ns(namespace)
        keys = _keys_of(keys)
        parts: List[List[bytes]] = [[] for _ in keys]
        found = [False] * len(keys)
        base = 0
        for run in key_batches(keys):
            req = kv_pb2.BatchGetRequest(namespace=ns, hashes=list(run))
            # Each run bounded by the client's timeout, as each call is.
            bound = _WATCHDOG.watch(None if self._timeout is None else time.monotonic() + self._timeout)
            try:
                for m in self._open_stream(self._stub.BatchGet, req, bound, self._metadata):
                    if m.found:
                        found[base + m.index] = True
                        parts[base + m.index].append(m.data)
            except grpc.RpcError as e:
                raise (_wrap(e) if bound is None else bound.error(e)) from None
            except ValueError as e:
                raise _closed(e) from None
            finally:
                _WATCHDOG.unwatch(bound)
            base += len(run)
        return [b"".join(p) if f else None for p, f in zip(parts, found)]

    def put(self, key: bytes, value, namespace: Optional[str] = None,
            timeout: Optional[float] = None) -> bool:
        """Stores a block; returns True when the key was already cached (idempotent).
        ``value``: any C-contiguous bytes-like object (bytes, a numpy array of any dtype
        or shape, ``tensor.numpy()`` of a CPU tensor): its bytes are stored.
        ``timeout``: this call's bound (default: the client's)."""
        ns = self._ns(namespace)
        key = _key_of(key)
        view = _bytes_of(value)

        def messages() -> Iterator[kv_pb2.PutRequest]:
            yield kv_pb2.PutRequest(namespace=ns, hash=key, size=len(view), data=bytes(view[:CHUNK_BYTES]))
            for off in range(CHUNK_BYTES, len(view), CHUNK_BYTES):
                yield kv_pb2.PutRequest(data=bytes(view[off : off + CHUNK_BYTES]))

        return self._call(self._stub.Put, messages(), _timeout_of(timeout)).already_present

    def batched_put(
        self, keys: Sequence[bytes], values: Sequence[bytes], namespace: Optional[str] = None
    ) -> List[bool]:
        """Stores each ``values[i]`` under ``keys[i]`` (one Put each, in order); per
        key, whether it was already cached. Keys and values are checked before any is
        sent (a key of 1-64 bytes, a non-empty C-contiguous value), so a malformed batch
        stores nothing; a Put the service refuses stops the batch with a
        :class:`BatchPutError` naming its index and what was stored before it (black-box
        finding: the entries before a bad one were stored, the ones after it never sent,
        and the error named neither)."""
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys but {len(values)} values")
        checked = []
        for i, (k, v) in enumerate(zip(keys, values)):
            try:
                k, data = _key_of(k), _bytes_of(v)
            except (TypeError, ValueError) as e:
                raise type(e)(f"entry {i} of the batch: {e}; nothing was sent") from None
            if not 1 <= len(k) <= MAX_KEY_BYTES:
                raise ValueError(f"key {i} of the batch is {len(k)} bytes (1..={MAX_KEY_BYTES}); nothing was sent")
            if len(data) == 0:
                raise ValueError(f"value {i} of the batch is empty; nothing was sent")
            checked.append((k, data))
        done: List[bool] = []
        for i, (k, data) in enumerate(checked):
            try:
                done.append(self.put(k, data, namespace))
            except KvError as e:
                raise BatchPutError(e, i, done) from e
        return done

    def remove(self, keys: Sequence[bytes], namespace: Optional[str] = None) -> int:
        ns, removed = self._ns(namespace), 0
        for run in key_batches(_keys_of(keys)):
            req = kv_pb2.RemoveRequest(namespace=ns, hashes=list(run))
            removed += self._call(self._stub.Remove, req).removed
        return removed

    def prefetch(self, keys: Sequence[bytes], namespace: Optional[str] = None) -> Dict[str, int]:
        ns, out = self._ns(namespace), {"staged": 0, "already_fast": 0, "missing": 0}
        for run in key_batches(_keys_of(keys)):
            r = self._call(self._stub.Prefetch, kv_pb2.PrefetchRequest(namespace=ns, hashes=list(run)))
            out["staged"] += r.staged
            out["already_fast"] += r.already_fast
            out["missing"] += r.missing
        return out

    def estimate_load(
        self, keys: Sequence[bytes], block_bytes: int = 0, namespace: Optional[str] = None
    ) -> Dict[str, object]:
        """Where each block is and the expected load time now (microseconds);
        ``matched`` and ``total_us`` are of the leading blocks held."""
        ns = self._ns(namespace)
        blocks: List[tuple] = []
        matched, total_us, in_prefix = 0, 0.0, True
        for run in key_batches(_keys_of(keys)):
            req = kv_pb2.EstimateLoadRequest(namespace=ns, hashes=list(run), block_bytes=block_bytes)
            r = self._call(self._stub.EstimateLoad, req)
            blocks.extend((_TIERS.get(b.tier), b.load_us) for b in r.blocks)
            if in_prefix:
                matched += r.matched
                total_us += r.total_us
                in_prefix = r.matched == len(run)
        return {"blocks": blocks, "matched": matched, "total_us": total_us}

    def close(self) -> None:
        """Closes the connection. Views still open keep their shared-memory session until
        released (or collected): their bytes stay their blocks'."""
        self._closed = True
        self._check_fork()  # in a forked child, the parent's channel is not closed
        if self._arena is not None:
            self._arena.close()
        self._channel.close()

    def __enter__(self) -> "KvClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
