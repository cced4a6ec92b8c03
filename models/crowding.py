"""Set crowding: the share of a set-associative cache that rows of an array read in place can use.

A cache takes a line's set from the address bits just above the line offset. Inside a 4 KiB page
those bits are the same in the virtual and the physical address, so where the array's rows lie a
multiple of the page apart, every row starts at the same offset in its page and a piece of each
row falls into the few sets that offset selects, however large the cache. A block made of such
pieces (a GEMM's B read in place, 32 columns of 768 rows of 12 KiB) can use only those sets: the
cache keeps it only if they hold it. Measured on an Intel Xeon (L2 2 MiB 16-way): the calibration's
micro-kernel reading 256-byte pieces of B's rows 12 KiB apart added 0.32, 1.95 and 4.75 times its
L1 link's time at 256, 384 and 768 rows (64, 96 and 192 KiB of B, in 4/64 of L2's sets: 128 KiB);
at 3 KiB apart (rows starting at four offsets) 768 rows added 0.2. vit-b/16's MLP (197x3072x768)
in 11x32x1 tiles, B read in place across 18 row tiles: predicted 2.24 ms as if L2 kept B's
96 KiB panel, measured 5.7 ms (BENCHMARKS.md, "Crowding session").

Packed copies store each block contiguously (models/caches.py), so only inputs that no cache copies
crowd. Pure NumPy; tiles may be arrays.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np

from .caches import LINE_BYTES, contiguous, micro_order, read_once
from .costmodel import padded_extents

PAGE_BYTES = 4096  # the pages the operating system maps: 4 KiB on x86 and on most Arm systems


def page_sets(hardware) -> int | None:
    """Sets of the hardware caches that one page's lines map to (64 where a way holds a page or
    more: every x86 and Arm data cache); None without set-associative caches."""
    target = hardware.target
    sets = [lv.capacity_bytes // (lv.ways * LINE_BYTES) for i, lv in enumerate(hardware.levels)
            if lv.ways and target.cache_bytes(i) is not None]
    return min(PAGE_BYTES // LINE_BYTES, *sets) if sets else None


def set_share(stride: int, run, sets: int) -> np.ndarray:
    """Share of a cache's sets that rows `stride` bytes apart use when a piece of `run` bytes of
    each is cached (`sets`: page_sets). Rows that are not a whole number of lines apart start at
    every offset, and use them all."""
    if stride % LINE_BYTES:
        return np.ones(np.shape(run))
    starts = sets // math.gcd(stride // LINE_BYTES % sets, sets)  # gcd(0, s) = s: one offset
    return np.minimum(1.0, starts * np.ceil(np.asarray(run, dtype=np.float64) / LINE_BYTES) / sets)


def in_place(workload, tiles, padded=None) -> dict[str, np.ndarray]:
    """Per plain input stored in the order the micro-kernel reads it, whether no cache of the plan
    copies it (tiles innermost first, arrays allowed): it is not padded and its block at every
    level above the registers is contiguous in the array, so the thrifty rule skips each copy
    (models/caches.input_caches). `padded`: padded_extents of the tiles, when at hand."""
    padded = padded_extents(workload, tiles) if padded is None else padded
    out = {}
    for op in workload.ops:
        vector = micro_order(workload, op)[-1]
        for name in op.inputs:
            t = workload.tensors[name]
            if t.role != "input" or not t.plain or name in out or (vector in t.dims and t.dims[-1] != vector):
                continue
            ok = np.ones((), dtype=bool)
            for x in t.dims:
                ok = ok & (np.asarray(padded[x]) == workload.dims[x])
            shape = [workload.dims[x] for x in t.dims]
            for tile in tiles[1:]:
                ok = ok & contiguous([tile[x] for x in t.dims], shape)
            out[name] = ok
    return out


def crowding(workload, hardware, tiles) -> Callable[[Mapping], np.ndarray] | None:
    """For the plan's `tiles`, a function of a tile that a cache would keep (a sweep standing in
    for it: models/objective.py) to the bytes its inputs read in place take beyond their own, as
    their rows crowd into a share of the sets (set_share): what the tile's MU must add to fit.
    A piece takes whole lines there: chain 128 on a 32 KiB 8-way L1d, B read in place in 8-float
    pieces of 64 rows 512 B apart, fills all 8 ways of its 8 sets, so no L1 keeps it; counted as
    32-byte pieces, it fitted beside the rest, and valgrind missed 1.33x the expected bytes.
    Inputs read once (a decode step's weights) are left out: they stream through and no cache
    keeps them for a next use. None where nothing crowds."""
    sets = page_sets(hardware)
    if sets is None:
        return None
    padded = padded_extents(workload, tiles)
    once: dict[str, np.ndarray] = {}
    for op in workload.ops:
        for name in op.inputs:
            once[name] = once.get(name, np.ones((), dtype=bool)) & read_once(workload, op, name, tiles, padded)
    unpacked = {name: mask & ~once[name] for name, mask in in_place(workload, tiles, padded).items()}
    unpacked = {name: mask for name, mask in unpacked.items() if np.any(mask)}
    if not unpacked:
        return None
    elem = workload.elem_bytes

    def crowded(tile: Mapping) -> dict[str, tuple]:
        """Per input, its block's rows, the bytes of each row's piece, and the share of the sets
        those pieces use (1 where the block is not pieces of rows, or not read in place)."""
        out = {}
        for name, mask in unpacked.items():
            dims = workload.tensors[name].dims
            last = np.asarray(tile[dims[-1]])
            rows = np.ones(())
            for x in dims[:-1]:
                rows = rows * np.asarray(tile[x])
            share = set_share(workload.dims[dims[-1]] * elem, last * elem, sets)
            pieces = mask & (rows > 1) & (last < workload.dims[dims[-1]])
            out[name] = (rows, last * elem, np.where(pieces, share, 1.0))
        return out

    def extra(tile: Mapping) -> np.ndarray:
        # A piece takes whole lines of its sets: 8-float pieces of an AVX2 kernel, half a line each.
        return sum((rows * (np.where(share < 1, np.ceil(run / LINE_BYTES) * LINE_BYTES / share, run) - run)
                    for rows, run, share in crowded(tile).values()), np.zeros(()))

    extra.names = tuple(unpacked)  # the inputs whose rows may crowd
    extra.crowded = crowded
    return extra
