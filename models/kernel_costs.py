"""What the CPU kernel spends beside the streaming the DV model describes.

The LLVM backend's kernel (backends/llvm_emit.py) runs, besides its FMA loops:

- packing copies: each input is copied into its packed buffer at the key-slice
  models/caches.py gives it, once per iteration of the loops around it (the
  fills), reading the source array where it lives and writing the buffer;
- an output that must resume from its running sum across a reduction loop
  accumulates in a contiguous buffer of its block, or in place, zeroed first by
  a pass of its own when it is the kernel's output (models/caches.output_plan);
- inputs read from their array unpacked (models/caches.read_once) and large
  enough: the micro-kernel streams them in runs as long as
  one thread's walk keeps contiguous (`contiguous_run`: an L1 block's rows, as
  far as the next blocks continue them, or a private cache's block that is one
  contiguous piece), and each
  run's start costs the stream more (`run_start`: calibrated from memory on
  128-byte and 1 KiB runs, interpolated between; 430-970 bytes per 1 KiB run on
  both cores of the Zen 5 EPYC of BENCHMARKS.md as its memory's speed changed),
  a share of that growing with the input's size (`run_start_reach`), on
  every pass the plan makes over the input (`input_passes`); and
  when the L1 block reads a piece of more rows in turn than the hardware
  prefetcher follows at once, though the next blocks continue them, the
  stream takes a share longer (`band_stall`: calibrated per band of rows);
- inputs read in place whose rows lie apart (an unpacked B whose register
  tile reads a 64-float piece of each 768-float row): the FMA loop fetches a
  new row at every step, and the prefetchers follow such rows less well the
  farther apart they lie, so the loop stalls for a share of the L1 link's
  time for those bytes (`stride_stall`, calibrated per stride);
- packing copies that read pieces narrower than a cache line from more rows
  than L1 can hold at once (rows a multiple of 4 KiB apart share one set):
  every piece misses L1 again for the line the previous piece brought in
  (`thrashed_bytes`);
- packed buffers handed between cores: a copy made at the root (split over
  the cores) or above the parallel loop (on one core) is read in the parallel
  loop's chunks, and what a core reads that another wrote comes from that
  core's private cache (`handed_off`, calibrated per byte);
- output lines written by two cores: where the parallel loop's chunks of an
  output meet inside a cache line, the line moves between the cores'
  private caches (sharing.py, calibrated per line);
- parallel regions: the parallel loop is entered once per iteration of the
  loops around it (in a fused chain, a producer's own parallel loop sits inside
  the consumer's serial loops), each entry costing the thread pool's wake-up;
- the call itself.

These run between the FMA loops, not under them, so their times add to the
plan's instead of overlapping it. Copies inside the parallel loop (or at the
root, where the copy is itself parallel) share the cores; one above it runs on
one core. A copy streams at the fill bandwidth of the level inside the one
that holds what it reads (the whole source array) or writes (its buffer), and
its loop issues its moves meanwhile: it takes the longer of the two.

Scalar plans only (tiles as ints): solvers evaluate it once per plan, where
all levels but the register tile's are fixed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .caches import (LINE_BYTES, CacheSite, Layout, copied_out, effective_tiles, holder_block, input_caches, is_padded,
                     micro_order, outer_shared, output_plan, read_once, trips, walk)
from .costmodel import compute_seconds, data_volume, parallel_candidates, parallel_loops
from .crowding import set_share
from .hardware import Hardware
from .profile import RUN_BYTES, SHORT_RUN_BYTES
from .sharing import output_shared_lines
from .workload import Workload

# A band of rows whose stall reaches this share of the widest band's is one the prefetcher has
# given up on (the stall has levelled off): each piece of it is a run of its own. Below it the
# pieces still join up into runs, and the band's stall is charged as a share of the stream.
PLATEAU = 0.9


@dataclass
class KernelCosts:
    seconds: float = 0.0  # serial: copies, zeroing, cropping, parallel regions, the call
    copy_bytes: list[float] = field(default_factory=list)  # per level: bytes packing copies write into its buffers
    regions: float = 0.0  # parallel loops entered per call
    copy_seconds: float = 0.0
    # per level: bytes the copies and zeroing stream over the link filling it, weighted as
    # copy_seconds weighs them (a copy made on one core counts `cores` times), so copy_seconds is
    # sum(stream_bytes[l] / bandwidth_l) + issue_seconds + handoff_seconds + sharing_seconds: what a refit of the bandwidths rescales
    # is the first part, and with it issue_seconds, the part of each copy's issue beyond its streams (overlaps)
    stream_bytes: list[float] = field(default_factory=list)
    # (tensor, level it is packed at, bytes copied, bytes of its buffer, the loop position it is
    # filled at: None at the root)
    copies: list[tuple[str, int, float, float, object]] = field(default_factory=list)
    # per copy, what its loop issues (copy_ops): (tensor, vectors moved, elements moved one at a time)
    copy_ops: list[tuple[str, float, float]] = field(default_factory=list)
    # the part of copy_seconds those take beyond the copies' own streams, which they overlap
    # (calibrated per op, not a link's: no refit rescales it)
    issue_seconds: float = 0.0
    # per copy, its streams and its loop's issue, of which the longer counts: (bytes it streams
    # per link, weighted as stream_bytes counts them, seconds its loop issues), for a refit that
    # rescales the streams (models/refit.py)
    overlaps: list[tuple[list[float], float]] = field(default_factory=list)
    # inputs streamed unpacked whose runs pay a share of a run start (run_start_reach): (tensor,
    # contiguous runs read, elements per run)
    runs: list[tuple[str, float, int]] = field(default_factory=list)
    # the same for the copies' first pass over their sources, with the rows each reads in turn
    # and band_stall's share of its stream (copy_walk): (tensor, runs, elements per run, rows, share)
    copy_runs: list[tuple[str, float, int, int, float]] = field(default_factory=list)
    # copies whose reads spread their writes over places apart in the buffer (write_streams):
    # (tensor, places written in turn, band_stall's share of the buffer's stream)
    copy_writes: list[tuple[str, int, float]] = field(default_factory=list)
    # inputs streamed unpacked whose L1 block reads pieces of several rows in turn, continued by
    # the next blocks (band_rows): (tensor, rows read in turn, band_stall's share of its stream)
    bands: list[tuple[str, int, float]] = field(default_factory=list)
    # inputs read in place a piece of each row at a time (strided_inputs): (tensor, bytes its rows
    # lie apart, bytes it streams into L1, the share of their L1 link time the FMA loop stalls for)
    strides: list[tuple[str, int, float, float]] = field(default_factory=list)
    # packed buffers read by a core other than the one that wrote them (handed_off): (tensor,
    # bytes the busiest core reads of what another core wrote)
    handoffs: list[tuple[str, float]] = field(default_factory=list)
    handoff_seconds: float = 0.0  # the part of copy_seconds those take (calibrated, not a link's: no refit rescales it)
    # outputs whose cache lines two cores write (sharing.output_shared_lines): (tensor, lines per call)
    shared_lines: list[tuple[str, float]] = field(default_factory=list)
    sharing_seconds: float = 0.0  # the part of copy_seconds those take (calibrated, like handoff_seconds)
    # copies whose narrow pieces' rows thrash L1 (thrashed_bytes): (tensor, bytes L1 fetches again)
    thrashed: list[tuple[str, float]] = field(default_factory=list)
    # outputs accumulated across a reduction: (tensor, bytes zeroed, bytes of the block zeroed at
    # once, bytes written back from its buffer or cropped out of the padded output)
    outputs: list[tuple[str, float, float, float]] = field(default_factory=list)
    # per link, weighted as stream_bytes: bytes the copies inside the loop nest (not at the root)
    # read from their sources, which the links' DV counts as well (`relieved`)
    read_bytes: list[float] = field(default_factory=list)
    # per link: bytes of the copied inputs the FMA loops no longer move over it, since they read
    # the buffer a copy inside the loop nest filled where it stays, at most the copy's bytes
    relief: list[float] = field(default_factory=list)

    def read_seconds(self, hardware: Hardware) -> float:
        """Seconds the copies inside the loop nest spend reading their sources (read_bytes)."""
        return sum(b / lv.bandwidth_bytes_per_s for b, lv in zip(self.read_bytes, hardware.levels))


def keeping_level(hardware: Hardware, nbytes: float, kept: bool = False) -> int:
    """The smallest cache level that keeps `nbytes` among the rest of a kernel's data (the
    target's cache_bytes, or with `kept` its kept_bytes; the number of levels when none does)."""
    target, n = hardware.target, len(hardware.levels)
    usable = target.kept_bytes if kept else target.cache_bytes
    return next((i for i in range(1, n) if (usable(i) or 0) >= nbytes), n)


