"""The rank's memory over a traced step and at its peak: MemTracker's split of the peak by what
each tensor is (parameters, gradients, optimizer state, activations, temporaries), the phase marks
and samples that draw memory over the step, and the names of the tensors the harness knows.

Runs inside the ranks (imports torch); `workers.harness.measure.StepProfiler` drives it in the
profiled window, and `workers.harness.memtimeline` (no torch) turns its samples into the timeline.
"""

from __future__ import annotations

import gc
import itertools
import resource
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten

from workers.harness import memtimeline
from workers.harness.torchtools import MemTracker, ModTracker, get_untyped_storages

# ---- memory at the peak: MemTracker ----

MEMORY_CATEGORIES: dict[str, str] = {
    "Parameter": "params",
    "Gradient": "grads",
    "Optstate": "optimizer",
    "Activation": "activations",
    "Temp": "temporaries",
    "Buffer": "other",
    "Other": "other",
}
"""MemTracker's reference types -> the result document's `memory_breakdown` keys."""
MEMORY_KEYS = ("params", "grads", "optimizer", "activations", "temporaries", "other")


class _NonLeafInputsModTracker(ModTracker):
    """ModTracker that hooks a module's backward on its non-leaf inputs only.

    Its hook on the inputs fires once all of their gradients are computed, which autograd finds
    out by asking, of each input, whether the engine will run its node — a question
    `torch.autograd.grad` refuses for a leaf. The zero-bubble pipeline schedules compute a stage's
    input gradient with `autograd.grad` over its input, a leaf (the activation received from the
    previous stage). A module whose inputs are all leaves gets its post-backward call at the end
    of the backward instead (ModTracker's own fallback for inputs without gradients)."""

    def _fw_pre_hook(self, mod: torch.nn.Module, input: object) -> None:
        args, _ = tree_flatten(input)
        kept = tuple(a for a in args if not (isinstance(a, torch.Tensor) and a.is_leaf))
        super()._fw_pre_hook(mod, kept)


class StepMemTracker(MemTracker):
    """MemTracker over one optimizer step whose root module may run forward more than once.

    MemTracker refuses a root module's second forward ("multiple iterative calls"): it takes it for
    the next iteration, whose per-module snapshots would mix with this one's. Within one step the
    root runs once per accumulation micro-step, and a pipeline stage once per micro-batch. Only
    the global peak is used here, so the per-module stats of that root's modules are cleared before
    such a forward (what `reset_mod_stats`, MemTracker's own remedy, does for all of them); the
    tensors tracked, and the peak, are kept. Only that root's: a rank holding several pipeline
    chunks runs each as a root, and another chunk's pending backward still needs its stats.
    """

    def __init__(self) -> None:
        super().__init__()
        self._mod_tracker = _NonLeafInputsModTracker()

    def _pre_fw_hook(self, module: torch.nn.Module, inputs: object) -> None:
        name = self._mod_tracker.get_known_fqn(module)
        if module in self.memory_tracking and not self._mod_tracker.is_bw and set(self._mod_tracker.parents) - {name} == {"Global"}:
            for sub in module.modules():
                if sub in self.memory_tracking:
                    del self.memory_tracking[sub]
        super()._pre_fw_hook(module, inputs)


def live_tensors() -> list[torch.Tensor]:
    """Every dense tensor with memory that the Python heap holds now (plain tensors and subclasses such as DTensor).

    The heap can hold weak proxies whose referent is gone (torch.compile leaves some): `isinstance`
    on one raises ReferenceError, so proxies are skipped by their own type, which reads nothing through them.
    A rank's heap holds hundreds of thousands of objects of a few hundred types: the tensor types
    are picked among the types, and the objects of those types selected by C loops (`map`,
    `compress`), so no Python code runs per object (the window takes this census twice).
    """
    heap = gc.get_objects()
    tensor_types = {t for t in set(map(type, heap)) if t not in weakref.ProxyTypes and issubclass(t, torch.Tensor)}
    return [
        obj
        for obj in itertools.compress(heap, map(tensor_types.__contains__, map(type, heap)))
        if obj.layout == torch.strided and obj.device.type != "meta"
    ]


