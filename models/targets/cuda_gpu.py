"""CUDA GPUs: level 0 is a thread's registers (the thread tile), level 1 a block's shared
memory (the block tile), outer levels the caches the grid walks through (models/gpu.py).

Threads stream their fragments from shared memory (a broadcast to a warp still
issues a load per thread), accumulators persist through the block's walk, and
a chain's intermediates stay in shared memory. The grid's loops (spatial for
every op) come first in every order; the other loops run serially inside a
block, so at levels >= 2 they keep their whole extent, and a thread steps
through its reductions one at a time.

16-bit matrix products on sm_80+ run on tensor cores instead (models/targets/
tensor_cores.py): level 0 is then a warp's tile of mma fragments.
"""
from __future__ import annotations

import numpy as np

from .. import gpu
from .base import Target
from .tensor_cores import tensor_core_model


class CudaGpu(Target):
    name = "cuda-gpu"
    backends = ("cuda",)
    polish_grows = False  # fuller shared memory costs resident blocks
    fine_candidates = False  # divisors and powers of two only: odd block shapes waste threads and warps
    default_stages = 2
    figures = "published figures"  # the presets' whitepaper numbers
    calibration = None  # the CUDA presets are whitepaper figures; calibrate measures CPUs
    auto_strategy = "capped"

    def register_weights(self, workload):
        return {(op.name, t): 1 for op in workload.ops for t in [*op.inputs, op.output]}

    def local_level(self, n_levels):
        return min(1, n_levels - 1)

    def output_level(self, level, n_levels):
        # A thread's accumulators move only when the block walk leaves their block.
        return 1 if level == 0 and n_levels > 1 else None

    def model(self, workload):
        """How the workload's kernel uses the GPU: tensor cores where they apply, else SIMT."""
        return tensor_core_model(workload, self.hardware) or gpu.SIMT

    def peak_flops(self, workload):
        tc = self.model(workload).tensor_cores
        return self.hardware.gpu.tensor_flops[workload.dtype] if tc else self.hardware.peak_flops

    def level_usage(self, workload, level, tile, stages=1):
        if level == 0:
            return self.model(workload).registers(workload, tile) * gpu.REGISTER_BYTES
        if level == 1:
            return self.model(workload).shared_bytes(workload, tile, stages)
        return super().level_usage(workload, level, tile, stages)

    def launch_stretch(self, workload, tiles, stages):
        """Wave quantisation and too few resident warps (gpu.Launch.slowdown)."""
        if len(tiles) < 2:
            return 1.0
        kept = _FILTERED.stretch(self.hardware, workload, tiles, stages)
        if kept is not None:
            return kept
        return gpu.launch(workload, self.hardware, tiles, stages, self.model(workload)).slowdown(self.hardware)

    def lanes(self, workload):
        model = self.model(workload)
        return model.multiples(workload) if model.tensor_cores else super().lanes(workload)

    def leading_loops(self, workload):
        return gpu.block_loops(workload)

    def outer_loops(self, workload):
        return gpu.block_loops(workload)

    def tile_rule(self, workload, x, tiles, level, lanes):
        if level is not None and level >= 2 and x not in gpu.block_loops(workload):
            return tiles == workload.dims[x]  # a block runs its serial loops whole
        model = self.model(workload)
        if model.tensor_cores:
            return model.tile_rule(workload, x, tiles, level, x in _thread_steps(workload))
        if level == 0 and x in _thread_steps(workload):
            return tiles == 1  # a thread's reduction step changes no cost; take one at a time
        return True

    def level_filter(self, workload, level, tiles, stages):
        if level == 0:
            return self.launchable(workload, tiles, stages)
        if level == 1:
            return gpu.block_has_warps(workload, self.hardware, tiles[0])
        return None

    def orders_at(self, level, orders):
        return orders[:1] if level == 0 else orders  # a thread's loop order changes nothing

    def compute_floor(self, workload, level, tile, stages):
        if level != 1:
            return 1.0
        return gpu.slowdown_floor(workload, self.hardware, tile, stages, self.model(workload))[None, :]

    def admits(self, workload, tiles, stages, orders=None):
        return self.launchable(workload, tiles, stages)

    def admits_filtered(self, workload, tiles, stages, orders=None):
        return True  # level_filter checked the launch already, and a thread's loop order changes nothing

    def launchable(self, workload, tiles, stages):
        """Whether the launch fits the device (threads, registers, shared memory, and the tensor
        core fragments' rules)."""
        model = self.model(workload)
        launch = gpu.launch(workload, self.hardware, tiles, stages, model)
        ok = launch.feasible & model.schedulable(workload, tiles) if model.tensor_cores else launch.feasible
        _FILTERED.keep(self.hardware, workload, tiles, stages, launch, ok)
        return ok

    def check_stages(self, stages):
        pass

    def check_launch(self, workload, stages):
        """The smallest launch: whole warps (or the whole output, when smaller) of one-point threads."""
        from ..errors import Infeasible

        g, name = self.hardware.gpu, self.hardware.name
        points = int(np.prod([workload.dims[x] for x in workload.tensors[workload.ops[-1].output].dims]))
        least = min(g.warp, points)
        regs = int(gpu.registers(workload, {x: 1 for x in workload.dims}))
        for limit, what in [(g.max_threads_per_block, "max_threads_per_block"), (g.max_threads_per_sm, "max_threads_per_sm"),
                            (g.registers_per_sm // regs, f"registers_per_sm / {regs} registers per thread")]:
            if least > limit:
                raise Infeasible(f"a block needs at least {least} threads (whole warps of {g.warp}, or the whole "
                                 f"output) but {name!r} allows {limit} ({what})")

    def plan_extras(self, workload, names, orders, tiles, stages):
        from ..caches import gpu_cache_records

        model = self.model(workload)
        records = gpu_cache_records(workload, names, orders, tiles, stages)
        if model.tensor_cores:
            records = model.cache_records(workload, records, tiles, stages, names)
        return records, gpu.launch_plan(workload, self.hardware, tiles, stages, model)


def _tiles_key(tiles) -> tuple:
    """The tiles' values, exactly (arrays by dtype, shape and bytes), for an equality check."""
    def value(v):
        a = np.asarray(v)
        return a.dtype.str, a.shape, a.tobytes()
    return tuple(tuple((x, value(v)) for x, v in tile.items()) for tile in tiles)


class _LastFilter:
    """The launch of the thread tiles level 0's filter kept last, for launch_stretch.

    enumerate filters a level's thread tiles by their launch (launchable), then costs the
    rows it kept, whose compute time stretches by the same launch: computed twice, that was
    30% of a GPU search (gemm-a100-enumerate). The kept rows' stretch is taken from the
    filter's launch when launch_stretch is asked about exactly those rows (compared by value,
    so any other question computes afresh); the slowdown is elementwise per row, so it is the
    same number either way. One entry, swapped whole, so concurrent searches only miss."""

    def __init__(self):
        self._entry = None

    def keep(self, hardware, workload, tiles, stages, launch, ok) -> None:
        ok = np.asarray(ok)
        # Only rows of one length (enumerate's level 0 under scalar outer tiles): any other
        # shape (a one-element array broadcast, say) is left to launch_stretch to compute.
        if ok.ndim != 1 or not ok.any() or any(np.ndim(v) and np.shape(v) != ok.shape for t in tiles for v in t.values()):
            return
        kept = [{x: np.asarray(v)[ok] if np.ndim(v) else v for x, v in tile.items()} for tile in tiles]
        self._entry = (hardware, workload, stages, _tiles_key(kept), launch, ok)

    def stretch(self, hardware, workload, tiles, stages):
        entry = self._entry
        if entry is None or entry[0] is not hardware or entry[1] is not workload or entry[2] != stages:
            return None
        if entry[3] != _tiles_key(tiles):
            return None
        launch, ok = entry[4], entry[5]
        return np.broadcast_to(launch.slowdown(hardware), ok.shape)[ok]


_FILTERED = _LastFilter()


def _thread_steps(workload) -> list[str]:
    """Loops indexing no output: the reductions a thread steps through."""
    outputs = {x for op in workload.ops for x in workload.tensors[op.output].dims}
    return [x for x in workload.dims if x not in outputs]
