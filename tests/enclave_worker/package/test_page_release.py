"""The decrypted buffer's pages go back as the build consumes its tensors (page_release.py), and only
those no layer holds and no tensor still to be built overlaps (models/weights.py)."""

from __future__ import annotations

import mmap

import pytest
import torch

from enclave_worker.engine.models.weights import Weights
from enclave_worker.package.page_release import PageRelease

PAGE = mmap.PAGESIZE
MIB = 1 << 20


def rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def filled(nbytes: int) -> torch.Tensor:
    """NBYTES of 7s, starting on a page boundary (torch aligns to 64 bytes only)."""
    whole = torch.full((nbytes + PAGE,), 7, dtype=torch.uint8)
    skew = -whole.data_ptr() % PAGE
    return whole[skew : skew + nbytes]


def test_release_zeroes_whole_pages_and_gives_them_back() -> None:
    buffer = filled(96 * MIB)
    release = PageRelease(buffer)
    view = buffer[100 : 64 * MIB + 100]  # starts and ends inside a page shared with a neighbour
    before = rss()
    release(view)
    freed = before - rss()
    assert release.released_bytes == 64 * MIB - PAGE  # the two edge pages stay
    assert freed > 0.9 * release.released_bytes  # the kernel took them back
    assert int(buffer[:PAGE].min()) == 7 and int(buffer[64 * MIB :].min()) == 7  # neighbours intact
    assert int(buffer[PAGE : 64 * MIB].max()) == 0  # the released bytes read as zeros


@pytest.mark.parametrize("what", ["outside", "inside-one-page", "already-released"])
def test_release_leaves_what_it_does_not_own(what: str) -> None:
    buffer = filled(8 * MIB)
    release = PageRelease(buffer)
    if what == "outside":
        other = filled(4 * MIB)
        release(other)
        assert int(other.min()) == 7
    elif what == "inside-one-page":
        release(buffer[PAGE + 8 : 2 * PAGE - 8])
        assert int(buffer.min()) == 7
    else:
        release(buffer[: 4 * MIB])
        buffer[: 4 * MIB] = 9  # a later owner's bytes (not a real use: shows a second release is a no-op)
        release(buffer[: 4 * MIB])
        assert int(buffer[: 4 * MIB].min()) == 9
        return
    assert release.released_bytes == 0


def test_wipe_zeroes_the_rest_without_faulting_the_released_pages_back() -> None:
    buffer = filled(96 * MIB)
    release = PageRelease(buffer)
    release(buffer[: 80 * MIB])
    after_release = rss()
    release.wipe()
    assert int(buffer.max()) == 0
    assert rss() - after_release < 32 * MIB  # not the 80 MiB given back


@pytest.mark.parametrize("bad", [torch.zeros(16, dtype=torch.float32), torch.zeros(16, 2, dtype=torch.uint8)[:, 0]])
def test_only_a_contiguous_byte_buffer_is_taken(bad: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="contiguous CPU uint8"):
        PageRelease(bad)


class Holder(torch.nn.Module):
    def __init__(self, kept: torch.Tensor) -> None:
        super().__init__()
        self.kept = kept


def test_weights_releases_only_what_no_layer_holds_and_nothing_left_overlaps() -> None:
    buffer = filled(12 * MIB)
    release = PageRelease(buffer)
    f32 = buffer.view(torch.float32)  # three 4 MiB tensors, views of the buffer
    tensors = {"converted": f32[: MIB], "held": f32[MIB : 2 * MIB], "alias": f32[: MIB // 2], "later": f32[2 * MIB :]}
    w = Weights(tensors, release)
    copy = w.take("converted").to(torch.float64)  # a converted copy: its source is dead
    layer = Holder(w.take("held"))  # kept as it is: a view of the buffer
    w.release_consumed(Holder(copy), layer)
    assert int(buffer[: 4 * MIB].min()) == 7  # "alias", still to be taken, overlaps "converted"
    assert release.released_bytes == 0
    w.take("alias")
    w.release_consumed(Holder(torch.zeros(1)))
    assert int(buffer[: 4 * MIB].max()) == 0 and release.released_bytes == 4 * MIB
    assert int(buffer[4 * MIB :].min()) == 7  # the held tensor and the one still to be taken intact
    assert torch.equal(copy, filled(4 * MIB).view(torch.float32).double())  # the copy is untouched


def test_weights_without_release_frees_nothing() -> None:
    buffer = filled(4 * MIB)
    w = Weights({"x": buffer.view(torch.float32)})
    w.take("x").double()
    w.release_consumed(Holder(torch.zeros(1)))
    assert int(buffer.min()) == 7