def stream_level(hardware: Hardware, nbytes: float) -> int:
    """The level whose fill link streams `nbytes`: the one inside the smallest level that holds
    them (the outermost, filled from memory, when none does)."""
    levels = hardware.levels
    home = next((i for i, lv in enumerate(levels) if lv.capacity_bytes >= nbytes), len(levels))
    return max(home - 1, 0) if home < len(levels) else len(levels) - 1


def copy_walk(workload: Workload, hardware: Hardware, site: CacheSite, padded, tiles, split,
              cores: int) -> tuple[int, int]:
    """(run, rows): how the copy of `site` reads its row-major source, as
    backends/llvm_emit._copy_loops walks it: the elements of each contiguous run, and the rows
    it reads in turn while their pieces join up into those runs. Pieces join where the next
    ones continue them after a band of rows the prefetcher follows (followed_rows; any band
    without a calibration of them); after a wider band each piece is a run of its own. (0, 1)
    for an affine window.

    The copies that follow one another join up too (`tiles`, the plan's, effective): where
    the copy's key-slice loop steps along the rows and the copy reads its block's whole width in
    one run per row, the next copy continues each of the block's rows, a band the prefetcher
    follows (`split`, the op's parallel loop position, gives each of the `cores` threads a
    contiguous share of its trips). gemm 8x4096x1024 copying B in 25x16 blocks along n (64-byte
    pieces of 25 rows) ran in 1.98 ms, predicted 6.55 with every piece a run from memory (AMD EPYC
    Zen 3, BENCHMARKS.md "Seed-cap session").

    The copy walks the cache's tiles level by level in the array's order, each level-1 tile
    in the pack's inner order: llama's 8x4096x4096 copying B in 64x2048 blocks of 64x16 tiles
    read 64-byte pieces of 64 rows in turn, and ran in 15.0 ms, where its copy as one 8 KiB run
    per row predicted 6.0 (AMD EPYC Zen 3, BENCHMARKS.md "Read-once session")."""
    tensor, layout = workload.tensors[site.tensor], site.layout
    if not tensor.plain or layout is None:
        return 0, 1
    rank, last = len(layout.dims), len(layout.dims) - 1
    first = len(layout.bounds[0]) - site.level  # the cache's own tile in the bounds
    loops, run = _row_run(layout, site.level)
    if run >= padded[tensor.dims[last]]:  # whole rows: the block is one run
        return int(math.prod(layout.bounds[i][first] for i in range(rank))), 1
    # Without a band calibration, any band is followed, as an unpacked input's costs no stall then.
    followed, rows, band = followed_rows(hardware) or math.inf, 1, 1
    while loops:
        i, steps, stride = loops.pop()
        if i != last:
            rows *= steps
        elif stride == run and rows <= followed:
            run, band = run * steps, rows
        else:
            return run, band
    key = site.key
    if key is not None and key[0] == tensor.dims[last] and rows <= followed and run == layout.bounds[last][first]:
        run, band = run * thread_trips(tiles, padded, key, split, cores), rows
    return run, band


