"""The discrete search space: tile candidates per loop and loop orders per level.

Tile candidates for a loop of extent E: every divisor of E, every power of two
below E, E itself, ceil(E/q) for every block count q, and every integer 1..E
when E <= 64 (the *fine* set). The *coarse* set drops the last two rules; solvers search it first because a plan that
reaches the lower bound there is optimal over the fine set too.

Emittable tiles: each level's tile of a loop divides the tile of the level
above, unless that one is the whole extent (the backend then pads the loop to a
multiple of the largest tile below it). The hardware's target adds its own
rules (models/targets: vector lanes on SIMD CPUs, serial loops and thread
steps on GPUs). Solvers only return plans that obey these rules.

The space owns the objective every solver minimises (models/objective.py):
predicted time, or one level's DV for the Pareto sweeps.

Orders: permutations of all loops with the loops shared by every op first.
Two orders of one level are equivalent when, for every op and tensor, the walk
alternates between the same sets of tensor loops and other loops (the order
inside each run and the trailing non-tensor loops never change DV); only one
order per class is searched. Workloads with many loops (convolutions) have
thousands of classes; there one order per relaxed class is searched (which
other loops precede each tensor's last loop), and the search is then not
exhaustive.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from ..models.caches import read_once, tiles_nest
from ..models.costmodel import check_order, compute_seconds, data_volume, memory_usage, single_level_bound
from ..models.hardware import Hardware
from ..models.objective import Objective, WholeProblem, memory_extra, time_objective, whole_problem
from ..models.targets import Target
from ..models.workload import Workload
from . import budget


@functools.lru_cache(maxsize=64)
def divisors(extent: int) -> tuple[int, ...]:
    """Every divisor of `extent`, ascending (O(sqrt(extent)) steps: 46341 at MAX_EXTENT)."""
    low = [d for d in range(1, math.isqrt(extent) + 1) if extent % d == 0]
    return tuple(sorted({*low, *(extent // d for d in low)}))


def tile_candidates(extent: int, fine: bool = True) -> np.ndarray:
    """Sorted candidate tile extents for one loop."""
    values = set(divisors(extent))
    values |= {1 << i for i in range(extent.bit_length()) if 1 << i < extent}
    values.add(extent)
    if fine:
        # The smallest tile giving each block count q; past sqrt(E) those are all small
        # integers, so every integer up to sqrt(E) + 1 stands in for them.
        root = math.isqrt(extent)
        values |= {-(-extent // q) for q in range(1, root + 1)} | set(range(1, min(extent, root + 1) + 1))
        if extent <= 64:
            values |= set(range(1, extent + 1))
    return np.array(sorted(values), dtype=np.int64)


def _tensor_walks(workload: Workload, order):
    """For each op's input/output tensor: the op's loops in `order` and the tensor's loops."""
    for op in workload.ops:
        walk = [x for x in order if x in op.loops]
        for name in [*op.inputs, op.output]:
            yield walk, set(workload.tensors[name].loops)


def order_signature(workload: Workload, order) -> tuple:
    """What of a level's order the cost model can see (see module docstring)."""
    sig = []
    for walk, tdims in _tensor_walks(workload, order):
        runs: list[tuple[bool, frozenset]] = []
        for x in walk:
            is_t = x in tdims
            if runs and runs[-1][0] == is_t:
                runs[-1] = (is_t, runs[-1][1] | {x})
            else:
                runs.append((is_t, frozenset({x})))
        while runs and not runs[-1][0]:
            runs.pop()
        sig.append(tuple(runs))
    return tuple(sig)


def relaxed_signature(workload: Workload, order) -> tuple:
    """The signature when every loop runs more than once: per tensor, the other loops before its last loop."""
    sig = []
    for walk, tdims in _tensor_walks(workload, order):
        last = max((i for i, x in enumerate(walk) if x in tdims), default=-1)
        sig.append(frozenset(x for x in walk[:last] if x not in tdims))
    return tuple(sig)


