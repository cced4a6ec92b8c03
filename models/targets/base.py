"""What every target shares, and the hooks each kind of machine overrides.

A target is the strategy for one kind of machine: how its innermost level
holds data (the register model), what a level's usage is, how far the
arithmetic falls short of peak, which tiles and orders are legal, and what a
plan adds on it (caches, a launch). The cost model and the optimizer call
these hooks; they never ask which kind of machine they are on.

The base class is the plain model: every level holds the full blocks of the
tensors it works on, intermediates stay in the kernel at the outermost level,
and any tile that nests is legal. It also serves when no hardware is given.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    from ..hardware import Hardware
    from ..workload import Op, Workload


class Target:
    name: ClassVar[str] = "plain"
    backends: ClassVar[tuple[str, ...]] = ("llvm",)  # backends that build its plans; the first is the default
    registers_share_issue: ClassVar[bool] = False  # level 0's link time adds to compute (see SimdCpu)
    polish_grows: ClassVar[bool] = True  # polish breaks model ties towards fuller levels
    fine_candidates: ClassVar[bool] = True  # tile candidates include the block-count and small-integer sets
    default_stages: ClassVar[int] = 1
    figures: ClassVar[str] = "assumed figures"  # where an uncalibrated hardware's figures come from
    # How the host preset's figures are measured on this kind of machine (None: they are not).
    calibration: ClassVar[str | None] = "`tune hardware host --calibrate` measures this machine"
    # auto's first pass: "seeded" searches around the best register tiles, "capped" is enumerate
    # stopped after budget.GPU_WORK, "exact" is enumerate with the NLP solver as fallback.
    auto_strategy: ClassVar[str] = "exact"
    # How compute and the links' times combine into a plan's time (costmodel.overlapped): their
    # p-norm with this p. inf: they overlap perfectly, and the slowest alone sets the time.
    overlap_norm: ClassVar[float] = float("inf")

    def __init__(self, hardware: Hardware | None):
        self.hardware = hardware

    # --- cost model ------------------------------------------------------------------------
    def register_weights(self, workload: Workload) -> dict[tuple[str, str], float] | None:
        """Per (op, tensor), the cost of an element moved into level 0 (None: plain DV)."""
        return None

    def local_level(self, n_levels: int) -> int:
        """The level from which a fused chain's intermediates stay inside the kernel."""
        return n_levels - 1

    def output_level(self, level: int, n_levels: int) -> int | None:
        """The level whose walk moves outputs into `level` (None: `level` itself)."""
        return None

    def emitted_tiles(self, workload: Workload, orders, tiles: Sequence[Mapping]) -> list[dict]:
        """One plan's tiles (scalars, innermost level first) as its compiled kernel runs them: the
        plan's own, unless the compiler reshapes them (SimdCpu)."""
        return [dict(t) for t in tiles]

    def level_usage(self, workload: Workload, level: int, tile: Mapping, stages: int = 1) -> np.ndarray:
        """MU of `level` in bytes for (arrays of) tiles."""
        from ..costmodel import memory_usage

        return memory_usage(workload, tile)

    def peak_flops(self, workload: Workload) -> float:
        """The arithmetic peak the workload's kernel can reach on this machine (FLOP/s)."""
        return self.hardware.peak_flops

    def issue_efficiency(self, workload: Workload, op: Op, tiles: Sequence[Mapping], orders=None) -> np.ndarray | float:
        """The fraction of peak one op's inner loop can issue at (1: peak); `orders` (None: not
        fixed yet, the least the tiles allow) say which loops run around the register tile."""
        return 1.0

    def launch_stretch(self, workload: Workload, tiles: Sequence[Mapping], stages: int) -> np.ndarray | float:
        """How much longer the whole plan's arithmetic takes than at peak, beyond each op's own."""
        return 1.0

    # --- search space -------------------------------------------------------------------
    def usable_bytes(self, level) -> int:
        """How much of a level (a models.hardware.Level) a plan may fill."""
        return level.capacity_bytes

    def cache_bytes(self, index: int) -> int | None:
        """What the hardware cache at level `index` holds of a kernel's data (usable bytes), or
        None where the kernel itself places the data (registers, GPU shared memory) or the
        model stays Accera's (abstract hierarchies): there a level moves exactly its DV."""
        return None

    def kept_bytes(self, index: int) -> int | None:
        """What an LRU cache at level `index` keeps of a working set that cycles through it whole:
        the share the expected traffic counts (models/traffic.py). The time objective ranks plans
        with cache_bytes."""
        return self.cache_bytes(index)

    def capacity_for(self, level, need: float) -> int:
        """The smallest capacity of `level` whose usable share holds `need` bytes."""
        return int(math.ceil(need))

    def vector_lanes(self, workload: Workload) -> int:
        """Elements of the workload's dtype in one SIMD register (1: no SIMD)."""
        return 1

    def lanes(self, workload: Workload) -> dict[str, int]:
        """Per loop, the multiple its tiles take (vector lanes on SIMD machines)."""
        return {x: 1 for x in workload.dims}

    def leading_loops(self, workload: Workload) -> list[str]:
        """Loops every order must start with (in some order)."""
        return []

    def outer_loops(self, workload: Workload) -> list[str]:
        """Loops that may be tiled at levels >= 2 (the others keep their whole extent there)."""
        return list(workload.dims)

    def tile_rule(self, workload: Workload, x: str, tiles: np.ndarray, level: int | None, lanes: int) -> np.ndarray | bool:
        """The target's own rule on loop x's tiles at `level`, on top of nesting."""
        return True

    def level_filter(self, workload: Workload, level: int, tiles: Sequence[Mapping], stages: int):
        """Enumerate's per-level check of whole tile rows (tiles from `level` outwards), or None."""
        return None

    def reduction_room(self, workload: Workload, tile: Mapping, inner: Mapping) -> np.ndarray | bool:
        """Whether an outer level's `tile` (arrays allowed) leaves the register tile `inner` a
        reduction loop the target needs around it (SIMD CPUs): the seeded search's first dive keeps
        to such tiles, and its seeds that leave the whole problem that room rank first
        (enumeration._first_dive, Space.best_register_tiles). True elsewhere."""
        return True

    def orders_at(self, level: int, orders: list) -> list:
        """The order classes worth searching at `level`."""
        return orders

    def kernel_costs(self, workload: Workload, orders, tiles, stages: int = 1):
        """What the emitted kernel spends besides the overlapped streaming (scalar plans): a
        models.kernel_costs.KernelCosts, or None when the target models none."""
        return None

    def compute_floor(self, workload: Workload, level: int, tile: Mapping, stages: int) -> np.ndarray | float:
        """A lower bound on launch_stretch given only `level`'s tiles (enumerate's bound)."""
        return 1.0

    def admits(self, workload: Workload, tiles: Sequence[Mapping], stages: int, orders=None) -> np.ndarray | bool:
        """Whether the plan (tiles innermost level first, arrays allowed) is in this target's space,
        beyond each loop's tile_rule: on GPUs, a launch that fits the device; on SIMD CPUs, register
        tiles that keep the FMA pipes busy and, given the `orders`, accumulators that take more
        than one reduction step per load. True elsewhere."""
        return True

    def admits_filtered(self, workload: Workload, tiles: Sequence[Mapping], stages: int, orders=None) -> np.ndarray | bool:
        """`admits` for plans whose register tiles passed level_filter at level 0: what the orders
        and the whole plan add to that check (all of admits by default)."""
        return self.admits(workload, tiles, stages, orders)

    def check_stages(self, stages: int) -> None:
        """Raise InvalidInput unless the machine has shared-memory stages to rotate."""
        from ..errors import InvalidInput

        if stages > 1:
            name = self.hardware.name if self.hardware is not None else "this hardware"
            raise InvalidInput(f"stages apply to GPU shared memory; {name!r} is a CPU (use --double-buffer)")

    def check_launch(self, workload: Workload, stages: int) -> None:
        """Raise Infeasible when no plan can launch whatever its tiles (nothing to check off GPUs)."""

    # --- plan --------------------------------------------------------------------------
    def plan_extras(self, workload: Workload, names: list[str], orders, tiles, stages: int):
        """What the plan document adds on this machine: (cache records, launch or None)."""
        from ..caches import plan_caches
        from ..kernel_costs import plan_padding

        if self.hardware is None:
            return plan_caches(workload, names, orders, tiles), None
        padding = list(plan_padding(workload, self.hardware, orders, tiles).values())
        return plan_caches(workload, names, orders, tiles, cores=self.hardware.cores, padding=padding), None
