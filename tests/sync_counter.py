"""Counting the host syncs a decode step would make on CUDA, on the CPU path (tests only).

On CUDA every read of device data by the host (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `bool(t)`, `int(t)`,
`float(t)`, `t` used as an index) waits for the device's queue to drain, and so does every blocking host->device
copy: `torch.tensor(python_data, device=d)` and `t.to(d)` / `t.cuda()` of a host tensor. On CPU these calls cost
nothing, so a test counts them instead: `SyncCounter` patches those entry points and, while `counting`, records
each call made from this project's code (bench/, methods/).

Definition (what a test asserts):
- Only calls whose caller is a file of this project count. Calls inside torch or transformers (the target's own
  forward: rotary embeddings move a buffer to `x.device`, a no-op there) are not this project's to change.
- `t.to(device)` counts whenever a device is named, whether or not `t` already lives there: on the CPU path every
  tensor is a host tensor, so the shim cannot tell a device-resident one from a host one. Code in the timed path
  therefore keeps device tensors on the device and never re-`.to()`s them.
- Calls on tensors that are host tensors even on CUDA (speculative sampling's host-side arithmetic after its one
  copy) are counted too, so only greedy counts are exact; `counts_by_kind` tells the kinds apart.
- The phase timer's `torch.cuda.synchronize` is not counted (it does nothing on CPU; it moves to CUDA events).

`count_decode_steps(engine, prompt, stop)` hooks the drafter's `propose` (called once at the start of every decode
step, vanilla included) so that prefill is excluded and each step's count is kept apart: it returns the engine's
TurnOutput and the list of per-step counts (`count_per_step` hooks any per-step method, e.g. the batched engine's
`_propose`). Counting stops when generate returns; nothing after its loop is counted because nothing runs there.
"""
from __future__ import annotations

import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import torch

PROJECT = Path(__file__).resolve().parent.parent
COUNTED_DIRS = tuple(str(PROJECT / name) + "/" for name in ("bench", "methods"))
READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


def _names_a_device(args, kwargs) -> bool:
    if "device" in kwargs and kwargs["device"] is not None:
        return True
    for arg in args[:1]:
        if isinstance(arg, torch.device):
            return True
        if isinstance(arg, str):
            try:
                torch.device(arg)
                return True
            except RuntimeError:
                return False
    return False


class SyncCounter:
    """Patches torch's host-sync entry points while active; `counting` turns recording on and off."""

    def __init__(self):
        self.counting = False
        self.kinds: Counter[str] = Counter()
        self.sites: Counter[str] = Counter()
        self._busy = False  # a counted call that calls another entry point counts once

    @property
    def total(self) -> int:
        return sum(self.kinds.values())

    def _record(self, kind: str) -> None:
        frame = sys._getframe(2)
        filename = frame.f_code.co_filename
        if filename.startswith(COUNTED_DIRS):
            self.kinds[kind] += 1
            self.sites[f"{Path(filename).relative_to(PROJECT)}:{frame.f_lineno} {kind}"] += 1

    def _wrap(self, original, kind: str, when=None):
        counter = self

        def wrapper(*args, **kwargs):
            if counter.counting and not counter._busy and (when is None or when(args, kwargs)):
                counter._record(kind)
                counter._busy = True
                try:
                    return original(*args, **kwargs)
                finally:
                    counter._busy = False
            return original(*args, **kwargs)

        return wrapper

    @contextmanager
    def patched(self):
        saved = {name: torch.Tensor.__dict__.get(name) for name in (*READS, "to", "cuda")}
        originals = {name: getattr(torch.Tensor, name) for name in saved}
        tensor_fn = torch.tensor
        try:
            for name in READS:
                setattr(torch.Tensor, name, self._wrap(originals[name], name))
            setattr(torch.Tensor, "to", self._wrap(originals["to"], "to(device)",
                                                   lambda a, k: _names_a_device(a[1:], k)))
            setattr(torch.Tensor, "cuda", self._wrap(originals["cuda"], "cuda"))
            torch.tensor = self._wrap(tensor_fn, "tensor(device=)", lambda a, k: k.get("device") is not None)
            yield self
        finally:
            torch.tensor = tensor_fn
            for name, value in saved.items():
                if value is None:
                    delattr(torch.Tensor, name)
                else:
                    setattr(torch.Tensor, name, value)


def count_per_step(run, owner, step_start: str) -> tuple[object, list[int], SyncCounter]:
    """(run()'s result, host syncs of each step, the counter): `owner.<step_start>` is called once at the start of
    every decode step; counting starts at its first call, so whatever ran before (prefill) is left out."""
    counter = SyncCounter()
    steps: list[int] = []
    original = getattr(owner, step_start)

    def marked(*args, **kwargs):
        if counter.counting:
            steps.append(counter.total - sum(steps))
        counter.counting = True
        return original(*args, **kwargs)

    setattr(owner, step_start, marked)
    try:
        with counter.patched():
            result = run()
            if counter.counting:
                steps.append(counter.total - sum(steps))
            counter.counting = False
    finally:
        delattr(owner, step_start)
    return result, steps, counter


def count_decode_steps(engine, prompt: list[int], stop) -> tuple[object, list[int], SyncCounter]:
    """count_per_step of a batch-1 engine.generate: steps start at the drafter's propose (vanilla's too)."""
    return count_per_step(lambda: engine.generate(prompt, stop), engine.drafter, "propose")
