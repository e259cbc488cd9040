"""Real checkpoint writers through a real kernel mount: `torch.save` / `torch.load`,
`torch.distributed.checkpoint`, `safetensors` (it renames its temporary file while still
holding it open), Hugging Face `save_pretrained` / `from_pretrained`, NumPy's `savez` (a
zipfile that seeks back to patch its headers), a logging `FileHandler` appending across
two runs, a checkpoint directory renamed into place (as Orbax and TensorFlow's checkpoint
manager save), and a `subprocess.run` while a checkpoint is open (its child closes a copy
of the descriptor).

Each test checks what the mount reads back and what the object store (a local
directory behind `strata mount file://...`) holds: the same bytes, whole.

Runs in the test script's virtualenv (vllm brings torch, transformers, safetensors and
numpy). The mount is `strata mount --allow-writes --allow-overwrite --allow-delete`; the
binary is $STRATA_BIN (default <repo>/target/debug/strata). A missing binary, package or
/dev/fuse fails the tests: never a skip.
"""

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mount():
    """A writable mount of a local-directory store: yields (mountpoint, store dir)."""
    binary = os.environ.get("STRATA_BIN", str(REPO / "target" / "debug" / "strata"))
    if not os.path.exists(binary):
        pytest.fail(f"{binary} not found: run `cargo build -p strata-tools` or set STRATA_BIN")
    with tempfile.TemporaryDirectory(prefix="strata-ckpt-") as d:
        store, mnt, cache = (Path(d) / n for n in ("store", "mnt", "cache"))
        store.mkdir()
        mnt.mkdir()
        (store / "data").mkdir()
        (store / "data" / "train.txt").write_text("tokens\n")
        log = open(Path(d) / "daemon.log", "w")
        proc = subprocess.Popen(
            [binary, "mount", f"file://{store}", str(mnt), "--cache-dir", str(cache),
             "--allow-writes", "--allow-overwrite", "--allow-delete", "--foreground"],
            stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    pytest.fail(f"strata mount exited with {proc.wait()}: "
                                f"{(Path(d) / 'daemon.log').read_text()[-2000:]}")
                if line.strip() == "ready":
                    break
            else:
                pytest.fail("strata mount not ready within 30 s")
            yield mnt, store
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
                proc.kill()
                proc.wait()
            log.close()


def same_bytes(mnt, store, rel):
    got, want = (mnt / rel).read_bytes(), (store / rel).read_bytes()
    assert got == want, f"{rel}: the mount reads {len(got)} bytes, the store holds {len(want)}"
    return want


def model_state():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    return {k: v.clone() for k, v in m.state_dict().items()}


def test_torch_save_and_load(mount):
    mnt, store = mount
    (mnt / "ckpt").mkdir()
    state = {"model": model_state(), "step": 100, "opt": {"lr": 1e-3}}
    torch.save(state, mnt / "ckpt" / "step-100.pt")
    same_bytes(mnt, store, "ckpt/step-100.pt")
    back = torch.load(mnt / "ckpt" / "step-100.pt", weights_only=True)
    assert back["step"] == 100 and back["opt"] == {"lr": 1e-3}
    for k, v in state["model"].items():
        assert torch.equal(back["model"][k], v), k


def test_safetensors_roundtrip(mount):
    mnt, store = mount
    tensors = {f"layer.{i}.weight": torch.randn(128, 128) for i in range(8)}
    save_file(tensors, mnt / "model.safetensors")
    same_bytes(mnt, store, "model.safetensors")
    back = load_file(mnt / "model.safetensors")
    assert back.keys() == tensors.keys()
    assert all(torch.equal(back[k], v) for k, v in tensors.items())


def test_numpy_savez_seeks_back_into_its_zip(mount):
    mnt, store = mount
    arrays = {"a": np.arange(100_000, dtype=np.float32), "b": np.eye(64)}
    np.savez(mnt / "arrays.npz", **arrays)
    same_bytes(mnt, store, "arrays.npz")
    with np.load(mnt / "arrays.npz") as z:
        assert all(np.array_equal(z[k], v) for k, v in arrays.items())


def test_a_log_appended_by_two_runs(mount):
    mnt, store = mount
    path = mnt / "train.log"
    for run in (1, 2):
        log = logging.getLogger(f"run{run}")
        handler = logging.FileHandler(path)  # mode "a": the second run appends
        log.addHandler(handler)
        log.warning("run %d started", run)
        handler.close()
        log.removeHandler(handler)
    want = "run 1 started\nrun 2 started\n"
    assert path.read_text() == want
    assert same_bytes(mnt, store, "train.log").decode() == want


def test_a_checkpoint_directory_renamed_into_place(mount):
    mnt, store = mount
    tmp = mnt / "ckpt_200.orbax-checkpoint-tmp-1"
    (tmp / "params").mkdir(parents=True)
    torch.save(model_state(), tmp / "params" / "shard-0.pt")
    (tmp / "_CHECKPOINT_METADATA").write_text('{"step": 200}')
    os.rename(tmp, mnt / "ckpt_200")
    assert not tmp.exists()
    # No object is left under the old name (and a local store keeps no emptied
    # directory, which a listing would show).
    assert not (store / tmp.name).exists()
    assert sorted(p.name for p in (mnt / "ckpt_200").iterdir()) == ["_CHECKPOINT_METADATA", "params"]
    same_bytes(mnt, store, "ckpt_200/params/shard-0.pt")
    assert (store / "ckpt_200" / "_CHECKPOINT_METADATA").read_text() == '{"step": 200}'


def test_a_subprocess_while_a_checkpoint_is_open(mount):
    mnt, store = mount
    chunk = os.urandom(1 << 20)
    with open(mnt / "big.bin", "wb") as f:
        for i in range(24):
            f.write(chunk)
            if i % 8 == 4:
                # Its child closes a copy of the descriptor (exec closes O_CLOEXEC
                # ones): that close must not upload a half-written file.
                subprocess.run([sys.executable, "-c", "pass"], check=True)
                assert not (store / "big.bin").exists(), "uploaded before the writer's close"
    assert same_bytes(mnt, store, "big.bin") == chunk * 24


def test_hugging_face_save_pretrained_and_from_pretrained(mount):
    mnt, store = mount
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(1)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=500, n_positions=64)
    model = GPT2LMHeadModel(config)
    model.save_pretrained(mnt / "hf-model")
    names = sorted(p.name for p in (mnt / "hf-model").iterdir())
    assert "config.json" in names and "model.safetensors" in names, names
    same_bytes(mnt, store, "hf-model/model.safetensors")
    back = GPT2LMHeadModel.from_pretrained(mnt / "hf-model")
    want = model.state_dict()
    for k, v in back.state_dict().items():
        assert torch.equal(v, want[k]), k


def test_torch_distributed_checkpoint(mount):
    mnt, store = mount
    import torch.distributed.checkpoint as dcp

    state = {k: v for k, v in model_state().items()}
    dcp.save(state, checkpoint_id=str(mnt / "dcp-1"))
    names = sorted(p.name for p in (mnt / "dcp-1").iterdir())
    assert ".metadata" in names and any(n.endswith(".distcp") for n in names), names
    for n in names:
        same_bytes(mnt, store, f"dcp-1/{n}")
    back = {k: torch.empty_like(v) for k, v in state.items()}
    dcp.load(back, checkpoint_id=str(mnt / "dcp-1"))
    assert all(torch.equal(back[k], v) for k, v in state.items())


def test_an_anonymous_temporary_file(mount):
    mnt, store = mount
    before = sorted(p.name for p in store.iterdir())
    # Created and unlinked at once (or O_TMPFILE), then written and read back.
    with tempfile.TemporaryFile(dir=mnt) as f:
        f.write(b"scratch " * 1000)
        f.seek(0)
        assert f.read() == b"scratch " * 1000
    assert sorted(p.name for p in store.iterdir()) == before, "nothing left in the store"
