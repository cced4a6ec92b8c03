"""Brute-force block-level simulator: walks every loop and counts block reloads.

Independent of models/costmodel.py: it enumerates the actual iteration sequence
and compares each tensor's active block with the previous one.
"""


def simulate_dv(workload, orders, tiles, level, tensors=None):
    """Bytes moved into `level` (0 = innermost), by walking the loops; only `tensors` when given."""
    n = len(orders)
    total = 0
    for op in workload.ops:
        walk = [(j, y) for j in reversed(range(level, n)) for y in orders[j] if y in op.loops]
        io = [t for t in workload.moved_tensors(op, level, n - 1) if tensors is None or t in tensors]
        # block[y][j] = (start, size) of y's current level-j block; level n is the whole extent.
        block = {y: {n: (0, e)} for y, e in workload.dims.items()}
        last = {t: None for t in io}

        def visit(i):
            nonlocal total
            if i == len(walk):
                for t in io:
                    key = tuple(block[x][level] for x in workload.tensors[t].dims)
                    if key != last[t]:
                        last[t] = key
                        size = 1
                        for _, s in key:
                            size *= s
                        total += size * workload.elem_bytes
                return
            j, y = walk[i]
            start, size = block[y][j + 1]
            t = int(tiles[j][y])
            for s in range(start, start + size, t):
                block[y][j] = (s, min(t, start + size - s))
                visit(i + 1)

        visit(0)
    return total


def simulate_mu(workload, tile):
    """Largest per-op footprint of full level blocks, by listing each block."""
    worst = 0
    for op in workload.ops:
        total = 0
        for t in [*op.inputs, op.output]:
            size = 1
            for x in workload.tensors[t].dims:
                size *= int(tile[x])
            total += size
        worst = max(worst, total)
    return worst * workload.elem_bytes
