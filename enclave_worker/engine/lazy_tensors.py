"""A checkpoint's tensors read from their file when the model builder takes them, not all at once.

The builder pops each tensor as it consumes it (models/weights.py) and converts it into the layer's
layout (int8 codes, panels, packed bf16): read lazily, a bf16 checkpoint quantized to int8 at load
never holds its 2 bytes a weight beside the 1.125 of the codes; the load's peak is the weights as held
plus one tensor. Each access reads the tensor again into a fresh buffer: take every tensor once (pop),
as the builders do. A value set (a converted tensor) is kept as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping

import torch

Reader = Callable[[], torch.Tensor]


class LazyTensors(MutableMapping[str, torch.Tensor]):
    """name -> tensor, each read by its reader when taken (``pop``, ``[]``); insertion order kept."""

    def __init__(self, readers: dict[str, Reader], extents: dict[str, tuple[int, int]] | None = None) -> None:
        self._entries: dict[str, torch.Tensor | Reader] = dict(readers)
        # [first byte, past last byte) of the memory each reader fills, where it is known beforehand (a
        # streamed package's buffer): the build's page release asks which memory is still to be taken
        # (models/weights.py), and reading every remaining tensor to learn it would undo the streaming.
        self._extents = dict(extents or {})

    def unread(self) -> tuple[list[torch.Tensor], list[tuple[int, int]]]:
        """(the values set, the known extents of the entries not read yet), reading nothing."""
        values = [e for e in self._entries.values() if isinstance(e, torch.Tensor)]
        spans = [
            self._extents[n] for n, e in self._entries.items() if not isinstance(e, torch.Tensor) and n in self._extents
        ]
        return values, spans

    def __getitem__(self, name: str) -> torch.Tensor:
        entry = self._entries[name]
        return entry if isinstance(entry, torch.Tensor) else entry()

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        self._entries[name] = value

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:  # a name check reads nothing
        return name in self._entries
