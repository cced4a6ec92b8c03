"""Local search on the exact cost model: repair infeasible tiles, then polish.

Used after rounding a continuous solution and to break the objective's ties
(see registry.py) once a solver has a plan: each round tries every single tile
change (see _tile_moves) and every other order class at each level.
"""
from __future__ import annotations

import bisect
import itertools
import math

import numpy as np

from ..models.kernel_costs import followed_rows
from .registry import TIE, Candidate, Deadline, level_with, rescore, score
from .space import Space, divisors


# Single-candidate shrinks before repair scales every tile of a level at once: enough for a
# rounded solution just over capacity, while a huge extent (10^9 has ~63,000 candidates) would
# otherwise take minutes one candidate at a time.
REPAIR_STEPS = 64


def repair(space: Space, tiles: list[dict[str, int]], deadline: Deadline | None = None) -> list[dict[str, int]] | None:
    """Clamp tiles into their nesting bounds and shrink them until every level fits; None if
    impossible or when `deadline` passes first."""
    loops = space.loops
    tiles = [dict(t) for t in tiles]
    for j in reversed(range(space.n_levels)):
        if deadline is not None and deadline.expired():
            # Each level's legal tiles take a while to list where extents are huge (0.05-0.13 s
            # per level at 2^31: a 0.5 s pyomo-ipopt solve took 1.7 s), so the clock is read here too.
            return None
        parent = tiles[j + 1] if j + 1 < space.n_levels else space.workload.dims
        smallest = space.smallest_tiles(j)
        # Legal values of each loop, ascending; the smallest tile is always among them.
        legal = {x: sorted({smallest[x], *space.candidates[x][space.legal(x, space.candidates[x], parent[x], j)].tolist()})
                 for x in loops}

        def at_most(x: str, v: float) -> int:
            i = bisect.bisect_right(legal[x], v)
            return int(legal[x][i - 1] if i else legal[x][0])

        tiles[j] = {x: at_most(x, tiles[j][x]) for x in loops}
        cap = space.capacity(j)
        steps = 0
        while space.usage(j, tiles[j]) > cap:
            if deadline is not None and deadline.expired():
                return None
            if steps == REPAIR_STEPS:
                tiles[j] = _scale_to_fit(space, j, tiles[j], smallest, at_most)
                if tiles[j] is None:
                    return None
                break
            x = max(loops, key=lambda y: tiles[j][y] / smallest[y])
            if tiles[j][x] == smallest[x]:
                return None
            tiles[j][x] = legal[x][bisect.bisect_left(legal[x], tiles[j][x]) - 1]
            steps += 1
    return tiles


def _scale_to_fit(space: Space, level: int, tile: dict[str, int], smallest, at_most) -> dict[str, int] | None:
    """The tile with every loop scaled by the largest common factor that fits (bisection), or None."""
    def scaled(f: float) -> dict[str, int]:
        return {x: at_most(x, max(smallest[x], t * f)) for x, t in tile.items()}

    cap = space.capacity(level)
    if space.usage(level, scaled(0.0)) > cap:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if space.usage(level, scaled(mid)) <= cap else (lo, mid)
    return scaled(lo)


REFIT_GRID = 100_000  # largest set of one level's tile combinations refit costs at once
REFIT_SERIAL = 8  # of those, the best (without the kernel's serial costs) that refit ranks with them