def order_classes(workload: Workload, key=order_signature, leading: list[str] | None = None) -> list[tuple[str, ...]]:
    """One representative order per equivalence class, in a stable order, each starting with
    the `leading` loops (the target's: on GPUs the grid's loops, since blocks run side by side
    and every other loop runs serially inside a block)."""
    grid = leading or []
    # A loop of extent 1 never runs more than once, so where it stands changes nothing: it
    # closes its group instead of being permuted.
    unit = [x for x in workload.dims if workload.dims[x] == 1 and x not in grid]
    shared = [x for x in workload.shared_loops if x not in unit]
    private = [x for x in workload.dims if x not in workload.shared_loops and x not in unit]
    unit_shared = tuple(x for x in unit if x in workload.shared_loops)
    unit_private = tuple(x for x in unit if x not in workload.shared_loops)
    seen: dict[tuple, tuple[str, ...]] = {}
    for head in itertools.permutations(shared):
        if grid and sorted(head[: len(grid)]) != sorted(grid):
            continue
        for tail in itertools.permutations(private):
            order = head + unit_shared + tail + unit_private
            seen.setdefault(key(workload, order), order)
    reps = list(seen.values())
    for order in reps:
        check_order(workload, order)
    return reps


# Past this many order classes per level (a convolution's seven loops give ~1900), levels
# search one order per relaxed class instead (relaxed_signature: exact when every loop runs
# more than once, as it does away from ragged edges); enumerate then reports `feasible`.
ORDER_CLASS_LIMIT = 256

# A plan within this fraction of the lower bound is reported optimal (a MIP-style gap):
# on SIMD CPUs the bound adds the best register-load time any tile allows, which real
# plans approach but rarely meet exactly.
OPTIMALITY_GAP = 0.01
RANKED_TILE = 4096  # register tiles ranked (Space._register_times): each dim up to this, and its largest
FITTING_LIMIT = 2_000_000  # rows fitting_tiles may hold


def fitting_tiles(workload: Workload, candidates: dict, smallest: dict, capacity: float, target: Target) -> dict | None:
    """Every combination of candidate tiles whose register usage fits `capacity`, as column arrays;
    None past FITTING_LIMIT. Built loop by loop, dropping partial rows that cannot fit
    even with the smallest tiles for the loops still open (MU grows with every tile)."""
    loops = list(workload.dims)
    rows = np.zeros((1, 0), dtype=np.int64)
    for i, x in enumerate(loops):
        c = candidates[x]
        rows = np.concatenate([np.repeat(rows, len(c), axis=0), np.tile(c, len(rows))[:, None]], axis=1)
        tile = {y: rows[:, k] for k, y in enumerate(loops[: i + 1])} | {y: smallest[y] for y in loops[i + 1:]}
        rows = rows[target.level_usage(workload, 0, tile) <= capacity]
        if len(rows) * max(1, len(candidates[loops[i + 1]]) if i + 1 < len(loops) else 1) > FITTING_LIMIT:
            return None
    return {x: rows[:, k] for k, x in enumerate(loops)}


