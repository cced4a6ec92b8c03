"""Cache lines of an output that more than one core writes (false sharing).

When the parallel loop splits an output along a dim, each core writes its own
chunks of the row-major array; where a chunk boundary falls inside a cache
line, both cores write that line and it moves between their private caches.
gemm 127x251x509's plan with its n halves on two cores wrote 254 such lines
per call (C's 1004-byte rows: one at the halves' border and one at each row's
end) and ran 1.08x the time of the same tiles split along m; with n = 256,
where no line is shared, 1.02x (Intel Xeon, BENCHMARKS.md). The cost per line
is calibrated (backends/calibrate.shared_line_seconds), with `shared_lines`
counting the calibration's lines as it counts a plan's.
"""
from __future__ import annotations

import math

from .caches import LINE_BYTES, copied_out, output_tile, trips
from .workload import Workload


def owner_changes(extent: int, tile: int, parent: int, cores: int) -> list[int]:
    """Indices i in (0, extent) along a dim where the core that owns i is not the one that
    owns i - 1, when a loop of parent // tile trips over tiles of `tile` runs in parallel
    inside each block of `parent`: the backend's thread pool gives each core a contiguous
    chunk of ceil(trips / cores) trips."""
    chunk = -(-(parent // tile) // cores) * tile
    changes = []
    for start in range(0, extent, parent):
        if start:
            changes.append(start)  # the last chunk's core hands over to the first's
        changes += range(start + chunk, min(start + parent, extent), chunk)
    return [i for i in changes if 0 < i < extent and (i % parent) // chunk != ((i - 1) % parent) // chunk]


def shared_lines(extents: list[int], axis: int, changes: list[int], elem_bytes: int) -> int:
    """Cache lines of a row-major array of `extents` that two cores write, where the owner
    changes at `changes` along dim `axis` (owner_changes) and nowhere else but where that dim
    starts again (the next index of the dims before it): the lines a change falls inside.

    The byte offsets of the changes repeat every lcm(row, LINE_BYTES) bytes, a row being what one
    index of the dims before `axis` spans, so one such period is counted and multiplied."""
    inner = math.prod(extents[axis + 1:]) * elem_bytes
    row = extents[axis] * inner
    rows = math.prod(extents[:axis])
    period = LINE_BYTES // math.gcd(row, LINE_BYTES)
    wraps = bool(changes) and rows > 1  # the last index's owner differs from the first's

    def counted(n: int) -> int:  # in the first n rows (the rows of a period start on a line)
        offsets = {o * row + i * inner for o in range(n) for i in changes}
        offsets |= {o * row for o in range(1, n)} if wraps else set()
        return len({off // LINE_BYTES for off in offsets if off % LINE_BYTES})

    return rows // period * counted(period) + counted(rows % period)


def output_shared_lines(workload: Workload, orders, tiles, padded, parallel: dict, cores: int,
                        plans: dict) -> list[tuple[str, int]]:
    """Per output written by an op running its own parallel loop: (tensor, lines two cores
    write per call). `tiles` effective, `padded` their extents, `parallel` per op as
    kernel_costs.parallel_ops gives it, `plans` each op's caches.output_plan (None: stored once).
    An output accumulated in place is stored at every trip
    of the reductions above its register tile (into a padded buffer of its own when copied
    out); one kept in a block buffer or in registers is written to the array once."""
    found = []
    for op in workload.ops:
        out = workload.tensors[op.output]
        position, own = parallel.get(op.name, (None, False))
        if out.role != "output" or not own:
            continue
        x, j = position
        plan = plans[op.name]
        stores, real = 1, True
        if plan is not None and plan.holder is None:
            _, above = output_tile(workload, orders, op, tiles, padded)
            stores = math.prod(trips(tiles, padded, y, i) for y, i in above if y not in out.dims)
            real = not copied_out(workload, op, padded)
        extents = [int(workload.dims[d] if real else padded[d]) for d in out.dims]
        parent = int(tiles[j + 1][x] if j + 1 < len(tiles) else padded[x])
        changes = owner_changes(extents[out.dims.index(x)], int(tiles[j][x]), parent, cores)
        lines = shared_lines(extents, out.dims.index(x), changes, workload.elem_bytes)
        if lines:
            found.append((op.output, lines * stores))
    return found
