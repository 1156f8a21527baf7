"""tree_rss.py on real processes: a child's memory counts in its parent's tree, and a filter on the
command line keeps only the processes it names."""

from __future__ import annotations

import subprocess
import sys
import time

from sealed_bench.tree_rss import TreeRssSampler, tree_pids

# A parent that starts a child holding 200 MiB it has written to (resident), then both wait for stdin to close.
_CHILD = (
    "import sys; b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096]); print('ready', flush=True); "
    "sys.stdin.read()"
)
_PARENT = (
    "import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', sys.argv[1], 'resident' + '-child'], "
    "stdin=subprocess.PIPE, stdout=subprocess.PIPE); print(c.stdout.readline().decode().strip(), flush=True); "
    "sys.stdin.read(); c.stdin.close(); c.wait()"
)


def test_a_childs_resident_memory_counts_in_the_tree_and_a_filter_keeps_it_alone() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == b"ready"
        pids = tree_pids(parent.pid)
        assert len(pids) == 2 and pids[0] == parent.pid
        whole = TreeRssSampler([parent.pid], interval_s=0.01).start()
        child = TreeRssSampler([parent.pid], interval_s=0.01, only=lambda cmd: b"resident-child" in cmd).start()
        time.sleep(0.05)
        tree, alone = whole.stop(), child.stop()
    finally:
        assert parent.stdin is not None
        parent.stdin.close()
        parent.wait(30)
    assert tree.processes == 2 and alone.processes == 1
    assert alone.hwm_sum_bytes >= 200 << 20 and alone.sampled_peak_bytes >= 200 << 20
    assert tree.sampled_peak_bytes > alone.sampled_peak_bytes and tree.hwm_sum_bytes > alone.hwm_sum_bytes
    assert whole.stop() is tree  # stopping again answers the same figures
