"""The checkpoint's tensors as a model builder consumes them: popped as they are used, so each
source is dropped at once, and fused parts taken as one matrix (a view where they lie adjacent).

With a `release` (Checkpoint.release: a decrypted package's buffer), `release_consumed(layer)` after
each layer hands over every tensor taken since that neither a built layer nor a tensor still to be
taken overlaps: a converted tensor's source memory is given back while the build goes on, so the
load's peak is the weights as held plus about one layer, not the weights plus the whole buffer."""

from __future__ import annotations

import itertools
from collections.abc import Callable, MutableMapping

import torch

from ..heap import trim_heap
from ..layers.quantized_weight import QuantizedWeight
from ..lazy_tensors import LazyTensors


class Weights:
    """Pops tensors from the checkpoint dict as they are consumed, so each source is dropped at once."""

    def __init__(self, tensors: MutableMapping[str, torch.Tensor],
                 release: Callable[[torch.Tensor], None] | None = None) -> None:
        self.tensors = tensors
        self._release = release
        self._taken: list[torch.Tensor] = []  # since the last release_consumed
        self._held: list[tuple[int, int]] = []  # extents the built layers hold
        self._built: list[torch.nn.Module] = []  # the modules handed to release_consumed

    def _pop(self, name: str, default: torch.Tensor | None = None, *, required: bool = True) -> torch.Tensor | None:
        """Take one tensor; a source that fails while it is read (a streamed package's segment refused
        mid-build, package/stream.py) first zeroes what the build made so far: the converted layers
        are copies of plaintext that nothing else would wipe once the build is abandoned."""
        try:
            return self.tensors.pop(name) if required else self.tensors.pop(name, default)
        except KeyError:
            raise
        except BaseException:
            self.wipe_built()
            raise

    def wipe_built(self) -> None:
        """Zero every tensor of the modules built so far (those handed to release_consumed); a layer
        being built when the source failed is not reachable from here (its parts are locals)."""
        from ..layers.packed import zero_every_byte
        from . import model_tensors

        with torch.inference_mode():
            for module in self._built:
                for tensor in model_tensors(module):
                    zero_every_byte(tensor)

    def _took(self, tensor: torch.Tensor | None) -> torch.Tensor | None:
        if self._release is not None and tensor is not None:
            self._taken.append(tensor)
        return tensor

    def has(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str) -> torch.Tensor:
        tensor = self._pop(name)
        assert tensor is not None
        self._took(tensor)
        return tensor

    def take_opt(self, name: str) -> torch.Tensor | None:
        return self._took(self._pop(name, None, required=False))

    def take_cat(self, names: list[str]) -> torch.Tensor:
        parts = [t for t in (self._pop(n) for n in names) if t is not None]
        for part in parts:
            self._took(part)
        if _adjacent(parts):  # e.g. a decrypted package laid out for fusion: a view, not a copy
            first = parts[0]
            rows = sum(p.shape[0] for p in parts)
            return first.as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())
        fused = torch.cat(parts, dim=0)
        del parts
        return fused

    def take_cat_opt(self, names: list[str]) -> torch.Tensor | None:
        return self.take_cat(names) if all(n in self.tensors for n in names) else None

    def release_consumed(self, *built: torch.nn.Module) -> None:
        """`built`: the modules made since the last call. Every tensor taken since then that none of
        the layers built so far holds, and that no tensor still in the checkpoint overlaps, is
        handed to `release` (its memory is dead: converted, fused or quantized into a copy); one
        that a tensor still to be taken overlaps waits for a later call. Either way the heap pages the
        layer's sources and transients freed go back to the OS (heap.py), not at the build's end."""
        self._built += built
        if self._release is None:
            trim_heap()
            return
        from . import model_tensors  # the one definition of what a model holds (the wipe's too)

        self._held += [_extent(t) for module in built for t in model_tensors(module) if not t.is_mkldnn]
        untaken = _untaken(self.tensors)
        waiting: list[torch.Tensor] = []
        for tensor in _plain(self._taken):
            lo, hi = _extent(tensor)
            if any(a < hi and lo < b for a, b in self._held):
                continue  # a layer reads it: it stays as long as the model
            if any(a < hi and lo < b for a, b in untaken):
                waiting.append(tensor)  # shares bytes with a tensor still to be built: asked again later
            else:
                self._release(tensor)
        self._taken = waiting
        trim_heap()


def _untaken(tensors: MutableMapping[str, torch.Tensor]) -> list[tuple[int, int]]:
    """The extents of the tensors still to be taken; a LazyTensors' (a streamed package) from what
    it knows of them, without reading (decrypting) them."""
    if isinstance(tensors, LazyTensors):
        values, spans = tensors.unread()
        return [_extent(t) for t in _plain(values)] + spans
    return [_extent(t) for t in _plain(tensors.values())]


def _adjacent(parts: list[torch.Tensor]) -> bool:
    """True when the parts are contiguous and follow each other in one storage (same dtype/columns)."""
    first = parts[0]
    if not all(p.is_contiguous() and p.dtype == first.dtype and p.shape[1:] == first.shape[1:] for p in parts):
        return False
    if any(p.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() for p in parts):
        return False
    return all(a.data_ptr() + a.nbytes == b.data_ptr() for a, b in itertools.pairwise(parts))


def _plain(tensors: object) -> list[torch.Tensor]:
    """The plain tensors among checkpoint values, a QuantizedWeight as its components (codes, scales,
    zeros, perm; a row-block weight's parts'): the CPU's int8 layers hold a repacked copy of them
    (layers/q8_blocks.py), so their source is released like a converted float's; the others hold
    some component itself, which the held extents keep."""
    out: list[torch.Tensor] = []
    for t in tensors:  # type: ignore[attr-defined]
        if isinstance(t, QuantizedWeight):
            out += _plain(t.parts) if t.parts else [c for c in (t.codes(), t.scales, t.zeros, t.perm) if c is not None]
        elif isinstance(t, torch.Tensor):
            out.append(t)
    return out


def _extent(tensor: torch.Tensor) -> tuple[int, int]:
    start = tensor.data_ptr()
    if tensor.numel() == 0:
        return start, start
    span = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    return start, start + span * tensor.element_size()
