"""Model runner: turns a scheduled batch into flat tensors + attention metadata, runs the model, samples."""

from __future__ import annotations

import torch

from .config import TokenLogprob
from .cuda_graphs import DecodeGraphs, DecodeInputs, SamplingRow, TransferCounter, capture_sizes
from .kernels.paged_attention import num_splits_for
from .kernels.sampling import BatchSampling, sample_on_device
from .layers.attention import AttentionMetadata, PrefillChunk
from .layers.logits_processors import process
from .layers.sampler import History, sample
from .models import CausalLM
from .scheduler import ScheduledSeq
from .sequence import Sequence
from .structured import apply_grammar_masks

# A step's inputs: token ids, positions, attention metadata and the rows to sample; (None, None, None, [])
# when a captured decode graph's static buffers take them (execute() fills those).
StepInputs = tuple[torch.Tensor | None, torch.Tensor | None, AttentionMetadata | None, list[int]]
# Decodes of a step: their rows in the batch, block tables, mask, single length, context lengths.
DecodeMeta = tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, int, torch.Tensor | None]

class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        kv_cache: torch.Tensor,
        block_size: int,
        device: str,
        num_threads: int = 1,
        fused_decode: bool = False,
        max_model_len: int = 0,
        cpu_kernel: bool = False,
    ) -> None:
        self.model = model
        # CPU steps through kernels/cpu_ops.py (decode K/V read in place, fused elementwise work).
        self.cpu_kernel = cpu_kernel and device == "cpu"
        # Fused decode (kernels/): block tables padded to one fixed width, so a captured graph fits any step.
        self.fused_decode = fused_decode
        self.max_blocks = -(-max_model_len // block_size)
        self.num_splits = num_splits_for(max_model_len, block_size) if fused_decode else 1
        self.graphs: DecodeGraphs | None = None
        self.transfers = TransferCounter()
        self.block_size = block_size
        self.device = device
        self.num_threads = num_threads  # CPU: every step's torch pool, fixed (threads.py)
        self.kv_bytes_per_token = kv_cache.nbytes // max(1, kv_cache.shape[2])  # K and V, every layer
        for i, attn in enumerate(model.attention_layers()):
            attn.k_cache = kv_cache[0, i]
            attn.v_cache = kv_cache[1, i]
            attn.num_blocks = kv_cache.shape[2] // block_size
        self.kv_cache = kv_cache

    def _slots(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        bs = self.block_size
        blocks = torch.tensor(block_table, dtype=torch.long)
        pos = torch.arange(start, end)
        return blocks[pos // bs] * bs + pos % bs

    def prepare(self, batch: list[ScheduledSeq]) -> StepInputs:
        if self._graph_step_fits(batch):
            return None, None, None, []  # the captured graph's static buffers take the inputs in execute()
        if all(s.num_tokens == 1 for s in batch):
            return self._prepare_fused(batch) if self.fused_decode else self._prepare_decodes(batch)
        return self._prepare_mixed(batch)

    def _prepare_mixed(self, batch: list[ScheduledSeq]) -> StepInputs:
        """Any eager step: prefill chunks and decodes."""
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
        index, table, mask, single_len, lens = self._decode_meta(decodes)
        meta = AttentionMetadata(
            torch.cat(slot_mapping).to(self.device), index, table, mask, tuple(prefills), not prefills, single_len,
            decode_lens=lens,
        )
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        pos = torch.cat(positions).to(self.device)
        return input_ids, pos, meta, logits_index

    def _prepare_decodes(self, batch: list[ScheduledSeq]) -> StepInputs:
        """An eager step of one token per sequence, built from Python ints: one tensor per input instead
        of a few small torch ops per sequence (those took ~1.4 ms of a batch-16 CPU step). Same inputs
        as the general path (tested)."""
        dev = self.device
        ids, positions, slots = self._decode_tokens(batch)
        logits_index = [i for i, s in enumerate(batch) if s.samples]
        index, table, mask, single_len, lens = self._decode_meta(list(enumerate(batch)))
        meta = AttentionMetadata(torch.tensor(slots, dtype=torch.long, device=dev), index, table, mask, (), True,
                                 single_len, decode_lens=lens)
        return (torch.tensor(ids, dtype=torch.long, device=dev), torch.tensor(positions, dtype=torch.long, device=dev),
                meta, logits_index)

    def _decode_meta(self, decodes: list[tuple[int, ScheduledSeq]]) -> DecodeMeta:
        if not decodes:
            return None, None, None, 0, None
        bs = self.block_size
        lens = [s.start + 1 for _, s in decodes]
        max_blocks = -(-max(lens) // bs)
        rows = [s.seq.block_table[:max_blocks] for _, s in decodes]
        table = torch.tensor([r + [0] * (max_blocks - len(r)) for r in rows], dtype=torch.long)
        index = torch.tensor([o for o, _ in decodes], dtype=torch.long)
        dev = self.device
        if self.cpu_kernel:  # K/V read in place by the C++ kernel: lengths instead of a mask
            return index, table, None, 0, torch.tensor(lens, dtype=torch.long)
        if len(decodes) == 1:  # one sequence: attention takes its exact length, no mask needed
            return index.to(dev), table.to(dev), None, lens[0], None
        mask = torch.arange(max_blocks * bs)[None, :] < torch.tensor(lens)[:, None]
        return index.to(dev), table.to(dev), mask[:, None, None, :].to(dev), 0, None

    # ------------------------------------------------------------ fused decode and CUDA graphs

    def _decode_tokens(self, batch: list[ScheduledSeq]) -> tuple[list[int], list[int], list[int]]:
        """Each decode's input token, its position and the cache slot it writes."""
        bs = self.block_size
        return ([s.seq.token_ids[s.start] for s in batch], [s.start for s in batch],
                [s.seq.block_table[s.start // bs] * bs + s.start % bs for s in batch])

    def _decode_lists(self, batch: list[ScheduledSeq]
                      ) -> tuple[list[int], list[int], list[int], list[list[int]], list[SamplingRow]]:
        ids, positions, slots = self._decode_tokens(batch)
        sampling = [(0.0 if p.greedy else p.temperature, p.top_k, p.top_p) for p in (s.seq.params for s in batch)]
        return ids, positions, slots, [s.seq.block_table for s in batch], sampling

    def _fused_meta(self, inputs: DecodeInputs) -> AttentionMetadata:
        return AttentionMetadata(inputs.slot_mapping, None, inputs.block_tables, None, (), all_decode=True,
                                 fused=True, context_lens=inputs.context_lens, num_splits=self.num_splits,
                                 block_size=self.block_size)

    def _prepare_fused(self, batch: list[ScheduledSeq]) -> StepInputs:
        """Eager fused decode: the step's inputs packed into one buffer, one host->device copy."""
        inputs = DecodeInputs(len(batch), self.max_blocks, torch.device(self.device))
        ids, positions, slots, tables, sampling = self._decode_lists(batch)
        inputs.load(ids, positions, slots, tables, pad_slot=0, counter=self.transfers, sampling=sampling)
        return inputs.input_ids, inputs.positions, self._fused_meta(inputs), list(range(len(batch)))

    def enable_decode_graphs(self, max_num_seqs: int, pad_slot: int) -> None:
        """Capture decode steps for every padded batch size. `pad_slot` is a KV slot no sequence owns
        (padding rows write their K/V there). On the CPU nothing is captured: replay calls the step,
        so the bookkeeping runs (and is tested) exactly as on the GPU."""
        if not self.fused_decode:
            raise ValueError("decode graphs need the fused decode kernels")
        device = torch.device(self.device)
        index = {n: torch.arange(n, device=device) for n in capture_sizes(max_num_seqs)}

        @torch.inference_mode()
        def step(inputs: DecodeInputs) -> torch.Tensor:
            logits: torch.Tensor = self.model(inputs.input_ids, inputs.positions, self._fused_meta(inputs),
                                              index[inputs.size])
            return logits

        self.graphs = DecodeGraphs(tuple(index), self.max_blocks, device, pad_slot, step)
        self.graphs.counter = self.transfers
        with torch.inference_mode():
            self.graphs.capture_all()

    def _graph_step_fits(self, batch: list[ScheduledSeq]) -> bool:
        return (self.graphs is not None and len(batch) <= self.graphs.sizes[-1]
                and all(s.num_tokens == 1 for s in batch))

    def _sample_on_device(self, batch: list[ScheduledSeq], logits: torch.Tensor,
                          inputs: DecodeInputs) -> tuple[list[int], list[TokenLogprob | None]]:
        seqs = [s.seq for s in batch]
        params = [q.params for q in seqs]
        self.transfers.device_to_host += 1  # the one copy back: the sampled tokens (or the logits)
        logits = apply_grammar_masks(logits, [q.grammar for q in seqs])
        if any(p.logprobs is not None for p in params):  # logprob records are built on the host
            return sample(logits, params, [q.generator for q in seqs], token_history(seqs))
        logits = process(logits, params, *token_history(seqs))  # bias and penalties, on the device
        if all(p.greedy for p in params):
            return logits.argmax(dim=-1).tolist(), [None] * len(batch)
        min_p = None
        if any(p.min_p for p in params):
            min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32, device=logits.device)
        sampling = BatchSampling(*inputs.sampling(len(batch)), min_p=min_p)
        tokens = sample_on_device(logits, sampling, [q.generator for q in seqs])
        return tokens.tolist(), [None] * len(batch)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_index: list[int],
    ) -> torch.Tensor:
        index = torch.tensor(logits_index, dtype=torch.long, device=self.device)
        # Every step on the engine's fixed count, whichever thread steps (the compute thread, set when it
        # built the model, or a direct caller of LLMEngine.step): the count is never tuned (threads.py).
        if self.device == "cpu" and torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        logits: torch.Tensor = self.model(input_ids, positions, meta, index)
        return logits

    @torch.inference_mode()
    def execute(
        self,
        batch: list[ScheduledSeq],
        input_ids: torch.Tensor | None,
        positions: torch.Tensor | None,
        meta: AttentionMetadata | None,
        logits_index: list[int],
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        """Forward the batch; sample for sequences whose chunk reached their end (in batch order)."""
        if input_ids is None:  # a captured decode step
            assert self.graphs is not None
            ran = self.graphs.run(*self._decode_lists(batch))
            assert ran is not None
            return self._sample_on_device(batch, *ran)
        assert positions is not None and meta is not None  # prepare() made an eager step
        logits = self.forward(input_ids, positions, meta, logits_index)
        sampled = [s.seq for s in batch if s.samples]
        logits = apply_grammar_masks(logits, [q.grammar for q in sampled])
        return sample(logits, [q.params for q in sampled], [q.generator for q in sampled], token_history(sampled))


def token_history(seqs: list[Sequence]) -> History:
    """Each sequence's prompt and output tokens, for the penalties; empty lists for rows without one
    (building the lists costs a copy of every token, so only penalized rows pay it)."""
    prompts = [q.token_ids[: q.num_prompt_tokens] if q.params.penalized else [] for q in seqs]
    outputs = [q.completion_ids if q.params.penalized else [] for q in seqs]
    return prompts, outputs
