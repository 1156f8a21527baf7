"""Model runner: turns a scheduled batch into flat tensors + attention metadata, runs the model, samples."""

from __future__ import annotations

import torch

from .config import TokenLogprob
from .layers.attention import AttentionMetadata, PrefillChunk
from .layers.sampler import sample
from .scheduler import ScheduledSeq

BLAS_MAX_TOKENS = 64  # above this many rows a step is a real GEMM; torch's pool is as fast and multi-threaded


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        kv_cache: torch.Tensor,
        block_size: int,
        device: str,
        num_threads: int = 1,
        weight_bytes: int = 0,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.device = device
        self.num_threads = num_threads
        self.weight_bytes = weight_bytes
        self.kv_bytes_per_token = kv_cache.nbytes // max(1, kv_cache.shape[2])  # K and V, every layer
        for i, layer in enumerate(model.layers):
            layer.attn.k_cache = kv_cache[0, i]
            layer.attn.v_cache = kv_cache[1, i]
            layer.attn.num_blocks = kv_cache.shape[2] // block_size
        self.kv_cache = kv_cache

    def _slots(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        bs = self.block_size
        blocks = torch.tensor(block_table, dtype=torch.long)
        pos = torch.arange(start, end)
        return blocks[pos // bs] * bs + pos % bs

    def prepare(self, batch: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        ids: list[int] = []
        positions: list[torch.Tensor] = []
        slot_mapping: list[torch.Tensor] = []
        logits_index: list[int] = []
        decodes: list[tuple[int, ScheduledSeq]] = []
        prefills: list[PrefillChunk] = []
        for s in batch:
            offset, end = len(ids), s.start + s.num_tokens
            ids.extend(s.seq.token_ids[s.start : end])
            positions.append(torch.arange(s.start, end))
            slot_mapping.append(self._slots(s.seq.block_table, s.start, end))
            if s.samples:
                logits_index.append(offset + s.num_tokens - 1)
            if s.num_tokens == 1:
                decodes.append((offset, s))
                continue
            mask = None
            if s.start > 0:
                q_pos = torch.arange(s.start, end)[:, None]
                mask = (torch.arange(end)[None, :] <= q_pos).to(self.device)
            prefills.append(
                PrefillChunk(offset, s.num_tokens, self._slots(s.seq.block_table, 0, end).to(self.device), mask)
            )
        index, table, mask, single_len = self._decode_meta(decodes)
        meta = AttentionMetadata(
            torch.cat(slot_mapping).to(self.device), index, table, mask, tuple(prefills), not prefills, single_len
        )
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        pos = torch.cat(positions).to(self.device)
        return input_ids, pos, meta, logits_index

    def _decode_meta(self, decodes: list[tuple[int, ScheduledSeq]]) -> tuple:
        if not decodes:
            return None, None, None, 0
        bs = self.block_size
        lens = [s.start + 1 for _, s in decodes]
        max_blocks = -(-max(lens) // bs)
        table = torch.zeros(len(decodes), max_blocks, dtype=torch.long)
        for i, (_, s) in enumerate(decodes):
            bt = s.seq.block_table[:max_blocks]
            table[i, : len(bt)] = torch.tensor(bt, dtype=torch.long)
        index = torch.tensor([o for o, _ in decodes], dtype=torch.long)
        dev = self.device
        if len(decodes) == 1:  # one sequence: attention takes its exact length, no mask needed
            return index.to(dev), table.to(dev), None, lens[0]
        mask = torch.arange(max_blocks * bs)[None, :] < torch.tensor(lens)[:, None]
        return index.to(dev), table.to(dev), mask[:, None, None, :].to(dev), 0

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_index: list[int],
        blas: bool = False,
    ) -> torch.Tensor:
        """``blas``: this step's dense matmuls go to OpenBLAS (see use_blas); set for every call."""
        index = torch.tensor(logits_index, dtype=torch.long, device=self.device)
        if self.device == "cpu":
            # One token (batch-1 decode) of any dtype also runs on one thread: its ops are too small to
            # split, and served, the event loop's thread would preempt an OpenMP worker mid-barrier
            # (int4 batch-1 through `generate`: 25 tok/s on two threads, 42 on one).
            threads = 1 if blas or input_ids.numel() == 1 else self.num_threads
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
        self.model.blas.enabled = blas
        return self.model(input_ids, positions, meta, index)

    def use_blas(self, num_tokens: int, context_tokens: int) -> bool:
        """Whether this step's dense matmuls go to OpenBLAS, with torch on one thread (BlasSwitch).

        Worth it while the step is weight-streaming bound: few rows, and attention (which then runs
        on one thread) reads at most half as many KV bytes as the matmuls read weight bytes.
        Measured crossovers: docs/engine.md.
        """
        return (
            self.weight_bytes > 0
            and num_tokens <= BLAS_MAX_TOKENS
            and 2 * context_tokens * self.kv_bytes_per_token <= self.weight_bytes
        )

    @torch.inference_mode()
    def execute(
        self,
        batch: list[ScheduledSeq],
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_index: list[int],
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        """Forward the batch; sample for sequences whose chunk reached their end (in batch order)."""
        blas = self.use_blas(input_ids.numel(), sum(s.start + s.num_tokens for s in batch))
        logits = self.forward(input_ids, positions, meta, logits_index, blas=blas)
        sampled = [s.seq for s in batch if s.samples]
        return sample(logits, [q.params for q in sampled], [q.generator for q in sampled])
