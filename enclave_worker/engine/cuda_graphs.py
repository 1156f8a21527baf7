"""CUDA-graph bookkeeping for decode steps, kept apart from the kernels so it is tested on the CPU.

A decode step of B sequences is padded up to the nearest captured size; its inputs are packed into
one pinned host buffer and cross to the device in ONE copy (in GPU confidential-computing mode each
crossing goes through an encrypted bounce buffer and is synchronous), land in static device buffers
that the captured graph reads, and the sampled tokens come back in ONE copy. Padding rows attend to
one token of a reserved block, so they compute finite garbage that nobody reads.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE  # a private alias: at run time its import is a cycle

DEFAULT_CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


def capture_sizes(max_num_seqs: int, sizes: tuple[int, ...] = DEFAULT_CAPTURE_SIZES) -> tuple[int, ...]:
    """The sizes to capture: the defaults up to max_num_seqs, plus max_num_seqs itself."""
    chosen = sorted({s for s in sizes if s < max_num_seqs} | {max_num_seqs})
    return tuple(chosen)


def padded_size(batch: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest captured size holding `batch` rows; None when the batch is larger (run eager)."""
    i = bisect.bisect_left(sizes, batch)
    return sizes[i] if i < len(sizes) else None


@dataclass
class TransferCounter:
    """Host<->device crossings made by the engine; the benchmark reports them per decode step."""

    host_to_device: int = 0
    device_to_host: int = 0

    def total(self) -> int:
        return self.host_to_device + self.device_to_host


SamplingRow = tuple[float, int, float]  # temperature (0 = greedy), top_k (0 = off), top_p (1 = off)
_ROWS = 7  # ids, positions, slots, context lens, temperature bits, top-k, top-p bits


@dataclass
class DecodeInputs:
    """Static device buffers a captured graph reads, all views of one int32 tensor (one copy in).
    The sampling parameters ride along (floats as their int32 bit patterns), so sampling on the
    device needs no copy of its own."""

    size: int
    max_blocks: int
    device: torch.device
    packed: torch.Tensor = field(init=False)
    staging: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        width = _ROWS * self.size + self.size * self.max_blocks
        self.packed = torch.zeros(width, dtype=torch.int32, device=self.device)
        self.staging = torch.zeros(width, dtype=torch.int32, pin_memory=self.device.type == "cuda")

    def _row(self, t: torch.Tensor, i: int) -> torch.Tensor:
        return t[i * self.size:(i + 1) * self.size]

    def _tables(self, t: torch.Tensor) -> torch.Tensor:
        return t[_ROWS * self.size:].view(self.size, self.max_blocks)

    @property
    def input_ids(self) -> torch.Tensor:
        return self._row(self.packed, 0)

    @property
    def positions(self) -> torch.Tensor:
        return self._row(self.packed, 1)

    @property
    def slot_mapping(self) -> torch.Tensor:
        return self._row(self.packed, 2)

    @property
    def context_lens(self) -> torch.Tensor:
        return self._row(self.packed, 3)

    @property
    def block_tables(self) -> torch.Tensor:
        return self._tables(self.packed)

    def sampling(self, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """temperature, top_k, top_p of the first `rows` rows, on the device."""
        return (self._row(self.packed, 4)[:rows].view(torch.float32), self._row(self.packed, 5)[:rows].long(),
                self._row(self.packed, 6)[:rows].view(torch.float32))

    def load(self, ids: list[int], positions: list[int], slots: list[int], block_tables: list[list[int]],
             pad_slot: int, counter: TransferCounter, sampling: list[SamplingRow] | None = None) -> None:
        """Fill the staging buffer on the host, then one host->device copy."""
        n, real = self.size, len(ids)
        if real > n:
            raise ValueError(f"{real} sequences do not fit a graph of size {n}")
        staged = self.staging
        tables = self._tables(staged)
        tables.zero_()  # padding rows (and unused columns) point at block 0: read, never written
        pad = n - real
        self._row(staged, 0).copy_(torch.tensor(ids + [0] * pad, dtype=torch.int32))
        self._row(staged, 1).copy_(torch.tensor(positions + [0] * pad, dtype=torch.int32))
        self._row(staged, 2).copy_(torch.tensor(slots + [pad_slot] * pad, dtype=torch.int32))
        self._row(staged, 3).copy_(torch.tensor([p + 1 for p in positions] + [1] * pad, dtype=torch.int32))
        rows = (sampling or [(0.0, 0, 1.0)] * real) + [(0.0, 0, 1.0)] * pad
        self._row(staged, 4).view(torch.float32).copy_(torch.tensor([r[0] for r in rows], dtype=torch.float32))
        self._row(staged, 5).copy_(torch.tensor([r[1] for r in rows], dtype=torch.int32))
        self._row(staged, 6).view(torch.float32).copy_(torch.tensor([r[2] for r in rows], dtype=torch.float32))
        for row, table in enumerate(block_tables):
            if len(table) > self.max_blocks:
                raise ValueError(f"a block table of {len(table)} blocks exceeds the {self.max_blocks} captured")
            tables[row, : len(table)] = torch.tensor(table, dtype=torch.int32)
        self.packed.copy_(staged, non_blocking=True)
        counter.host_to_device += 1


class DecodeGraph:
    """One captured decode step of a fixed size; on the CPU (tests) it replays by calling the step."""

    def __init__(self, inputs: DecodeInputs, step: Callable[[DecodeInputs], torch.Tensor]) -> None:
        self.inputs, self.step = inputs, step
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: torch.Tensor | None = None

    def capture(self, pool: _POOL_HANDLE | None = None) -> _POOL_HANDLE | None:
        if self.inputs.device.type != "cuda":
            return pool
        self.step(self.inputs)  # warm-up outside the graph: lazy inits, Triton autotuning, cuBLAS handles
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.output = self.step(self.inputs)
        return self.graph.pool()

    def replay(self) -> torch.Tensor:
        if self.graph is None:
            return self.step(self.inputs)
        self.graph.replay()
        assert self.output is not None
        return self.output


class DecodeGraphs:
    """Graphs for every capture size, sharing one memory pool; picks and pads per step."""

    def __init__(self, sizes: tuple[int, ...], max_blocks: int, device: torch.device, pad_slot: int,
                 step: Callable[[DecodeInputs], torch.Tensor]) -> None:
        self.sizes, self.pad_slot = sizes, pad_slot
        self.counter = TransferCounter()
        self.graphs = {s: DecodeGraph(DecodeInputs(s, max_blocks, device), step) for s in sizes}

    def capture_all(self) -> None:
        pool = None
        for size in sorted(self.sizes, reverse=True):  # largest first: the pool fits every smaller one
            pool = self.graphs[size].capture(pool)

    def run(self, ids: list[int], positions: list[int], slots: list[int], block_tables: list[list[int]],
            sampling: list[SamplingRow] | None = None) -> tuple[torch.Tensor, DecodeInputs] | None:
        """Output rows of the real sequences and the inputs they came from; None when the batch is
        larger than any graph."""
        size = padded_size(len(ids), self.sizes)
        if size is None:
            return None
        graph = self.graphs[size]
        graph.inputs.load(ids, positions, slots, block_tables, self.pad_slot, self.counter, sampling)
        return graph.replay()[: len(ids)], graph.inputs
