"""What every CPU target shares: the kernel the LLVM backend emits spends time outside the
streaming the DV model describes (packing copies, zeroing, parallel regions, the call;
models/kernel_costs.py counts it), and its tiles must leave room in set-associative caches.
"""
from __future__ import annotations

from .base import Target

# Besides the block a level keeps for reuse, the kernel streams lines of the other arrays through
# it between two uses (the micro-kernel's A, B and C, and the stack). Under LRU a W-way cache keeps
# the block only if every set has that many ways left over, so a tile may fill at most 1 - 4/W of
# it (never less than half). Measured with valgrind's cache simulator on a 12-way 48 KiB L1d:
# tiles at 37-67% of L1 missed 1.0-1.1x the model's bytes, at 74-79% 1.0-1.7x, at 88-99%
# 1.5-2.3x (BENCHMARKS.md, bench/cachegrind.py).
STREAMS = 4


class CpuTarget(Target):
    def usable_bytes(self, level) -> int:
        if not level.ways:
            return level.capacity_bytes
        return int(level.capacity_bytes * max(1 - STREAMS / level.ways, 0.5))

    def kernel_costs(self, workload, orders, tiles, stages=1):
        from ..kernel_costs import kernel_costs

        return kernel_costs(workload, self.hardware, orders, tiles)
