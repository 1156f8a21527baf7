"""Continuous batching: admit, chunk, and preempt (by recompute) sequences at every step."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from .block_manager import BlockManager
from .sequence import SeqStatus, Sequence


@dataclass(frozen=True)
class ScheduledSeq:
    seq: Sequence
    start: int  # first position computed this step
    num_tokens: int  # tokens computed this step

    @property
    def samples(self) -> bool:
        """The chunk reaches the end of the sequence, so this step samples its next token."""
        return self.start + self.num_tokens == len(self.seq)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledSeq]:
        budget = self.max_num_batched_tokens
        batch: list[ScheduledSeq] = []
        for seq in list(self.running):  # running first: decodes and unfinished prefill chunks
            if budget == 0 or seq.status is not SeqStatus.RUNNING:
                continue
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.blocks.can_append(seq, n):
                victim = self.running[-1]
                self.preempt(victim)
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING:
                continue
            self.blocks.append_slots(seq, n)
            batch.append(ScheduledSeq(seq, seq.num_computed_tokens, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self.blocks.can_allocate(seq):
                break
            self.waiting.popleft()
            self.blocks.allocate(seq)
            seq.status = SeqStatus.RUNNING
            if seq.scheduled_at is None:  # a preempted sequence's queue wait was its first one
                seq.scheduled_at = time.monotonic()
            self.running.append(seq)
            n = min(seq.num_uncomputed_tokens, budget)
            batch.append(ScheduledSeq(seq, seq.num_computed_tokens, n))
            budget -= n
        return batch

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free_seq(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire a sequence (finished or aborted) and free its blocks at once."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free_seq(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
