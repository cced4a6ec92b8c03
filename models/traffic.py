"""The traffic a CPU kernel is expected to cause at each level: Accera's DV plus what the
kernel adds (models/kernel_costs.py), for comparison with a cache simulator.

dv_bytes counts the refills of the blocks the FMA loops read; a cache holding
an outer tile whole moves only that tile's DV (objective.effective_dv). The kernel also
copies each packed input: the copy at level L reads the source through every
level inside L (misses there) and writes its buffer, whose lines are fetched
for ownership at every level up to L (write-allocate). Where the buffers copied
at the same loop, one after another, fit a level together (its usable share,
targets/simd_cpu.py), the lines the copy brought in are still there when the
FMA loops first read them: those first fills are not paid twice. A buffer that
also fits beside the level's own tile is fetched
for ownership once, however often the copy rewrites it (gemm 250^3 packs a
16 KiB panel of B for every column block: 0.24 MiB of copies, one fetch). An
output accumulated across a reduction is zeroed first (missing wherever the
block zeroed at once does not fit) and, from its buffer, written back into the
array, whose lines are fetched for ownership at every level.
"""
from __future__ import annotations

from .costmodel import data_volume, level_usage
from .hardware import Hardware
from .kernel_costs import KernelCosts, kernel_costs
from .objective import charged_dv
from .workload import Workload


def expected_traffic(workload: Workload, hardware: Hardware, orders, tiles) -> list[float]:
    """Bytes moved into each level (innermost first) by one call of the kernel."""
    dv = [float(d) for d in data_volume(workload, orders, tiles, hardware=hardware)]
    mu = [float(level_usage(workload, hardware, i, t)) for i, t in enumerate(tiles)]
    charged = [float(d) for d in charged_dv(workload, hardware, dv, mu, orders, tiles)]
    return with_kernel_traffic(workload, hardware, orders, tiles, charged, mu,
                               kernel_costs(workload, hardware, orders, tiles))


def with_kernel_traffic(workload: Workload, hardware: Hardware, orders, tiles, charged, mu,
                        costs: KernelCosts | None) -> list[float]:
    """The bytes the time objective charges each level (`charged`: objective.charged_dv; the
    levels' MU) plus what the kernel's copies, zeroing and write-back add (`costs`; None, a
    target that models none: nothing added)."""
    dv = list(charged)
    if costs is None:
        return dv
    target = hardware.target
    together = {}  # the buffers filled at one loop position, one after another
    for _, level, _, buffer, key in costs.copies:
        together[level, key] = together.get((level, key), 0.0) + buffer
    for tensor, level, nbytes, buffer, key in costs.copies:
        mine = data_volume(workload, orders, tiles, hardware=hardware, only={tensor})
        for j in range(1, level + 1):
            usable = target.usable_bytes(hardware.levels[j])
            if j == level:
                dv[j] += nbytes
                continue
            credit = min(float(mine[j]), nbytes) if together[level, key] <= usable else 0.0
            # Rewritten for every tile, a buffer with room beside the level's own tile stays
            # there: fetched for ownership once, not at every rewrite.
            owned = buffer if buffer + mu[j] <= usable else nbytes
            dv[j] += nbytes + owned - credit
    for _, zeroed, block, written in costs.outputs:
        for j in range(1, len(dv)):
            dv[j] += written + (zeroed if block > target.usable_bytes(hardware.levels[j]) else 0.0)
    return dv
