"""``KvClient``: Strata's KV service in the shape of an LMCache remote connector
(``exists``, ``batched_contains``, ``get``, ``put``, batched forms, ``close``).

Keys are the block hashes (bytes, 1..64) a client derives, e.g. with
:func:`strata_kv.chain_hashes_v1`; every call works in the client's namespace (model +
tenant) unless given another. Errors are :class:`KvError` with the gRPC status code; a
missing block is ``None``, not an error.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import socket
import struct
import threading
import time
import warnings
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


def check_namespace(namespace: str) -> str:
    """``namespace`` if the server takes it, else ``ValueError`` saying why (a client
    built with one it refuses would fail every call)."""
    n = len(namespace.encode("utf-8"))
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


def _wrap(e: grpc.RpcError) -> KvError:
    return KvError(e.code(), e.details() or "")


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


#: gRPC metadata asking for a device handle of a GPU-tier block (kvcache/src/shm.rs).
DEVICE_IPC_METADATA = "strata-device-ipc"
#: The side socket's hello: session (16), arena size (8), device memory size (8), then
#: the device memory's id (16) when it is not 0.
_HELLO, _HELLO_DEVICE = 32, 48
#: What the daemon sends instead of a hello when every session holds leases.
_REFUSED_SESSIONS_FULL = b"strata-shm refused: sessions full"


class _ShmArena:
    """The daemon's shared-memory arena, attached over its side socket: the memfd comes
    with SCM_RIGHTS and is mapped read-only; lease ids go back on the socket.
    ``timeout`` bounds the attach (a stopped daemon accepts the connection but never
    says hello): past it, ``TimeoutError``."""

    def __init__(self, path: str, timeout: Optional[float] = None):
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.device_view: Optional[memoryview] = None
        self.device_id = b""
        try:
            self._sock.settimeout(timeout)
            self._sock.connect(path)
            msg, fds, _flags, _addr = socket.recv_fds(self._sock, _HELLO_DEVICE, 2)
            self._sock.settimeout(None)
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
        self._lock = threading.Lock()

    def release(self, lease: int) -> None:
        with self._lock:
            try:
                self._sock.sendall(struct.pack("<Q", lease))
            except OSError:
                pass  # the session is gone; the daemon released its leases already

    def abandon(self, call: int) -> None:
        """Gives up the leases that answered the leasing call ``call`` (numbered by
        :data:`SHM_REQUEST_METADATA`): its answer never came (a timeout, a cancel), so its
        lease ids are unknown here and could not be released one by one."""
        with self._lock:
            try:
                self._sock.sendall(struct.pack("<Q", call | _ABANDON_BIT))
            except OSError:
                pass

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
        self._sock.close()  # ends the session: the daemon releases what is left
        # The mapping goes when the last view into it does.


class BlockView:
    """A fetched block: ``data`` is a read-only memoryview, in place in the daemon's
    shared-memory arena when ``shared`` (valid until :meth:`release`, or the end of a
    ``with`` block), else over inline bytes.

    Served by device handle (``device`` is "emulated" or "cuda", ``handle`` the parsed
    :class:`strata_kv.ipc.IpcHandle`): for an emulated device ``data`` is the block in
    place in the daemon's device memory; for CUDA ``data`` is None and
    :meth:`cuda_tensor` opens the handle (a uint8 CUDA tensor over the block)."""

    def __init__(self, data, arena: Optional[_ShmArena] = None, lease: int = 0,
                 handle: Optional[IpcHandle] = None):
        self.data = data
        self.shared = arena is not None
        self._arena, self._lease = arena, lease
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
        if self._cuda is not None:
            self._cuda.close()
            self._cuda = None
        if self._arena is not None:
            if self.data is not None:
                self.data.release()
            self._arena.release(self._lease)
            self._arena = None

    def __enter__(self) -> "BlockView":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass


class KvClient:
    """A connection to a Strata KV service.

    ``addr``: ``unix:///path/kv.sock``, ``host:port`` (plaintext) or, with
    ``root_certificates`` (PEM bytes), a TLS connection to ``host:port``. ``token`` is
    sent as ``authorization: Bearer <token>``. ``identity`` (a :class:`ModelIdentity` or
    its digest) is sent with every call: the service binds each namespace to the first
    identity it sees and refuses calls with another (``FAILED_PRECONDITION``), so blocks
    of another model revision are never served even if a key collides by mistake.
    ``shm``: on the daemon's host, attach to its shared-memory arena (True: the
    ``kv-shm.sock`` beside a ``unix://`` address; or the side socket's path): Gets are
    then answered with ranges of the arena read in place (:meth:`get_view`); attaching
    waits at most ``timeout`` (``TimeoutError``, an ``OSError``). ``timeout`` also bounds
    each call; :meth:`put` and :meth:`get_view` take a shorter one per call.
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
        options = [
            ("grpc.max_receive_message_length", 16 << 20),
            ("grpc.max_send_message_length", 16 << 20),
            # A connection of its own: gRPC core otherwise shares one among every
            # channel to the same address in the process, and a put waiting for the
            # server's put budget holds part of that connection's HTTP/2 window, which
            # stalled the other clients' puts that had their budget (black-box finding:
            # 8 clients' concurrent 64 MiB puts, 4 refused after 10 s).
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if addr.startswith("unix:"):
            # gRPC core sends the socket path as :authority, which HTTP/2 servers such as
            # hyper (the Rust service) refuse as malformed; any valid host name will do.
            options.append(("grpc.default_authority", "localhost"))
        if root_certificates is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=root_certificates)
            self._channel = grpc.secure_channel(addr, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(addr, options=options)
        self._stub = kv_pb2_grpc.KvCacheStub(self._channel)
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
                # unix:///run/kv.sock -> /run/kv.sock; unix:run/kv.sock (gRPC: relative to
                # the working directory) -> run/kv.sock, not /run/kv.sock.
                rest = addr[len("unix:"):]
                kv_sock = "/" + rest.lstrip("/") if rest.startswith("/") else rest
                shm = os.path.join(os.path.dirname(kv_sock), "kv-shm.sock")
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
        if self._arena is not None and self._arena.device_view is not None:
            return "emulated"
        return None

    # -- plumbing ---------------------------------------------------------------------

    def _use_arena(self, arena: Optional[_ShmArena]) -> None:
        """Gets name ``arena``'s session (None: no arena, blocks come as bytes)."""
        md = self._metadata or ()
        get_md = md + ((SHM_SESSION_METADATA, arena.session),) if arena is not None else md
        self._get_metadata = get_md or None
        self._device_metadata = (get_md + ((DEVICE_IPC_METADATA, "1"),)) if arena is not None else self._metadata
        self._arena = arena

    def _reattach(self, ended: Optional[_ShmArena]) -> None:
        """The daemon no longer holds ``ended``'s session (it restarted): attach again at
        the same side socket, once for all threads that saw it (``ended`` None: no arena
        now, after a failed attach). Views into the old arena stay readable (their
        mapping is their own). When attaching fails (the daemon now runs without an
        arena, or is not back yet), Gets go on as bytes, and attaching is tried again
        at a Get 5 s later."""
        with self._attach_lock:
            if self._arena is not ended:
                return  # another thread attached already
            try:
                # A later try waits at most 2 s for the hello: it runs inside a Get.
                bound = self._timeout if ended is not None else min(self._timeout or 2.0, 2.0)
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

    def _call(self, method, request, timeout: Optional[float] = None):
        try:
            return method(request, timeout=self._timeout if timeout is None else timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise _wrap(e) from None
        except ValueError as e:  # grpc's "Cannot invoke RPC: Channel closed!"
            raise _closed(e) from None

    def _ns(self, namespace: Optional[str]) -> str:
        return self.namespace if namespace is None else namespace

    # -- connector API ----------------------------------------------------------------

    def ping(self) -> Dict[str, object]:
        r = self._call(self._stub.Ping, kv_pb2.PingRequest())
        return {"version": r.version, "api": r.api, "max_block_bytes": r.max_block_bytes}

    def exists(self, key: bytes, namespace: Optional[str] = None) -> bool:
        r = self._call(self._stub.Exists, kv_pb2.ExistsRequest(namespace=self._ns(namespace), hash=key))
        return r.exists

    def locate(self, key: bytes, namespace: Optional[str] = None) -> Optional[str]:
        """The tier holding ``key`` ("memory", "disk", "gpu") or None."""
        r = self._call(self._stub.Exists, kv_pb2.ExistsRequest(namespace=self._ns(namespace), hash=key))
        return _TIERS.get(r.tier)

    def batch_exists(self, keys: Sequence[bytes], namespace: Optional[str] = None) -> List[bool]:
        ns, out = self._ns(namespace), []
        for run in key_batches(keys):
            req = kv_pb2.BatchExistsRequest(namespace=ns, hashes=list(run))
            out.extend(self._call(self._stub.BatchExists, req).exists)
        return out

    def match_prefix(self, keys: Sequence[bytes], namespace: Optional[str] = None) -> int:
        """Number of leading keys of the chain that are cached (stops at the first miss)."""
        ns, matched = self._ns(namespace), 0
        for run in key_batches(keys):
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
        in one BatchLease call; else the Gets sent together on the connection and then
        collected: one round trip for the batch rather than one per key (a page-by-page
        load of 16 pages over the arena took 22 ms against 4 ms for one batched Get over
        TCP). A failure releases the views already taken and raises."""
        ns = self._ns(namespace)
        bound = self._timeout if timeout is None else timeout
        if self._arena is not None and self._arena.ended():
            # The daemon restarted: a Get naming the old session is answered with bytes,
            # not refused, so the device-handle path (per-key Gets) never learnt of it
            # (black-box finding: zero-copy lost for the engine's lifetime).
            self._reattach(self._arena)
        elif self._arena is None and self._shm_path and time.monotonic() >= self._next_attach:
            self._reattach(None)
        if self._arena is not None and not device and self._batch_lease and keys:
            views = self._leased_views(keys, ns, bound)
            if views is not None:
                return views
        md = self._device_metadata if device else self._get_metadata
        arena, call = self._arena, _call_number()
        if arena is not None and md:
            md = tuple(md) + ((SHM_REQUEST_METADATA, str(call)),)
        try:
            streams = [
                self._stub.Get(kv_pb2.GetRequest(namespace=ns, hash=k), timeout=bound, metadata=md)
                for k in keys
            ]
        except ValueError as e:
            raise _closed(e) from None
        views: List[Optional[BlockView]] = []
        try:
            for stream in streams:
                views.append(self._view_of(stream))
        except BaseException:
            for v in views:
                if v is not None:
                    v.release()
            for stream in streams[len(views):]:
                stream.cancel()
            if arena is not None:
                arena.abandon(call)  # leases answered to Gets whose answer never came
            raise
        return views

    def _leased_views(self, keys: Sequence[bytes], ns: str,
                      bound: Optional[float]) -> Optional[List[Optional[BlockView]]]:
        """The batch leased in one BatchLease call (blocks the arena could not lease then
        by Get, as bytes). None when the daemon predates BatchLease (the caller falls back
        to one Get per key)."""
        deadline = None if bound is None else time.monotonic() + bound
        for attempt in (0, 1):
            arena = self._arena
            if arena is None:
                return None  # attaching again failed: Gets as bytes
            call = _call_number()
            md = tuple(self._get_metadata) + ((SHM_REQUEST_METADATA, str(call)),)
            try:
                answer = self._stub.BatchLease(kv_pb2.BatchGetRequest(namespace=ns, hashes=list(keys)),
                                               timeout=bound, metadata=md)
                break
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self._batch_lease = False
                    return None
                if (attempt == 0 and e.code() == grpc.StatusCode.FAILED_PRECONDITION
                        and SHM_SESSION_ENDED in (e.details() or "")):
                    self._reattach(arena)
                    continue
                # The answer may have been built after we gave up: its leases go back.
                arena.abandon(call)
                raise _wrap(e) from None
            except ValueError as e:
                raise _closed(e) from None
            except BaseException:
                arena.abandon(call)
                raise
        views: List[Optional[BlockView]] = []
        # Every lease answered is owned by a view from here on, so any failure below
        # releases them all.
        for b in answer.blocks:
            views.append(BlockView(None, arena, b.shm_lease) if b.found and b.shm_lease else None)
        try:
            if len(answer.blocks) != len(keys):
                raise KvError(grpc.StatusCode.INTERNAL,
                              f"BatchLease answered {len(answer.blocks)} entries for {len(keys)} keys")
            for i, (b, k) in enumerate(zip(answer.blocks, keys)):
                if not b.found:
                    continue
                if b.shm_lease:
                    if b.shm_offset + b.size > arena.size:
                        raise KvError(grpc.StatusCode.INTERNAL, f"bad shared-memory lease {b.shm_offset}+{b.size}")
                    views[i].data = arena.view[b.shm_offset : b.shm_offset + b.size]
                else:
                    left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
                    views[i] = self._view_of(self._stub.Get(kv_pb2.GetRequest(namespace=ns, hash=k),
                                                            timeout=left, metadata=self._get_metadata))
        except BaseException:
            for v in views:
                if v is not None:
                    v.release()
            raise
        return views

    def _view_of(self, stream) -> Optional[BlockView]:
        """The view one Get stream answers (None: the block is not held)."""
        try:
            msgs = list(stream)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND and e.details() == "block not found":
                return None
            raise _wrap(e) from None
        except ValueError as e:
            raise _closed(e) from None
        if msgs and msgs[0].device_handle:
            return self._device_view(msgs[0])
        if msgs and msgs[0].shm_lease:
            m = msgs[0]
            if self._arena is None or m.shm_offset + m.size > self._arena.size:
                raise KvError(grpc.StatusCode.INTERNAL, f"bad shared-memory lease {m.shm_offset}+{m.size}")
            data = self._arena.view[m.shm_offset : m.shm_offset + m.size]
            return BlockView(data, self._arena, m.shm_lease)
        parts = [m.data for m in msgs]
        return BlockView(memoryview(parts[0] if len(parts) == 1 else b"".join(parts)))

    def _device_view(self, m) -> BlockView:
        arena = self._arena
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
                return BlockView(dv[h.offset : h.offset + h.length], arena, m.shm_lease, h)
            return BlockView(None, arena, m.shm_lease, h)
        except ValueError as e:
            arena.release(m.shm_lease)
            raise KvError(grpc.StatusCode.INTERNAL, str(e)) from None

    def batched_get(self, keys: Sequence[bytes], namespace: Optional[str] = None) -> List[Optional[bytes]]:
        ns = self._ns(namespace)
        parts: List[List[bytes]] = [[] for _ in keys]
        found = [False] * len(keys)
        try:
            base = 0
            for run in key_batches(keys):
                req = kv_pb2.BatchGetRequest(namespace=ns, hashes=list(run))
                for m in self._stub.BatchGet(req, timeout=self._timeout, metadata=self._metadata):
                    if m.found:
                        found[base + m.index] = True
                        parts[base + m.index].append(m.data)
                base += len(run)
        except grpc.RpcError as e:
            raise _wrap(e) from None
        except ValueError as e:
            raise _closed(e) from None
        return [b"".join(p) if f else None for p, f in zip(parts, found)]

    def put(self, key: bytes, value: bytes, namespace: Optional[str] = None,
            timeout: Optional[float] = None) -> bool:
        """Stores a block; returns True when the key was already cached (idempotent).
        ``timeout``: this call's bound (default: the client's)."""
        ns = self._ns(namespace)
        view = memoryview(value)

        def messages() -> Iterator[kv_pb2.PutRequest]:
            yield kv_pb2.PutRequest(namespace=ns, hash=key, size=len(view), data=bytes(view[:CHUNK_BYTES]))
            for off in range(CHUNK_BYTES, len(view), CHUNK_BYTES):
                yield kv_pb2.PutRequest(data=bytes(view[off : off + CHUNK_BYTES]))

        return self._call(self._stub.Put, messages(), timeout).already_present

    def batched_put(
        self, keys: Sequence[bytes], values: Sequence[bytes], namespace: Optional[str] = None
    ) -> List[bool]:
        """Stores each ``values[i]`` under ``keys[i]`` (one Put each, in order); per
        key, whether it was already cached. Keys and values are checked before any is
        sent (a key of 1-64 bytes, a non-empty value), so a malformed batch stores
        nothing; a Put the service refuses stops the batch with a
        :class:`BatchPutError` naming its index and what was stored before it (black-box
        finding: the entries before a bad one were stored, the ones after it never sent,
        and the error named neither)."""
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys but {len(values)} values")
        for i, (k, v) in enumerate(zip(keys, values)):
            if not 1 <= len(k) <= MAX_KEY_BYTES:
                raise ValueError(f"key {i} of the batch is {len(k)} bytes (1..={MAX_KEY_BYTES}); nothing was sent")
            if len(memoryview(v)) == 0:
                raise ValueError(f"value {i} of the batch is empty; nothing was sent")
        done: List[bool] = []
        for i, (k, v) in enumerate(zip(keys, values)):
            try:
                done.append(self.put(k, v, namespace))
            except KvError as e:
                raise BatchPutError(e, i, done) from e
        return done

    def remove(self, keys: Sequence[bytes], namespace: Optional[str] = None) -> int:
        ns, removed = self._ns(namespace), 0
        for run in key_batches(keys):
            req = kv_pb2.RemoveRequest(namespace=ns, hashes=list(run))
            removed += self._call(self._stub.Remove, req).removed
        return removed

    def prefetch(self, keys: Sequence[bytes], namespace: Optional[str] = None) -> Dict[str, int]:
        ns, out = self._ns(namespace), {"staged": 0, "already_fast": 0, "missing": 0}
        for run in key_batches(keys):
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
        for run in key_batches(keys):
            req = kv_pb2.EstimateLoadRequest(namespace=ns, hashes=list(run), block_bytes=block_bytes)
            r = self._call(self._stub.EstimateLoad, req)
            blocks.extend((_TIERS.get(b.tier), b.load_us) for b in r.blocks)
            if in_prefix:
                matched += r.matched
                total_us += r.total_us
                in_prefix = r.matched == len(run)
        return {"blocks": blocks, "matched": matched, "total_us": total_us}

    def close(self) -> None:
        if self._arena is not None:
            self._arena.close()
        self._channel.close()

    def __enter__(self) -> "KvClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
