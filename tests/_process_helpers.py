"""Transforms for the process-worker tests (tests/test_process_workers.py), and the /proc
probes the crash scenarios share. The transforms live in a module of their own, at module
level, so that forkserver and spawn workers can unpickle them by name."""

from __future__ import annotations

import os
import pathlib
import threading
import time
from typing import Any, NamedTuple

import numpy as np

from loaderx.context import BatchContext

#: Seconds to wait for what must happen (a process ending, a child reaped): only a hang gets
#: near it, never a loaded machine.
DEADLINE = 60.0


# -- transforms ---------------------------------------------------------------------------------


def augment(batch: dict[str, Any], ctx: BatchContext) -> dict[str, Any]:
    """A random augmentation from the batch's context: noise per row from ``record_rngs``,
    a shared scale from ``ctx.rng``, each ragged record summed and shifted, and the step."""
    scale = float(ctx.rng.uniform(0.5, 2.0))
    noise = np.stack([rng.normal(size=batch["x"].shape[1:]).astype(np.float32)
                      for rng in ctx.record_rngs()]) if len(batch["x"]) else batch["x"]
    out = {"x": batch["x"] * scale + noise, "y": batch["y"] + ctx.step,
           "step": np.full(len(batch["y"]), ctx.step, dtype=np.int64),
           "rows": ctx.rows.copy()}
    if "r" in batch:
        out["r"] = [record + np.int16(ctx.step % 7) for record in batch["r"]]
        out["r_sum"] = np.array([int(record.sum()) for record in batch["r"]], dtype=np.int64)
    for key in batch:
        out.setdefault(key, batch[key])  # the mask of a padded pass, if any
    return out


def as_tuple(batch: dict[str, Any]) -> tuple[Any, ...]:
    return (batch["x"], batch["y"])


def as_list(batch: dict[str, Any]) -> list[Any]:
    return [batch["y"], batch["x"], batch["x"][:, 0]]


def bare_array(batch: dict[str, Any]) -> np.ndarray:
    return batch["x"]


def nested(batch: dict[str, Any]) -> dict[str, Any]:
    """Containers within containers."""
    return {"pair": (batch["x"], [batch["y"], {"deep": batch["y"] * 2}]), "y": batch["y"]}


class Pair(NamedTuple):
    x: Any
    y: Any


def as_namedtuple(batch: dict[str, Any]) -> Pair:
    return Pair(batch["x"], batch["y"])


def odd_containers(batch: dict[str, Any]) -> dict[Any, Any]:
    """Keys that are not strings, empty containers, and one array under two names."""
    return {0: batch["y"], (1, "a"): batch["x"], "same": batch["y"], "empty": ([], (), {}),
            "twice": [batch["x"], batch["x"]]}