def refit(space: Space, orders, tiles: list[dict[str, int]], deadline: Deadline) -> Candidate | None:
    """The best feasible plan that re-chooses one level's tiles among all its legal candidates,
    the other levels fixed (each level tried, innermost first; the first that yields one wins).

    For rounded solutions that break a rule no relaxation models, such as a GPU launch
    needing whole warps of threads; None when no level's search finds a feasible plan.
    """
    loops, n = space.loops, space.n_levels
    for j in range(n):
        if deadline.expired():
            return None
        parent = tiles[j + 1] if j + 1 < n else space.workload.dims
        options = []
        for x in loops:
            c = space.candidates[x]
            options.append(c[np.broadcast_to(space.legal(x, c, parent[x], j), c.shape)])
        if math.prod(len(o) for o in options) > REFIT_GRID:
            continue
        # The serial costs are costed one plan at a time (5,800 rows of a 1 x 2^31 x 1 gemm took
        # 2.2 s): the grid is ranked without them, and its best REFIT_SERIAL rows with them.
        grid, (pred, mmax, msum), rows = _level_grid(space, orders, tiles, j, options, serial=False)
        best = None
        for r in rows[np.lexsort((msum[rows], mmax[rows], pred[rows]))[:REFIT_SERIAL]]:
            found = [dict(t) for t in tiles]
            found[j] = {x: int(g[r]) for x, g in zip(loops, grid)}
            cand = rescore(space, Candidate(tuple(tuple(o) for o in orders),
                                            tuple(tuple(t[x] for x in loops) for t in found), ()))
            best = cand if best is None or cand.key < best.key else best
        if best is not None:
            return best
    return None


def _level_grid(space: Space, orders, tiles, level: int, options, serial: bool = True):
    """Every combination of `options` (per loop, the tiles to try) as `level`'s tile, the other
    levels as in `tiles`: the grid (one array per loop), the ranking key's parts (registry.score,
    `serial` as there) and the feasible rows."""
    grid = [g.ravel() for g in np.meshgrid(*options, indexing="ij")]
    trial = [{x: np.full(len(grid[0]), t[x]) for x in space.loops} for t in tiles]
    trial[level] = dict(zip(space.loops, grid))
    pred, mmax, msum, ok = score(space, orders, trial, serial)
    return grid, (pred, mmax, msum), np.flatnonzero(np.broadcast_to(ok, np.shape(pred)))


def _key(space: Space, orders, tiles, bound: float = np.inf) -> tuple[tuple, bool]:
    pred, mmax, msum, ok = score(space, orders, tiles, bound=bound)
    return (float(pred), float(mmax), float(msum)), bool(ok)


def _order_key(space: Space, orders, tiles, plan_tiles, bound: float, costed: dict) -> tuple[tuple, bool]:
    """_key of the incumbent's tiles under other loop orders. Orders that differ only where
    one-trip loops sit are one plan (Space.canonical), so each is costed once per polish, in
    `costed`. The polish still charges every order it tries to the work budget: the budget
    counts moves, so the polish takes the same path in less time. A key costed under an earlier,
    higher `bound` may be finite where the current bound would give inf; either way it is over
    the bound, and no pick takes it."""
    same = (space.canonical(Candidate(orders, plan_tiles, ())).orders, plan_tiles)
    if same not in costed:
        costed[same] = _key(space, orders, tiles, bound)
    return costed[same]


def _fill(space: Space, tiles) -> np.ndarray:
    """How full the levels are: the sum over levels of MU / capacity."""
    return sum(
        space.usage(j, tiles[j]) / space.capacity(j)
        for j in range(space.n_levels)
    )


def _compare(a: tuple, b: tuple, rel: float = TIE) -> int:
    """Lexicographic comparison of ranking keys that treats rounding noise as a tie."""
    for x, y in zip(a, b):
        if x > y * (1 + rel) + 1e-300:
            return 1
        if x < y * (1 - rel) - 1e-300:
            return -1
    return 0


