"""Where a launch runs: the device's properties, its current context and its current device.

Queries are cached per device index (each costs microseconds of CPU, and launchers ask on every call).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import torch


def on_input_device(launcher):
    """Decorate a launcher: on CUDA, it runs with the device of its first tensor argument (``None``
    placeholders skipped) as the current one, as torch's own operators do. Triton launches on the current
    device (its context and stream) whatever device the arguments live on, so a launch on tensors of
    cuda:1 while cuda:0 is current would run on the wrong GPU, reading the other's memory. The check costs
    about a microsecond where the devices already agree."""

    @functools.wraps(launcher)
    def wrapper(*args, **kwargs):
        t = next((a for a in args if isinstance(a, torch.Tensor)), None)
        device = t.device if t is not None else None
        if device is not None and device.type == "cuda" and device.index is not None:
            if device.index != torch.cuda.current_device():
                with torch.cuda.device(device.index):
                    return launcher(*args, **kwargs)
        return launcher(*args, **kwargs)

    return wrapper


@functools.cache
def num_sms(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (cached: the query costs microseconds)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def _capability_major(device_index: int) -> int:
    return torch.cuda.get_device_capability(device_index)[0]


def _cuda_index(device: torch.device) -> int:
    """The index of a CUDA ``device`` (the current device's where it names none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def compute_capability_major(t: torch.Tensor) -> int:
    """The major compute capability of the CUDA device holding ``t`` (cached: the query cost 2.4–4.7 µs
    of CPU per call, and the launchers ask on every call)."""
    return _capability_major(_cuda_index(t.device))


# The GPU models with launch tables of their own (measured there), named as in the driver's device name.
TABLE_MODELS = ("H100", "H200")
# The architecture the tables' kernels and tiles were measured on: tensor descriptors, the Gluon
# kernels, 227 KB of shared memory a program.
TABLE_CAPABILITY = (9, 0)


@dataclass(frozen=True)
class Card:
    """What chooses a launch table: the GPU's model, architecture and shared memory."""

    name: str  # the driver's device name, e.g. "NVIDIA H100 80GB HBM3"
    capability: tuple[int, int]
    max_shared_mem: int  # bytes of shared memory one program may use (the opt-in limit)

    @property
    def model(self) -> str | None:
        """The model of TABLE_MODELS this card is (a word of its name; "GH200" is not "H200"), or None."""
        words = self.name.split()
        return next((m for m in TABLE_MODELS if m in words), None)

    @property
    def tabled(self) -> bool:
        """Whether the measured tables apply: the architecture they were measured on (a card of no
        model there reads the tables of the models that are)."""
        return self.capability == TABLE_CAPABILITY


def models_in_order(card: Card | None, tables: dict[str, dict]) -> list[str]:
    """The models of ``tables`` whose tables ``card`` reads, first to last: its own, then the others
    (measured on the same architecture); none on a card of another architecture, which the rules serve.
    ``None`` stands for a card of the tables' architecture and no model of its own."""
    if card is not None and not card.tabled:
        return []
    own = card.model if card is not None and card.model in tables else None
    return ([own] if own else []) + [m for m in tables if m != own]


def tables_in_order(card: Card | None, overrides: dict, tables: dict[str, dict]) -> tuple[dict, ...]:
    """The launch tables ``card`` reads, first to last: ``overrides`` (the user's), then those of
    :func:`models_in_order`."""
    return (overrides, *(tables[m] for m in models_in_order(card, tables)))


def first_entry(tables, key: tuple, regime: bool):
    """The entry of ``(*key, regime)`` in the first of ``tables`` that has it or the other regime's
    ``(*key, not regime)``; None where none has either."""
    for table in tables:
        entry = table.get((*key, regime)) or table.get((*key, not regime))
        if entry is not None:
            return entry
    return None


def tables_label(card: Card, overrides: dict, tables: dict[str, dict]) -> str:
    """The tables ``card`` reads, named (a run's record of what it launched): ``tuned.json`` for non-empty
    overrides, then the models', or ``rule`` where no table serves it."""
    return ",".join((["tuned.json"] if overrides else []) + (models_in_order(card, tables) or ["rule"]))


@functools.cache
def _card(device_index: int) -> Card:
    import triton

    props = torch.cuda.get_device_properties(device_index)
    smem = triton.runtime.driver.active.utils.get_device_properties(device_index)["max_shared_mem"]
    return Card(props.name, (props.major, props.minor), smem)


def current_card() -> Card:
    """The card of the current CUDA device."""
    return _card(torch.cuda.current_device())


def card_of(t: torch.Tensor) -> Card | None:
    """The card holding ``t`` (cached per device); None for a tensor not on CUDA."""
    return _card(_cuda_index(t.device)) if t.device.type == "cuda" else None


_THREAD = threading.local()


def bind_cuda_context(t: torch.Tensor) -> None:
    """Make the primary CUDA context of ``t``'s device current on the calling thread (once per thread and
    device; nothing for a tensor not on CUDA). Call it before building a tensor descriptor for a launch.

    Triton encodes a descriptor's tensor map (``cuTensorMapEncodeTiled``, a driver call that needs a
    current context) before its launcher makes the primary context current, so on a thread whose first
    CUDA work is such a launch the call fails with "invalid device context". The autograd engine's worker
    thread is one: torch binds no context to it when the device needs no change, and the caching
    allocator hands out cached blocks without a CUDA call, so a backward made only of crossfuse's kernels
    may be the first CUDA work there. A runtime call binds the primary context as the runtime
    does on first use: ``cudaStreamQuery`` of the current stream, which neither waits nor launches."""
    device = t.device
    if device.type != "cuda":
        return
    index = _cuda_index(device)
    bound = getattr(_THREAD, "devices", None)
    if bound is None:
        bound = _THREAD.devices = set()
    if index not in bound:
        torch.cuda.current_stream(index).query()
        bound.add(index)


def device_parallelism(t: torch.Tensor) -> int:
    """How many programs fill the device: SM count on CUDA, a small number under the interpreter."""
    if t.device.type == "cuda":
        return num_sms(_cuda_index(t.device))
    return 4
