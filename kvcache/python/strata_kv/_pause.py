"""The pause after a daemon failure, shared by the engine connectors (``vllm``,
``sglang``): a daemon that stopped answering costs one bounded call, then calls to it
are not made for a while instead of each waiting out its own timeout."""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional

import grpc

from .client import KvError

logger = logging.getLogger(__name__)


class Pause:
    """Calls to a daemon that just failed are not made for a while: 2 s after one
    failure (unavailable or past its deadline), doubled with each failure in a row up to
    30 s; one answer (a success, or an error the daemon sent) ends it. Thread-safe."""

    BASE_S = 2.0
    MAX_S = 30.0
    #: What says the daemon is unreachable or too slow (not a refusal of the call).
    DOWN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._until = 0.0
        self._failures = 0
        self._lock = threading.Lock()

    def active(self) -> bool:
        return self._clock() < self._until

    def outcome(self, error: Optional[KvError]) -> None:
        """A call's outcome. A failure while paused is a call that was in flight when
        the pause began (calls are not made while paused): the same outage seen again,
        not another failure in a row (black-box finding: four threads' calls in flight
        across a 50 ms restart made the pause 16 s)."""
        with self._lock:
            if error is None or error.code not in self.DOWN:
                self._failures = 0
                self._until = 0.0
                return
            if self._clock() < self._until:
                return
            self._failures += 1
            wait = min(self.MAX_S, self.BASE_S * 2 ** (self._failures - 1))
            self._until = self._clock() + wait
        logger.warning("strata: KV daemon failed (%s); not asked for %.0f s", error.code.name, wait)
