"""Brute-force block-level simulator: walks every loop and counts block reloads.

Independent of models/costmodel.py: it enumerates the actual iteration sequence
and compares each tensor's active block with the previous one. A block is its
loops' blocks; its size is the number of distinct index tuples it touches,
counted by listing them (an affine dim `2*oh+kh` touches {2a + b} over the
block's a and b).
"""
import functools
import itertools


def simulate_dv(workload, orders, tiles, level, tensors=None, ops=None):
    """Bytes moved into `level` (0 = innermost), by walking the loops; only `tensors`, and only
    the ops named in `ops`, when given."""
    n = len(orders)
    total = 0
    for op in workload.ops:
        if ops is not None and op.name not in ops:
            continue
        walk = [(j, y) for j in reversed(range(level, n)) for y in orders[j] if y in op.loops]
        io = [t for t in workload.moved_tensors(op, level, n - 1) if tensors is None or t in tensors]
        # block[y][j] = (start, size) of y's current level-j block; level n is the whole extent.
        block = {y: {n: (0, e)} for y, e in workload.dims.items()}
        last = {t: None for t in io}

        def visit(i):
            nonlocal total
            if i == len(walk):
                for t in io:
                    tensor = workload.tensors[t]
                    key = tuple(block[x][level] for x in tensor.loops)
                    if key != last[t]:
                        last[t] = key
                        total += _touched(tensor, {x: block[x][level] for x in tensor.loops}) * workload.elem_bytes
                return
            j, y = walk[i]
            start, size = block[y][j + 1]
            t = int(tiles[j][y])
            for s in range(start, start + size, t):
                block[y][j] = (s, min(t, start + size - s))
                visit(i + 1)

        visit(0)
    return total


def _touched(tensor, ranges):
    """Distinct index tuples a block touches; `ranges` maps each loop to (start, size). Each
    loop indexes one dim, so that is the product of each dim's distinct indices."""
    size = 1
    for ix in tensor.index:
        size *= _distinct(tuple(c for _, c in ix.terms), tuple(ranges[x][1] for x in ix.loops))
    return size


@functools.cache
def _distinct(coefficients, sizes):
    """Distinct values of sum(c * a) over each a in range(size), listed. Where the block starts
    shifts every value alike, so the count is its sizes' alone, and each is listed once."""
    combos = itertools.product(*map(range, sizes))
    return len({sum(c * a for c, a in zip(coefficients, combo)) for combo in combos})


def _window(tensor, tile):
    """Elements of the box between the smallest and largest index the full block reaches."""
    size = 1
    for ix in tensor.index:
        values = [sum(c * a for (_, c), a in zip(ix.terms, combo))
                  for combo in itertools.product(*[range(int(tile[x])) for x in ix.loops])]
        size *= max(values) - min(values) + 1
    return size


def simulate_mu(workload, tile):
    """Largest per-op footprint of full level blocks (the windows they span), by listing each block."""
    worst = 0
    for op in workload.ops:
        total = sum(_window(workload.tensors[t], tile) for t in [*op.inputs, op.output])
        worst = max(worst, total)
    return worst * workload.elem_bytes
