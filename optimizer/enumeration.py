"""`enumerate`: exact branch and bound over the discrete space of optimizer/space.py.

Levels are fixed outermost first, since DV_l depends only on levels >= l. At
each node every (order class, tile) choice for the next level inward is costed
at once with numpy; a child whose partial objective (compute and the links so
far, overlapped as the objective says) cannot beat the k-th best plan is
pruned, and the rest are visited best first. The coarse candidate set is searched first, for at most a quarter of
the time limit; if its best plan meets the global lower bound (compute time,
or each level loading every tensor once) it is optimal over the fine set as
well, otherwise the fine set is searched with those incumbents. Once k plans
are held, a per-level floor (single_level_bound, as a running-minimum table
over the candidate grid) both prunes and orders the children.
"""
from __future__ import annotations

import numpy as np

from ..models.costmodel import compute_seconds, data_volume, loop_classes, padding_factor, single_level_bound
from ..models.objective import (
    INNER_STEPS, core_sweeps, fitting_dv, grown_sweeps, memory_extra, outermost, private_fit, private_floor,
    private_levels,
)
from . import budget
from .registry import Candidate, Deadline, SolveResult, TopK, rank, register
from .space import Space, divisors


class _Timeout(Exception):
    pass


LEAF_ROWS = 4  # register tiles per kept plan a leaf offers the top-k, once serial costs are added
GRID_LIMIT = 250_000  # largest candidate grid a per-level floor table is built for
GRID_MAX = 4_000_000  # largest candidate grid enumerate holds in memory
CHUNK = 100_000  # candidate tiles costed per numpy call
REMEMBERED_ROWS = 1024  # children of an outer level whose costing is remembered for other searches (_Search._costed)
REMEMBERED_BYTES = 32 * 2**20  # ... while the costings remembered in a space hold at most this much
GREEDY_SAMPLE = 32_768  # (order, tile) children per level the first dive of a large search costs
GREEDY_MIN_ROWS = 64  # ... but at least this many tiles
GREEDY_CHILDREN = 100_000  # (order, tile) children of the outermost level that make a search large


def _grid(space: Space) -> np.ndarray:
    """Every combination of candidate tiles, one row each (columns in Space.loops order)."""
    grids = np.meshgrid(*[space.candidates[x] for x in space.loops], indexing="ij")
    return np.stack([g.ravel() for g in grids], axis=1)