@dataclass
class Space:
    """Everything a solver needs that does not depend on the plan being searched."""

    workload: Workload
    hardware: Hardware
    fine: bool = True
    stages: int = 1  # buffers per shared-memory input cache (GPUs)
    objective: Objective | None = None  # default: predicted time on the hardware
    target: Target = field(init=False)
    loops: list[str] = field(init=False)
    candidates: dict[str, np.ndarray] = field(init=False)
    orders: list[tuple[str, ...]] = field(init=False)
    exhaustive_orders: bool = field(init=False)  # False: one order per relaxed class (ORDER_CLASS_LIMIT)
    compute_seconds: float = field(init=False)
    whole: WholeProblem = field(init=False)  # the whole problem as one tile (objective.effective_dv)
    lower_bound: float = field(init=False)
    lanes: dict[str, int] = field(init=False)
    register_floor: float = field(init=False)
    _serial: dict = field(init=False, repr=False, default_factory=dict)  # (orders, tiles) -> serial_costs' terms
    _levels: dict = field(init=False, repr=False, default_factory=dict)  # (level, its orders and tiles out) -> DV
    # level -> enumerate's floor table over this space's candidate grid, which every search
    # of the space shares (the seeded passes' growing beams), since it depends on nothing else.
    floor_tables: dict = field(init=False, repr=False, default_factory=dict)
    # enumerate's large levels costed along a search path, which the seeded passes walk again
    # (enumeration._Search._costed)
    level_costs: dict = field(init=False, repr=False, default_factory=dict)
    _registers: tuple = field(init=False, repr=False)  # (fitting register tiles, their register-load floor)

    def __post_init__(self):
        w, hw = self.workload, self.hardware
        self.target = hw.target
        self.objective = self.objective or time_objective(hw, w)
        self.loops = list(w.dims)
        self.candidates = {x: tile_candidates(e, self.fine and self.target.fine_candidates) for x, e in w.dims.items()}
        self.orders = order_classes(w, leading=self.target.leading_loops(w))
        self.exhaustive_orders = len(self.orders) <= ORDER_CLASS_LIMIT
        if not self.exhaustive_orders:
            self.orders = order_classes(w, key=relaxed_signature, leading=self.target.leading_loops(w))
        self.compute_seconds = float(self.objective.compute(w.flops / self.target.peak_flops(w)))
        self.whole = whole_problem(w, hw)
        # Every level loads each input and output at least once.
        io_bytes = w.bytes_of("input", "output")
        self.lanes = self.target.lanes(w)
        moved = [io_bytes] * len(hw.levels)
        moved[-1] += memory_extra(self.whole, self.objective.caches)  # as effective_dv charges it
        links = self.objective.links(moved)
        self.register_floor = 0.0
        self._registers = (None, None)
        if self.objective.shares_issue:
            # Register loads issue with the FMAs: compute + the least register time any tile allows.
            self._registers = self._register_times()
            times = self._registers[1]
            self.register_floor = float(np.min(times)) if times is not None and times.size else 0.0
            links = links[1:]
        self.lower_bound = float(self.objective.overlap(self.compute_seconds + self.register_floor, *links))

    def _register_times(self):
        """Register tiles that fit and the target admits, and for each the least register-load time
        it allows (seconds)."""
        w = self.workload
        weights = self.target.register_weights(w)
        # Tiles up to RANKED_TILE and the largest: a tile's register time does not grow with its
        # extent, and a gemm of 10^9 cubed offered 63,258 reduction tiles, whose million register
        # tiles took 0.5-1 s to rank, past a 0.5 s limit.
        ranked = {x: c[(c <= RANKED_TILE) | (c == c.max())] for x, c in self.candidates.items()}
        rows = fitting_tiles(w, {x: c[self.legal(x, c, w.dims[x], level=0)] for x, c in ranked.items()},
                             self.smallest_tiles(), self.capacity(0), self.target)
        if rows is None:
            return None, None
        admitted = np.broadcast_to(self.admits([rows]), rows[self.loops[0]].shape)
        rows = {x: r[admitted] for x, r in rows.items()}
        bound = np.broadcast_to(single_level_bound(w, rows, weights), rows[self.loops[0]].shape)
        return rows, self.objective.links([bound])[0]

    def best_register_tiles(self, n: int) -> np.ndarray | None:
        """The n register tiles (rows in `loops` order) with the least compute plus register-load
        floor: where a search on SIMD CPUs looks first."""
        ranked = self._ranked_register_tiles()
        if ranked is None:
            return None
        rows = self._registers[0]
        return np.stack([rows[x][ranked[:n]] for x in self.loops], axis=1)

    def _ranked_register_tiles(self) -> np.ndarray | None:
        """Indices of the register tiles, best first, one per output tile (best_register_tiles)."""
        rows, times = self._registers
        if rows is None or not times.size:
            return None
        score = times + self.objective.compute(compute_seconds(self.workload, self.hardware, None, [rows]))
        # Tiles that leave room for the reduction loop the target needs around them come first
        # (Target.reduction_room): a 3x3 -> 1x1 conv chain whose register tiles spanned two of its
        # 64 channels' vectors left the 1x1 four steps, and on AVX2 no plan was admitted.
        room = np.broadcast_to(self.target.reduction_room(self.workload, self.workload.dims, rows), score.shape)
        # Reduction tiles barely change the register model: keep the smallest of each output tile.
        outputs = sorted({x for op in self.workload.ops for x in self.workload.tensors[op.output].dims})
        order = np.lexsort([rows[x] for x in reversed(self.loops)] + [score, ~room])
        # The first row of each output tile in that order, in numpy: a Python loop over the rows
        # took 1.5 s of a 0.5 s limit on a gemm of 10^9 cubed, before RANKED_TILE.
        ranks = [np.unique(rows[x], return_inverse=True) for x in outputs]
        group = np.ravel_multi_index([inverse.ravel() for _, inverse in ranks], [len(values) for values, _ in ranks])
        _, first = np.unique(group[order], return_index=True)
        return order[np.sort(first)]

    def read_once_seed(self) -> tuple[int, ...] | None:
        """The best register tile (best_register_tiles' ranking) under which some input reaches
        the registers once: every loop of its op that does not index it lies whole in the tile
        (models/caches.read_once), so the kernel streams it in place, unpacked. None where no
        register tile does that, or the target ranks none.

        The ranking weighs the micro-kernel alone, and a decode step's weights are read from
        memory whatever it does: llama's 8x4096x4096 on the AMD EPYC Zen 3 ranked its 8-row tile
        seventh, behind 4x16 tiles that read B twice and so pack it (10.7 ms, numpy 7.6). The 8x8
        tile's plan, polished, read B in place along 8-row bands in 5.1 ms (BENCHMARKS.md,
        "Read-once session")."""
        ranked = self._ranked_register_tiles()
        if ranked is None:
            return None
        rows = self._registers[0]
        tile = [{x: rows[x][ranked] for x in self.loops}]
        once = np.zeros(len(ranked), dtype=bool)
        for op in self.workload.ops:
            for name in op.inputs:
                tensor = self.workload.tensors[name]
                if tensor.role == "input" and tensor.plain:
                    once |= read_once(self.workload, op, name, tile, self.workload.dims)
        if not once.any():
            return None
        best = ranked[np.argmax(once)]
        return tuple(int(rows[x][best]) for x in self.loops)

    def canonical(self, cand):
        """The candidate with each level's one-trip loops (tile equal to the tile above) moved to
        the end of their group (the target's leading loops, the other shared loops, the private
        loops), in `loops` order. Where such a loop sits changes neither a cost nor the kernel, so
        plans that differ only there are one plan."""
        dims = [self.workload.dims[x] for x in self.loops]
        leading, shared = set(self.target.leading_loops(self.workload)), set(self.workload.shared_loops)
        orders = []
        for j, order in enumerate(cand.orders):
            parent = cand.tiles[j + 1] if j + 1 < len(cand.tiles) else dims
            single = {x for i, x in enumerate(self.loops) if -(-parent[i] // cand.tiles[j][i]) == 1}

            def place(x, order=order, single=single):
                group = 0 if x in leading else 1 if x in shared else 2
                return group, x in single, self.loops.index(x) if x in single else order.index(x)

            orders.append(tuple(sorted(order, key=place)))
        return dataclasses.replace(cand, orders=tuple(orders))

    def data_volume(self, orders, tiles) -> list:
        """costmodel.data_volume of every level on this space's hardware. A single plan's levels are
        remembered: level l depends only on the orders and tiles from l out, and a polish costs
        each loop order of each level of its incumbent, so most levels were costed already."""
        if any(np.ndim(t[x]) for t in tiles for x in self.loops):
            return data_volume(self.workload, orders, tiles, hardware=self.hardware)
        plan = tuple(tuple(int(t[x]) for x in self.loops) for t in tiles)
        orders = tuple(map(tuple, orders))
        keys = [(level, orders[level:], plan[level:]) for level in range(self.n_levels)]
        missing = [level for level, key in enumerate(keys) if key not in self._levels]
        if missing:
            dv = data_volume(self.workload, orders, tiles, levels=missing, hardware=self.hardware)
            self._levels.update({keys[level]: d for level, d in zip(missing, dv)})
        return [self._levels[key] for key in keys]

    def serial_costs(self, orders, tiles, within=True) -> tuple:
        """The kernel's serial seconds for plans sharing `orders` (the target's kernel_costs),
        tiles scalars or arrays, with the seconds its copies inside the loop nest read and the
        bytes they spare each link (Objective.value's `reads` and `relief`); 0 where the
        objective does not count them or tiles do not nest. `within`: a mask (broadcast like the
        tiles) of the plans to cost; the others get inf seconds."""
        if not self.objective.counts_serial:
            return 0.0, 0.0, None
        shape = np.broadcast_shapes(np.shape(within), *[np.shape(t[x]) for t in tiles for x in self.loops])
        flat = [{x: np.broadcast_to(t[x], shape).ravel() for x in self.loops} for t in tiles]
        out = np.zeros((int(np.prod(shape)), 2 + self.n_levels))
        out[:, 0] = np.inf
        for i in np.flatnonzero(np.broadcast_to(within, shape)):
            row = tuple(tuple(int(t[x][i]) for x in self.loops) for t in flat)
            key = (tuple(map(tuple, orders)), row)
            if key not in self._serial:
                plan_tiles = [dict(zip(self.loops, r)) for r in row]
                costs = (self.target.kernel_costs(self.workload, orders, plan_tiles, self.stages)
                         if tiles_nest(self.workload, plan_tiles) else None)
                self._serial[key] = ((costs.seconds, costs.read_seconds(self.hardware), *costs.relief) if costs
                                     else (0.0,) * (2 + self.n_levels))
            out[i] = self._serial[key]
        terms = [column.reshape(shape) if shape else float(column[0]) for column in out.T]
        return terms[0], terms[1], terms[2:]

    def work(self, rows: int = 1, levels: int = 1) -> float:
        """Units of search work (budget.py) of costing `rows` candidates over `levels` levels: a
        cost-model call's time grows with the terms it sums (each op's tensors times the loops),
        a gemm's call being one unit, and with the rows beyond ROWS_PER_UNIT."""
        terms = sum(len(op.inputs) + 1 for op in self.workload.ops) * len(self.loops) / 9
        return terms * levels * (1 + rows / budget.ROWS_PER_UNIT)

    def coarse(self) -> Space:
        """The same space over the coarse candidate sets (same objective and stages)."""
        return dataclasses.replace(self, fine=False)

    def meets_lower_bound(self, seconds: float) -> bool:
        """True when no plan can be more than OPTIMALITY_GAP faster than `seconds`."""
        return seconds <= self.lower_bound * (1 + OPTIMALITY_GAP)

    def grid_size(self) -> int:
        """Number of tile combinations per level."""
        return math.prod(len(c) for c in self.candidates.values())

    @property
    def n_levels(self) -> int:
        return len(self.hardware.levels)

    def smallest_tiles(self, level: int | None = None) -> dict[str, int]:
        """The smallest emittable tile of each loop: 1, or one vector on vector loops; at `level`,
        the smallest candidate the target allows there (GPUs hold serial loops whole at L2)."""
        if level is None:
            return {x: min(self.lanes[x], e) for x, e in self.workload.dims.items()}
        smallest = {}
        for x, e in self.workload.dims.items():
            c = self.candidates[x]
            allowed = c[np.broadcast_to(self.legal(x, c, e, level), c.shape)]
            smallest[x] = int(allowed[0]) if len(allowed) else e
        return smallest

    def min_footprint(self) -> float:
        """MU with the smallest tiles: below this no level can hold a plan."""
        return float(memory_usage(self.workload, self.smallest_tiles()))

    def level_footprint(self, level: int) -> float:
        """Usage of `level` (as the target counts it) with the smallest tiles allowed there:
        below this the level cannot hold a plan."""
        return float(self.usage(level, self.smallest_tiles(level)))

    def capacity(self, level: int) -> int:
        """Bytes a plan may hold in `level` (the target's usable share of its capacity)."""
        return self.target.usable_bytes(self.hardware.levels[level])

    def usage(self, level: int, tile) -> np.ndarray:
        """MU of `level` for (arrays of) tiles."""
        return self.target.level_usage(self.workload, level, tile, self.stages)

    def admits(self, tiles, orders=None, filtered: bool = False) -> np.ndarray | bool:
        """Whether the target admits the tiles, and with `orders` the plan (a launch that fits a
        GPU, register tiles that keep a SIMD CPU's FMA pipes busy; Target.admits). `filtered`:
        the register tiles passed level 0's level_filter, which need not be checked again
        (Target.admits_filtered)."""
        check = self.target.admits_filtered if filtered else self.target.admits
        return check(self.workload, tiles, self.stages, orders)

    def legal(self, x: str, tiles: np.ndarray, parent: np.ndarray | int, level: int | None = None) -> np.ndarray:
        """Which tiles of loop x (at `level`) nest in the parent tile and obey the target's rules
        (see module docstring)."""
        extent = self.workload.dims[x]
        tiles, parent = np.asarray(tiles), np.asarray(parent)
        nests = (parent % tiles == 0) | (parent == extent)
        return (tiles <= parent) & nests & self.target.tile_rule(self.workload, x, tiles, level, self.lanes[x])