def growing(batch: dict[str, Any], ctx: BatchContext) -> dict[str, Any]:
    """Arrays far larger than the batch, of another size at every step."""
    size = (ctx.step % 5) * 700_000 + 1
    return {"big": np.full(size, ctx.step, dtype=np.uint8), "y": batch["y"],
            "floats": np.arange(size // 8, dtype=np.float64) + ctx.step}


def to_torch(batch: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {"x": torch.from_numpy(batch["x"].copy()), "y": torch.from_numpy(batch["y"] * 3),
            "tuple": (torch.arange(4, dtype=torch.int32), batch["y"])}


def non_arrays(batch: dict[str, Any], ctx: BatchContext) -> dict[str, Any]:
    """Values that are not arrays next to one that is."""
    return {"x": batch["x"], "name": f"step-{ctx.step}", "n": int(batch["y"].sum()),
            "floats": [float(v) for v in batch["y"][:3]], "none": None,
            "scalar": np.float64(ctx.step) / 3}


def odd_arrays(batch: dict[str, Any], ctx: BatchContext) -> dict[str, Any]:
    """Arrays whose layout or dtype a shared-memory copy could get wrong."""
    x = batch["x"]
    return {"strided": x[:, ::2, ::-1], "fortran": np.asfortranarray(x[:, 0, :]),
            "zero_d": np.array(ctx.step, dtype=np.int16), "empty": x[:0],
            "objects": np.array([f"row{i}" for i in batch["y"][:2]] + [None], dtype=object),
            "big_endian": batch["y"].astype(">i4"), "flags": batch["y"] % 2 == 0,
            "broadcast": np.broadcast_to(x[:1], (50, *x.shape[1:])),
            "unicode": np.array(["a", "bcd"]), "complex": x[:, 0, 0] * 1j,
            "record": np.array([(ctx.step, 1.5)], dtype=[("a", "<i8"), ("b", "<f4")])}


def masked(batch: dict[str, Any]) -> dict[str, Any]:
    """An ndarray subclass with state of its own: the mask must not be lost."""
    return {"y": np.ma.masked_array(batch["y"], mask=batch["y"] % 20 == 0), "x": batch["x"]}


def odd_tensors(batch: dict[str, Any]) -> dict[str, Any]:
    """Tensors NumPy has no dtype for, or that a copy could get wrong."""
    import torch

    x = torch.from_numpy(batch["x"].copy())
    return {"bf16": x.to(torch.bfloat16), "flags": x > 0, "zero_d": torch.tensor(3),
            "strided": x[:, :, ::2], "transposed": x.transpose(0, 2),
            "f16": x.half()}


class KeepsEarlier:
    """A transform with state: it keeps views of the inputs of its last ``LAG`` batches (no
    copy) and returns the oldest with each batch as ``prev`` -- mixup against an earlier
    batch, a memory bank -- and a value computed from it, ``mix``, as such a transform would."""

    LAG = 3

    def __init__(self) -> None:
        self.bank: list[dict[str, Any]] = []

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        prev = self.bank.pop(0) if len(self.bank) == self.LAG else {
            "x": np.zeros_like(batch["x"]), "r": [np.zeros((0, 3), np.int16)]}
        self.bank.append({"x": batch["x"], "r": batch["r"]})
        # Nothing returned lies in the batch's own memory: `x` goes back as a copy.
        return {"x": batch["x"].copy(), "prev": prev["x"], "mix": batch["x"] + prev["x"],
                "prev_r": prev["r"][0].copy()}


def read_only(batch: dict[str, Any]) -> dict[str, Any]:
    """Read-only arrays: the gathered one made read-only in place, a computed one, a view."""
    x = batch["x"]
    x.setflags(write=False)
    doubled = batch["y"] * 2
    doubled.setflags(write=False)
    return {"x": x, "doubled": doubled, "view": x[1:3], "y": batch["y"],
            "nested": [x[:2]]}


def self_referencing(batch: dict[str, Any]) -> dict[str, Any]:
    """A list that holds itself, a dict that holds itself, and one list held twice."""
    loop: list[Any] = [batch["x"]]
    loop.append(loop)
    ring: dict[str, Any] = {"y": batch["y"]}
    ring["me"] = ring
    shared = [batch["y"] + 1]
    return {"loop": loop, "ring": ring, "a": shared, "b": (shared, 1)}


def unpicklable_output(batch: dict[str, Any]) -> dict[str, Any]:
    return {"x": batch["x"], "lock": threading.Lock()}


def unpicklable_key_at(step: int, batch: dict[str, Any], ctx: BatchContext) -> dict[Any, Any]:
    """With ``functools.partial(unpicklable_key_at, step)``: the batch, but at ``step`` a
    dict of arrays whose key hashes and does not pickle (a local function)."""
    if ctx.step == step:
        def local() -> None:
            return None
        return {local: batch["x"]}  # arrays only, in the batch's segment: the fast reply
    return batch


def stop_at_step_1(batch: dict[str, Any], ctx: BatchContext) -> dict[str, Any]:
    if ctx.step == 1:
        raise StopIteration
    return batch


def boom_at_step_3(batch: dict[str, Any], ctx: BatchContext) -> dict[str, Any]:
    if ctx.step == 3:
        raise ValueError("boom at step 3")
    return batch


class HoldsALock(Exception):
    """An exception that does not pickle: it holds a lock."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


class NeedsTwoArguments(Exception):
    """An exception that pickles but does not unpickle (its __init__ wants two arguments,
    its args hold one)."""

    def __init__(self, what: str, where: int) -> None:
        super().__init__(f"{what} at {where}")


def unpicklable_at_step_2(batch: dict[str, Any], ctx: BatchContext) -> dict[str, Any]:
    if ctx.step == 2:
        raise HoldsALock("a lock inside at step 2")
    return batch


def unloadable_at_step_2(batch: dict[str, Any], ctx: BatchContext) -> dict[str, Any]:
    if ctx.step == 2:
        raise NeedsTwoArguments("two arguments needed", 2)
    return batch


def hang_at_step_2(batch: dict[str, Any], ctx: BatchContext) -> dict[str, Any]:
    """A transform stuck for good at step 2 (close() must kill its worker)."""
    if ctx.step == 2:
        threading.Event().wait()
    return batch


#: The file whose existence lets :func:`gate_at_step_2` go on (the tests set it).
GATE_VARIABLE = "LOADERX_TEST_GATE"


def gate_at_step_2(batch: dict[str, Any], ctx: BatchContext) -> dict[str, Any]:
    """Step 2 waits until the file ``$LOADERX_TEST_GATE`` exists: the consumer then waits
    for it as long as the test wants."""
    if ctx.step == 2:
        while not os.path.exists(os.environ[GATE_VARIABLE]):
            time.sleep(0.01)
    return batch


def blocked(pid: int) -> bool:
    """Whether process ``pid``'s main thread sleeps inside a system call (what a consumer
    waiting for a batch should do), not running (spinning)."""
    try:
        return pathlib.Path(f"/proc/{pid}/syscall").read_text().split()[0] != "running"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def exit_at_step_2(batch: dict[str, Any], ctx: BatchContext) -> dict[str, Any]:
    if ctx.step == 2:
        os._exit(7)
    return batch


# -- processes, as /proc shows them ------------------------------------------------------------


def state_of(pid: int) -> str | None:
    """The process's state letter (R, S, Z, ...), or None once it is gone."""
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line.split()[1]
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: whoever inherited it may be slow to reap)."""
    return state_of(pid) not in (None, "Z", "X")


def parents() -> dict[int, int]:
    """Every process's parent pid."""
    out = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("PPid:"):
                    out[int(entry.name)] = int(line.split()[1])
                    break
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


def descendants(pid: int) -> set[int]:
    """The processes below ``pid`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for child, parent in parents().items():
        children.setdefault(parent, []).append(child)
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def zombies_below(pid: int) -> list[int]:
    """The zombies among ``pid``'s descendants: children that ended and nobody reaped."""
    return sorted(p for p in descendants(pid) if state_of(p) == "Z")


def wait_until(condition: Any, what: str, timeout: float = DEADLINE) -> None:
    """Polls ``condition()`` until it is true; raises AssertionError naming ``what`` after
    ``timeout`` seconds (only a hang gets there)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen in {timeout:.0f} s")
        time.sleep(0.02)


def shm_mappings(pid: int) -> list[str]:
    """The /dev/shm files process ``pid`` maps (named shared memory)."""
    try:
        maps = pathlib.Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return []
    return sorted({line.split(None, 5)[5] for line in maps.splitlines()
                   if len(line.split(None, 5)) == 6 and "/dev/shm/" in line})


def global_draws(batch: dict[str, Any]) -> dict[str, Any]:
    """Draws from the process-global generators a torchvision-style augmentation uses
    (Python's random, np.random, torch's default generator), and who drew them."""
    import random

    import torch

    return {"y": batch["y"], "pid": os.getpid(), "random": random.random(),
            "np": float(np.random.random()), "torch": float(torch.rand(1))}


def numpy_draws(batch: dict[str, Any]) -> dict[str, Any]:
    """Who built the batch, and a draw from its process-global NumPy generator (no torch)."""
    return {"y": batch["y"], "pid": os.getpid(), "np": float(np.random.random())}
