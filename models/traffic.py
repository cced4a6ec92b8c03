"""The traffic a CPU kernel is expected to cause at each level: Accera's DV plus what the
kernel adds (models/kernel_costs.py), for comparison with a cache simulator.

dv_bytes counts the refills of the blocks the FMA loops read. The kernel also
copies each packed input: the copy at level L reads the source through every
level inside L (misses there) and writes its buffer, whose lines are fetched
for ownership at every level up to L (write-allocate).
"""
from __future__ import annotations

from .costmodel import data_volume
from .hardware import Hardware
from .kernel_costs import kernel_costs
from .workload import Workload


def expected_traffic(workload: Workload, hardware: Hardware, orders, tiles) -> list[float]:
    """Bytes moved into each level (innermost first) by one call of the kernel."""
    dv = [float(d) for d in data_volume(workload, orders, tiles, hardware=hardware)]
    costs = kernel_costs(workload, hardware, orders, tiles)
    for _, level, nbytes in costs.copies:
        for j in range(1, level + 1):
            dv[j] += nbytes * (2 if j < level else 1)  # the source read through, and the buffer written
    return dv