@contextmanager
def track_memory(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[StepMemTracker]:
    """MemTracker over the block, told first about what already exists: the model's parameters,
    buffers and gradients, the optimizer's state, and every other live tensor as "other" (the
    data, a pipeline stage's buffers, ...), so its peak is the whole total, parameters included.
    Tensors held only by C++ (DDP's gradient buckets) join when an operator touches them."""
    tracker = StepMemTracker()
    tracker.track_external(model, optimizer)
    others = [t for t in live_tensors() if not any(st in tracker._WINFO for st in get_untyped_storages(t))]
    tracker.track_external(*others)
    with tracker:
        yield tracker


def peak_breakdown(tracker: MemTracker, device: torch.device) -> tuple[dict[str, int], int] | None:
    """(bytes per `MEMORY_KEYS` category, total) at the tracker's peak on `device`; None if nothing was tracked there."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    snap = tracker.get_tracker_snapshot("peak").get(device)
    if not snap:
        return None
    out = dict.fromkeys(MEMORY_KEYS, 0)
    total = 0
    for key, value in snap.items():
        name = getattr(key, "value", key)
        if name == "Total":
            total = int(value)
        else:
            out[MEMORY_CATEGORIES[name]] += int(value)
    return out, total


# ---- memory over the step: phase marks and the tensors the harness knows ----

_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def _phase_name(fqn: str) -> str:
    """A module's name without the wrappers' prefixes (DDP's `module.`), so runs of one model align by phase."""
    while fqn.startswith(_WRAPPER_PREFIXES):
        fqn = fqn.split(".", 1)[1]
    return "" if fqn in ("module", "_orig_mod") else fqn


Sampler = Callable[[], dict[str, int | None]]


def mark_phase(phase: str, sample: Sampler | None = None) -> None:
    """A zero-length profiler range naming the phase that starts now (`memtimeline.PHASE_MARK`),
    and with `sample`, one carrying what the framework cannot see then (`memtimeline.SAMPLE_MARK`)."""
    with torch.profiler.record_function(memtimeline.PHASE_MARK + phase):
        pass
    if sample is not None:
        with torch.profiler.record_function(memtimeline.encode_sample(sample())):
            pass


def _rss_bytes() -> int | None:
    """This process's resident set now (Linux's /proc/self/statm; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return None


def memory_sampler(device: torch.device) -> Sampler:
    """What the allocator does not count, sampled at each phase mark: on CPU the process's RSS
    (the Python heap, libraries, gloo's buffers); on CUDA the allocator's reserved bytes and,
    where pynvml is installed, this process's device memory by NVML (the CUDA context, NCCL's
    buffers). The CUDA path has not been run on a GPU yet."""
    if device.type != "cuda":
        return lambda: {"rss": _rss_bytes()}
    nvml = _nvml_handle(device)

    def cuda() -> dict[str, int | None]:
        return {"rss": _rss_bytes(), "reserved": int(torch.cuda.memory_reserved(device)), "device_used": _nvml_used(nvml)}

    return cuda


def _nvml_handle(device: torch.device) -> object | None:
    """An NVML handle for `device`, or None without pynvml (optional) or a driver to ask."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(device.index if device.index is not None else torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - pynvml missing or no NVML: the sample goes without it
        return None


def _nvml_used(handle: object | None) -> int | None:
    """This process's device memory as NVML sees it (None without a handle, or where NVML cannot tell)."""
    if handle is None:
        return None
    try:
        import os

        import pynvml

        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
    except Exception:  # noqa: BLE001 - containers often hide other pids' or their own: no figure then
        return None
    return None


def _marked_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The modules whose forward and backward are phases: each element of a ModuleList (the layers)
    and the root's other children (embeddings, head), under their unwrapped names."""
    out: list[tuple[str, torch.nn.Module]] = []
    for fqn, mod in model.named_modules():
        parent = model.get_submodule(fqn.rsplit(".", 1)[0]) if "." in fqn else model
        name = _phase_name(fqn)
        containers = (torch.nn.ModuleList, torch.nn.ModuleDict)
        if name and (isinstance(parent, containers) or ("." not in name and not isinstance(mod, containers))):
            out.append((name, mod))
    return out


@contextmanager
def phase_marks(model: torch.nn.Module, sample: Sampler | None = None) -> Iterator[None]:
    """Marks each marked module's forward (a pre-hook) and backward (a hook on its output's gradient,
    which fires as that module's backward begins), with `sample`'s figures beside each mark;
    nothing on a compiled model, whose hooks would recompile it."""
    if any("_orig_mod" in fqn for fqn, _ in model.named_modules()):
        yield
        return
    handles = []
    for name, mod in _marked_modules(model):

        def pre(_m: torch.nn.Module, _a: object, name: str = name) -> None:
            # A forward run inside the backward is activation checkpointing's recomputation.
            mark_phase(f"{'recompute' if torch._C._current_graph_task_id() != -1 else 'forward'} {name}", sample)

        def post(_m: torch.nn.Module, _a: object, out: object, name: str = name) -> None:
            first = next((t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad), None)
            if first is not None:
                first.register_hook(lambda _g: mark_phase(f"backward {name}", sample))

        handles += [mod.register_forward_pre_hook(pre, prepend=True), mod.register_forward_hook(post, prepend=True)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _storage(t: object, device: torch.device) -> tuple[int, int] | None:
    """(address, bytes) of the storage this rank holds for `t` on `device`'s kind, or None."""
    if not isinstance(t, torch.Tensor):
        return None
    local = t.to_local() if isinstance(t, DTensor) else t
    if local.layout != torch.strided or local.device.type != device.type:
        return None
    try:
        st = local.untyped_storage()
        return st.data_ptr(), st.nbytes()
    except RuntimeError:  # a tensor with no real storage (torch.compile leaves fake tensors on the heap)
        return None


def known_storages(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device, *, others: bool
) -> dict[int, tuple[str, int]]:
    """Storage address -> (category, bytes) of the parameters, their gradients and the optimizer's
    state on `device`'s kind (the timeline's); with `others`, every other live tensor there as `other`."""
    out: dict[int, tuple[str, int]] = {}
    groups: list[tuple[str, list[object]]] = [
        ("params", list(model.parameters())),
        ("grads", [p.grad for p in model.parameters()]),
        ("optimizer", [v for state in optimizer.state.values() for v in state.values()]),
    ]
    if others:
        groups.append(("other", list(live_tensors())))
    for category, tensors in groups:
        for t in tensors:
            st = _storage(t, device)
            if st is not None and st[0] and st[0] not in out:
                out[st[0]] = (category, st[1])
    return out


def storage_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> dict[int, str]:
    """Storage address -> what it is: a parameter's name, its `.grad`, an optimizer state's key and parameter."""
    names = {id(p): _phase_name(n) for n, p in model.named_parameters()}
    out: dict[int, str] = {}
    for p in model.parameters():
        name = names.get(id(p), "?")
        pairs: tuple[tuple[object, str], ...] = ((p, name), (p.grad, f"{name}.grad"))
        for t, label in pairs:
            st = _storage(t, device)
            if st is not None and st[0]:
                out.setdefault(st[0], label)
    for param, state in optimizer.state.items():
        for key, v in state.items():
            st = _storage(v, device)
            if st is not None and st[0]:
                out.setdefault(st[0], f"{key} of {names.get(id(param), '?')}")
    return out


def cuda_history(enable: bool) -> None:
    """Start (or stop) the CUDA caching allocator's history of allocations with their stacks
    (`torch.cuda.memory._record_memory_history`); nothing without CUDA."""
    if torch.cuda.is_available():
        torch.cuda.memory._record_memory_history(max_entries=100_000 if enable else 0, enabled="all" if enable else None)


def cuda_snapshot() -> dict[str, Any] | None:
    """The allocator's snapshot (segments, blocks, their stacks), or None without CUDA."""
    return torch.cuda.memory._snapshot() if torch.cuda.is_available() else None
