"""The traffic a CPU kernel is expected to cause at each level: Accera's DV plus what the
kernel adds (models/kernel_costs.py), for comparison with a cache simulator.

dv_bytes counts the refills of the blocks the FMA loops read; a cache holding
an outer tile whole moves only that tile's DV (objective.effective_dv). The kernel also
copies each packed input: the copy at level L reads the source through every
level inside L (misses there) and writes its buffer, whose lines are fetched
for ownership at every level up to L (write-allocate). Where the buffers copied
at the same loop, one after another, fit a level together (the share it keeps of
a cycling working set, Target.kept_bytes), the lines the copy brought in are
still there when the FMA loops first read them: those first fills are not paid
twice. A buffer that also fits beside the level's own tile is fetched
for ownership once, however often the copy rewrites it (gemm 250^3 packs a
16 KiB panel of B for every column block: 0.24 MiB of copies, one fetch). An
output accumulated across a reduction is zeroed first (missing wherever the
block zeroed at once does not fit) and, from its buffer, written back into the
array, whose lines are fetched for ownership at every level.
"""
from __future__ import annotations

from pydantic import ValidationError

from .caches import effective_tiles
from .costmodel import data_volume, level_usage
from .hardware import Hardware
from .kernel_costs import KernelCosts, kernel_costs
from .objective import charged_dv, held_bytes
from .workload import Workload


def expected_traffic(workload: Workload, hardware: Hardware, orders, tiles) -> list[float]:
    """Bytes moved into each level (innermost first) by one call of the kernel."""
    dv = [float(d) for d in data_volume(workload, orders, tiles, hardware=hardware)]
    mu = [float(level_usage(workload, hardware, i, t)) for i, t in enumerate(tiles)]
    charged = [float(d) for d in charged_dv(workload, hardware, dv, mu, orders, tiles)]
    return with_kernel_traffic(workload, hardware, orders, tiles, charged,
                               kernel_costs(workload, hardware, orders, tiles))


def padded_problem(workload: Workload, tiles) -> tuple[Workload, list[dict[str, int]]]:
    """The problem the kernel computes (one plan's tiles, innermost first): every extent padded
    to a multiple of its tiles (caches.effective_tiles), and the tiles in that space. The
    kernel's full edge tiles move padded rows through every level: gemm 97x211x131 in 64x48x3
    L1 tiles computes 128 rows, and valgrind's L1 missed 5.98 MiB where the logical DV (97
    rows) gives 3.78 and the padded one 5.60."""
    padded, inside = effective_tiles(workload, tiles)
    if all(padded[x] == extent for x, extent in workload.dims.items()):
        return workload, inside
    data = workload.model_dump()
    for name, tensor in data["tensors"].items():
        if tensor.get("shape"):  # a stored shape follows its plain dims (a convolution's channels)
            index = workload.tensors[name].index
            tensor["shape"] = [padded[ix.loops[0]] if ix.plain else s for ix, s in zip(index, tensor["shape"])]
    try:
        return Workload.model_validate({**data, "dims": padded}), inside
    except ValidationError:  # padded past the largest extent a workload takes: the logical one stands in
        return workload, [dict(t) for t in tiles]


def with_kernel_traffic(workload: Workload, hardware: Hardware, orders, tiles, charged,
                        costs: KernelCosts | None) -> list[float]:
    """The bytes each level is expected to take in, given what the time objective charges the
    plan (`charged`: objective.charged_dv): inside the outermost level, what it charges the
    padded problem (padded_problem), with each inner cache's tile swept along every loop and
    each cache keeping its kept_bytes (targets/simd_cpu.py: KEPT_STREAMS), since the arrays in
    memory are the logical ones and the padded buffers live in the caches; plus
    what the kernel's copies, zeroing and write-back add (`costs`; None, a target that models
    none: `charged` as it is). The search sweeps one loop (objective.INNER_STEPS) to plan fast;
    for one plan, every one costs little: chain 128 in 2x128x32x32 L1 tiles keeps B and D whole
    in a 48 KiB L1 (valgrind: 0.45 MiB missed; 2.34 expected with one loop swept, 0.38 with
    all). The registers' bytes are plain bytes, not the load slots their link is charged
    (costmodel.register_weights)."""
    if costs is None:
        return [float(data_volume(workload, orders, tiles, levels=[0], hardware=hardware, weighted=False)[0]),
                *charged[1:]]
    workload, tiles = padded_problem(workload, tiles)
    dv = [float(d) for d in data_volume(workload, orders, tiles, hardware=hardware, weighted=False)]
    mu = [float(level_usage(workload, hardware, i, t)) for i, t in enumerate(tiles)]
    target = hardware.target
    kept = [target.kept_bytes(j) for j in range(len(tiles))]
    dv = [*(float(d) for d in charged_dv(workload, hardware, dv, mu, orders, tiles, kept)[:-1]), charged[-1]]
    together = {}  # the buffers filled at one loop position, one after another
    for _, level, _, buffer, key in costs.copies:
        together[level, key] = together.get((level, key), 0.0) + buffer
    # Beside them, while the FMA loops read them, the outputs' blocks of that level's tile where the
    # loops come back to them (their DV into level j is more than their size): gemm 256^3 packing
    # A's and B's halves of k (260 KiB) at each half, accumulating into all of C (256 KiB), missed
    # 2.05 MiB of a 512 KiB L2 under valgrind where the buffers' first fills credited as kept
    # there predicted 1.51 (AMD EPYC Zen 3, BENCHMARKS.md "Seed-cap session").
    outputs = [t for t in workload.tensors if workload.tensors[t].role == "output"]
    whole = held_bytes(workload, workload.dims, outputs)
    revisited = [float(d) > whole for d in data_volume(workload, orders, tiles, hardware=hardware, only=set(outputs))]
    for tensor, level, nbytes, buffer, key in costs.copies:
        mine = data_volume(workload, orders, tiles, hardware=hardware, only={tensor})
        beside = held_bytes(workload, tiles[level], outputs)
        for j in range(1, level + 1):
            usable = kept[j]
            if j == level:
                dv[j] += nbytes
                continue
            live = together[level, key] + (beside if revisited[j] else 0.0)
            credit = min(float(mine[j]), nbytes) if live <= usable else 0.0
            # Rewritten for every tile, a buffer with room beside the level's own tile stays
            # there: fetched for ownership once, not at every rewrite.
            owned = buffer if buffer + mu[j] <= usable else nbytes
            dv[j] += nbytes + owned - credit
    for _, zeroed, block, written in costs.outputs:
        for j in range(1, len(dv)):
            dv[j] += written + (zeroed if block > kept[j] else 0.0)
    return dv