class _Search:
    def __init__(self, space: Space, deadline: Deadline, best: TopK, register_rows: np.ndarray | None = None,
                 beam: int | None = None, deep: bool = False, relaxed: bool = False):
        self.space, self.deadline, self.best, self.beam = space, deadline, best, beam
        self.relaxed = relaxed  # the target admits plans by their register tiles alone (seeded's last dive)
        grid = _grid(space)
        self.grid = grid
        # Candidate tiles that fit each level by its own usage (SIMD registers hold
        # accumulators, GPU shared memory counts stages), level 0 limited to `register_rows` when given.
        tile = {x: grid[:, i] for i, x in enumerate(space.loops)}
        self.mu = [space.usage(j, tile) for j in range(space.n_levels)]
        self.rows = [grid[mu <= space.capacity(j)] for j, mu in enumerate(self.mu)]
        # Rules of one level alone (GPU loops held whole or stepped one by one): applied once here.
        for j, rows in enumerate(self.rows):
            extents = np.array([space.workload.dims[x] for x in space.loops])
            keep = np.logical_and.reduce([space.legal(x, rows[:, i], extents[i], j) for i, x in enumerate(space.loops)])
            self.rows[j] = rows[keep]
        if register_rows is not None:
            self.rows[0] = register_rows
            # Outer tiles must leave room for some seed to nest (divisibility is transitive).
            for j in range(1, len(self.rows)):
                rows = self.rows[j]
                ok = np.zeros(len(rows), dtype=bool)
                for seed in register_rows:
                    nests = np.logical_and.reduce([space.legal(x, seed[i], rows[:, i], 0) for i, x in enumerate(space.loops)])
                    if deep:  # and leave that seed a reduction loop around it (Target.reduction_room)
                        nests &= space.target.reduction_room(space.workload, {x: rows[:, i] for i, x in enumerate(space.loops)},
                                                             dict(zip(space.loops, seed)))
                    ok |= nests
                self.rows[j] = rows[ok]
        self.floor_tables: dict[int, np.ndarray | None] = space.floor_tables
        # Which rows each level offers, by level as _costed asks: searches that share them share
        # their remembered costings.
        self.signature: dict[int, int] = {}
        # What the outermost tile's per-core sweeps (objective.core_sweeps) fit, as swept gives them.
        self.core_fit = private_fit(space.objective.caches)
        self.charged: set[int] = set()  # levels whose table this search has paid for
        self.row_index: dict[int, list | None] = {}  # per level, each row's candidate per loop (_legal)
        self.evaluated = 0

    def _floor_table(self, level: int) -> np.ndarray | None:
        """Over the candidate grid: the least time `level` can take with a tile <= each cell.

        Built from single_level_bound (which no choice at other levels can beat),
        with +inf where the tile does not fit, then a running minimum along every
        axis, so one lookup bounds all tiles nested inside a parent tile.
        """
        sp = self.space
        shape = tuple(len(sp.candidates[x]) for x in sp.loops)
        if np.prod(shape) > GRID_LIMIT:
            return None
        if level not in self.charged:
            # Every search pays for the table as if it built it: sharing it saves time without
            # moving where the work budget stops the searches (so the plans stay the same).
            if self.deadline.expired():
                raise _Timeout
            self.deadline.spend(sp.work(len(self.grid)))
            self.charged.add(level)
        if level not in self.floor_tables:
            # Each loop's candidates along an axis of its own: each op's bound is costed over the
            # grid of its own loops and broadcast along the others (ViT attention's chain spent a
            # fifth of its plan time here, costing each op over the other op's loops as well).
            tile = {x: sp.candidates[x].reshape([-1 if k == i else 1 for k in range(len(shape))])
                    for i, x in enumerate(sp.loops)}
            weights = sp.target.register_weights(sp.workload) if level == 0 else None
            t = np.broadcast_to(single_level_bound(sp.workload, tile, weights) / sp.objective.divisors[level], shape)
            t = np.where(self.mu[level].reshape(shape) <= sp.capacity(level), t, np.inf)
            for axis in range(len(shape)):
                t = np.minimum.accumulate(t, axis=axis)
            self.floor_tables[level] = t
        return self.floor_tables[level]

    def _inner_floor(self, level: int, rows: np.ndarray, first: int = 0, held=None) -> np.ndarray:
        """For each candidate tile of `level`, the least time any level in [first, level) inside it can take.
        `held(j)`: per candidate, the least bytes a hardware cache at level j may move instead
        (effective_dv: an outer tile that fits it)."""
        sp = self.space
        index = tuple(np.searchsorted(sp.candidates[x], rows[:, i]) for i, x in enumerate(sp.loops))
        worst = np.zeros(len(rows))
        for j in range(first, level):
            table = self._floor_table(j)
            if table is not None:
                floor = table[index]
                if held is not None:
                    floor = np.minimum(floor, held(j) / sp.objective.divisors[j])
                worst = np.maximum(worst, floor)
        return worst

    def _held(self, level: int, tiles: tuple):
        """What the hardware cache at `level` moves at most whatever its own tile: the least DV
        of `tiles` ((DV, MU) of outer tiles) and of the whole problem that fit it (fitting_dv);
        np.inf where the level is no cache."""
        caches = self.space.objective.caches
        fit = caches[level] if caches else None
        return np.inf if fit is None else fitting_dv(fit, (*tiles, self.space.whole[:2]))

    def _legal(self, level: int, parent) -> np.ndarray:
        """Which of the level's rows nest in `parent` and obey the target's rules (Space.legal).
        Legality is per loop and per value, so it is asked of each loop's candidates once and
        looked up per row: a level has thousands of rows but each loop a dozen candidates, and
        asking it of every row was a tenth of a GPU chain's search."""
        sp, rows = self.space, self.rows[level]
        if level not in self.row_index:
            index = [np.searchsorted(sp.candidates[x], rows[:, i]) for i, x in enumerate(sp.loops)]
            # Rows seeded from outside the grid (register_rows) may hold values no candidate has.
            found = all(np.array_equal(sp.candidates[x][np.minimum(index[i], len(sp.candidates[x]) - 1)], rows[:, i])
                        for i, x in enumerate(sp.loops))
            self.row_index[level] = index if found else None
        index = self.row_index[level]
        if index is None:
            return np.logical_and.reduce([sp.legal(x, rows[:, i], parent[i], level) for i, x in enumerate(sp.loops)])
        per_value = [np.broadcast_to(sp.legal(x, sp.candidates[x], parent[i], level), sp.candidates[x].shape)
                     for i, x in enumerate(sp.loops)]
        return np.logical_and.reduce([per_value[i][index[i]] for i in range(len(sp.loops))])

    greedy = False  # in the first dive of a many-loop search: sampled rows, first child only

    def run(self) -> None:
        if any(len(rows) == 0 for rows in self.rows):
            # No tile fits some level: no plan, and costing the levels above it would not say so
            # (seeded's deep pass under a chain's 12x512 attention spent 0.3 s learning it).
            return
        extents = np.array([self.space.workload.dims[x] for x in self.space.loops])
        top = self.space.n_levels - 1
        children = len(self.space.target.orders_at(top, self.space.orders)) * len(self.rows[top])
        if not self.space.exhaustive_orders or children > GREEDY_CHILDREN:
            # A convolution's level has millions of (order, tile) children: one greedy dive
            # through a sample of each level's rows first, so the search holds a plan before
            # its first full level is costed.
            self.greedy = True
            try:
                self._expand(self.space.n_levels - 1, (), [], extents, 0.0, 0.0, 0.0)
            finally:
                self.greedy = False
        self._expand(self.space.n_levels - 1, (), [], extents, 0.0, 0.0, 0.0)

    def _expand(self, level, outer_orders, outer_tiles, parent, pmax, psum, plinks, outer=(), plevels=()):
        """`pmax`, `psum`, `plinks`: the slowest, the sum and the overlap (Objective.overlap) of the
        link times of the levels outside `level` along this branch; `outer`: their (DV, MU)
        (effective_dv); `plevels`: their link times, innermost first."""
        sp = self.space
        rows = self.rows[level]
        rows = rows[self._legal(level, parent)]
        tile = {x: rows[:, i] for i, x in enumerate(sp.loops)}
        ok = sp.target.level_filter(sp.workload, level, [tile, *outer_tiles], sp.stages)
        if ok is not None:
            rows = rows[np.broadcast_to(ok, (len(rows),))]
            tile = {x: rows[:, i] for i, x in enumerate(sp.loops)}
        if len(rows) == 0:
            return
        orders = sp.target.orders_at(level, sp.orders)
        sample = max(GREEDY_MIN_ROWS, GREEDY_SAMPLE // len(orders))
        if self.greedy and len(rows) > sample:
            rows = rows[np.linspace(0, len(rows) - 1, sample).astype(int)]
            tile = {x: rows[:, i] for i, x in enumerate(sp.loops)}
        divisor = sp.objective.divisors[level]
        at_top = level == sp.n_levels - 1  # the outermost level
        raw, cap = self._costed(level, orders, outer_orders, outer_tiles, outer, tile)
        secs = np.minimum(raw, cap) / divisor
        if level == 0 and sp.hardware.cores > 1 and private_levels(sp.objective.caches):
            pmax, psum, plinks, plevels = self._private_floor(outer_orders, outer_tiles, plevels)
        if at_top:
            secs = secs + memory_extra(sp.whole, sp.objective.caches, tile) / divisor  # as effective_dv
        self.evaluated += len(rows) * len(orders)
        # Fold in the best the inner levels can do under each child: a bound, and a guide
        # that steers the search to children leaving room for good inner tiles.
        # (Skipped until k plans are held: the first dive needs no bound, and when compute
        # bounds the time it is also the last.)
        guided = level > 0 and np.isfinite(self.best.worst_primary())
        shares = sp.objective.shares_issue
        held = None
        if guided and sp.objective.caches:
            # An inner hardware cache moves at most what a fitting outer tile does: this child's
            # (its least DV over the orders) or one along the branch.
            child = ((raw.min(axis=0) + sp.whole.standing(level, sp.n_levels - 1, tile), sp.usage(level, tile)), *outer)
            held = lambda j: self._held(j, child)  # noqa: E731
        inner = self._inner_floor(level, rows, 1 if shares else 0, held)[None, :] if guided else 0.0
        # Register loads issue with the FMAs: their least time under each child adds to compute.
        registers = sp.register_floor
        if guided and shares:
            registers = np.maximum(registers, self._inner_floor(1, rows, 0, held)[None, :])
        cmax = np.maximum(pmax, secs)
        csum = psum + secs
        clinks = sp.objective.overlap(plinks, secs)
        # The register tile fixes how close to peak the arithmetic runs; above it, peak is the bound.
        compute = sp.compute_seconds  # a bound until the register tile fixes the plan
        if at_top:
            # Padding to the outermost tile adds flops whatever the inner levels do. (Below it the
            # bound would hold as well, but re-sorting the inner levels' children cost gemm
            # 512x2304x768 its best plan under the beam: 3.92 against 3.87 ms predicted.)
            compute = compute * padding_factor(sp.workload, [tile, *outer_tiles])
        if level >= 1:
            floor = sp.target.compute_floor(sp.workload, level, tile, sp.stages)
            # An infinite floor (no launch fits) prunes the child even when compute costs nothing.
            compute = np.where(np.isinf(floor), np.inf, compute * np.where(np.isinf(floor), 1.0, floor))
        else:  # the loops right around the register tile decide how many FMA chains overlap
            compute = np.stack([np.broadcast_to(sp.objective.compute(compute_seconds(
                sp.workload, sp.hardware, (order, *outer_orders), [tile, *outer_tiles], sp.stages)), (len(rows),))
                for order in orders])
            self.deadline.spend(sp.work(len(rows) * len(orders)))
        if level == 0 and shares:
            bound = sp.objective.overlap(compute + secs, plinks)
        else:
            bound = sp.objective.overlap(compute + (registers if shares else 0.0), clinks, inner)
        if level == 0:  # the orders complete the plan: what the target admits of it (Target.admits)
            bound = self._admitted(bound, orders, outer_orders, tile, outer_tiles)
        guide = np.maximum(cmax, inner)
        keep = np.flatnonzero((bound < self.best.worst_primary()).ravel())
        if len(keep) == 0:
            return
        # Among equal costs visit larger tiles first: they leave the inner levels more room.
        volume = np.broadcast_to(np.prod(rows.astype(float), axis=1), secs.shape).ravel()
        keep = keep[np.lexsort((-volume[keep], csum.ravel()[keep], guide.ravel()[keep], bound.ravel()[keep]))]
        n_rows = len(rows)
        if level == 0:
            # The kernel's serial costs (copies, regions, unpacked runs) are known only now that
            # every level is fixed; the register tile decides which inputs are read once, unpacked.
            costed = set()
            for flat in keep[: LEAF_ROWS * self.best.k]:
                if float(bound.flat[flat]) > self.best.worst_primary():
                    break  # sorted by bound, and the serial costs only add
                o, r = divmod(int(flat), n_rows)
                plan_orders = (orders[o], *outer_orders)
                tiles = (tuple(int(v) for v in rows[r]), *(tuple(int(t[x]) for x in sp.loops) for t in outer_tiles))
                serial, reads, relief = sp.serial_costs(plan_orders, [dict(zip(sp.loops, t)) for t in tiles])
                if o not in costed:  # counted once per order, as when it was costed once per order:
                    costed.add(o)  # the work budget, and so the plans it reaches, stay as they were
                    self.deadline.spend(sp.work(levels=sp.n_levels))
                best = float(bound.flat[flat])  # the plan's overlapped time, now that every level is fixed
                # Copies inside the loop nest spare the links what they read (Objective.spared).
                spared = sp.objective.spared(float(compute[o, r]), [float(secs[o, r]), *plevels], best, relief, reads)
                key = (best + serial - float(spared), float(cmax.flat[flat]), float(csum.flat[flat]))
                self.best.add(Candidate(plan_orders, tiles, key))
            return
        for n, flat in enumerate(keep):
            # Past the beam's width only at level 1 and only until the search holds a plan: the
            # target may admit none of the register tiles under an L1 tile (SimdCpu.admits counts
            # what LLVM hoists around the tile, which depends on the levels above). Level 1 alone
            # keeps that walk as long as the level's children, not their product over the levels.
            if self.beam is not None and n >= self.beam and (self.best.items or level != 1):
                break
            if self.deadline.expired():
                raise _Timeout
            if self.greedy and self.best.items:
                return
            cutoff = self.best.worst_primary()
            if bound.flat[flat] >= cutoff or sp.meets_lower_bound(cutoff):
                return  # children are sorted by bound, and nothing beats the lower bound
            o, r = divmod(int(flat), n_rows)
            child = {x: int(v) for x, v in zip(sp.loops, rows[r])}
            here = (float(raw[o, r] + sp.whole.standing(level, sp.n_levels - 1, child)), float(sp.usage(level, child)))
            stand_ins = (here,)
            if at_top and sp.objective.caches:  # the outermost tile's sweeps, as effective_dv gives the inner caches
                grown = outermost(sp.workload, sp.hardware, sp.whole, sp.orders[o], child).sweeps
                if self.core_fit:
                    grown = [*grown, *core_sweeps(sp.workload, sp.hardware, sp.orders[o], child, self.core_fit)]
                stand_ins += tuple((float(d) + sp.whole.intermediates, float(m)) for d, m in grown)
            self._expand(
                level - 1, (sp.orders[o], *outer_orders), [child, *outer_tiles], rows[r],
                float(cmax.flat[flat]), float(csum.flat[flat]), float(clinks.flat[flat]), (*stand_ins, *outer),
                (float(secs[o, r]), *plevels),
            )

    def _admitted(self, bound: np.ndarray, orders, outer_orders, tile: dict, outer_tiles) -> np.ndarray:
        """`bound` (orders x register tiles) with the plans the target does not admit made inf.
        Only the plans under the k-th best plan are asked: the others are pruned either way, and
        the registers' check (hoisted_vectors) cost a quarter of a small gemm's search."""
        under = bound < self.best.worst_primary()
        out = np.full(bound.shape, np.inf)
        for o, order in enumerate(orders):
            rows = np.flatnonzero(under[o])
            if len(rows) == 0:
                continue
            some = {x: v[rows] for x, v in tile.items()}
            ok = self.space.admits([some, *outer_tiles], None if self.relaxed else (order, *outer_orders), filtered=True)
            out[o, rows] = np.where(np.broadcast_to(ok, (len(rows),)), bound[o, rows], np.inf)
        return out

    def _costed(self, level, orders, outer_orders, outer_tiles, outer, tile: dict) -> tuple[np.ndarray, np.ndarray]:
        """Each child's DV into `level` (orders x tiles) and what the level's hardware cache moves
        at most (objective.swept), costed in chunks so that the time limit is checked often. One of
        the two outermost levels with at least REMEMBERED_ROWS children is remembered along its
        search path (few nodes, many rows each, within REMEMBERED_BYTES in all): seeded's
        passes walk the same greedy path again (12x512 attention: its capped pass ran out of work
        there, and the relaxed pass after it costed those levels anew). A remembered costing walks the
        same chunks and orders, reading the clock and charging the work budget as the costing did,
        so every pass stops where it stopped."""
        sp = self.space
        n = len(next(iter(tile.values())))
        key = kept = None
        if n >= REMEMBERED_ROWS and level >= sp.n_levels - 2:
            if level not in self.signature:
                self.signature[level] = hash(self.rows[level].tobytes())
            key = (level, self.greedy, self.signature[level], tuple(map(tuple, outer_orders)),
                   tuple(tuple(int(t[x]) for x in sp.loops) for t in outer_tiles))
            kept = sp.level_costs.get(key)
        raw, cap = kept or (np.empty((len(orders), n)), None)  # DV in bytes
        at_top = level == sp.n_levels - 1
        fit = sp.objective.caches[level] if sp.objective.caches else None
        if kept is None:
            cap = np.broadcast_to(self._held(level, outer), raw.shape).copy()
        for lo in range(0, n, CHUNK):
            part = {x: v[lo : lo + CHUNK] for x, v in tile.items()}
            # the same for every order
            classes = loop_classes(sp.workload, [part, *outer_tiles], 0) if kept is None else None
            for o, order in enumerate(orders):
                if self.deadline.expired():
                    raise _Timeout
                if kept is None:
                    raw[o, lo : lo + CHUNK] = data_volume(
                        sp.workload, (order, *outer_orders), [part, *outer_tiles], levels=[0], hardware=sp.hardware,
                        offset=level, blocks=classes)[0]
                    if fit is not None:
                        sweeps = (outermost(sp.workload, sp.hardware, sp.whole, order, part, fit).sweeps if at_top else
                                  grown_sweeps(sp.workload, sp.hardware, level, (order, *outer_orders),
                                               [part, *outer_tiles], outer_tiles[0], fit, INNER_STEPS))
                        cap[o, lo : lo + CHUNK] = np.minimum(cap[o, lo : lo + CHUNK], fitting_dv(fit, sweeps))
                self.deadline.spend(sp.work(min(CHUNK, n - lo)))
        if key is not None and kept is None:
            held = sum(a.nbytes + b.nbytes for a, b in sp.level_costs.values())
            if held + raw.nbytes + cap.nbytes <= REMEMBERED_BYTES:
                sp.level_costs[key] = (raw, cap)
        return raw, cap

    def _private_floor(self, outer_orders, outer_tiles, plevels):
        """The branch's (slowest, sum, overlap) of the link times of the levels outside the
        register tile, each cache inside the shared one raised to the private caches' floor
        (objective.private_floor), as effective_dv raises it. The floor depends on where the
        parallel loop sits, so it is known only once every level >= 1 is fixed; the bounds above
        leave it out (it only adds), so the leaves rank as registry.score does."""
        sp = self.space
        floor = float(private_floor(sp.workload, sp.hardware, (outer_orders[0], *outer_orders),
                                    [outer_tiles[0], *outer_tiles]))
        private = private_levels(sp.objective.caches)
        links = [max(s, floor / sp.objective.divisors[j]) if j in private else s for j, s in enumerate(plevels, start=1)]
        return max(links), sum(links), float(sp.objective.overlap(*links)), tuple(links)


REGISTER_SEEDS = 6


def _ladders(space: Space, seeds: np.ndarray) -> tuple[Space, np.ndarray]:
    """The space around the seed register tiles: outer tiles are small multiples,
    power-of-two multiples and divisors-of-the-extent multiples of a seed's tile (so
    they nest), or the whole extent. Seeds are taken best first while the grid stays
    within LADDER_GRID; returns the space and the seeds it serves."""
    around = space.coarse()
    values = {x: {e} for x, e in space.workload.dims.items()}
    used = 0
    for seed in seeds:
        grown = {x: set(v) for x, v in values.items()}
        for i, x in enumerate(space.loops):
            extent, t = space.workload.dims[x], int(seed[i])
            grown[x] |= {t * j for j in range(1, LADDER + 1)} | {t << s for s in range(extent.bit_length())}
            grown[x] |= {d for d in divisors(extent) if d % t == 0}  # divisors the seed divides
            grown[x] = {v for v in grown[x] if v <= extent}
        if used and np.prod([len(v) for v in grown.values()], dtype=np.float64) > LADDER_GRID:
            break
        values, used = grown, used + 1
    for x in space.loops:
        around.candidates[x] = np.array(sorted(values[x]), dtype=np.int64)
    return around, seeds[:used]


LADDER = 4  # small multiples of a seed tile offered to the outer levels
LADDER_GRID = 30_000  # tile combinations per level the seeded search holds
BEAMS = (1, 2, 4, 8)  # children per node the seeded passes visit, in turn


def seeded(space: Space, deadline: Deadline, top: int, cap: Deadline | None = None,
           seeds: np.ndarray | None = None) -> SolveResult:
    """The fast path on SIMD CPUs: search only around the best register tiles (`_ladders`),
    visiting at most BEAMS[i] children of each node, for i = 0, 1, ... while time lasts.

    Branch and bound over the full space proves little here (compute bounds the time, and
    many outer tilings tie under it), so it would spend its budget in the first subtree. A
    growing beam finds a good plan within milliseconds (beam 1 is the greedy dive) and then
    widens the search over every level; the passes share their best plans, which prune the
    next. The greedy dive has the whole `deadline`; the wider passes stop at `cap` too (auto
    passes a deadline of work, budget.SEED_WORK, so the plans do not depend on the machine's
    load). `optimal` when the best plan is within OPTIMALITY_GAP of the lower bound,
    `feasible` when the widest beam ran to the end, else `timeout`. `seeds`: the register
    tiles to search around, rows in `Space.loops` order (default: the REGISTER_SEEDS best).

    The joint passes pick the outer tiles for every seed at once, so a seed none of the tiles
    they favour is a multiple of may never be costed: when the best plan found is not built
    on the first seed, that seed gets a greedy dive of its own (_dive), whose plan goes first
    if it ranks first and last otherwise, one more than `top` then.
    """
    wider = cap if cap is not None else deadline
    if seeds is None:
        seeds = space.best_register_tiles(REGISTER_SEEDS)
    best = TopK(max(top, 1))
    if seeds is None:
        return SolveResult("timeout", [], 0, "too many register tiles to rank")
    around, seeds = _ladders(space, seeds)
    status, evaluated = "timeout", 0
    for beam in BEAMS:
        if beam == BEAMS[0]:
            costed, status = _first_dive(around, deadline, best, seeds)
        else:
            search = _Search(around, wider, best, seeds, beam=beam)
            try:
                search.run()
                status = "feasible"
            except _Timeout:
                status = "timeout"
            costed = search.evaluated
        evaluated += costed
        if status == "timeout" or (best.items and space.meets_lower_bound(best.items[0].key[0])):
            break
    plans = best.items
    if plans and tuple(int(v) for v in seeds[0]) != plans[0].tiles[0]:
        dived, costed = _dive(space, deadline, seeds[0])
        evaluated += costed
        if dived is not None:
            # Either way both stay starts for tune's polishes, which end where they start more
            # than by the start's rank: gemm 1024^3's dive around 6x64 found 8.27 ms against the
            # joint passes' 6.94 with 4x64, and was polished to 6.64 (7.13 ms measured) where
            # 4x64's polish stopped at 6.76 (7.94 ms).
            plans = [dived, *plans] if rank(dived) < rank(plans[0]) else [*plans, dived]
    once = space.read_once_seed()
    if plans and once is not None and all(c.tiles[0] != once for c in plans):
        # The tile that streams an input in place gets a dive of its own too, as a start for
        # tune's polishes (Space.read_once_seed): the passes above rank it after the others.
        dived, costed = _dive(space, deadline, np.array(once))
        evaluated += costed
        if dived is not None:
            plans = [dived, *plans] if rank(dived) < rank(plans[0]) else [*plans, dived]
    if plans and space.meets_lower_bound(plans[0].key[0]):
        status = "optimal"
    return SolveResult(status, plans, evaluated)


def _first_dive(around: Space, deadline: Deadline, best: TopK, seeds: np.ndarray) -> tuple[int, str]:
    """seeded's greedy dive (beam 1), until one finds a plan: first among outer tiles that leave a
    seed its reduction loop (Target.reduction_room), then among all (within budget.SEED_WORK: a
    walk under outer tiles none of whose plans the target admits is long), then admitting plans by
    their register tiles alone, whose loops around the tile the target would refuse (on AVX2's 16
    registers a 3x3 conv of 7 channels into a 1x1 has no other plan; it spills). Returns the plans
    costed and `feasible`, or `timeout` once `deadline` passes."""
    evaluated = 0
    for deep, relaxed, work in ((True, False, None), (False, False, budget.SEED_WORK), (False, True, None)):
        search = _Search(around, Deadline(deadline.left(), work) if work else deadline, best, seeds, beam=BEAMS[0],
                         deep=deep, relaxed=relaxed)
        try:
            search.run()
        except _Timeout:
            if deadline.expired():
                return evaluated + search.evaluated, "timeout"
        evaluated += search.evaluated
        if best.items:
            break
    return evaluated, "feasible"


def _dive(space: Space, deadline: Deadline, seed: np.ndarray) -> tuple[Candidate | None, int]:
    """The greedy dive around one register tile alone, within budget.DIVE_WORK, with no plan to
    beat (an incumbent's bound steers a greedy dive elsewhere): its best plan, if it found one,
    and the plans it costed. gemm 1000^3: the joint passes tiled for the 4x64 register tile,
    under 512-wide outer tiles that no 5-row tile divides, and returned a plan predicted 6.74 ms
    that ran 0.85x numpy; the dive around 5x64 found one polished to 6.49 ms, 0.97-0.99x."""
    alone, one = _ladders(space, seed[None])
    found = TopK(1)
    search = _Search(alone, Deadline(deadline.left(), budget.DIVE_WORK), found, one, beam=BEAMS[0])
    try:
        search.run()
    except _Timeout:
        pass
    return (found.items[0] if found.items else None), search.evaluated


def per_register_tile(space: Space, deadline: Deadline, n: int) -> list[Candidate]:
    """The best plan `seeded` finds around each of the n best register tiles alone, each search
    within budget.REGISTER_TILE_WORK; [] where the target has no register tiles to rank.

    For autotuning: the register tile is the micro-kernel, whose speed depends most on the
    code generator, which the model sees least; plans that differ only in outer tiles are
    measured within a few percent of each other (BENCHMARKS.md).
    """
    seeds = space.best_register_tiles(n)  # None unless the space ranks register tiles (SIMD CPUs)
    if seeds is None:
        return []
    found: list[Candidate] = []
    for seed in seeds:
        if deadline.expired():
            break
        cap = Deadline(deadline.left(), budget.REGISTER_TILE_WORK)
        found += seeded(space, deadline, 1, cap, seed[None]).plans
    return found


@register("enumerate")
def solve(space: Space, deadline: Deadline, top: int) -> SolveResult:
    best = TopK(max(top, 1))
    evaluated = 0
    coarse = space.coarse()
    passes = [(coarse, deadline.part(budget.COARSE_SHARE)), (space, deadline)]
    if all(np.array_equal(space.candidates[x], coarse.candidates[x]) for x in space.loops):
        passes = [(space, deadline)]  # the fine set adds nothing
    if coarse.grid_size() > GRID_MAX:
        return SolveResult("timeout", [], 0, f"{coarse.grid_size()} tile combinations per level is more than enumerate handles ({GRID_MAX})")
    if space.grid_size() > GRID_MAX:
        passes = [(coarse, deadline)]  # the fine grid is too large to hold: the best plan is only feasible
    if space.objective.shares_issue:
        # SIMD CPUs: the micro-kernel's register tile matters most. Search the outer levels
        # around the few best register tiles first; the full passes then start from those plans.
        seeds = space.best_register_tiles(REGISTER_SEEDS)
        if seeds is not None:
            around, seeds = _ladders(space, seeds)
            passes.insert(0, (around, deadline.part(budget.SEED_SHARE), seeds))
    status = "timeout"
    for sp, limit, *seeds in passes:
        search = _Search(sp, limit, best, *seeds)
        try:
            search.run()
            # optimal: exhaustive over the space
            status = "optimal" if sp is space and not seeds and space.exhaustive_orders else "feasible"
        except _Timeout:
            status = "timeout"
        evaluated += search.evaluated
        if best.items and space.meets_lower_bound(best.items[0].key[0]):
            status = "optimal"  # meets the lower bound: no space can do better
            break
        if deadline.expired():
            break
    if not best.items:
        if status == "timeout":
            return SolveResult("timeout", [], evaluated, "time limit reached before any plan")
        return SolveResult("infeasible", [], evaluated, "no tiling fits the level capacities")
    return SolveResult(status, best.items, evaluated)