def _tile_moves(space: Space, tiles: list[dict[str, int]]) -> list[tuple[tuple[int, ...], ...]]:
    """Plans one tile change away: per loop and level the neighbouring candidates, half,
    double, 1, the full extent and the adjacent levels' tiles; other levels follow to
    keep the nesting (outer tiles grow to at least the new value, inner ones shrink)."""
    loops, n = space.loops, space.n_levels
    moved = set()
    for j in range(n):
        for x in loops:
            c = space.candidates[x]
            now = tiles[j][x]
            i = int(np.searchsorted(c, now))
            targets = {int(c[k]) for k in (i - 1, i + 1 if c[min(i, len(c) - 1)] == now else i) if 0 <= k < len(c)}
            targets |= {max(1, now // 2), now * 2, 1, space.workload.dims[x]}
            targets |= {tiles[k][x] for k in (j - 1, j + 1) if 0 <= k < n}
            for v in targets:
                if v == now or not 1 <= v <= space.workload.dims[x]:
                    continue
                new = [dict(t) for t in tiles]
                for k in range(n):
                    new[k][x] = v if k == j else max(tiles[k][x], v) if k > j else min(tiles[k][x], v)
                moved.add(tuple(tuple(t[y] for y in loops) for t in new))
    return sorted(moved)


LEVEL_GRID = 2048  # largest set of one level's re-tilings (_level_moves) a polish costs
LADDER = 4  # small multiples of the inner level's tile a re-tiling offers
LEVEL_KEEP = 24  # re-tilings per level, best without serial costs, that are costed in full


def _level_moves(space: Space, orders, tiles: list[dict[str, int]], deadline: Deadline) -> list:
    """Plans that re-tile one cache level at once, the others fixed: each loop's tile among
    small multiples of the inner level's tile, the divisors of the extent it divides, and the
    outer level's tile; per level the LEVEL_KEEP best without the serial costs (costed one plan
    at a time, they would take most of a second). Single moves stall where a better plan is
    several steps away across worse ones: a fused depthwise + pointwise chain's L1 tile must
    take the whole reduction of the pointwise op (so its accumulators stay in registers) and
    halve its output channels (so its weights still fit) in one step."""
    loops, n, dims = space.loops, space.n_levels, space.workload.dims
    moved = []
    for j in range(1, n):
        parent = tiles[j + 1] if j + 1 < n else dims
        options = []
        for x in loops:
            inner = tiles[j - 1][x]
            values = {inner * m for m in range(1, LADDER + 1)} | {parent[x]}
            values |= {d for d in divisors(dims[x]) if d % inner == 0}
            values = np.array(sorted(v for v in values if v <= parent[x]), dtype=np.int64)
            ok = space.legal(x, values, parent[x], j) & space.legal(x, np.int64(inner), values, j - 1)
            options.append(values[ok])
        if math.prod(len(o) for o in options) > LEVEL_GRID:
            continue
        grid, (pred, _, _), rows = _level_grid(space, orders, tiles, j, options, serial=False)
        deadline.spend(space.work(len(grid[0]), n))
        now = [tuple(t[y] for y in loops) for t in tiles]
        for r in rows[np.argsort(pred[rows], kind="stable")[:LEVEL_KEEP]]:
            tile = tuple(int(g[r]) for g in grid)
            if tile != now[j]:  # the plan itself may rank among them
                moved.append(tuple(now[:j] + [tile] + now[j + 1:]))
    return moved


UNPACK_FITS = 3  # per level and split, the largest tiles of the free loop that fit


def _unpack_moves(space: Space, tiles: list[dict[str, int]], costs) -> list:
    """Plans that read a packed input where it lies: every cache level's block of the input made
    one contiguous run of its row-major array (caches.row_major_thrifty: leading dims of one
    element, then one free dim, then whole dims), with the free loop as large as still fits, or
    L1 collapsed onto the register tile. Polish tries them once single moves stall. A
    packing copy is a serial cost that only a whole plan shows, and dropping it changes
    every level at once: gpt-2's decode GEMM 16x3072x768 reads its 9.4 MB of weights in place
    when each level's block spans whole rows of them or a single one (0.36 ms predicted, and
    0.33 measured), and packs them when a single level does not (0.87 ms). `costs`: the plan's
    kernel_costs, which name its copies."""
    w, loops, n = space.workload, space.loops, space.n_levels
    now = tuple(tuple(t[x] for x in loops) for t in tiles)
    moved = []
    for name in dict.fromkeys(c[0] for c in costs.copies):
        tensor = w.tensors[name]
        if tensor.role != "input" or not tensor.plain:
            continue
        dims = tensor.loops
        options = []
        for j in range(1, n):
            parent = tiles[j + 1] if j + 1 < n else w.dims
            # Level 1 may collapse onto the register tile (the micro-kernel reads its rows from
            # the L2 block); an outer level collapsed too would stream the input in runs of a row
            # of the register tile from beyond the core's caches (gpt-2's 1024x768x768: 5% slower).
            level = {tuple(tiles[0][x] for x in loops)} if j == 1 else set()
            for i, free in enumerate(dims):
                base = {**tiles[j], **{y: 1 for y in dims[:i]}, **{y: w.dims[y] for y in dims[i + 1:]}}
                c = space.candidates[free]
                # Divisors of the extent only: a padded input is copied whatever its blocks.
                c = c[space.legal(free, c, parent[free], j) & (c >= tiles[j - 1][free]) & (w.dims[free] % c == 0)]
                trial = {x: np.full(len(c), base[x]) for x in loops} | {free: c}
                fits = c[space.usage(j, trial) <= space.capacity(j)]
                level |= {tuple(int(v) if x == free else base[x] for x in loops) for v in fits[-UNPACK_FITS:]}
            options.append(sorted(level))
        combos = [(now[0], *rest) for rest in itertools.product(*options)]
        moved += [c for c in combos if c != now and all(a <= b for j in range(n - 1) for a, b in zip(c[j], c[j + 1]))]
    return moved


BAND_SIZES = 2  # per input, the widest band that fits the prefetcher and the next one down


def _band_moves(space: Space, tiles: list[dict[str, int]], costs) -> list:
    """Plans whose L1 block reads an unpacked input in a band of rows the prefetcher follows
    (kernel_costs.followed_rows), with or without the L2 block taking that band across its
    parent's whole rows, so that each row streams as one run (kernel_costs.contiguous_run).
    Once the model sees that wider bands stall (kernel_costs.band_stall), such a plan is several
    moves away: narrowing the L1 block alone leaves runs of its width, as costly as the wide band (gemm
    8x4096x4096: bands of 8-16 rows across 2048 columns ran in 1.3 ms, the 128-row band tune
    returned before in 2.0, bench/bands.py). `costs`: the plan's kernel_costs, which name its
    unpacked inputs."""
    w, loops, n = space.workload, space.loops, space.n_levels
    streams = followed_rows(space.hardware)
    if not streams or n < 3:
        return []
    now = tuple(tuple(t[x] for x in loops) for t in tiles)
    parent = tiles[3] if n > 3 else w.dims
    moved = []
    runs = {}  # per unpacked input (an input of several ops appears once per op), its first op's runs
    for name, _, run in costs.runs:
        runs.setdefault(name, run)
    for name, run in runs.items():
        *lead, row = w.tensors[name].loops
        if not lead or tiles[1][row] >= w.dims[row]:
            continue
        if math.prod(tiles[1][x] for x in lead) <= streams and run > tiles[1][row]:
            continue  # a band the prefetcher follows, its rows continued
        x, others = lead[-1], math.prod(tiles[1][y] for y in lead[:-1])
        c = space.candidates[x]
        c = c[(c * others <= streams) & space.legal(x, np.int64(tiles[0][x]), c, 0) & space.legal(x, c, tiles[2][x], 1)]
        for band in map(int, c[-BAND_SIZES:]):
            l1, l2 = {**tiles[1], x: band}, {**tiles[2], x: band, row: parent[row]}
            plans = []
            if space.usage(1, l1) <= space.capacity(1):
                plans.append([tiles[0], l1, *tiles[2:]])
                if space.legal(x, np.int64(band), parent[x], 2) and space.usage(2, l2) <= space.capacity(2):
                    plans.append([tiles[0], l1, l2, *tiles[3:]])
            # Or every level above L1 across the array's whole rows (L2 a core's share of them, so
            # that the parallel loop runs above the band's walk instead of entering a region at
            # each band), shrunk to fit: a panel whose runs end at its own width has no parent wide
            # enough to continue them (gemm 1x4096x4096: 1024-wide panels ran 1.4x the time of
            # 8-row bands across 2048 columns). Fewer rows first, in whole bands; repair then
            # narrows what still does not fit, L1 included.
            share = {row: max(1, w.dims[row] // space.hardware.cores), x: band}
            above = [{**t, row: w.dims[row], **(share if j == 2 else {})} for j, t in enumerate(tiles[2:], 2)]
            for j, t in enumerate(above, 2):
                while space.usage(j, t) > space.capacity(j) and t[x] > band:
                    t[x] = max(band, t[x] // 2 // band * band)
            whole = repair(space, [tiles[0], l1, *above])
            if whole is not None:
                plans.append(whole)
            for new in plans:
                plan = tuple(tuple(t[y] for y in loops) for t in new)
                if plan != now:
                    moved.append(plan)
    return moved


def collapsed(space: Space, cand: Candidate) -> list[Candidate]:
    """Starts for the polish beside the search's plans: `cand` with every level between the
    register tile and the outermost collapsed onto the register tile, scored. Single moves keep
    each level a multiple of the one inside it, so a polish that first grows the middle levels
    cannot shrink the outermost tile below them again. On gemm 1000^3 every start the search
    returned polished to 6.60 ms predicted, this one to 6.29 (BENCHMARKS.md). It leads to plans
    that stream the inner levels from the outermost cache, which the assumed figures overrate
    (a fill of L2 from L3 2.7x the one calibration measured on the Intel Xeon): there, without a
    profile, gemm 1000^3 and ViT's MLP got plans that ran 0.49 and 0.53x numpy, against 0.89 and
    1.10 for the plans found without this start. So none unless the hardware's figures were
    measured (Hardware.calibrated), and none that is no feasible plan.

    Where the memory link idles (objective.warm_levels) every outermost tile costs it nothing, so
    the search's, often the whole problem, is a weak guide: a second start takes the last cache's
    tile as the outermost. On the Xeon whose L3 holds 128 MiB it led attention 1024 (16 heads) to
    11.41 ms predicted against 11.73 (14.27 against 15.16 measured) and gpt-2's 1024x768x768
    projection to 3.30 against 3.34 (3.81 against 4.17), BENCHMARKS.md "Warm-L3 session"."""
    tiles = cand.tiles
    if len(tiles) < 3 or not space.hardware.calibrated:
        return []
    tops = [tiles[-1], tiles[-2]] if np.isinf(space.objective.divisors[-1]) and tiles[-2] != tiles[-1] else [tiles[-1]]
    starts = []
    for top in tops:
        start = Candidate(cand.orders, (tiles[0],) * (len(tiles) - 1) + (top,), ())
        pred, mmax, msum, ok = score(space, start.orders, start.tile_dicts(space.loops))
        if bool(ok) and np.isfinite(pred):
            starts.append(Candidate(start.orders, start.tiles, (float(pred), float(mmax), float(msum))))
    return starts


def polish(space: Space, cand: Candidate, deadline: Deadline, rounds: int = 25) -> Candidate:
    """Improve `cand`'s ranking key by single moves until none helps or time runs short.

    Phase 1 takes the move that improves the key most; a move that keeps the key
    but frees capacity counts as an improvement too, since it opens the way for
    the next one (shrink k so that m and n can grow); each of its rounds also
    tries re-tiling one whole level (_level_moves), and once no move lowers the key,
    reading a packed input in place (_unpack_moves) or an unpacked one in narrower bands
    (_band_moves). Phase 2 then grows tiles wherever the
    key does not get worse: when the model is indifferent, fuller levels are the
    better bet for real code.
    """
    loops, n = space.loops, space.n_levels
    best, best_fill = cand, float(_fill(space, cand.tile_dicts(loops)))
    tried = False  # unpack moves (_unpack_moves)
    costed: dict = {}  # _order_key's
    for grow in (False, True) if space.target.polish_grows else (False,):
        for _ in range(rounds):
            if deadline.expired():
                # Out of work before the moves stalled: the unpack moves still get their one try,
                # as they would have at the stall (gpt-2's decode 16x3072x768 reached its plan that
                # reads B in place, 1.01 ms predicted against 1.34, only past 100 units).
                unpacked = None if tried or deadline.left() <= 0 else _unpacked(space, best, deadline.left())
                return Candidate(unpacked[2], unpacked[3], unpacked[0]) if unpacked else best
            tiles = best.tile_dicts(loops)
            moves = _tile_moves(space, tiles)
            if not grow:
                moves = sorted(set(moves) | set(_level_moves(space, best.orders, tiles, deadline)))
            # Every pick must rank at least level with the incumbent: plans over that bound
            # before their serial costs are not costed further (the same picks, in less time).
            bound = level_with(best.key[0])
            # Each phase takes its round's least option (of those fuller than the incumbent, when
            # growing), so the other moves and orders are costed only while they may still be it.
            options = _scored(space, best.orders, moves, deadline, bound, best_fill if grow else -np.inf)
            if not grow:
                # The orders too need only beat the least move. No later round's bound is above
                # this one (its incumbent is a pick at most this fast), so what _order_key keeps
                # as over it stays over.
                bound = min([bound, *(level_with(o[0][0]) for o in options)])
                for j in range(n):
                    for order in space.orders:
                        if order != best.orders[j]:
                            orders = best.orders[:j] + (order,) + best.orders[j + 1 :]
                            key, ok = _order_key(space, orders, tiles, best.tiles, bound, costed)
                            deadline.spend(space.work(levels=space.n_levels))
                            if ok:
                                options.append((key, best_fill, orders, best.tiles))
            if grow:
                options = [o for o in options if _compare(o[0], best.key) <= 0 and o[1] > best_fill]
                pick = max(options, key=lambda o: (-o[0][0], -o[0][1], -o[0][2], o[1]), default=None)
            else:
                pick = _best_gain(options, best, best_fill)
                if (pick is None or _compare(pick[0], best.key) == 0) and not tried:
                    # No single move lowers the key: read an input in place (every level at once).
                    # Once per polish, on the clock but not the work budget: it is a fixed cost, and
                    # charged, it cut the grow phase short (gpt-2's 1024x768x768 kept 8-deep L1
                    # tiles that ran 5% slower than the 32-deep ones it grows to otherwise).
                    tried = True
                    pick = _unpacked(space, best, deadline.left()) or pick
            if pick is None:
                break
            best, best_fill = Candidate(pick[2], pick[3], pick[0]), pick[1]
    return best


def _unpacked(space: Space, best: Candidate, seconds: float):
    """The best option (as _scored gives them) among the incumbent's unpack and band moves
    (_unpack_moves, _band_moves) that ranks ahead of it, within `seconds`; None if none does."""
    tiles, n = best.tile_dicts(space.loops), space.n_levels
    if n < 2:
        return None
    clock = Deadline(seconds)
    # The incumbent's costs name its copies and its unpacked inputs: both kinds of move start there.
    costs = space.target.kernel_costs(space.workload, best.orders, tiles, space.stages)
    if costs is None:  # a target without copies (scalar CPUs, GPUs) has nothing to unpack
        return None
    clock.spend(space.work(levels=n))
    moves = _unpack_moves(space, tiles, costs) + _band_moves(space, tiles, costs)
    options = _scored(space, best.orders, moves, clock, level_with(best.key[0]), -np.inf)
    return min([o for o in options if _compare(o[0], best.key) < 0], default=None)


def _scored(space: Space, orders, moves, deadline: Deadline, bound: float, fuller: float) -> list:
    """(key, fill, orders, tiles) of each feasible move (tiles as Candidate.tiles), for a pick of
    the move of least predicted time among those fuller than `fuller` (-inf: any): moves over
    `bound` get an infinite key, and so may others that cannot be that move (registry.score's
    `least`)."""
    if not moves:
        return []
    loops = space.loops
    arrays = [{x: np.array([m[j][i] for m in moves]) for i, x in enumerate(loops)} for j in range(space.n_levels)]
    fill = _fill(space, arrays)
    pred, mmax, msum, ok = score(space, orders, arrays, bound=bound, least=fill > fuller)
    deadline.spend(space.work(len(moves), space.n_levels))
    return [((float(pred[m]), float(mmax[m]), float(msum[m])), float(fill[m]), orders, moves[m]) for m in np.flatnonzero(ok)]


def _best_gain(options, best: Candidate, best_fill: float):
    """The option that improves (key, fill) most over the incumbent's, or None."""
    return min((o for o in options if (o[0], o[1]) < (best.key, best_fill)), key=lambda o: (o[0], o[1]), default=None)