def thread_trips(tiles, padded, position, split, cores: int) -> int:
    """Trips of loop `position` (dim, level) that one thread runs: of the parallel loop (`split`),
    a contiguous share of them per each of the `cores` threads."""
    steps = trips(tiles, padded, *position)
    return -(-steps // cores) if position == split else steps


def _row_run(layout: Layout, level: int) -> tuple[list, int]:
    """The loops of a level-`level` copy's walk left outside its innermost run along the row (dim,
    trips, stride in that dim's elements; outermost first), and that run's elements."""
    rank, last = len(layout.dims), len(layout.dims) - 1
    first = len(layout.bounds[0]) - level  # the cache's own tile in the bounds
    loops = []
    for k in range(len(layout.bounds[0]) - first - 1):
        for i in range(rank):
            b = layout.bounds[i][first:]
            loops.append((i, max(b[k] // b[k + 1], 1), b[k + 1]))
    loops += [(i, layout.bounds[i][-1], 1) for i in layout.inner_order]
    loops = [loop for loop in loops if loop[1] > 1]
    run = 1
    while loops and loops[-1][0] == last and loops[-1][2] == run:
        run *= loops.pop()[1]
    return loops, run


def write_streams(workload: Workload, site: CacheSite) -> tuple[int, int]:
    """(places, elements): the places apart in its buffer that the copy of `site` writes in turn,
    and what it writes at each visit. As the copy reads along a row (its loops, innermost first:
    llvm_emit._copy_loops), each piece of a packed tile's width lands in another tile, stored a
    whole tile's other dims apart; loops along other dims inside the first one along the row
    write rows of the same tile, next to each other. (1, 0) where the row's pieces lie one after
    the other in the pack (or for an affine window).

    Each place is a stream of lines the core writes, continued at the next visit, as a band of
    rows read in turn is a stream each to follow: llama's prefill 128x4096x4096 copying B into
    512x2048 blocks of 16-float panels (128 places in turn, a line each) ran in 50.4 ms, where
    128-wide blocks of 4096 rows (8 places) ran in 38.2, both predicted 55.5-56.5 (AMD EPYC
    Zen 3, BENCHMARKS.md "Piece-split session"). Charged as band_stall's share of the buffer's
    stream, over the lines of a visit (a visit of more lines restarts its stream less often)."""
    layout = site.layout
    if not workload.tensors[site.tensor].plain or layout is None:
        return 1, 0
    loops, run = _row_run(layout, site.level)
    rank, first = len(layout.dims), len(layout.bounds[0]) - site.level
    digits = layout.run_order([layout.bounds[i][first] for i in range(rank)])
    piece = 1
    for i, size in reversed(digits):
        if i != rank - 1:
            break
        piece *= size
    places, visit = max(run // piece, 1), min(piece, run)
    for i, steps, _ in reversed(loops):
        if i == rank - 1:
            places *= steps
        elif places > 1:
            break
        else:
            visit *= steps
    return (places, visit) if places > 1 else (1, 0)


def _prod(values) -> float:
    return float(math.prod(values))


def kernel_costs(workload: Workload, hardware: Hardware, orders, tiles) -> KernelCosts:
    """The serial costs of one plan (orders and tiles innermost level first, scalars)."""
    orders = [list(o) for o in orders]
    tiles = [{x: int(t[x]) for x in workload.dims} for t in tiles]
    padded, eff = effective_tiles(workload, tiles)
    cores, elem = hardware.cores, workload.elem_bytes
    parallel = parallel_ops(workload, orders, tiles, cores)
    n = len(tiles)
    costs = KernelCosts(copy_bytes=[0.0] * n, stream_bytes=[0.0] * n, read_bytes=[0.0] * n, relief=[0.0] * n)

    def stream(nbytes: float, footprint: float | None, shared: int = cores, level: int | None = None) -> float:
        """Seconds to stream `nbytes` of a `footprint`-byte array or buffer, kept per link (the
        one stream_level picks, unless `level` names it); a pass split over `shared` of the cores
        (1: a serial one) counts cores / shared times, since the link's bandwidth is the figure
        for all cores."""
        level = stream_level(hardware, footprint) if level is None else level
        weighted = nbytes * (cores / shared)
        costs.stream_bytes[level] += weighted
        return weighted / hardware.levels[level].bandwidth_bytes_per_s

    root_shared = cores if parallel else 1  # a root pass is split over the cores when the kernel is (llvm_emit)

    copies = [site for site in input_caches(workload, orders, eff, padded) if not site.skipped]
    copies = [*padding_passes(workload, hardware, orders, eff, padded, copies, parallel).values(), *copies]
    first, spared = first_copies(copies), {}
    for site in copies:
        above = _above(workload, orders, site)
        fills, block = _fills(workload, eff, padded, site, above)
        op = next(o for o in workload.ops if o.name == site.op)
        pick = parallel[op.name][0] if op.name in parallel else None
        if site.key is None:
            shared = root_shared
        else:
            shared = cores if pick in above else 1  # inside the parallel loop
        nbytes = fills * block * elem
        costs.copy_bytes[site.level] += nbytes
        costs.copies.append((site.tensor, site.level, nbytes, block * elem, site.key))
        source = workload.size(site.tensor) * elem
        before = list(costs.stream_bytes)
        if site.key is None:
            streamed = stream(nbytes, source, shared)
        else:
            # Read where the links' DV would have read it: the first pass over the source (each
            # core's, when the parallel loop does not split the source) from the level that keeps
            # it whole; each copy again of a block from the level that keeps what the loops sweep of
            # the source in between (_reuse_slice), L1's link at the least unless all of it stays in
            # L1 (copy_ops counts nothing for an affine window, which the free register link would
            # then copy for nothing).
            # gemm 197x2304x768 copying B in 10x48 blocks again for each 13-row tile reads B's 10
            # rows (92 KiB) from L2, not from L3 where all of B (7 MB) lives: its copy loops took
            # 1.53 ms of 3.48, predicted 1.57 so and 2.06 before (BENCHMARKS.md, "Residual session").
            apart = cores if pick in above and pick[0] not in workload.tensors[site.tensor].loops else 1
            once = min(nbytes, source * apart)
            reach = min(source, _reuse_slice(workload, orders, op, eff, padded, site, above) * elem)
            home = keeping_level(hardware, source, True) - 1
            streamed = stream(once, None, shared, level=home)
            # That first pass reads the block's rows in runs and bands, which pay run starts and
            # band stalls as an unpacked input's do (copy_walk).
            run, rows = copy_walk(workload, hardware, site, padded, eff, pick, cores)
            paid = run_start_reach(hardware, source) if run else 0.0
            if paid:
                runs, share = once / (run * elem), band_stall(hardware, rows)
                costs.copy_runs.append((site.tensor, runs, run, rows, share))
                streamed += stream(runs * run_start_paid(hardware, run * elem, source) + once * share * paid, None, shared,
                                   level=home)
            streamed += stream(nbytes - once, None, shared, level=max(keeping_level(hardware, reach, True) - 1, min(home, 1)))
            relieved(costs, hardware, site.tensor, nbytes, block * elem, before, spared)
        streamed += stream(nbytes, block * elem, shared)
        places, visit = write_streams(workload, site)
        spread = band_stall(hardware, places) / max(visit * elem / LINE_BYTES, 1.0) if places > 1 else 0.0
        if spread:
            costs.copy_writes.append((site.tensor, places, spread))
            streamed += stream(nbytes * spread, block * elem, shared)
        costs.copy_seconds += streamed
        # The first copy of an input reads it through its zero padding (backends/tensorir.inline_padding).
        padding = site is first[site.op, site.tensor] and is_padded(workload, site.tensor, padded)
        vectors, elements = copy_ops(workload, hardware, site, fills * block, padding)
        again = thrashed_bytes(workload, hardware, site, fills * block)
        if again:
            costs.thrashed.append((site.tensor, again))
            costs.copy_seconds += stream(again, None, shared, level=1)
        costs.copy_ops.append((site.tensor, vectors, elements))
        issued = issue_seconds(workload, hardware, site, fills * block, (vectors, elements), padding) / shared
        costs.overlaps.append(([b - a for a, b in zip(before, costs.stream_bytes)], issued))
        # The loop issues its moves while its streams are under way: a copy takes the longer of
        # the two. Added to its streams (3.6 us over the L1 link), the calibration's own copy (64
        # rows of 1000 floats from L2, 6.9 us) would be predicted 1.5x its measured time; over
        # five fidelity dumps on the Intel Xeon, Spearman went from 0.840 to 0.850 (BENCHMARKS.md,
        # "Padded-copy session").
        beyond = max(issued - streamed, 0.0)
        costs.issue_seconds += beyond
        costs.copy_seconds += beyond
        if hardware.handoff_seconds and op.name in parallel and (site.key is None or shared == 1):
            foreign = handed_off(workload, hardware, site, parallel[op.name], eff, padded, fills * block * elem,
                                 block * elem)
            if foreign:
                costs.handoffs.append((site.tensor, foreign))
                costs.handoff_seconds += foreign * hardware.handoff_seconds
                costs.copy_seconds += foreign * hardware.handoff_seconds
    copied = {site.tensor for site in copies}
    # Accumulators stored and reloaded between k steps cost the register link only (the
    # accumulator bandwidth): gemm 8x4096x1024 reading B unpacked, 8x32 tiles reloaded every 2,
    # 4, 8, 16 and 64 k steps, ran in 0.58, 0.51, 0.48, 0.47 and 0.52 ms (Intel Xeon,
    # BENCHMARKS.md), where charging the reloads to B's stream as well predicted 1.76 to 0.64.
    for op in workload.ops:
        for name in op.inputs:
            t = workload.tensors[name]
            size = workload.size(name) * elem
            if t.role != "input" or not t.plain or name in copied:
                continue
            reach = run_start_reach(hardware, size)
            if not reach:
                continue
            run = contiguous_run(workload, orders, op, name, eff, padded, parallel.get(op.name, (None,))[0], cores)
            passes = input_passes(workload, hardware, orders, tiles, name, size)
            runs = workload.size(name) / run * passes
            costs.runs.append((name, runs, run))
            costs.copy_seconds += stream(runs * run_start_paid(hardware, run * elem, size), size)
            rows, piece = band_rows(workload, name, eff, padded, orders, op)
            share = (band_stall(hardware, rows, broadcast_rows(workload, hardware, op, name, eff[0]))
                     if piece and run > piece else 0.0)
            if share:
                costs.bands.append((name, rows, share))
                costs.copy_seconds += stream(size * passes * share * reach, size)
    strided = strided_inputs(workload, hardware, orders, tiles, eff, padded, copied, parallel)
    weight = compute_weight(workload, hardware, orders, tiles) if strided else 0.0
    for name, stride, nbytes, share in strided:
        costs.strides.append((name, stride, nbytes, share))
        costs.copy_seconds += stream(nbytes * share * weight, None, level=1)
    root_passes = sum(site.key is None for site in copies)  # each parallel itself
    plans = {op.name: output_plan(workload, orders, op, eff, padded) for op in workload.ops}
    for op in workload.ops:
        plan = plans[op.name]
        if not plan:
            continue
        out = workload.tensors[op.output].dims
        size = _prod(padded[x] for x in out) * elem
        if workload.tensors[op.output].role != "output":
            # A chain's intermediate accumulated across a reduction split above its register
            # tile is zeroed in place by a pass of its own, block by block above that reduction:
            # chain 128x128x64x64 with k split in two at L3 zeroes all 132x128 of it at once,
            # a 66 KiB pass through a 48 KiB L1 (valgrind's L1 missed 1.27x the expected
            # bytes without it, BENCHMARKS.md). It is read by its consumer, never written back.
            block = _prod(holder_block(workload, orders, op, eff, padded, plan.start, inclusive=True)) * elem
            costs.outputs.append((op.output, size, block, 0.0))
            costs.copy_seconds += stream(size, block)
            continue
        if plan.holder is None:  # zeroed in place, a pass over the whole output
            real = _prod(workload.dims[x] for x in out) * elem
            # padded, or rows that alias: then copied out by a pass of its own
            cropped = real if copied_out(workload, op, padded) else 0.0
            costs.outputs.append((op.output, size, size, cropped))
            costs.copy_seconds += stream(size, size)
            if cropped:  # reads the padded output, writes the array; over the cores like a root copy
                costs.copy_seconds += stream(2 * cropped, size, root_shared)
                root_passes += 1
        else:  # zeroed block by block in its buffer, then each block written back to the array
            block = _prod(holder_block(workload, orders, op, eff, padded, plan.holder)) * elem
            costs.outputs.append((op.output, size, block, size))
            costs.copy_seconds += stream(size, block) + stream(2 * size, size)
    if hardware.shared_line_seconds:
        costs.shared_lines = output_shared_lines(workload, orders, eff, padded, parallel, cores, plans)
        costs.sharing_seconds = sum(lines for _, lines in costs.shared_lines) * hardware.shared_line_seconds
        costs.copy_seconds += costs.sharing_seconds
    costs.regions = _regions(workload, orders, eff, padded, parallel, root_passes, plans)
    costs.seconds = costs.copy_seconds + costs.regions * hardware.parallel_region_seconds + hardware.call_seconds
    return costs


def relieved(costs: KernelCosts, hardware: Hardware, tensor: str, nbytes: float, block: float,
              before: list[float], spared: dict) -> None:
    """Note what a copy inside the loop nest (`nbytes` of `tensor` into a `block`-byte buffer)
    reads from its source (the stream_bytes added since `before`) and what it spares the links.

    That copy reads the very refills the links' DV counts for the input at its level and above:
    the FMA loops then read the buffer, which stays in the smallest level that holds it, so no
    link from that level out (the L1's, at least: registers hold no buffer) carries the input
    for them. The objective takes those links' time without these bytes, and the plan's time
    falls by what that saves, at most the copies' reads (Objective.value): on the Intel Xeon of
    BENCHMARKS.md, gemm 8x4096x1024 copying B in 74x128 blocks (B read twice) ran in 0.83 ms
    where reading B in place ran in 0.45; charging both B's reads at the links and the copy's
    reading of it had predicted 1.37 ms."""
    for level, now in enumerate(costs.stream_bytes):
        costs.read_bytes[level] += now - before[level]
    spared = spared.setdefault(tensor, [0.0] * len(costs.relief))  # per tensor, per link: the relief so far
    for level in range(keeping_level(hardware, block), len(costs.relief)):
        if nbytes > spared[level]:  # an input copied at two levels is spared once, its larger copy
            costs.relief[level] += nbytes - spared[level]
            spared[level] = nbytes


def padding_passes(workload: Workload, hardware: Hardware, orders, tiles, padded, sites, parallel) -> dict:
    """Per input whose zero padding is a pass of its own at the root, that pass as a root copy
    site (caches.CacheSite) of the padded array, row-major; the other padded inputs' padding
    folds into their first copy (backends/tensorir.inline_padding). `tiles` effective, `sites`
    caches.input_caches', `parallel` parallel_ops'.

    Folded into a copy that moves pieces of rows narrower than a vector, or transposes, the
    padding's condition costs at every element of every refill: gemm 127x251x509 packing A in
    pieces of 3 floats for each of its 26x16x57 blocks (each element 16 times) ran 0.72-0.80 ms,
    0.34-0.41 with A padded once, and packing it transposed for each 12x16x37 block 0.57-0.85
    ms, 0.39-0.45 (the same plans on the unpadded 130x256x513: 0.32 and 0.37 ms). So a copy
    that moves each element of its input twice or more on a core reads a padded array made
    once; one that moves it once keeps the padding (a pass of its own only adds one: gemm
    127x251x509's plan, whose two n blocks each pack all of A on their core, ran 1.2-1.3x as
    long with it). Over the random plans of four fidelity workloads that this rule pads apart,
    new/old ran 0.47-1.11 (geomean below 1; Intel Xeon, BENCHMARKS.md "Zeroing session"); what
    LLVM makes of the folded condition depends on the piece and the loops around it (a pack
    of 3-float pieces through it took 0.59 ns an element under 26-row tiles, 0.19 under 8-row
    ones, and 0.26 without it), which the model does not follow."""
    passes, first = {}, first_copies(sites)
    lanes = hardware.target.vector_lanes(workload)
    n = len(tiles)
    for site in sites:
        t = workload.tensors[site.tensor]
        if (site.skipped or site.key is None or site.layout is None or site.tensor in passes or not t.plain
                or not is_padded(workload, site.tensor, padded) or first[site.op, site.tensor] is not site):
            continue
        piece = row_piece(site.layout)
        if piece is not None and piece >= lanes:
            continue
        above = _above(workload, orders, site)
        fills, block = _fills(workload, tiles, padded, site, above)
        copies = fills * block / _prod(ix.extent(padded) for ix in workload.index(site.tensor))
        split = parallel.get(site.op, (None,))[0]
        if split in above and split[0] not in t.loops:
            copies /= hardware.cores  # every core copies all of it, each its own share of the copies
        if copies < 2:
            continue
        rank = len(t.dims)
        layout = Layout(dims=list(t.dims), bounds=[[padded[x]] * n for x in t.dims], inner_order=list(range(rank)),
                        level_orders=[list(range(rank))] * (n - 1))
        passes[site.tensor] = CacheSite(site.op, site.tensor, n - 1, None, False, layout)
    return passes


def first_copies(sites) -> dict:
    """Per (op, input), the first of `sites` (caches.CacheSite, in the order given) that copies it."""
    first = {}
    for site in sites:
        if not site.skipped:
            first.setdefault((site.op, site.tensor), site)
    return first


def plan_padding(workload: Workload, hardware: Hardware, orders, tiles) -> dict:
    """padding_passes of a plan (its orders and own tiles, innermost level first)."""
    padded, eff = effective_tiles(workload, tiles)
    return padding_passes(workload, hardware, orders, eff, padded, input_caches(workload, orders, eff, padded),
                          parallel_ops(workload, orders, tiles, hardware.cores))


def _above(workload: Workload, orders, site) -> list:
    """The positions of the copy's op down to its key-slice, outermost first ([] at the root)."""
    if site.key is None:
        return []
    positions = walk(workload, orders, next(o for o in workload.ops if o.name == site.op))
    return positions[: positions.index(site.key) + 1]


def _reuse_slice(workload: Workload, orders, op, tiles, padded, site, above) -> float:
    """Elements of the copy's source that its loops sweep between two copies of one block: within
    one trip of the innermost loop above the copy that does not index the source (inf when every
    loop above indexes it: each block is copied once). `tiles` effective, `above` _above's."""
    loops = workload.tensors[site.tensor].loops
    reuse = next((p for p in reversed(above) if p[0] not in loops and trips(tiles, padded, *p) > 1), None)
    if reuse is None:
        return float("inf")
    tile = dict(zip(loops, holder_block(workload, orders, op, tiles, padded, reuse, dims=loops)))
    return _prod(ix.span(tile) for ix in workload.index(site.tensor))


def _fills(workload: Workload, tiles, padded, site, above) -> tuple[float, float]:
    """(times the copy at `site` fills its buffer per call, elements of its block); `tiles`
    effective (caches.effective_tiles), `above` _above's."""
    index = workload.index(site.tensor)  # an affine dim's block is the window its loops span
    if site.key is None:
        return 1.0, _prod(ix.extent(padded) for ix in index)
    return _prod(trips(tiles, padded, x, j) for x, j in above), _prod(ix.span(tiles[site.level]) for ix in index)


def handed_off(workload: Workload, hardware: Hardware, site, parallel, tiles, padded, nbytes: float,
               block: float) -> float:
    """Bytes of a packed buffer the busiest core reads that another core wrote, per call: a copy
    made at the root is split over the cores by its outer loops (backends/llvm_emit._copy_loops),
    one made above the parallel loop on one core; the parallel loop then gives each core its
    chunk of `parallel`'s dim. Unless the two splits coincide, a core reads the rest of what it
    needs from another core's private cache, dirty there, which costs far more than its own: on
    the AMD EPYC Zen 4 of BENCHMARKS.md (2 cores, 1 MiB L2 each) a core read 256 KiB its
    neighbour had just written in 36.7 us against 13.4 us for its own (0.089 ns more per byte);
    gemm 127x251x509 with B packed at the root and m run in parallel ran 0.201 ms, the same
    tiles with B packed per n half inside the parallel loop 0.167 ms (1.70x and 1.91x their one
    core's times). Only what the writer's private cache still holds of each fill is handed off.
    `nbytes`: all the copy writes per call, `block` per fill; `tiles` effective, `parallel` the
    op's (position, own) or None."""
    cores = hardware.cores
    if not parallel or cores < 2 or len(hardware.levels) < 3:
        return 0.0
    (x, j), _ = parallel
    index = workload.index(site.tensor)
    split = site.key is None  # a root copy, split over the cores; else made by one core
    reads = nbytes
    if any(x in ix.loops for ix in index):  # each core reads its chunk of each parent tile along x
        parent = tiles[j + 1][x] if j + 1 < len(tiles) else padded[x]
        chunk = -(-trips(tiles, padded, x, j) // cores) * tiles[j][x]
        reads = nbytes * min(1.0, chunk / parent)
        if split and parent == padded[x] and _copy_split(workload, site, padded, cores) == (x, chunk):
            return 0.0
    written = block / cores if split else block
    foreign = reads * ((cores - 1) / cores if split else 1.0)
    return foreign * min(1.0, hardware.levels[-2].capacity_bytes / written)


def _copy_split(workload: Workload, site, padded, cores: int) -> tuple[str, int] | None:
    """(dim, elements per core) a root copy splits its buffer by, as _copy_loops fuses its outer
    loops: the first with more than one trip, when it has a trip per core; None otherwise."""
    layout = site.layout
    if layout is None:  # an affine window: its first loop, parallel
        first = workload.index(site.tensor)[0]
        if len(first.loops) != 1:
            return None
        x = first.loops[0]
        return x, -(-padded[x] // cores)
    first = len(layout.bounds[0]) - site.level
    for x, bounds in zip(layout.dims, layout.bounds):
        b = bounds[first:]
        count = max(b[0] // b[1], 1) if len(b) > 1 else 1
        if count > 1:
            return (x, -(-count // cores) * b[1]) if count >= cores else None
    if any(b[k] // b[k + 1] > 1 for b in (bounds[first:] for bounds in layout.bounds) for k in range(len(b) - 1)):
        return None
    # One block (a padding pass): the fused unit loops reach the block's outer loop inside.
    x = layout.inner_order[0]
    inner = layout.bounds[x][-1]
    return (layout.dims[x], -(-inner // cores)) if inner >= cores else None


def copy_ops(workload: Workload, hardware: Hardware, site, elements: float, padding: bool = False) -> tuple[float, float]:
    """(vectors, single elements) a packing copy of `elements` elements moves: its innermost loop
    (backends/llvm_emit._copy_loops) runs along a piece of the source's rows when the pack keeps
    them innermost, vectorised (vector_ops); otherwise, or along pieces of one element, one
    element at a time.
    An affine input's window (row-major, TensorIR's compact region) is not counted: charged by its
    rows' extent, it ranked ResNet-50's fused 3x3 -> 1x1 plans worse (Spearman 0.73 against 0.75
    over five dumps of bench/fidelity.py).

    Beside their streams, copies cost what their loops issue: on the AMD EPYC Zen 4 of
    BENCHMARKS.md, TVM's packing copy moved a 16-float vector every 1.15 ns on one core whether
    its 64 rows were 256 or 4000 bytes long (L1 or L2), and a transposing one an element every
    0.3 ns; gemm 1024^3 with a 1024x33 block of A packed element by element ran 2.3x its
    prediction, the copy loops holding 69% of its samples.

    `padding`: the copy reads the zero-padded input. A piece longer than a vector and not a
    whole number of them is then split in whole vectors, the last one masked
    (backends/llvm_emit._copy_loops). They were counted at a whole vector's cost each; before
    that, such pieces moved in vectors of the power of two that divides them, which LLVM splits
    under the padding's condition, and were counted as their elements' worth of vectors, less
    the parts: gemm 127x251x509's plans packing A in pieces of 30 floats ranked first, predicted
    5% faster than 8x32 tiles, and ran 14-20% slower (BENCHMARKS.md, "Padded-copy session").
    Now the masked vectors are counted as their elements, moved one at a time: TVM moves each
    lane under the split's predicate and the padding's condition on its own, a test each, and
    LLVM seldom merges them back. gemm 1000^3 with 9x8x11 tiles (k padded to 1001) packed A in
    pieces of 11 floats as 11 scalar loads, each under its own test, 104 instructions a piece;
    that loop held 53% of the kernel's samples (58 ms a call, predicted 51 with the pieces as two
    vectors each; AMD EPYC Zen 3). Built for Zen 4 the pieces move alike, as do pieces of 20 and
    50 floats read through a padding of the rows alone (BENCHMARKS.md, "Masked-lane session").
    Each element is priced as a transposing copy's (copy_element_seconds), though with its test
    it took about three times that here."""
    if site.layout is None:
        return 0.0, 0.0
    lanes = hardware.target.vector_lanes(workload)
    piece = row_piece(site.layout) or 1
    if piece <= 1 or masked_piece(piece, lanes, padding):
        return 0.0, float(elements)
    return elements / piece * vector_ops(piece, lanes), 0.0


def issue_seconds(workload: Workload, hardware: Hardware, site, elements: float, ops=None,
                  padding: bool = False) -> float:
    """Seconds one core spends issuing what copy_ops counts (`ops`, when the caller has them):
    each vector at copy_vector_seconds, each single element at copy_element_seconds, and a part
    of a piece narrower than a vector (vector_ops) at the lesser of a vector's figure and its
    elements'. gemm 127x251x509's plans that pack A two floats a piece were predicted 1.3-1.4x
    their measured time with each part priced as a 16-float vector (BENCHMARKS.md, "Hoist
    session"). `padding`: as copy_ops takes it (a padded piece longer than a vector, not a
    whole number of them, moves its elements one at a time)."""
    vectors, singles = ops if ops is not None else copy_ops(workload, hardware, site, elements, padding)
    seconds = vectors * hardware.copy_vector_seconds + singles * hardware.copy_element_seconds
    piece, lanes = row_piece(site.layout), hardware.target.vector_lanes(workload)
    if piece and piece > 1 and not masked_piece(piece, lanes, padding):
        parts = _parts(piece % lanes)
        saved = sum(max(hardware.copy_vector_seconds - w * hardware.copy_element_seconds, 0.0) for w in parts)
        seconds -= elements / piece * saved
    return seconds


def row_piece(layout) -> int | None:
    """Elements of a source row the pack's innermost loop copies in one run, when it keeps the
    source's rows innermost; None for a transposing pack or an affine input's window (no layout)."""
    if layout is None:
        return None
    return layout.bounds[-1][-1] if layout.inner_order[-1] == len(layout.dims) - 1 else None


def masked_piece(piece: int, lanes: int, padding: bool) -> bool:
    """Whether a packing copy splits its rows' pieces of `piece` elements in whole vectors of
    `lanes`, the last one masked: it reads through the input's zero padding and the piece is
    longer than a vector but not a whole number of them (backends/llvm_emit._copy_loops emits
    it so; copy_ops counts what that compiles to: its elements, one at a time)."""
    return padding and piece > lanes and piece % lanes != 0


def vector_ops(piece: int, lanes: int) -> int:
    """Loads (and as many stores) LLVM issues for a vectorised run of `piece` elements: a whole
    vector per `lanes`, then the rest in power-of-two parts (a 15-float piece on AVX-512 takes 8,
    4, 2 and 1: four, in the assembly of a TensorIR copy, against one for 8 or 16). A pack of
    gemm 127x251x509's A widened to 15 columns (k tile 255) ran 1.2x as long as one widened to
    16 (k tile 256) or to 10, 0.030 ms more (BENCHMARKS.md, Rounds session)."""
    return piece // lanes + len(_parts(piece % lanes))


def _parts(rest: int) -> list[int]:
    """The power-of-two parts LLVM splits a run of `rest` (< lanes) elements into."""
    return [1 << b for b in range(rest.bit_length()) if rest >> b & 1]


def thrashed_bytes(workload: Workload, hardware: Hardware, site, elements: float) -> float:
    """Bytes a packing copy of `elements` elements fetches into L1 again because its pieces are
    narrower than a line and come from more rows than the L1 sets those rows map to can hold.

    The copy reads a piece of each row of its innermost block, then the next piece of the same
    rows (backends/llvm_emit._copy_loops), which lies in the lines the first brought in, unless
    those rows, a multiple of the L1's set span apart (4 KiB: 64 sets of 64-byte lines), crowd
    fewer sets than their lines need: then every piece misses again, and L1 fetches a whole
    line per piece instead of the piece. On the AMD EPYC (Zen 4, 8-way 32 KiB L1) of
    BENCHMARKS.md, gemm 1024^3 `nkm:16,16,1 | nkm:16,16,1 | kmn:16,16,19 | knm:64,32,19` (A
    packed one element of each of 16 rows at a time, k tile 19 being prime) ran 25.9 ms, the
    same plan with k tile 16 (16-float pieces, a line each) 14.2 ms, predicted 16.2 and 12.4."""
    layout, t, elem = site.layout, workload.tensors[site.tensor], workload.elem_bytes
    l1 = hardware.levels[1] if len(hardware.levels) > 1 else None
    piece = row_piece(layout)
    if piece is None or piece * elem >= LINE_BYTES or not t.plain or l1 is None or not l1.ways:
        return 0.0
    rows = math.prod(b[-1] for b in layout.bounds[:-1])
    sets = l1.capacity_bytes // (l1.ways * LINE_BYTES)
    crowded = set_share(workload.dims[t.dims[-1]] * elem, piece * elem, sets) * sets  # sets the rows' lines use
    if rows <= crowded * l1.ways:
        return 0.0
    return elements * (LINE_BYTES / piece - elem)


def strided_inputs(workload: Workload, hardware: Hardware, orders, tiles, eff, padded, copied, split):
    """(tensor, row stride in bytes, bytes into L1, stride_stall share) of each input the
    micro-kernel reads in place (none of its caches copies it) a piece of a row at a time: its
    vectorised dim is its last, its runs (contiguous_run; `split`: parallel_ops) are
    shorter than its rows, and it is read more than once (read_once inputs stream from memory,
    charged by their runs). Only where the hierarchy has an L1 and the profile has stride_stall
    figures."""
    if not hardware.stride_stall or len(tiles) < 3:
        return []
    found = []
    for op in workload.ops:
        vector = micro_order(workload, op)[-1]
        for name in op.inputs:
            t = workload.tensors[name]
            if t.role != "input" or not t.plain or name in copied or t.dims[-1] != vector:
                continue
            if read_once(workload, op, name, eff, padded):
                continue
            run = contiguous_run(workload, orders, op, name, eff, padded, split.get(op.name, (None,))[0],
                                 hardware.cores)
            if run >= padded[t.dims[-1]]:
                continue  # whole rows, one after another
            stride = workload.dims[t.dims[-1]] * workload.elem_bytes  # the array's own rows: read in place
            share = stride_stall(hardware, stride)
            if share > 0:
                nbytes = float(data_volume(workload, orders, tiles, levels=[1], only=[name])[0])
                found.append((name, stride, nbytes, share))
    return found


def compute_weight(workload: Workload, hardware: Hardware, orders, tiles) -> float:
    """How much of a stall in the FMA loop reaches the plan's time: d(time)/d(compute) where
    compute overlaps the links in the target's norm (1 for the slowest alone), taken against
    the one link every plan pays, the compulsory traffic from memory. A stall in a loop waiting
    on memory anyway costs little: gpt-2's decode step (16x3072x768) read B's 12 KiB rows in
    place in 0.33 ms, as predicted without a stall; charged in full, the stall tipped the search
    to a plan that ran in 0.46."""
    compute = float(compute_seconds(workload, hardware, orders, tiles))
    nbytes = sum(workload.size(name) for name, t in workload.tensors.items() if t.role != "intermediate")
    memory = nbytes * workload.elem_bytes / hardware.levels[-1].bandwidth_bytes_per_s
    norm = hardware.target.overlap_norm
    if math.isinf(norm):
        return 1.0 if compute >= memory else 0.0
    return (compute / (compute ** norm + memory ** norm) ** (1 / norm)) ** (norm - 1) if compute > 0 else 0.0


def stride_stall(hardware: Hardware, stride: float) -> float:
    """The share of the L1 link's time for an input's bytes that an FMA loop reading its rows
    `stride` bytes apart stalls for beyond a contiguous read (Hardware.stride_stall: linear in
    the log of the stride between the strides calibrated, the nearer point's outside them).

    The L2 prefetcher follows a stream within a 4 KiB page, so rows that share a page are
    fetched ahead and rows each in a page of their own are not. On the Intel Xeon of
    BENCHMARKS.md (2 cores), the calibration's 4x4 micro-kernel reading 256 bytes of each row
    from L2 added 0-0.01, 0-0.13 and 0.13-0.24 of that link time with rows 1, 2 and 3 KiB
    apart (farther apart, 0.13 to 0.89 as the pages fell; the calibration stops at 3 KiB);
    gpt-2's projection (1024x768x768) read B's 768-float rows in place in 3.57 ms, and 3.32 ms
    with each 64-column panel of B packed (numpy 3.18), though the model had ranked the first
    ahead by the pack's 0.05 ms ("Stride session")."""
    points = hardware.stride_stall
    if not points:
        return 0.0
    return log_interp(points, stride)


def run_start(hardware: Hardware, run_bytes: float) -> float:
    """Bytes of memory stream one run's start costs. Calibrated on runs of two lengths
    (models/profile: SHORT_RUN_BYTES, RUN_BYTES): the figure of the nearer one outside them,
    linear in the run's length between them. Without the short figure, the figure for long
    runs, but no more than the run itself.

    The memory system overlaps the next run's start with this run's transfer, so short runs
    pay less than a whole start each, but not nothing: on the Intel Xeon of BENCHMARKS.md
    (2 cores, against the contiguous stream timed beside them), runs of 64, 128, 256 and
    512 B and 1, 2 and 4 KiB streamed at 1/4.35, 1/2.65, 1/1.75, 1/1.60, 1/1.57, 1/1.24 and
    1/1.17 of it: starts of 214, 211, 192, 307, 594, 450 and 700 B. Capped at the run, the
    1 KiB figure alone (627 B) gives 128- and 256-byte runs the same 1/2, and gemm
    8x4096x4096 with 128-byte runs of B ran 1.10x slower than with 256-byte runs, the two
    plans predicted within 0.1%. On the Zen 5 EPYC, 256 B and 1, 2 and 4 KiB runs streamed
    at 0.54x, 0.72x, 0.78x and 0.93x."""
    long, short = hardware.run_start_bytes, hardware.short_run_start_bytes
    if short is None:
        return min(long, run_bytes)
    return _by_run(run_bytes, short, long)


def _by_run(run_bytes: float, short: float, long: float) -> float:
    """A figure for runs of `run_bytes`, from its figures for SHORT_RUN_BYTES and RUN_BYTES: the
    nearer one's outside them, linear in the run's length between them."""
    along = min(max((run_bytes - SHORT_RUN_BYTES) / (RUN_BYTES - SHORT_RUN_BYTES), 0.0), 1.0)
    return short + along * (long - short)


def run_start_reach(hardware: Hardware, nbytes: float, run_bytes: float | None = None) -> float:
    """The share of a run start (run_start) that the runs of an `nbytes` input pay: calibrated
    per working-set size (Hardware.run_start_reach, on runs of RUN_BYTES), linear in the log of
    the size between the sizes measured; without that, all of it beyond the outermost level and
    none within. Runs of `run_bytes` at most SHORT_RUN_BYTES take Hardware.short_run_start_reach
    where it was calibrated, the shares for lengths between the two figures' interpolated (as
    run_start interpolates the figures); without `run_bytes`, the mean of the two shares (what a
    band's stall scales with).

    Runs cost more the larger the array they stride through, well before it leaves the last
    cache, as pages and rows outgrow what the TLB and the prefetchers track: on the Intel Xeon
    of BENCHMARKS.md (2 cores, 2 MiB L2 each), 128-byte runs streamed at 1/1.22, 1/1.51,
    1/1.76, 1/2.40 and 1/2.69 of the contiguous rate over 8, 16, 32, 64 and 960 MiB, and
    1 KiB runs at 1/1.10, 1/1.24, 1/1.41, 1/1.35 and 1/1.59, though the L3 streamed 59 GB/s
    contiguous up to 96 MiB and 32 GB/s at 256 MiB. Short runs reach their memory figure later
    than long ones: on the same Xeon in the "Reach session", 128-byte runs over 16 MiB added
    0.54 of the contiguous time against 1.48 from memory (a share of 0.36), 1 KiB runs 0.24
    against 0.38 (0.63); one share for both, their mean, charged llama's decode 8x4096x1024
    reading B in 128-byte runs 0.85 ms where it ran 0.51."""
    long = _reach(hardware.run_start_reach, hardware, nbytes)
    short = _reach(hardware.short_run_start_reach, hardware, nbytes) if hardware.short_run_start_reach else long
    return (long + short) / 2 if run_bytes is None else _by_run(run_bytes, short, long)


def run_start_paid(hardware: Hardware, run_bytes: float, nbytes: float) -> float:
    """Bytes of stream one `run_bytes` run's start costs an `nbytes` input: its run start at its
    share for that size and run length."""
    return run_start(hardware, run_bytes) * run_start_reach(hardware, nbytes, run_bytes)


def _reach(points, hardware: Hardware, nbytes: float) -> float:
    if not points:
        return 1.0 if nbytes > hardware.levels[-1].capacity_bytes else 0.0
    return log_interp(points, nbytes)


def log_interp(points, x):
    """The share at `x` (a number or an array) of calibrated (x, share) points: linear in the log
    of x between them, the nearer point's outside them."""
    xs, shares = zip(*points)
    share = np.interp(np.log(x), np.log(xs), shares)
    return float(share) if np.ndim(share) == 0 else share


def band_stall(hardware: Hardware, rows: int, broadcast: float = 1.0) -> float:
    """The share of an unpacked input's stream that reading it in bands of `rows` rows adds
    (Hardware.band_stall: linear in the log of the rows between the bands calibrated, the
    nearer band's outside them; none uncalibrated).

    `broadcast`: what the register tile does with each vector it loads of the input, in rows of
    the other operand it is multiplied with (a decode GEMM's 8x32 tile: 8 rows of A per vector of
    B). More FMAs between the input's loads leave fewer of them in flight, so a row's late start
    stalls longer: the share moves from band_stall (measured under one row, a GEMV's) towards
    Hardware.tall_band_stall (measured under tall_rows), linear in the rows. On the Intel Xeon of
    BENCHMARKS.md's "Warm-L3 session", the 1x4 GEMV micro-kernel's 64-row bands took 1.02x its
    8-row time from memory, an 8x2 one's 1.68x; llama's decode 8x4096x4096 under 8x32 tiles in
    64-row bands ran 2.96 ms against 1.51 in 16-row bands, both predicted about 1.31.

    The micro-kernel reads a piece of each of its L1 block's rows in turn, and the next blocks
    continue them: each row is a stream the hardware prefetcher must follow, and past the
    streams it follows at once, each row's next piece starts late. gemm 8x4096x1024 reading B
    through L1 blocks 8x32xk moving along 2048-wide rows ran in 0.323, 0.335, 0.339, 0.456 and
    0.450 ms for k = 8, 16, 32, 64 and 128 rows (Intel Xeon, two cores, bench/bands.py,
    BENCHMARKS.md "Band session"), all predicted 0.570 ms before the bands were costed. Graded,
    not a limit past which each piece counts as a run of its own: on the AMD EPYC Zen 4, a GEMV
    took 1.08-1.27x its 8-row time with 16-row bands and about 2x with 32 or more, while such a
    cut charged 16-row bands as much as 256-row ones ("Graded band session")."""
    points = hardware.band_stall
    if not points or rows <= 1:
        return 0.0
    share = log_interp(points, rows)
    tall, top = hardware.tall_band_stall, hardware.tall_rows
    if tall and top and broadcast > 1:
        share += (log_interp(tall, rows) - share) * min((broadcast - 1) / (top - 1), 1.0)
    return share


def input_passes(workload: Workload, hardware: Hardware, orders, tiles, name: str, nbytes: float) -> float:
    """How many times the plan streams unpacked input `name` (`nbytes`) over the link that
    stream_level gives it: its DV into that level over its size, at least 1. Each pass pays its
    runs' starts and its bands' stall again: llama's prefill 128x4096x4096 reading B in place
    under 13-row L2 blocks streams B ten times, and ran 21.9 ms against 17.6 for a plan packing
    B, both predicted about 15.3 with B's runs and bands charged once (Intel Xeon, BENCHMARKS.md
    "Warm-L3 session")."""
    level = stream_level(hardware, nbytes)
    dv = data_volume(workload, orders, tiles, levels=[level], hardware=hardware, only=[name], weighted=False)[0]
    return max(float(dv) / nbytes, 1.0)


def broadcast_rows(workload: Workload, hardware: Hardware, op, name: str, tile: dict) -> float:
    """What op's register tile `tile` does with each vector it loads of input `name` (band_stall's
    `broadcast`): its extent along the output's dims the input lacks, counted in vectors along the
    output's contiguous dim (a GEMM's B under an m x n tile: m; its A: n's vectors)."""
    out = workload.tensors[op.output].dims
    lanes = hardware.target.vector_lanes(workload)
    own = set(workload.tensors[name].dims)
    return float(math.prod(math.ceil(tile[x] / lanes) if x == out[-1] else tile[x] for x in out if x not in own))


def followed_rows(hardware: Hardware) -> int | None:
    """The widest band calibrated whose stall is under PLATEAU of the widest's: the band the polish
    narrows a wider one to (optimizer/local._band_moves), and the widest whose pieces copy_walk
    joins into runs. None without a stall.

    The level-off, not half of it: on the AMD EPYC Zen 3 of BENCHMARKS.md ("Zen 3 return
    session") bands of 8, 16, 32 and 64+ rows stalled 0, 49, 155 and 205%, and gemm 8x4096x1024
    copying B in 64-byte pieces of 18 rows ran in 2.01 ms, predicted 9.38 with every piece a run
    of its own (half the top put the limit at 16 rows); joined, at 18 rows' stall, 2.06. Pieces of
    64 rows there ran as runs of their own (15.0 ms for llama's 8x4096x4096, "Read-once
    session")."""
    points = hardware.band_stall or []
    top = max((share for _, share in points), default=0.0)
    calm = [int(rows) for rows, share in points if share < PLATEAU * top]
    return max(calm) if top > 0 and calm else None


def band_rows(workload: Workload, name: str, tiles, padded, orders, op) -> tuple[int, int]:
    """(rows, piece): the rows of input `name`'s row-major array that `op`'s walk (the plan's
    `orders`) reads in turn before the next piece of the same rows, and the elements it reads of
    each, when its L1 block holds a piece of its rows; (1, 0) when it reads whole rows, one
    after another (tiles effective). The L1 block's rows, times the trips of the loops above L1
    along the array's other dims inside the first one along its rows: bert-base ffn2
    (512x768x3072) reading B in place under 6x768x64 L2 tiles walks 64 rows of 1x16 L1 blocks
    down k before stepping along n, and ran in 25.1 ms against 18.9 for the plan that packs B,
    predicted 29.8 against 30.1 as 1-row bands (AMD EPYC Zen 3, BENCHMARKS.md "Piece-split
    session")."""
    dims = workload.tensors[name].dims
    block = [tiles[min(1, len(tiles) - 1)][x] for x in dims]
    if block[-1] >= padded[dims[-1]]:
        return 1, 0
    rows = math.prod(block[:-1])
    for x, j in reversed(walk(workload, orders, op)):
        steps = trips(tiles, padded, x, j)
        if j < 1 or steps <= 1 or x not in dims:
            continue
        if x == dims[-1]:
            break
        rows *= steps
    return rows, block[-1]


def contiguous_run(workload: Workload, orders, op, name: str, tiles, padded, split=None, cores: int = 1) -> int:
    """Elements in each contiguous run of input `name`'s row-major array as one thread's walk
    reads it unpacked (tiles effective; `split`, the op's parallel loop position, gives each of
    the `cores` threads a contiguous chunk of its trips): its L1 block's rows, grown while the
    loops around that block move it on along them.

    The L1 block, not the register tile's: the register tiles of one L1 block read all its rows
    within a few microseconds, and memory streams those as one run. gemm 1x4096x4096 on two
    cores, one register tile 1x256 each time: L1 blocks 16x256 ran in 1.24-1.31 ms, 16x512 in
    0.97-1.03, 8x1024 in 0.84-0.89 (register tile 1x128 under the 16x512 block: 0.95-1.00).
    A block whose next one continues its rows extends each row's run, though the rows are read
    in turn: gemm 8x4096x4096 with 128x32 L1 blocks of B moving along its rows through an L3
    block 2048 wide (one block per thread: runs of 2048 floats, half a row) ran at 0.77-0.86x the
    time of 64x64 blocks moving down its columns (runs of 64), Intel Xeon, BENCHMARKS.md.
    Or a private cache's whole block, where one thread's part of it is one contiguous piece of
    the array (rows read whole). How many rows the block reads in turn is band_stall's matter."""
    dims = workload.tensors[name].dims
    full = [padded[x] for x in dims]
    level = min(1, len(tiles) - 1)

    def run(block) -> int:
        elements = 1
        for b, f in zip(reversed(block), reversed(full)):
            elements *= b
            if b < f:
                break
        return elements

    block = [tiles[level][x] for x in dims]
    for x, j in reversed(walk(workload, orders, op)):
        t = thread_trips(tiles, padded, (x, j), split, cores)
        if j < level or x not in dims or t == 1:
            continue  # inside the block, the same block again (from the caches), or no move
        grown = [b * t if d == x else b for b, d in zip(block, dims)]
        if run(grown) == run(block):
            break  # the next block starts other runs
        block = grown

    def own(j: int) -> list[int]:  # one thread's part of a level-j block: a chunk of the split loop inside it
        px, pj = split or (None, len(tiles))
        return [thread_trips(tiles, padded, (x, pj), split, cores) * tiles[pj][x] if x == px and pj < j else tiles[j][x]
                for x in dims]

    whole = [math.prod(b) for b in map(own, range(level + 1, len(tiles) - 1)) if run(b) == math.prod(b)]
    return max([run(block), *whole])


def parallel_ops(workload: Workload, orders, tiles, cores: int) -> dict[str, tuple[tuple[str, int], bool]]:
    """Per op, the position the backend runs in parallel (costmodel.parallel_loops) and whether
    the op enters it itself (a chain's producer may run inside the consumer's parallel loop)."""
    if cores < 2:
        return {}
    picked = {}
    consumer = workload.ops[-1]
    loops = parallel_loops(workload, orders, tiles, cores)
    index, count = loops[-1]
    if int(index) >= 0 and int(count) >= 2:
        picked[consumer.name] = (parallel_candidates(workload, orders, consumer)[int(index)], True)
    for op, (index, count) in zip(workload.ops[:-1], loops[:-1]):
        if int(index) >= 0 and int(count) >= 2:
            picked[op.name] = (parallel_candidates(workload, orders, op)[int(index)], True)
        elif int(index) < 0 and consumer.name in picked:
            picked[op.name] = (picked[consumer.name][0], False)
    return picked


def _regions(workload: Workload, orders, tiles, padded, parallel: dict, root_passes: int, plans: dict) -> float:
    """Parallel loops entered per call: per op, the iterations of the loops around its parallel
    loop, and again around its zeroing when that is split off above the parallel loop (the
    zeroing nest repeats it); plus one per copy or crop made at the root, which is parallel itself.
    `plans`: per op, its output_plan."""
    total = float(root_passes) if parallel else 0.0
    for op in workload.ops:
        position, own = parallel.get(op.name, (None, False))
        if not own:
            continue
        plan = plans[op.name]
        positions = walk(workload, orders, op)
        if plan is not None:  # the order the kernel runs them in (one-trip loops may have moved)
            top = len(tiles) - 1
            positions = [p for p in positions if outer_shared(workload, op, p, top)] + plan.owned
        around = lambda p: _prod(trips(tiles, padded, x, j) for x, j in positions[: positions.index(p)])  # noqa: E731
        total += around(position)
        if plan is not None and positions.index(plan.start) < positions.index(position):
            total += around(plan.start)
    return total
