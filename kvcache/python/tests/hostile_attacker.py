"""One hostile client, run as its own process by test_hostile_tenants.py (so its
work does not share the measuring client's interpreter lock).

usage: hostile_attacker.py ADDR MODE SECONDS

Prints one JSON line: {"mode", "attempts", "clear_errors", "unexpected"}; an
attempt that succeeded where it must not, or failed with another code than the one
the mode expects, counts as unexpected (and is printed to stderr).
"""

import json
import os
import sys
import threading
import time

import grpc

from strata_kv._gen import kv_pb2, kv_pb2_grpc

# The attacker holds tenant c's token; c may use qwen-* only. Tenant a owns llama3-*
# blocks the test stored; b is the well-behaved client.
TOKEN_C = "tok-c"
VICTIM_NS = "llama3-8b/chat"
OWN_NS = "qwen-7b/chat"

EXPECTED = {
    # mode: the status codes that are the clear error this attack must get
    "stall": {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE,
              grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED,
              # the stream ended (attack over) before its declared size: nothing stored
              grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DATA_LOSS},
    "huge": {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED},
    "tiny": {grpc.StatusCode.INVALID_ARGUMENT},
    "cross": {grpc.StatusCode.PERMISSION_DENIED},
    "badtoken": {grpc.StatusCode.UNAUTHENTICATED},
    "junkns": {grpc.StatusCode.PERMISSION_DENIED},
}


def main():
    addr, mode, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    channel = grpc.insecure_channel(addr)
    stub = kv_pb2_grpc.KvCacheStub(channel)
    md = (("authorization", f"Bearer {TOKEN_C}"),)
    end = time.monotonic() + seconds
    counts = {"mode": mode, "attempts": 0, "clear_errors": 0, "unexpected": 0}

    def outcome(call):
        counts["attempts"] += 1
        try:
            call()
        except grpc.RpcError as e:
            if e.code() in EXPECTED[mode]:
                counts["clear_errors"] += 1
                return
            print(f"{mode}: unexpected {e.code()}: {e.details()}", file=sys.stderr)
        else:
            print(f"{mode}: an attempt succeeded", file=sys.stderr)
        counts["unexpected"] += 1

    if mode == "stall":
        # Streams that declare 64 MiB, send one byte and then send nothing until the
        # server gives up on them (its idle timeout) or the attack ends.
        release = threading.Event()

        def stalled(i):
            def messages():
                yield kv_pb2.PutRequest(namespace=OWN_NS, hash=b"stall-%d" % i, size=64 << 20, data=b"x")
                release.wait(seconds + 5)

            outcome(lambda: stub.Put(messages(), timeout=seconds + 10, metadata=md))

        threads = [threading.Thread(target=stalled, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        time.sleep(seconds)
        release.set()
        for t in threads:
            t.join()
    else:
        i = 0
        while time.monotonic() < end:
            i += 1
            if mode == "huge":
                req = kv_pb2.PutRequest(namespace=OWN_NS, hash=b"huge-%d" % i, size=1 << 40, data=b"x")
                outcome(lambda: stub.Put(iter([req]), timeout=10, metadata=md))
            elif mode == "tiny":
                req = kv_pb2.PutRequest(namespace=OWN_NS, hash=b"tiny-%d" % i, size=10, data=b"0123456789")
                outcome(lambda: stub.Put(iter([req]), timeout=10, metadata=md))
            elif mode == "cross":
                # Read, probe, overwrite and remove tenant a's blocks with c's token.
                k = b"a-block-%d" % (i % 8)
                calls = [
                    lambda: list(stub.Get(kv_pb2.GetRequest(namespace=VICTIM_NS, hash=k), timeout=10, metadata=md)),
                    lambda: stub.Exists(kv_pb2.ExistsRequest(namespace=VICTIM_NS, hash=k), timeout=10, metadata=md),
                    lambda: stub.Put(iter([kv_pb2.PutRequest(namespace=VICTIM_NS, hash=k, size=4096, data=bytes(4096))]),
                                     timeout=10, metadata=md),
                    lambda: stub.Remove(kv_pb2.RemoveRequest(namespace=VICTIM_NS, hashes=[k]), timeout=10, metadata=md),
                ]
                outcome(calls[i % len(calls)])
            elif mode == "badtoken":
                bad = (("authorization", f"Bearer forged-{i}"),)
                outcome(lambda: stub.Exists(kv_pb2.ExistsRequest(namespace=VICTIM_NS, hash=b"a-block-0"),
                                            timeout=10, metadata=bad))
            elif mode == "junkns":
                ns = "junk-%d-%s" % (i, os.urandom(4).hex())
                outcome(lambda: list(stub.Get(kv_pb2.GetRequest(namespace=ns, hash=b"k"), timeout=10, metadata=md)))
            else:
                raise SystemExit(f"unknown mode {mode}")
    channel.close()
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
