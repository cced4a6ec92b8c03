"""The kernel's own costs (models/kernel_costs.py) against the TensorIR the backend emits:
every packing copy's bytes and every parallel region entered, counted by walking the IR."""
import bisect
import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import WARM_L3, XEON, ZEN3, gemm_plan
from simulator import simulate_dv
from tir_walk import block_runs, copy_moves, parallel_axes, parallel_entries

from cachetile import builtin, make_plan, preset, tune
from cachetile.backends.llvm_build import build
from cachetile.models.kernel_costs import kernel_costs, parallel_ops
from cachetile.models.objective import charged_dv
from cachetile.models.hardware import Hardware, Level

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))

HOST = preset("host")
# AVX-512 registers (32 x 64 B) and a 12-way 48 KiB L1: the SIMD register model's terms alone.
REGISTERS_AND_L1 = Hardware(name="cpu", peak_flops=4e11, vector_bytes=64, levels=[
    Level(name="registers", capacity_bytes=2048, bandwidth_bytes_per_s=8e12),
    Level(name="L1", capacity_bytes=49152, bandwidth_bytes_per_s=4e11, ways=12)])
CASES = [
    ("gemm", {"m": 1000, "n": 1000, "k": 1000}),
    ("gemm", {"m": 127, "n": 251, "k": 509}),
    ("gemm", {"m": 8, "n": 4096, "k": 1024}),
    ("batch-gemm", {"b": 3, "m": 31, "n": 67, "k": 19}),
    ("gemm-chain", {"b": 3, "m": 197, "l": 197, "k": 64, "n": 64}),
    ("gemm-chain", {"m": 37, "l": 53, "k": 13, "n": 11}),
]


@pytest.mark.parametrize("kind,dims", CASES, ids=[f"{k}-{'x'.join(map(str, d.values()))}" for k, d in CASES])
def test_copies_and_parallel_regions_are_what_the_kernel_runs(kind, dims):
    w = builtin(kind, dims)
    result = tune(w, HOST, time_limit=3, top=2)
    for plan in [result.plan, *result.alternatives]:
        orders, tiles = [lp.order for lp in plan.levels], [lp.tile for lp in plan.levels]
        costs = kernel_costs(w, HOST, orders, tiles)
        body = build(w, HOST, plan).emitted.schedule.mod["main"].body
        runs = block_runs(body)
        copied = {}
        for tensor, _, nbytes, *_ in costs.copies:
            copied[tensor] = copied.get(tensor, 0) + nbytes
        emitted = {}
        for name, count in runs.items():  # A_global copies A; A_pad_global copies A's zero-padded view
            tensor = name.removesuffix("_global").removesuffix("_pad")
            if name.endswith("_global") and w.tensors.get(tensor) and w.tensors[tensor].role == "input":
                emitted[tensor] = emitted.get(tensor, 0) + count * w.elem_bytes
        assert emitted == copied
        assert costs.regions == parallel_entries(body)
        # What each copy's loop issues (kernel_costs.copy_ops): its vectors or single elements.
        lanes = HOST.vector_bytes // w.elem_bytes
        issued, modelled = {}, {}
        for name, (vectors, elements) in copy_moves(body, lanes).items():
            tensor = name.removesuffix("_global").removesuffix("_pad")
            if name.endswith("_global") and w.tensors.get(tensor) and w.tensors[tensor].role == "input":
                issued[tensor] = tuple(a + b for a, b in zip(issued.get(tensor, (0, 0)), (vectors, elements)))
        for tensor, vectors, elements in costs.copy_ops:
            modelled[tensor] = tuple(a + b for a, b in zip(modelled.get(tensor, (0, 0)), (vectors, elements)))
        assert modelled.keys() == issued.keys()
        for tensor in issued:
            assert modelled[tensor] == pytest.approx(issued[tensor], rel=1e-9)


def test_serial_seconds_add_to_the_overlapped_time():
    levels = [Level(name="registers", capacity_bytes=2048, bandwidth_bytes_per_s=1e12),
              Level(name="L1", capacity_bytes=49152, bandwidth_bytes_per_s=4e11, ways=12),
              Level(name="L2", capacity_bytes=1 << 20, bandwidth_bytes_per_s=2e11, ways=16)]
    hw = Hardware(name="cpu", levels=levels, peak_flops=4e11, cores=2, vector_bytes=64,
                  parallel_region_seconds=2e-6, call_seconds=1e-6)
    w = builtin("gemm-chain", {"m": 128, "l": 128, "k": 64, "n": 64})
    plan = tune(w, hw, time_limit=3, top=0).plan
    orders, tiles = [lp.order for lp in plan.levels], [lp.tile for lp in plan.levels]
    costs = kernel_costs(w, hw, orders, tiles)
    assert costs.seconds == pytest.approx(costs.copy_seconds + costs.regions * 2e-6 + 1e-6, rel=1e-12)
    # The copies' seconds split by link, as the refit rescales them (models/refit.py).
    assert costs.copy_seconds > 0 and costs.copy_seconds == pytest.approx(
        sum(b / lv.bandwidth_bytes_per_s for b, lv in zip(costs.stream_bytes, levels)), rel=1e-12)
    assert plan.serial_seconds == pytest.approx(costs.seconds, rel=1e-12)
    quiet = hw.model_copy(update={"parallel_region_seconds": 0.0, "call_seconds": 0.0})
    again = make_plan(w, quiet, orders, tiles)
    assert plan.predicted_seconds - again.predicted_seconds == pytest.approx(costs.regions * 2e-6 + 1e-6, rel=1e-6)
    assert [lp.copy_bytes for lp in plan.levels] == costs.copy_bytes


def test_a_copy_inside_the_loop_nest_reads_the_refills_the_links_would_carry():
    """gemm 8x4096x1024 (a decode step) on the Intel Xeon's calibrated bandwidths (conftest.XEON): B read in place, copied block by block inside the loop nest (64x128 blocks, B read
    twice since m is split in two at L3), or copied whole at the root. Measured side by side
    there (BENCHMARKS.md): 0.45, 0.83 and 1.25 ms. A copy inside the loop nest reads exactly the
    refills the links' DV counts for its input at its level (the simulator's), so the links
    carry them once: without that, the blocks were predicted slower than the root copy."""
    hw = XEON
    w = builtin("gemm", {"m": 8, "n": 4096, "k": 1024})
    plans = {
        "in place": ([["m", "n", "k"]] * 4, [{"m": 8, "n": 32, "k": 1}, {"m": 8, "n": 32, "k": 8},
                                              {"m": 8, "n": 32, "k": 8}, {"m": 8, "n": 2048, "k": 8}]),
        "blocks": ([["n", "m", "k"], ["n", "k", "m"], ["m", "n", "k"], ["m", "n", "k"]],
                   [{"m": 2, "n": 64, "k": 32}, {"m": 2, "n": 64, "k": 32}, {"m": 2, "n": 64, "k": 64},
                    {"m": 4, "n": 128, "k": 64}]),
        "root": ([["m", "n", "k"]] * 4, [{"m": 2, "n": 64, "k": 1}, {"m": 8, "n": 256, "k": 16},
                                          {"m": 8, "n": 256, "k": 1024}, {"m": 8, "n": 4096, "k": 1024}]),
    }
    orders, tiles = plans["blocks"]
    costs = kernel_costs(w, hw, orders, tiles)
    assert [(t, level, nbytes, key) for t, level, nbytes, _, key in costs.copies] == [
        (t, 3, simulate_dv(w, orders, tiles, 3, {t}), ("k", 3)) for t in ("A", "B")]
    moved = simulate_dv(w, orders, tiles, 3, {"A", "B"})
    # Both buffers (1 and 32 KiB) stay in L1: no link from L1 out carries A or B for the FMA loops.
    assert costs.relief == [0.0, moved, moved, moved]
    # A (32 KiB) is read from L1, B (16 MiB) from L3 over L2's link; both copies share the cores.
    assert costs.read_bytes == [simulate_dv(w, orders, tiles, 3, {"A"}), 0.0, simulate_dv(w, orders, tiles, 3, {"B"}), 0.0]
    plan = make_plan(w, hw, orders, tiles)
    links = [lp.link_seconds for lp in plan.levels]
    # The slowest link (B's refills from memory) is not charged beside the copy that reads them.
    assert plan.predicted_seconds < plan.serial_seconds + max(links[1:])
    assert plan.predicted_seconds >= plan.serial_seconds
    predicted = {name: make_plan(w, hw, o, t).predicted_seconds for name, (o, t) in plans.items()}
    assert predicted["in place"] < predicted["blocks"] < predicted["root"]
    # A copy at the root fills the buffer the loops then read: it spares no link.
    assert kernel_costs(w, hw, *plans["root"]).relief == [0.0] * 4


def test_a_block_copied_again_is_read_from_the_cache_that_keeps_what_the_loops_swept_since():
    """gemm 64x4096x1024 on the Intel Xeon's figures (conftest.XEON), B (16 MiB, kept by L3) copied
    in 64x128 blocks under 16-row tiles. With n, m, k outermost, each core walks its own columns
    of B (n is the parallel loop) and copies a block again for each of 4 row tiles, after a sweep
    of 1024x128 floats (512 KiB, kept by L2): the first pass over B comes from L3 (L2's link), the
    three others from L2 (L1's link). With k, m, n outermost, m is the parallel loop: each core
    copies every block once from L3, then again from L2 for its second row tile, after a sweep
    of 64 rows of B (1 MiB). A (256 KiB, kept by L2) is read from L2 either way: copied again
    for each column block, or once."""
    hw = XEON
    w = builtin("gemm", {"m": 64, "n": 4096, "k": 1024})
    tiles = [{"m": 4, "n": 32, "k": 1}, {"m": 4, "n": 32, "k": 64}, {"m": 16, "n": 128, "k": 64},
             {"m": 16, "n": 128, "k": 64}]
    b, a = w.size("B") * w.elem_bytes, w.size("A") * w.elem_bytes
    for top, parallel, b_from_l3, a_copies in ((["n", "m", "k"], "n", b, 32), (["k", "m", "n"], "m", 2 * b, 1)):
        orders = [["m", "n", "k"]] * 3 + [top]
        costs = kernel_costs(w, hw, orders, tiles)
        assert parallel_ops(w, orders, tiles, hw.cores)["gemm"][0] == (parallel, 3)
        copied = {t: simulate_dv(w, orders, tiles, 3, {t}) for t in ("A", "B")}
        assert [(t, nbytes) for t, _, nbytes, *_ in costs.copies] == [("A", copied["A"]), ("B", copied["B"])]
        assert (copied["A"], copied["B"]) == (a_copies * a, 4 * b)
        assert costs.read_bytes == [0.0, copied["A"] + copied["B"] - b_from_l3, b_from_l3, 0.0]


def test_copies_take_the_longer_of_what_their_loops_issue_and_their_streams():
    """With the calibrated per-vector and per-element figures (one core), a copy takes the
    longer of what its loop issues at those figures and its streams' time; gemm 127x251x509's
    plan here packs A element by element (its register tile's k step is one column) and B by
    vectors."""
    w = builtin("gemm", {"m": 127, "n": 251, "k": 509})
    orders = [["m", "n", "k"]] * 4
    tiles = [{"m": 16, "n": 16, "k": 1}] * 3 + [{"m": 127, "n": 16, "k": 509}]
    hw = XEON.model_copy(update={"cores": 1})  # 16-float vectors, whatever this machine has
    plain = kernel_costs(w, hw, orders, tiles)
    # A (padded to 128 rows) once, element by element; B's 509 x 16 panels (16 of them) in 16-float vectors.
    slow = kernel_costs(w, hw.model_copy(update={"copy_vector_seconds": 1e-6, "copy_element_seconds": 1e-7}),
                        orders, tiles)
    assert slow.copy_ops == [("A", 0.0, 128 * 509), ("B", 16 * 509, 0.0)]
    # Issuing far slower than the streams: each copy takes its loop's time alone.
    assert slow.copy_seconds == pytest.approx(16 * 509 * 1e-6 + 128 * 509 * 1e-7, rel=1e-9)
    assert slow.issue_seconds == pytest.approx(slow.copy_seconds - plain.copy_seconds, rel=1e-9)
    # What a refit rescales: per copy, its streams beside its loop's issue.
    assert [issued for _, issued in slow.overlaps] == pytest.approx([128 * 509 * 1e-7, 16 * 509 * 1e-6], rel=1e-9)
    links = [lv.bandwidth_bytes_per_s for lv in hw.levels]
    assert sum(sum(b / bw for b, bw in zip(nbytes, links)) for nbytes, _ in slow.overlaps) == pytest.approx(
        plain.copy_seconds, rel=1e-9)
    # Issuing far faster: the streams' time alone.
    fast = kernel_costs(w, hw.model_copy(update={"copy_vector_seconds": 1e-15, "copy_element_seconds": 1e-16}),
                        orders, tiles)
    assert fast.copy_seconds == plain.copy_seconds and fast.issue_seconds == 0.0
    assert slow.stream_bytes == fast.stream_bytes == plain.stream_bytes  # what a refit rescales is the streams alone


def test_a_part_of_a_piece_narrower_than_a_vector_costs_at_most_its_elements():
    """kernel_costs.issue_seconds: A's pieces of 17, 18, 20 and 24 floats issue a 16-float vector
    and a part of 1, 2, 4 and 8 (vector_ops); at 1 ns a vector and 0.3 ns an element, the parts
    of 1 and 2 cost their elements (0.3 and 0.6 ns), those of 4 and 8 a vector's 1 ns. Read
    through A's zero padding, each piece is split in two whole vectors, the last one masked
    (llvm_emit._copy_loops), whose lanes TVM moves one at a time: 0.3 ns each element."""
    from cachetile.models.caches import effective_tiles, input_caches
    from cachetile.models.kernel_costs import issue_seconds, row_piece

    if HOST.vector_bytes != 64:
        pytest.skip("the parts are AVX-512's")
    w = builtin("gemm", {"m": 127, "n": 251, "k": 509})
    priced = HOST.model_copy(update={"copy_vector_seconds": 1e-9, "copy_element_seconds": 3e-10})
    for piece, part_seconds in ((17, 3e-10), (18, 6e-10), (20, 1e-9), (24, 1e-9)):
        tiles = [{"m": 8, "n": 16, "k": 1}, *[{"m": 8, "n": 16, "k": piece}] * 2, {"m": 127, "n": 16, "k": 509}]
        padded, eff = effective_tiles(w, tiles)
        site = next(s for s in input_caches(w, [list("mnk")] * 4, eff, padded) if s.tensor == "A")
        assert row_piece(site.layout) == piece
        assert issue_seconds(w, priced, site, 100 * piece) == pytest.approx(100 * (1e-9 + part_seconds), rel=1e-9)
        assert issue_seconds(w, priced, site, 100 * piece, padding=True) == pytest.approx(100 * piece * 3e-10, rel=1e-9)


def test_tiles_leave_room_in_set_associative_caches():
    """A W-way level may be filled to 1 - 4/W (never under half): 12-way L1 2/3, 16-way 3/4."""
    levels = [Level(name="registers", capacity_bytes=2048, bandwidth_bytes_per_s=1e12),
              Level(name="L1", capacity_bytes=49152, bandwidth_bytes_per_s=4e11, ways=12),
              Level(name="L2", capacity_bytes=1 << 20, bandwidth_bytes_per_s=2e11, ways=16),
              Level(name="L3", capacity_bytes=1 << 22, bandwidth_bytes_per_s=1e11, ways=4)]
    hw = Hardware(name="cpu", levels=levels, peak_flops=4e11, vector_bytes=64)
    assert [hw.target.usable_bytes(lv) for lv in levels] == [2048, 32768, 786432, 1 << 21]
    plan = tune(builtin("gemm", {"m": 256, "n": 256, "k": 256}), hw, time_limit=3, top=0).plan
    assert all(lp.mu_bytes <= hw.target.usable_bytes(lv) for lp, lv in zip(plan.levels, levels))


def test_accumulators_stored_and_reloaded_cost_at_their_own_bandwidth():
    """A register tile reloaded at every k step (a spatial loop inside k around it) moves its
    accumulators at accumulator_bytes_per_s, both ways: the registers' DV counts the output's
    elements 2 x (register bandwidth / accumulator bandwidth) times, the inputs as before."""
    from cachetile.models.costmodel import data_volume

    plain = REGISTERS_AND_L1
    slow = plain.model_copy(update={"accumulator_bytes_per_s": 1e12})
    w = builtin("gemm", {"m": 32, "n": 64, "k": 48})
    orders, tiles = [["k", "m", "n"], ["m", "n", "k"]], [{"m": 4, "n": 32, "k": 1}, {"m": 32, "n": 64, "k": 48}]
    assert plain.target.register_weights(w)[("gemm", "C")] == 2.0
    assert slow.target.register_weights(w)[("gemm", "C")] == 2.0 * 8
    # k outermost in the walk of register tiles: the tiles of C (32 x 64) are reloaded at each k step.
    reloads = 48 * 32 * 64 * 4
    extra = data_volume(w, orders, tiles, hardware=slow)[0] - data_volume(w, orders, tiles, hardware=plain)[0]
    assert extra == pytest.approx((16 - 2) * reloads)
    assert make_plan(w, slow, orders, tiles).predicted_seconds > make_plan(w, plain, orders, tiles).predicted_seconds


def test_simd_register_tiles_keep_enough_accumulators_to_hide_the_fma_latency():
    """The SIMD target admits register tiles of FMA_CHAINS accumulator vectors or more per op (the
    whole output when it has fewer), and the searches plan within that space."""
    from cachetile.models.targets.simd_cpu import FMA_CHAINS
    from cachetile.optimizer.space import Space

    hw = REGISTERS_AND_L1
    assert FMA_CHAINS == 8

    def admits(w, tile):
        return bool(hw.target.admits(w, [tile, dict(w.dims)], 1))

    gemm = builtin("gemm", {"m": 64, "n": 64, "k": 64})  # 16 lanes: 4 vectors per row
    assert admits(gemm, {"m": 2, "n": 64, "k": 1}) and admits(gemm, {"m": 8, "n": 16, "k": 64})
    assert not admits(gemm, {"m": 1, "n": 64, "k": 1}) and not admits(gemm, {"m": 7, "n": 16, "k": 64})
    assert not admits(gemm, {"m": 3, "n": 32, "k": 8})  # 6 vectors
    small = builtin("gemm", {"m": 3, "n": 40, "k": 64})  # 3 rows of 3 vectors (the last one partial)
    assert admits(small, {"m": 3, "n": 40, "k": 1}) and not admits(small, {"m": 3, "n": 32, "k": 1})
    smaller = builtin("gemm", {"m": 3, "n": 32, "k": 64})  # 6 vectors in all: a tile must take them all
    assert admits(smaller, {"m": 3, "n": 32, "k": 1}) and not admits(smaller, {"m": 2, "n": 32, "k": 64})
    chain = builtin("gemm-chain", {"m": 4, "l": 16, "k": 8, "n": 64})  # C: 4 vectors in all, E: 16
    assert admits(chain, {"m": 4, "l": 16, "k": 1, "n": 32})
    assert not admits(chain, {"m": 2, "l": 16, "k": 1, "n": 64})  # E has 8, C only 2 of its 4
    rows = Space(gemm, hw).best_register_tiles(50)
    assert len(rows) and all(int(m) * -(-int(n) // 16) >= FMA_CHAINS for m, n, _ in rows)
    result = tune(gemm, hw, time_limit=3, top=5)
    for plan in [result.plan, *result.alternatives]:
        assert plan.levels[0].tile["m"] * -(-plan.levels[0].tile["n"] // 16) >= FMA_CHAINS
    plain = Hardware(name="plain", peak_flops=1e9, levels=REGISTERS_AND_L1.levels)  # no vectors: no rule
    assert bool(plain.target.admits(gemm, [{"m": 1, "n": 1, "k": 1}, dict(gemm.dims)], 1))


def test_the_fma_chains_the_pipes_need_set_the_pace_of_tiles_with_fewer():
    """A calibrated fma_chains (the Xeon of BENCHMARKS.md needs 9.3) slows a register tile of
    FMA_CHAINS accumulators to FMA_CHAINS / fma_chains of the peak, and leaves one of 16 at the peak;
    uncalibrated, FMA_CHAINS is all a tile needs."""
    from cachetile.models.costmodel import compute_seconds

    gemm = builtin("gemm", {"m": 64, "n": 64, "k": 64})  # 16 lanes
    chained = REGISTERS_AND_L1.model_copy(update={"fma_chains": 10.0})
    orders = [list("mnk"), list("mnk")]
    flops_seconds = 2 * 64 ** 3 / 4e11
    for tile, share in (({"m": 8, "n": 16, "k": 64}, 0.8), ({"m": 4, "n": 64, "k": 64}, 1.0)):
        tiles = [tile, dict(gemm.dims)]
        assert float(compute_seconds(gemm, chained, None, tiles)) == pytest.approx(flops_seconds / share, rel=1e-12)
        assert float(compute_seconds(gemm, REGISTERS_AND_L1, None, tiles)) == pytest.approx(flops_seconds, rel=1e-12)
    # With the orders, the out-of-order window adds OOO_FMAS / (FMAs per chain) vectors: 128 / 64.
    tiles = [{"m": 8, "n": 16, "k": 64}, dict(gemm.dims)]
    assert float(chained.target.issue_efficiency(gemm, gemm.ops[0], tiles, orders)) == pytest.approx(1.0)
    tiles = [{"m": 8, "n": 16, "k": 1}, {"m": 8, "n": 16, "k": 64}]
    assert float(chained.target.issue_efficiency(gemm, gemm.ops[0], tiles, orders)) == pytest.approx(1.0)
    few = chained.model_copy(update={"fma_chains": 12.0})
    assert float(few.target.issue_efficiency(gemm, gemm.ops[0], tiles, orders)) == pytest.approx(10 / 12)


def test_a_tile_fed_from_l2_keeps_the_share_of_peak_calibrated_for_its_width():
    """With fed_share calibrated (one vector 0.6, four 1.0), a one-vector-wide tile whose panels
    over the whole reduction outgrow half of L1 runs at 0.6 of the peak, a two-vector one at the
    share interpolated in the log of the width (0.8), a four-vector one at the peak; the same
    one-vector tile over a reduction whose panels fit L1 keeps the peak, and so does every tile
    uncalibrated."""
    from cachetile.models.costmodel import compute_seconds

    fed = REGISTERS_AND_L1.model_copy(update={"fed_share": [(1.0, 0.6), (4.0, 1.0)], "fma_chains": 1.0})
    deep = builtin("gemm", {"m": 64, "n": 64, "k": 1024})  # 16 lanes; L1 holds 48 KiB
    for width, share in ((16, 0.6), (32, 0.8), (64, 1.0)):
        tiles = [{"m": 8, "n": width, "k": 1}, dict(deep.dims)]
        # (8 + width) floats a k step over 1024 steps: 96 KiB and more, past half of L1
        assert float(fed.target.fed_share(deep, deep.ops[0], tiles[0])) == pytest.approx(share)
        plain = float(compute_seconds(deep, REGISTERS_AND_L1.model_copy(update={"fma_chains": 1.0}), None, tiles))
        assert float(compute_seconds(deep, fed, None, tiles)) == pytest.approx(plain / share, rel=1e-12)
    shallow = builtin("gemm", {"m": 64, "n": 64, "k": 64})  # 24 floats x 64 steps: 6 KiB
    assert float(fed.target.fed_share(shallow, shallow.ops[0], {"m": 8, "n": 16, "k": 1})) == 1.0
    assert float(REGISTERS_AND_L1.target.fed_share(deep, deep.ops[0], {"m": 8, "n": 16, "k": 1})) == 1.0


@pytest.mark.parametrize("hw", [ZEN3, XEON], ids=["zen3", "xeon"])
def test_a_simd_plan_whose_register_tile_passed_the_level_filter_is_admitted_as_admits_does(hw):
    """The search checks the register tiles at level 0's filter (SimdCpu.level_filter) and then
    only what admits adds to it (SimdCpu.admits_filtered): on random register tiles under an L1
    tile, every order, the filtered check of the rows that passed equals all of admits, and
    refuses some of them (the chains and registers it adds are real checks)."""
    rng = np.random.default_rng(3)
    for kind, dims in [("gemm", {"m": 96, "n": 128, "k": 64}), ("gemm-chain", {"m": 64, "k": 32, "l": 96, "n": 64})]:
        w = builtin(kind, dims)
        outer = [{x: min(e, 32) for x, e in w.dims.items()}, dict(w.dims), dict(w.dims), dict(w.dims)]
        rows = {x: rng.choice([v for v in (1, 2, 4, 8, 16, 32) if v <= t], size=400) for x, t in outer[0].items()}
        passed = np.broadcast_to(hw.target.level_filter(w, 0, [rows, *outer], 1), (400,))
        assert 0 < passed.sum() < 400
        kept = [{x: v[passed] for x, v in rows.items()}, *outer]
        refused = 0
        for order in [list(w.dims), list(reversed(w.dims))]:
            orders = [order] * 4
            whole = hw.target.admits(w, kept, 1, orders)
            assert np.array_equal(np.broadcast_to(hw.target.admits_filtered(w, kept, 1, orders), whole.shape), whole)
            refused += int((~whole).sum())
        assert refused and hw.target.admits_filtered(w, kept, 1) is True  # without orders: nothing to add


def test_a_whole_simd_plan_takes_register_tiles_of_two_rows_unless_the_output_has_one():
    """SimdCpu.admits with the orders (a whole plan): a one-row register tile reuses no B vector
    across rows and is not admitted where the output has more rows; a GEMV's is. Without the
    orders (ranking register tiles, whose multiples seed the outer levels) it is; and random
    feasible plans, which the fidelity benchmark draws with the orders, never have one."""
    import random

    from cachetile.models.targets.simd_cpu import MIN_ROWS
    from cachetile.optimizer.space import Space

    from kernels import random_plan

    hw = REGISTERS_AND_L1
    assert MIN_ROWS == 2
    orders = [list("mnk"), list("mnk")]
    for m, admitted in ((64, False), (1, True)):
        gemm = builtin("gemm", {"m": m, "n": 256, "k": 64})
        tiles = [{"m": 1, "n": 128, "k": 1}, dict(gemm.dims)]
        assert bool(hw.target.admits(gemm, tiles, 1, orders)) is admitted
        assert bool(hw.target.admits(gemm, tiles, 1))
    gemm = builtin("gemm", {"m": 64, "n": 256, "k": 64})
    rng = random.Random(0)
    plans = [random_plan(Space(gemm, hw), rng) for _ in range(20)]
    assert all(tiles[0]["m"] >= 2 for _, tiles in plans)


def test_a_convolution_window_takes_a_register_per_output_point():
    """Register MU of a 3x3 conv tile: its accumulators, one step of the weights' vectors, and
    the input window's elements of a step (one per output point: neighbours reuse them), while
    a GEMM's broadcast input (no window) takes one register."""
    from cachetile.models.costmodel import level_usage

    conv = builtin("conv2d", {"n": 1, "c": 64, "h": 56, "w": 56, "k": 64, "r": 3, "s": 3},
                   params={"pad": 1, "layout": "nhwc"})
    hw = REGISTERS_AND_L1
    tile = {"n": 1, "oh": 2, "ow": 7, "k": 32, "kh": 3, "kw": 3, "c": 1}
    assert float(level_usage(conv, hw, 0, tile)) == (2 * 7 * 2 + 2 + 2 * 7) * 64
    gemm = builtin("gemm", {"m": 64, "n": 64, "k": 64})
    assert float(level_usage(gemm, hw, 0, {"m": 14, "n": 32, "k": 1})) == (14 * 2 + 2 + 1) * 64


def test_a_cache_moves_no_more_than_a_fitting_outer_tile_and_a_chain_adds_its_intermediates():
    """effective_dv: a cache's link carries the least DV of its own tile, of an outer tile that
    fits it, or of the whole problem when that fits; the outermost level standing in adds a
    chain's intermediates (written and read back once), which its DV leaves out."""
    from cachetile.models.objective import WholeProblem, effective_dv, whole_problem

    dv, mu = [900.0, 500.0, 300.0, 100.0], [10.0, 40.0, 200.0, 700.0]
    caches = [None, 64, 1000, None]
    plain = effective_dv(dv, mu, caches, WholeProblem(400.0, 5000.0, 0.0))
    assert plain == [900.0, 500.0, 100.0, 100.0]  # L1: no outer tile fits 64; L2: the outermost's 100
    chain = effective_dv(dv, mu, caches, WholeProblem(400.0, 5000.0, 150.0))
    assert chain == [900.0, 500.0, 250.0, 100.0]  # 100 + 150 of intermediates; the level's own DV stays
    fits = effective_dv(dv, mu, caches, WholeProblem(120.0, 900.0, 150.0))
    assert fits[2] == 120.0  # the whole problem fits L2 and moves less
    w = builtin("gemm-chain", {"m": 64, "l": 48, "k": 32, "n": 16})
    whole = whole_problem(w, HOST)
    assert whole.dv == (64 * 32 + 32 * 48 + 64 * 48 + 48 * 16 + 64 * 16) * 4
    assert whole.intermediates == 2 * 64 * 48 * 4
    assert whole_problem(builtin("gemm", {"m": 8, "n": 8, "k": 8}), HOST).intermediates == 0.0


GEMV = builtin("gemm", {"m": 1, "n": 4096, "k": 4096})  # llama-7b's decode: 64 MiB of B
GEMV_ORDERS = [["n", "k", "m"]] * 4


def _gemv_band(rows: int) -> list[dict]:
    """Register tiles 1x256 under L1 tiles of `rows` rows of B, each thread's 2048 columns."""
    return [{"m": 1, "n": 256, "k": 1}, {"m": 1, "n": 256, "k": rows}, {"m": 1, "n": 2048, "k": rows},
            {"m": 1, "n": 2048, "k": rows}]


def test_the_memory_link_idles_while_the_last_cache_holds_the_whole_problem():
    """objective.warm_levels: a problem the L3 holds and the L2 does not stays in the L3 from one
    call to the next, so its memory link costs nothing; the bytes are still reported, and the
    links inside keep their charges. Bands of 6 rows (4096 is no multiple) copy B into a padded
    buffer: measured 1.58 ms against 0.99-1.01 for bands of 8 read in place (numpy 1.12); charged
    at memory's rate, the copy looked 1% faster."""
    from cachetile.models.objective import warm_levels, whole_problem

    eight = make_plan(GEMV, WARM_L3, GEMV_ORDERS, _gemv_band(8))
    last = eight.levels[-1]
    assert last.link_seconds == 0.0 and last.expected_bytes >= GEMV.size("B") * 4
    l2 = WARM_L3.levels[2]
    assert eight.levels[2].link_seconds == pytest.approx(eight.levels[2].dv_bytes / l2.bandwidth_bytes_per_s, rel=0.01)
    assert eight.levels[2].link_seconds > 0.0
    six = make_plan(GEMV, WARM_L3, GEMV_ORDERS, _gemv_band(6))
    assert six.levels[-1].copy_bytes >= GEMV.size("B") * 4  # B copied whole
    assert six.predicted_seconds > 1.2 * eight.predicted_seconds
    # An L3 that cannot hold it is filled from memory at every call.
    small = WARM_L3.model_copy(update={"levels": [*WARM_L3.levels[:3], WARM_L3.levels[3].model_copy(
        update={"capacity_bytes": 32 << 20})]})
    cold = make_plan(GEMV, small, GEMV_ORDERS, _gemv_band(8))
    assert cold.levels[-1].link_seconds > 0.0 and cold.predicted_seconds > eight.predicted_seconds
    # A problem the L2 holds keeps every link charged (the exhaustive search's bounds need them).
    caches = [WARM_L3.target.cache_bytes(i) for i in range(4)]
    held = whole_problem(GEMV, WARM_L3).mu
    assert warm_levels(held, caches) == [3]
    assert warm_levels(caches[2], caches) == [] and warm_levels(caches[3] + 1, caches) == []
    assert warm_levels(held, [None, None, None, None]) == []


def test_the_outermost_cache_keeps_a_sweep_of_sliding_windows():
    """objective.outermost: a depthwise conv tiled in single output rows reloads each input row
    with every window that covers it (Accera's rule); the outermost cache, holding a sweep of
    the rows, moves what one image's tile moves: each array once. The memory link also carries
    the output's write-back."""
    from cachetile.models.costmodel import data_volume
    from cachetile.models.objective import effective_dv, outermost, time_objective, whole_problem

    hw = _streaming_hardware(0.0)  # with a 120 KiB L2: one image fits, not the whole problem
    hw = hw.model_copy(update={"levels": [*hw.levels[:2], hw.levels[2].model_copy(update={"capacity_bytes": 120 << 10})]})
    w = builtin("conv2d", dict(n=2, c=16, h=20, w=20, k=16, r=3, s=3), params={"pad": 1, "groups": 16})
    order, rows = list(w.dims), {**w.dims, "n": 1, "oh": 1}
    once = (2 * 22 * 22 * 16 + 2 * 20 * 20 * 16 + 3 * 3 * 16) * 4  # input (zero-padded), output, weights
    whole = whole_problem(w, hw)
    (swept, _), *_ = outermost(w, hw, whole, order, rows).sweeps
    assert swept == once
    own = float(data_volume(w, [order], [rows], levels=[0], hardware=hw, offset=2)[0])
    assert own > 2.5 * 2 * 22 * 22 * 16 * 4  # each input row about three times
    dv, mu = [0.0, 0.0, own], [0.0, 0.0, 1000.0]
    charged = effective_dv(dv, mu, time_objective(hw).caches, whole, outermost(w, hw, whole, order, rows))
    assert charged[2] == once + 2 * 20 * 20 * 16 * 4
    # A GEMM's row tiles reload all of B for each; a sweep of n holds B, and each array moves once.
    gemm = builtin("gemm", {"m": 256, "n": 96, "k": 80})
    tile = {"m": 16, "n": 32, "k": 80}
    assert float(data_volume(gemm, [["m", "n", "k"]], [tile], levels=[0], hardware=hw, offset=2)[0]) == \
        (256 * 80 + 16 * 80 * 96 + 256 * 96) * 4
    (moved, held), *_ = outermost(gemm, hw, whole_problem(gemm, hw), ["m", "n", "k"], tile).sweeps
    assert (moved, held) == ((256 * 80 + 80 * 96 + 256 * 96) * 4, (16 * 80 + 80 * 96 + 16 * 96) * 4)
    # Where the whole problem fits, it stands in, and moves less than any sweep.
    small = builtin("gemm", {"m": 64, "n": 96, "k": 80})
    assert outermost(small, hw, whole_problem(small, hw), ["m", "n", "k"], tile).sweeps == []


# Registers, L1, L2 and L3 of this machine for an AVX2 core: a 48 KiB 12-way L1 (32 KiB usable).
AVX2_CACHES = Hardware(name="cpu", peak_flops=4e11, vector_bytes=32, levels=[
    Level(name="registers", capacity_bytes=512, bandwidth_bytes_per_s=8e12),
    Level(name="L1", capacity_bytes=49152, bandwidth_bytes_per_s=4e11, ways=12),
    Level(name="L2", capacity_bytes=1 << 20, bandwidth_bytes_per_s=2e11, ways=16),
    Level(name="L3", capacity_bytes=32 << 20, bandwidth_bytes_per_s=1e11, ways=16)])
# A chain whose consumer walks four 16-column blocks of D (113 x 16) across each 5-row L1 tile.
SWEPT_CHAIN = builtin("gemm-chain", {"m": 40, "l": 113, "k": 64, "n": 64})
SWEPT_ORDERS = [["m", "l", "k", "n"]] * 4
SWEPT_TILES = [{"m": 5, "l": 16, "k": 1, "n": 16}, {"m": 5, "l": 113, "k": 64, "n": 16},
               dict(SWEPT_CHAIN.dims), dict(SWEPT_CHAIN.dims)]


def _dv_and_mu(w, hw, orders, tiles) -> tuple[list[float], list[float]]:
    """Each level's DV and MU, innermost first: what charged_dv and effective_dv take."""
    from cachetile.models.costmodel import data_volume, level_usage

    return ([float(d) for d in data_volume(w, orders, tiles, hardware=hw)],
            [float(level_usage(w, hw, j, t)) for j, t in enumerate(tiles)])


# An AVX2 core with a Zen 4's data caches: 32 KiB 8-way L1d, 1 MiB 8-way L2.
EIGHT_WAY = Hardware(name="cpu", peak_flops=1.7e11, vector_bytes=32, levels=[
    Level(name="registers", capacity_bytes=512, bandwidth_bytes_per_s=6.6e11),
    Level(name="L1", capacity_bytes=32768, bandwidth_bytes_per_s=3.3e11, ways=8),
    Level(name="L2", capacity_bytes=1 << 20, bandwidth_bytes_per_s=1.7e11, ways=8),
    Level(name="L3", capacity_bytes=32 << 20, bandwidth_bytes_per_s=4e10, ways=16)])


def test_rows_that_crowd_a_few_sets_stream_apart_from_what_the_cache_keeps():
    """objective.grown_sweeps(streamed=...): gemm 256^3 in 6x16 tiles reads 16-column panels of
    B in place, 256 rows 1 KiB apart, which crowd into 4 of an 8-way L1's 64 sets. The sweep of
    the L2 tile along k (6 rows of A, a panel of B) does not fit with B kept, so the time
    objective charges L1 A's refill at every panel. In the expected traffic B streams through its
    4 sets and the rest keep the 6 rows of A across the panels: B once per 6-row block, A and C
    once (m padded to 258). Valgrind's 32 KiB 8-way L1 missed 11.7 MiB for the whole kernel;
    11.3 expected, 15.0 with A refilled."""
    from cachetile.models.crowding import crowding
    from cachetile.models.traffic import padded_problem

    hw = EIGHT_WAY
    w = builtin("gemm", {"m": 256, "n": 256, "k": 256})
    orders = [list("mnk"), list("nkm"), list("mnk"), list("mnk")]
    tiles = [{"m": 6, "n": 16, "k": 1}] * 3 + [{"m": 6, "n": 256, "k": 256}]
    assert crowding(w, hw, tiles).names == ("B",)
    padded, inside = padded_problem(w, tiles)
    dv, mu = _dv_and_mu(padded, hw, orders, inside)
    blocks = 258 // 6
    a_per_panel = blocks * (256 // 16) * 6 * 256 * 4
    assert charged_dv(padded, hw, dv, mu, orders, inside)[1] == dv[1] == \
        blocks * 256 * 256 * 4 + a_per_panel + 258 * 256 * 4
    kept = [hw.target.kept_bytes(j) for j in range(len(tiles))]
    assert charged_dv(padded, hw, dv, mu, orders, inside, kept)[1] == blocks * 256 * 256 * 4 + 2 * 258 * 256 * 4


def test_rows_crowding_a_full_set_miss_as_often_as_another_line_lands_there():
    """objective.crowded_misses: batch-gemm 4x96x128x64 in 4x16 tiles (k swept whole) reads
    16-column panels of B in place, 64 rows 512 bytes apart: one line each in 8 of an 8-way
    L1's 64 sets, 8 to a set, which leaves no way free. Between two uses of a line, A's 4 rows
    of 64 and C's 4x16 add 20 lines spread over the 64 sets; under LRU a crowded set misses its
    whole turn when one of them lands there: 1 - exp(-20/64) of B's reuses. Valgrind's 32 KiB
    8-way L1 missed 1.93 MiB for the whole kernel, 1.89 expected this way; 4.13 with no reuse
    of B, 1.06 with all. With a way to spare a set misses only when two land; 64 rows in 4
    sets never fit."""
    from cachetile.models.costmodel import level_usage
    from cachetile.models.crowding import crowding
    from cachetile.models.objective import crowded_misses

    w = builtin("batch-gemm", {"b": 4, "m": 96, "n": 128, "k": 64})
    l1 = EIGHT_WAY.levels[1]
    tiles = [{"b": 1, "m": 4, "n": 16, "k": 1}] * 2 + [dict(w.dims)] * 2
    swept_k = {"b": 1, "m": 4, "n": 16, "k": 64}
    crowd = crowding(w, EIGHT_WAY, tiles)
    assert crowd.names == ("B",) and crowd.crowded(swept_k)["B"] == (64, 64, 8 / 64)
    held = level_usage(w, EIGHT_WAY, 1, swept_k)
    assert held == (4 * 64 + 64 * 16 + 4 * 16) * 4
    others = 20 / 64
    assert crowded_misses(l1, crowd.crowded(swept_k), held)["B"] == pytest.approx(1 - math.exp(-others))
    spare = l1.model_copy(update={"ways": 9, "capacity_bytes": 9 * 64 * 64})
    assert crowded_misses(spare, crowd.crowded(swept_k), held)["B"] == \
        pytest.approx(1 - math.exp(-others) * (1 + others))
    assert crowded_misses(l1, {"B": (256, 64, 4 / 64)}, held)["B"] == 1.0


def test_an_inner_cache_keeps_the_sweep_of_its_innermost_loop():
    """objective.swept: Accera's rule reloads D's four blocks with every 5-row L1 tile; an L1
    that holds the tile grown along n (32 468 B of its 32 KiB usable share) keeps D across the
    tiles, as valgrind's L1 did on this plan at 2x97x113 (0.76 MiB missed for the whole kernel,
    where the refills alone are 1.42 MiB). Neither the L2 tile nor the whole problem fits L1.
    The grown tile's DV is the brute-force simulator's."""
    from simulator import simulate_dv

    from cachetile.models.costmodel import level_usage
    from cachetile.models.objective import swept, time_objective, whole_problem

    w, hw, orders, tiles = SWEPT_CHAIN, AVX2_CACHES, SWEPT_ORDERS, SWEPT_TILES
    own = simulate_dv(w, orders, tiles, 1)
    grown = [tiles[0], {**tiles[1], "n": 64}, *tiles[2:]]
    held = simulate_dv(w, orders, grown, 1)
    assert own - held == 7 * 113 * 64 * 4  # D once, not once in each of 8 row tiles
    whole = whole_problem(w, hw)
    (dv, mu), *_ = swept(w, hw, whole, orders, tiles).inner[1]
    assert (dv, mu) == (held, level_usage(w, hw, 1, grown[1]))
    assert mu <= time_objective(hw).caches[1] < min(level_usage(w, hw, 1, tiles[2]), whole.mu)
    dvs, mu = _dv_and_mu(w, hw, orders, tiles)
    charged = charged_dv(w, hw, dvs, mu, orders, tiles)
    assert (dvs[1], charged[1]) == (own, held)


def test_a_chains_inner_cache_keeps_the_sweep_of_the_op_running():
    """objective.op_sweeps: the backend runs the producer's whole nest, then the consumer's, so
    an L1 keeps the consumer's tile grown along l (its row block of C, all of D's column block)
    although the producer's grown tile (all of B) overflows it. The refill rule reloads C's row
    block for every column tile of E; the stand-in moves it once, as the brute-force simulator
    counts each op at its own tile and at the grown one. (chain 2x97x113 on a 32 KiB 8-way L1:
    valgrind missed 0.73x the expected bytes without it, 0.97x with it; BENCHMARKS.md.)"""
    from simulator import simulate_dv

    from cachetile.models.objective import held_bytes, op_sweeps

    w = builtin("gemm-chain", {"m": 36, "l": 48, "k": 32, "n": 16})
    orders = [list("lmkn")] * 4
    tiles = [{"m": 3, "l": 8, "k": 1, "n": 8}, {"m": 3, "l": 16, "k": 32, "n": 8},
             {"m": 3, "l": 48, "k": 32, "n": 8}, dict(w.dims)]
    grown = [tiles[0], {**tiles[1], "l": 48}, *tiles[2:]]
    fit, producer, consumer = 4096, ["A", "B", "C"], ["C", "D", "E"]
    assert held_bytes(w, tiles[1], producer) <= fit < held_bytes(w, grown[1], producer)
    assert held_bytes(w, grown[1], consumer) <= fit
    own = simulate_dv(w, orders, tiles, 1, ops={"gemm1"})
    kept = simulate_dv(w, orders, grown, 1, ops={"gemm2"})
    assert kept < simulate_dv(w, orders, tiles, 1, ops={"gemm2"})
    assert op_sweeps(w, AVX2_CACHES, 1, orders[1:], tiles[1:], tiles[2], fit) == [
        (own + kept, max(held_bytes(w, tiles[1], producer), held_bytes(w, grown[1], consumer)))]
    # Where not even the producer's own tile fits, the ops stand in for nothing; one op, neither.
    assert op_sweeps(w, AVX2_CACHES, 1, orders[1:], tiles[1:], tiles[2], 1024) == []
    gemm = builtin("gemm", {"m": 36, "n": 48, "k": 32})
    assert op_sweeps(gemm, AVX2_CACHES, 1, [list("nmk")] * 3, [{"m": 3, "n": 16, "k": 32}] * 3,
                     dict(gemm.dims), fit) == []


def test_a_cache_that_cannot_hold_a_chains_outermost_blocks_reloads_them_at_every_trip():
    """objective.turns: outermost tiles of 6 query rows whose producer reads all of K and whose
    consumer reads all of V (512 KiB each). The backend runs the producer at the outermost
    level's m loop, so the ops take turns between those tiles. Each op's MU fits L2's usable
    768 KiB, both do not: LRU evicts K while V streams, and V while the next tile's producer
    reads K, so L2 moves every block at every trip: more than its own DV (the simulator's),
    and far more than the outermost tile's reuse that stood in for it. (Attention 2048 x 128
    ran 1.5x as long as a plan predicted 3% slower while L2 was charged that reuse.)"""
    from simulator import simulate_dv

    from cachetile.models.costmodel import level_usage
    from cachetile.models.objective import effective_dv, held_bytes, swept, time_objective, turns, whole_problem

    w, hw = builtin("gemm-chain", {"m": 48, "l": 2048, "k": 64, "n": 64}), AVX2_CACHES
    orders = [["m", "l", "k", "n"]] * 4
    top = {"m": 6, "l": 2048, "k": 64, "n": 64}
    tiles = [{"m": 6, "l": 16, "k": 1, "n": 16}, {"m": 6, "l": 64, "k": 64, "n": 16}, {**top, "n": 32}, top]
    every = 4 * (6 * 64 + 2048 * 64 + 6 * 2048 + 2048 * 64 + 6 * 64)  # Q, K, S, V and O's blocks
    each = level_usage(w, hw, 3, top)
    assert held_bytes(w, top) == every and turns(w, top) == (each, every, 8)
    assert each <= time_objective(hw).caches[2] < every
    dvs, mu = _dv_and_mu(w, hw, orders, tiles)
    assert dvs[2] == simulate_dv(w, orders, tiles, 2) < 8 * every
    assert charged_dv(w, hw, dvs, mu, orders, tiles)[2] == 8 * every
    # Without the turns, the outermost tile's reuse (K and V once) stood in for L2.
    whole = whole_problem(w, hw)
    reuse = swept(w, hw, whole, orders, tiles)._replace(turns=(0.0, 0.0, 0.0))
    assert effective_dv(dvs, mu, time_objective(hw).caches, whole, reuse)[2] < 8 * every / 4
    # Where all fit (L3), where not one op's do (L1), or with one op, nothing is added.
    charged = charged_dv(w, hw, dvs, mu, orders, tiles)
    assert charged[3] < 8 * every and charged[1] == effective_dv(dvs, mu, time_objective(hw).caches, whole, reuse)[1]
    assert turns(builtin("gemm", {"m": 48, "n": 64, "k": 2048}), {"m": 6, "n": 64, "k": 2048}) == (0.0, 0.0, 0.0)


def test_an_inner_cache_that_holds_a_sweep_of_the_outermost_tile_keeps_its_reuse():
    """objective.outermost: outermost tiles of 22 x 128 x 10 (loops m, k, n from the outside)
    reload C's 22-row block at every k step under the refill rule, and so do the L2 tiles inside
    them. L2 (768 KiB usable) holds the outermost tile grown along n and k: all of B and one row
    block of A and C. So it moves each array once, as the simulator counts for that grown tile,
    not the 11x more its own DV says. The whole problem does not fit, and L1 holds no sweep.
    (gemm 1000^3 in 22 x 128 x 10 outermost tiles: L2 was charged 10 ms of a kernel that ran in
    11.2 ms; BENCHMARKS.md, "Outer-sweep session".)"""
    from simulator import simulate_dv

    from cachetile.models.costmodel import level_usage
    from cachetile.models.objective import effective_dv, swept, time_objective, whole_problem

    w, hw = builtin("gemm", {"m": 176, "n": 1024, "k": 160}), AVX2_CACHES
    orders = [["m", "n", "k"], ["m", "n", "k"], ["n", "m", "k"], ["m", "k", "n"]]
    tiles = [{"m": 11, "n": 16, "k": 1}, {"m": 11, "n": 16, "k": 5}, {"m": 22, "n": 16, "k": 10},
             {"m": 22, "n": 128, "k": 10}]
    caches, whole = time_objective(hw).caches, whole_problem(w, hw)
    grown = {"m": 22, "n": 1024, "k": 160}
    assert level_usage(w, hw, 3, grown) <= caches[2] < whole.mu
    once = 4 * (176 * 160 + 160 * 1024 + 176 * 1024)  # A, B and C, each moved once
    assert simulate_dv(w, [orders[-1]], [grown], 0) == once
    dvs, mu = _dv_and_mu(w, hw, orders, tiles)
    assert dvs[2] == simulate_dv(w, orders, tiles, 2) > 10 * once
    charged = charged_dv(w, hw, dvs, mu, orders, tiles)
    assert charged[2] == once
    # Without the outermost tile's sweeps, nothing stood in for L2 below its own DV; L1 is as it was.
    without = effective_dv(dvs, mu, caches, whole, swept(w, hw, whole, orders, tiles)._replace(sweeps=[]))
    assert without[2] == dvs[2] and without[1] == charged[1]


def test_each_core_keeps_its_share_of_the_parallel_loop_in_its_private_cache():
    """objective.core_sweeps: outermost tiles of 22 x 128 x 6 walked k, m, n from the outside, on 2
    cores; the backend runs m (12 trips) in parallel. All of C (1.08 MB) overflows L2's 768 KiB
    usable share, so every sweep of the shared walk reloads it at each k step. Each core walks
    its own 6 row tiles, and its half of C with B's 6-row slab (570 KiB) stays in its L2: A and C
    move once, B once per core, as the simulator counts for the core's tile (132 rows, n whole)
    with the loop over the cores outermost. (gemm 197x2304x768 in 33x192x6 tiles: L2 was charged
    4.1 ms of a kernel that ran in 3.3 ms; BENCHMARKS.md, "Core-share session".)"""
    from simulator import simulate_dv

    from cachetile.models.costmodel import level_usage
    from cachetile.models.objective import effective_dv, swept, time_objective, whole_problem

    w, hw = builtin("gemm", {"m": 264, "n": 1024, "k": 96}), AVX2_CACHES.model_copy(update={"cores": 2})
    orders = [["m", "n", "k"], ["m", "n", "k"], ["m", "n", "k"], ["k", "m", "n"]]
    tiles = [{"m": 11, "n": 16, "k": 1}, {"m": 11, "n": 16, "k": 6}, {"m": 22, "n": 16, "k": 6},
             {"m": 22, "n": 128, "k": 6}]
    caches, whole = time_objective(hw).caches, whole_problem(w, hw)
    share = {"m": 132, "n": 1024, "k": 6}
    assert level_usage(w, hw, 3, share) <= caches[2] < level_usage(w, hw, 3, {**share, "m": 264})
    a, b, c = 264 * 96, 96 * 1024, 264 * 1024
    assert simulate_dv(w, [["m", "k", "n"]], [share], 0) == 4 * (a + 2 * b + c)
    dvs, mu = _dv_and_mu(w, hw, orders, tiles)
    assert charged_dv(w, hw, dvs, mu, orders, tiles)[2] == 4 * (a + 2 * b + c)
    # Without the cores' shares, the least stand-in reloads C at each of the 16 k steps.
    top = swept(w, hw, whole, orders, tiles)
    without = effective_dv(dvs, mu, caches, whole, top._replace(cores=[]))
    assert without[2] > 16 * 4 * c
    # On one core nothing changes.
    one = AVX2_CACHES.model_copy(update={"cores": 1})
    assert swept(w, one, whole_problem(w, one), orders, tiles).cores == []


def test_a_cores_share_stands_in_only_once_the_loops_inside_it_are_whole():
    """objective.core_sweeps: 11 x 16 x 1 tiles at every level, walked m, n, k, on 2 cores; the
    backend runs m (8 trips) in parallel. Each row tile walks all of B's columns (1.5 MB, twice
    L2's usable share) before the next starts, so B streams into L2 once per row tile, as the
    simulator counts for the outermost tile's k sweep. A core's four row tiles taken together
    (44 x 16 x 96, 25 KiB) would read B once: that holds only when n and k run whole inside
    them. (vit-b/16's MLP in 9x32x1 tiles was charged so and ran 2.8x the prediction.) L1 moves
    its own DV: B's rows lie 16 KiB apart, so the sweep's 96 lines of B share one of its sets
    (crowding)."""
    from simulator import simulate_dv

    from cachetile.models.costmodel import level_usage
    from cachetile.models.objective import swept, time_objective, whole_problem

    w, hw = builtin("gemm", {"m": 88, "n": 4096, "k": 96}), AVX2_CACHES.model_copy(update={"cores": 2})
    orders, tiles = [["m", "n", "k"]] * 4, [{"m": 11, "n": 16, "k": 1}] * 4
    caches = time_objective(hw).caches
    a, b, c = 88 * 96, 96 * 4096, 88 * 4096
    assert level_usage(w, hw, 3, {"m": 44, "n": 16, "k": 96}) <= caches[2] < 4 * b
    sweep = simulate_dv(w, [["m", "n", "k"]], [{"m": 11, "n": 16, "k": 96}], 0)
    assert sweep == 4 * (a + 8 * b + c)
    dvs, mu = _dv_and_mu(w, hw, orders, tiles)
    assert charged_dv(w, hw, dvs, mu, orders, tiles)[1:3] == [dvs[1], sweep]
    assert dvs[1] == simulate_dv(w, orders, tiles, 1) > sweep
    assert all(d == float("inf") for d, _ in swept(w, hw, whole_problem(w, hw), orders, tiles).cores)


def test_buffers_packed_one_after_another_evict_each_other():
    """models/traffic.py: B's and D's buffers (32 KiB each, l padded to 128) are packed at the
    root one after the other. Each alone fits L1's usable share, both do not, so the FMA loops'
    first reads miss again: L1 takes each copy's writes and its buffer's fetch for ownership,
    with no read credited (valgrind, chain 2x97x113: 0.76 MiB missed; 0.55 expected with the
    credit, 0.72 without). The FMA loops read the padded problem (padded_problem: l is 128),
    and L1 keeps what a cycling working set may use of it (kept_bytes), swept along every loop."""
    from cachetile.models.traffic import expected_traffic, padded_problem

    w, hw, orders, tiles = SWEPT_CHAIN, AVX2_CACHES, SWEPT_ORDERS, SWEPT_TILES
    copies = kernel_costs(w, hw, orders, tiles).copies
    assert copies == [("B", 3, 64 * 128 * 4, 64 * 128 * 4, None), ("D", 3, 128 * 64 * 4, 128 * 64 * 4, None)]
    padded, inside = padded_problem(w, tiles)
    assert padded.dims == {**w.dims, "l": 128} and inside[1] == {**tiles[1], "l": 128}
    kept = [hw.target.kept_bytes(j) for j in range(len(tiles))]
    assert kept[1] == 11 * 4096 < 2 * 32768  # 11 of the 12 ways (KEPT_STREAMS)
    charged = charged_dv(padded, hw, *_dv_and_mu(padded, hw, orders, inside), orders, inside, kept)
    assert expected_traffic(w, hw, orders, tiles)[1] == charged[1] + 2 * (2 * 32768)


def test_a_chains_intermediate_buffer_costs_its_first_writes_or_a_round_trip_when_it_spills():
    """objective.WholeProblem: standing in for a cache, the outermost tile adds at most the
    buffers the cores keep the intermediate in (not its whole round trip); the memory link
    carries the output's write-back, and the intermediate's round trip once the tile's blocks
    over the shared loops (the pointwise output's channels whole) outgrow a core's cache."""
    from cachetile.models.objective import whole_problem

    hw = _streaming_hardware(0.0)  # 2 cores
    w = builtin("conv2d", dict(n=2, c=16, h=20, w=20, k=16, r=3, s=3),
                params={"pad": 1, "groups": 16, "pointwise": 32})
    whole = whole_problem(w, hw)
    row = {"n": 1, "oh": 1, "ow": 20, "c": 16, "kh": 3, "kw": 3, "f": 8}
    assert whole.intermediates == 2 * (2 * 20 * 20 * 16) * 4
    assert whole.standing(2, 2, row) == 2 * 20 * 16 * 4  # a one-row buffer per core
    assert whole.standing(1, 2, row) == 0.0
    written = 2 * 20 * 20 * 32 * 4
    assert whole.written == written
    # the input's full window (3 rows of 22 columns, unclipped as MU counts it), the buffer, the
    # output over every f, both weights
    footprint = (3 * 22 * 16 + 20 * 16 + 20 * 32 + 9 * 16 + 16 * 32) * 4
    assert whole.to_memory(row, footprint) == written
    assert whole.to_memory(row, footprint - 1) == written + whole.intermediates
    assert whole_problem(builtin("gemm", {"m": 8, "n": 8, "k": 8}), hw).to_memory(row, 1) == 8 * 8 * 4


def test_enumerates_bound_counts_the_padding_of_outer_tiles():
    """costmodel.padding_factor: the flops over padded loops, as a multiple of the workload's."""
    from cachetile.models.costmodel import padding_factor

    w = builtin("gemm", {"m": 100, "n": 64, "k": 48})
    assert padding_factor(w, [{"m": 32, "n": 64, "k": 48}]) == pytest.approx(128 / 100)
    assert padding_factor(w, [{"m": 25, "n": 64, "k": 16}]) == 1.0
    chain = builtin("gemm-chain", {"m": 10, "l": 12, "k": 8, "n": 6})
    tile = {"m": 4, "l": 12, "k": 8, "n": 6}  # m padded to 12 in both ops
    assert padding_factor(chain, [tile]) == pytest.approx(12 / 10)


def test_a_packed_panel_that_stays_beside_the_tile_is_fetched_once():
    """models/traffic.py: gemm 250^3 packs a 16-column panel of B (16 000 B) for every column
    block, 256 000 B of copies in all (n padded to 256). L2 holds the whole problem, so each
    array moves into it once; the copy reads B's padded columns once more, and the panel buffer,
    which fits beside the L2 tile, is fetched for ownership once, not at each rewrite (valgrind:
    0.726 MiB against 0.742 expected; 0.965 when each rewrite was charged). The FMA loops
    compute C's padded columns too (padded_problem). In L1 the panel fits beside the 21 KiB tile
    as well (in the 40 KiB that a 12-way 48 KiB L1 keeps), but not in a 32 KiB 8-way one."""
    from cachetile.models.traffic import expected_traffic, padded_problem

    hw = _streaming_hardware(0.0).model_copy(update={"cores": 1})
    hw = hw.model_copy(update={"levels": [*hw.levels, Level(name="L3", capacity_bytes=32 << 20,
                                                               bandwidth_bytes_per_s=5e10, ways=16)]})
    w = builtin("gemm", {"m": 250, "n": 250, "k": 250})
    orders = [["m", "n", "k"], ["k", "n", "m"], ["m", "n", "k"], ["m", "n", "k"]]
    tiles = [{"m": 5, "n": 16, "k": 1}, {"m": 5, "n": 16, "k": 250}, {"m": 5, "n": 16, "k": 250},
             {"m": 250, "n": 16, "k": 250}]
    assert [c[:4] for c in kernel_costs(w, hw, orders, tiles).copies] == [("B", 3, 250 * 256 * 4, 250 * 16 * 4)]
    once = 3 * 250 * 250 * 4
    traffic = expected_traffic(w, hw, orders, tiles)
    assert traffic[2] == once + 2 * 250 * 6 * 4 + 250 * 16 * 4
    padded, inside = padded_problem(w, tiles)
    assert padded.dims == {"m": 250, "n": 256, "k": 250}
    small = hw.model_copy(update={"levels": [hw.levels[0], hw.levels[1].model_copy(update={"capacity_bytes": 32768,
                                                                                          "ways": 8}),
                                             *hw.levels[2:]]})
    for machine, rewrites in ((hw, 1), (small, 256 // 16)):  # the panel fetched once, or at every rewrite
        kept = [machine.target.kept_bytes(j) for j in range(len(tiles))]
        charged = charged_dv(padded, machine, *_dv_and_mu(padded, machine, orders, inside), orders, inside, kept)
        assert expected_traffic(w, machine, orders, tiles)[1] == charged[1] + rewrites * 250 * 16 * 4


@pytest.mark.parametrize("l2,kept", [(512 << 10, False), (1 << 20, True)])
def test_packed_buffers_stay_in_a_cache_only_beside_the_output_block_the_loops_come_back_to(l2, kept):
    """gemm 256^3 packing A's and B's halves of k (132 + 128 KiB) at each half of its outermost
    tile, whose L2 tiles accumulate into all of C (256 KiB) twice per half: on a 512 KiB L2 the
    buffers and C evict each other, and valgrind missed 2.05 MiB where crediting the buffers'
    first fills as kept there expected 1.51 (2.01 without the credit; AMD EPYC Zen 3). On a 1 MiB
    L2 the three fit, and the FMA loops' first fills of the buffers are the copies' own lines."""
    from cachetile.models.costmodel import data_volume
    from cachetile.models.traffic import expected_traffic, padded_problem

    hw = ZEN3.model_copy(update={"cores": 1, "levels": [
        *ZEN3.levels[:2], ZEN3.levels[2].model_copy(update={"capacity_bytes": l2}), ZEN3.levels[3]]})
    w = builtin("gemm", {"m": 256, "n": 256, "k": 256})
    orders = [list("mnk"), list("nmk"), list("mnk"), list("mnk")]
    tiles = [{"m": 6, "n": 16, "k": 1}, {"m": 6, "n": 32, "k": 64}, {"m": 256, "n": 64, "k": 64},
             {"m": 256, "n": 256, "k": 128}]
    costs = kernel_costs(w, hw, orders, tiles)
    copies = costs.copies
    assert sorted((c[0], c[1], c[3]) for c in copies) == [("A", 3, 258 * 128 * 4), ("B", 3, 128 * 256 * 4)]
    padded, inside = padded_problem(w, tiles)
    live = sum(c[3] for c in copies) + 258 * 256 * 4  # both buffers and C's block of the outermost tile
    assert (live <= hw.target.kept_bytes(2)) == kept
    charged = charged_dv(padded, hw, *_dv_and_mu(padded, hw, orders, inside), orders, inside,
                         [hw.target.kept_bytes(j) for j in range(4)])
    owned = [c[3] if c[3] + float(_dv_and_mu(padded, hw, orders, inside)[1][2]) <= hw.target.kept_bytes(2) else c[2]
             for c in copies]
    credit = [min(float(data_volume(padded, orders, inside, hardware=hw, only={c[0]})[2]), c[2]) if kept else 0.0
              for c in copies]
    assert expected_traffic(w, hw, orders, tiles)[2] == pytest.approx(
        charged[2] + sum(c[2] + o - k for c, o, k in zip(copies, owned, credit))
        + sum(written + (zeroed if block > hw.target.kept_bytes(2) else 0.0) for _, zeroed, block, written in costs.outputs),
        rel=1e-12)
    assert credit == [0.0, 0.0] or all(k > 0 for k in credit)


def _streaming_hardware(run_start_bytes: float) -> Hardware:
    """Registers, L1 and a 1 MiB L2 filled from memory at 1e11 B/s."""
    return Hardware(name="cpu", peak_flops=4e11, cores=2, vector_bytes=64, run_start_bytes=run_start_bytes, levels=[
        Level(name="registers", capacity_bytes=2048, bandwidth_bytes_per_s=8e12),
        Level(name="L1", capacity_bytes=49152, bandwidth_bytes_per_s=4e11, ways=12),
        Level(name="L2", capacity_bytes=1 << 20, bandwidth_bytes_per_s=1e11, ways=16)])


# A decode-like gemm whose register tile holds every row of C: each element of B (2 MiB, more
# than L2 holds) reaches the registers once. Register tiles 2x64 walk n (4 trips) inside each
# 256-wide, one-row L1 tile, and k (32 trips) then n (4) inside the L2 tile.
DECODE = builtin("gemm", {"m": 2, "n": 1024, "k": 512})
DECODE_ORDERS = [["n", "k", "m"]] * 3
DECODE_TILES = [{"m": 2, "n": 64, "k": 1}, {"m": 2, "n": 256, "k": 1}, {"m": 2, "n": 1024, "k": 32}]


def test_an_input_read_once_is_streamed_unpacked_in_runs():
    """B is not packed at any level; the walk reads it in runs of 256 elements (the four
    register tiles of an L1 tile continue one row; the next k step starts another), each run
    costing run_start_bytes of the memory stream and nothing else: the accumulators reloaded
    at every k step cost the register link (accumulator bandwidth), not B's stream."""
    plain, costly = (kernel_costs(DECODE, _streaming_hardware(b), DECODE_ORDERS, DECODE_TILES) for b in (0.0, 100.0))
    assert "B" not in {tensor for tensor, *_ in plain.copies}
    assert plain.runs == [("B", 512 * 1024 / 256, 256)]
    assert plain.stream_bytes[-1] == 0.0
    assert costly.stream_bytes[-1] - plain.stream_bytes[-1] == 2048 * 100.0
    assert costly.copy_seconds - plain.copy_seconds == pytest.approx(2048 * 100.0 / 1e11, rel=1e-12)


def test_an_input_read_once_is_packed_when_rows_of_the_tile_share_it():
    """With two register tiles along m, each element of B reaches the registers twice: packed
    (at L1, whose 2x256 blocks are not contiguous in B)."""
    tiles = [{"m": 1, "n": 64, "k": 1}, {"m": 2, "n": 256, "k": 2}, {"m": 2, "n": 1024, "k": 32}]
    costs = kernel_costs(DECODE, _streaming_hardware(100.0), DECODE_ORDERS, tiles)
    assert "B" in {tensor for tensor, *_ in costs.copies} and costs.runs == []


def test_a_kernel_reading_an_input_unpacked_matches_numpy():
    """The emitted kernel reads B straight from its array (no B cache block) and is right."""
    from cachetile.backends.llvm_measure import check

    hw = _streaming_hardware(100.0)
    w = builtin("gemm", {"m": 3, "n": 192, "k": 37})
    tiles = [{"m": 3, "n": 64, "k": 1}, {"m": 3, "n": 192, "k": 1}, {"m": 3, "n": 192, "k": 37}]
    built = build(w, hw, make_plan(w, hw, [["n", "k", "m"]] * 3, tiles))
    assert not [name for name in block_runs(built.emitted.schedule.mod["main"].body) if name.startswith("B")]
    assert check(w, built.lib) < 1e-3


def test_an_unpacked_input_runs_along_its_l1_block_rows():
    """Register tiles 2x64 under an L1 block 4x512 of B: memory streams the block's 512-element
    rows as runs (all four register tiles read them within the block's lifetime), not the
    register tile's 64; the next L1 block along k starts new rows."""
    tiles = [{"m": 2, "n": 64, "k": 1}, {"m": 2, "n": 512, "k": 4}, {"m": 2, "n": 1024, "k": 32}]
    costs = kernel_costs(DECODE, _streaming_hardware(100.0), DECODE_ORDERS, tiles)
    assert costs.runs == [("B", 512 * 1024 / 512, 512)]


def test_a_run_start_costs_no_more_than_the_run():
    """Runs of 256 elements (1 KiB) under a calibrated start of 600 bytes pay 600 bytes each;
    under 4000 bytes, they pay their own 1 KiB (the stream at half the contiguous rate)."""
    plain, some, capped = (kernel_costs(DECODE, _streaming_hardware(b), DECODE_ORDERS, DECODE_TILES)
                           for b in (0.0, 600.0, 4000.0))
    assert some.stream_bytes[-1] - plain.stream_bytes[-1] == 2048 * 600.0
    assert capped.stream_bytes[-1] - plain.stream_bytes[-1] == 2048 * 256 * 4


def test_a_run_start_is_interpolated_between_the_two_calibrated_run_lengths():
    """Calibrated on 128-byte and 1 KiB runs (200 and 600 bytes of stream): the nearer figure
    outside them, linear between; the DECODE walk's 1 KiB runs pay 600 bytes each."""
    from cachetile.models.kernel_costs import run_start

    hw = _streaming_hardware(600.0).model_copy(update={"short_run_start_bytes": 200.0})
    assert [run_start(hw, b) for b in (64, 128, 576, 1024, 4096)] == [200.0, 200.0, 400.0, 600.0, 600.0]
    plain = kernel_costs(DECODE, _streaming_hardware(0.0), DECODE_ORDERS, DECODE_TILES)
    costs = kernel_costs(DECODE, hw, DECODE_ORDERS, DECODE_TILES)
    assert costs.stream_bytes[-1] - plain.stream_bytes[-1] == 2048 * 600.0


def test_an_input_pays_the_share_of_its_run_starts_calibrated_for_its_size():
    """B is 2 MiB: with shares calibrated 0 at 1 MiB and 1 at 4 MiB, it pays half of each run's
    start (halfway in the log of the size); with 0 up to 4 MiB it pays none and no runs are
    counted; without a calibration it pays all of it, being larger than the outermost level."""
    from cachetile.models.kernel_costs import run_start_reach

    plain = kernel_costs(DECODE, _streaming_hardware(0.0), DECODE_ORDERS, DECODE_TILES)
    hw = _streaming_hardware(100.0)
    half = hw.model_copy(update={"run_start_reach": [(1 << 20, 0.0), (4 << 20, 1.0)]})
    none = hw.model_copy(update={"run_start_reach": [(4 << 20, 0.0), (16 << 20, 1.0)]})
    assert run_start_reach(half, 2 << 20) == pytest.approx(0.5, rel=1e-12)
    assert [run_start_reach(half, b) for b in (1 << 19, 1 << 30)] == [0.0, 1.0]
    costs = kernel_costs(DECODE, half, DECODE_ORDERS, DECODE_TILES)
    assert costs.stream_bytes[-1] - plain.stream_bytes[-1] == pytest.approx(2048 * 100.0 * 0.5, rel=1e-12)
    assert kernel_costs(DECODE, none, DECODE_ORDERS, DECODE_TILES).runs == []
    full = kernel_costs(DECODE, hw, DECODE_ORDERS, DECODE_TILES)
    assert full.stream_bytes[-1] - plain.stream_bytes[-1] == 2048 * 100.0
    with pytest.raises(ValueError, match="run_start_reach needs sizes > 0, finite and increasing"):
        hw.model_validate({**hw.model_dump(), "run_start_reach": [(4 << 20, 0.0), (1 << 20, 1.0)]})
    with pytest.raises(ValueError, match="run_start_reach shares must be between 0 and 1"):
        hw.model_validate({**hw.model_dump(), "run_start_reach": [(1 << 20, 1.5)]})


def test_short_runs_pay_the_share_calibrated_for_short_runs():
    """B (2 MiB) with shares calibrated per run length: 0.5 for 1 KiB runs, 0.25 for 128-byte
    runs, 0.375 halfway between (and for a band's stall, which has no run length). The DECODE
    walk's 1 KiB runs pay 600 x 0.5 bytes each; under 32-wide L1 blocks moving down k, its
    128-byte runs pay 200 x 0.25. A profile without the short share gives every run the other."""
    from cachetile.models.kernel_costs import run_start_reach

    plain = kernel_costs(DECODE, _streaming_hardware(0.0), DECODE_ORDERS, DECODE_TILES)
    hw = _streaming_hardware(600.0).model_copy(update={
        "short_run_start_bytes": 200.0, "run_start_reach": [(1 << 20, 0.0), (4 << 20, 1.0)],
        "short_run_start_reach": [(1 << 20, 0.0), (16 << 20, 1.0)]})
    assert [run_start_reach(hw, 2 << 20, b) for b in (64, 128, 576, 1024, 4096)] == pytest.approx(
        [0.25, 0.25, 0.375, 0.5, 0.5], rel=1e-12)
    assert run_start_reach(hw, 2 << 20) == pytest.approx(0.375, rel=1e-12)
    costs = kernel_costs(DECODE, hw, DECODE_ORDERS, DECODE_TILES)
    assert costs.stream_bytes[-1] - plain.stream_bytes[-1] == pytest.approx(2048 * 600.0 * 0.5, rel=1e-12)
    short = [{"m": 2, "n": 32, "k": 1}, {"m": 2, "n": 32, "k": 1}, {"m": 2, "n": 1024, "k": 32}]
    plain = kernel_costs(DECODE, _streaming_hardware(0.0), DECODE_ORDERS, short)
    costs = kernel_costs(DECODE, hw, DECODE_ORDERS, short)
    assert costs.runs == [("B", 512 * 1024 / 32, 32)]
    assert costs.stream_bytes[-1] - plain.stream_bytes[-1] == pytest.approx(512 * 1024 / 32 * 200.0 * 0.25, rel=1e-12)
    older = hw.model_copy(update={"short_run_start_reach": None})
    assert run_start_reach(older, 2 << 20, 128) == run_start_reach(older, 2 << 20) == pytest.approx(0.5, rel=1e-12)
    with pytest.raises(ValueError, match="short_run_start_reach shares must be between 0 and 1"):
        hw.model_validate({**hw.model_dump(), "short_run_start_reach": [(1 << 20, 1.5)]})


def test_a_private_block_of_whole_rows_streams_as_one_run():
    """The DECODE walk under L2 blocks of 32 whole rows of B (one contiguous 128 KiB piece), on
    one core: each block is one run, whichever order its 256-wide L1 blocks take inside it;
    under L2 blocks 512 wide, the runs are the L1 blocks' rows again. On two cores the parallel
    loop inside the L2 block gives each thread half of its rows: runs of the L1 blocks' rows,
    since the next L1 block goes down k."""
    levels = _streaming_hardware(0.0).levels
    l3 = Level(name="L3", capacity_bytes=3 << 19, bandwidth_bytes_per_s=5e10, ways=12)  # 1.5 MiB: B streams from memory
    hw = _streaming_hardware(100.0).model_copy(update={"levels": [*levels, l3], "cores": 1})
    orders = [*DECODE_ORDERS, DECODE_ORDERS[-1]]
    rows = [*DECODE_TILES, dict(DECODE.dims)]
    assert kernel_costs(DECODE, hw, orders, rows).runs == [("B", 512 * 1024 / (32 * 1024), 32 * 1024)]
    narrow = [*DECODE_TILES[:2], {"m": 2, "n": 512, "k": 32}, dict(DECODE.dims)]
    assert kernel_costs(DECODE, hw, orders, narrow).runs == [("B", 512 * 1024 / 256, 256)]
    two = hw.model_copy(update={"cores": 2})
    assert kernel_costs(DECODE, two, orders, rows).runs == [("B", 512 * 1024 / 256, 256)]


def test_blocks_moving_along_their_rows_extend_each_threads_runs():
    """L1 blocks 4x256 of B whose next block continues their rows (n inside k): on one core the
    runs grow to whole rows, then down k to all of B; on two cores each thread walks its half
    of the L1 blocks along n (the parallel loop), so its runs are half rows. With k inside n,
    the next block starts other rows: runs of 256."""
    tiles = [{"m": 2, "n": 64, "k": 1}, {"m": 2, "n": 256, "k": 4}, {"m": 2, "n": 1024, "k": 32}]
    one, two = (_streaming_hardware(100.0).model_copy(update={"cores": c}) for c in (1, 2))
    along = [["k", "n", "m"]] * 3
    assert kernel_costs(DECODE, one, along, tiles).runs == [("B", 1.0, 512 * 1024)]
    assert kernel_costs(DECODE, two, along, tiles).runs == [("B", 1024.0, 512)]
    assert kernel_costs(DECODE, two, DECODE_ORDERS, tiles).runs == [("B", 2048.0, 256)]


def test_a_band_of_rows_read_in_turn_stalls_its_stream_by_the_calibrated_share():
    """L1 blocks 32x256 of B moving along its rows on one core: each run grows to all of B
    whatever band_stall says, and the band adds its share of B's stream (2 MiB, filled from
    memory): 32 rows the calibrated 0.5; 16 rows 0.1; 22 rows between them in the log of the
    rows; none uncalibrated. A band whose rows the next blocks do not continue (k moving
    first) pays run starts for each visit instead, and no stall."""
    from cachetile.models.kernel_costs import band_stall

    one = _streaming_hardware(100.0).model_copy(update={"cores": 1})
    stalled = one.model_copy(update={"band_stall": [(8.0, 0.0), (16.0, 0.1), (32.0, 0.5)]})
    along, down = [["k", "n", "m"]] * 3, [["n", "k", "m"]] * 3
    bands = {rows: [{"m": 2, "n": 64, "k": 1}, {"m": 2, "n": 256, "k": rows}, {"m": 2, "n": 1024, "k": 32}]
             for rows in (16, 32)}
    nbytes = 512 * 1024 * 4
    for rows, share in [(32, 0.5), (16, 0.1)]:
        plain, banded = (kernel_costs(DECODE, hw, along, bands[rows]) for hw in (one, stalled))
        assert plain.runs == banded.runs == [("B", 1.0, 512 * 1024)]
        assert (plain.bands, banded.bands) == ([], [("B", rows, pytest.approx(share))])
        assert banded.seconds - plain.seconds == pytest.approx(nbytes * share / one.levels[-1].bandwidth_bytes_per_s)
    assert band_stall(stalled, 22) == pytest.approx(0.1 + 0.4 * math.log(22 / 16) / math.log(2))
    assert (band_stall(stalled, 4), band_stall(stalled, 64), band_stall(one, 64)) == (0.0, 0.5, 0.0)
    panel = [{"m": 2, "n": 64, "k": 1}, {"m": 2, "n": 256, "k": 32}, {"m": 2, "n": 256, "k": 512}]
    visits = kernel_costs(DECODE, stalled, down, panel)
    assert visits.runs == [("B", 512 * 1024 / 256, 256)] and visits.bands == []


def test_a_band_under_a_tall_register_tile_stalls_as_calibrated_under_tall_rows():
    """band_stall moves from the one-row curve to the tall one with the rows of A the register
    tile broadcasts against each vector of the banded input (broadcast_rows: a GEMM's B under an
    8x32 tile, 8; its A, n's vectors, 2), linear in them and no further than tall_rows; without a
    tall curve, the one-row curve whatever the tile."""
    from cachetile.models.kernel_costs import band_stall, broadcast_rows

    flat = XEON.model_copy(update={"band_stall": [(8.0, 0.0), (64.0, 0.1)]})
    tall = flat.model_copy(update={"tall_band_stall": [(8.0, 0.0), (64.0, 0.9)], "tall_rows": 8})
    assert [band_stall(tall, 64, b) for b in (1, 8, 4.5, 16)] == pytest.approx([0.1, 0.9, 0.5, 0.9])
    assert band_stall(tall, 32, 8) == pytest.approx(0.9 * math.log(4) / math.log(8))
    assert [band_stall(flat, 64, b) for b in (1, 8)] == pytest.approx([0.1, 0.1])
    gemm = builtin("gemm", {"m": 8, "n": 4096, "k": 4096})
    tile = {"m": 8, "n": 32, "k": 1}
    assert [broadcast_rows(gemm, XEON, gemm.ops[0], x, tile) for x in ("B", "A")] == [8.0, 2.0]


def test_a_decode_gemm_under_8x32_tiles_reads_its_weights_in_bands_the_tall_stall_allows():
    """llama's decode 8x4096x4096 on the Warm-L3 Xeon with its calibrated band stalls and run
    starts' reach (its 8x2 micro-kernel's 64-row bands 0.75-0.84 of the stream, 16 rows none): 8x32 tiles reading B in
    place in 64-row bands ran 2.96 ms and in 16-row bands 1.51, both predicted about 1.31 with
    the one-row curve alone. With the tall curve the 64-row plan is predicted well above the
    16-row one, and tune's plan reads B in bands of at most 32 rows, predicted no slower."""
    from cachetile.models.caches import effective_tiles
    from cachetile.models.kernel_costs import band_rows

    hw = WARM_L3.model_copy(update={"band_stall": [(8.0, 0.0), (16.0, 0.05), (64.0, 0.06), (256.0, 0.25)],
                                    "run_start_reach": [(4 << 20, 0.0), (16 << 20, 0.46), (64 << 20, 0.87),
                                                        (256 << 20, 1.0)]})
    tall = hw.model_copy(update={"tall_band_stall": [(8.0, 0.0), (16.0, 0.0), (32.0, 0.24), (64.0, 0.79),
                                                     (128.0, 1.45), (256.0, 1.9)], "tall_rows": 8})
    gemm = builtin("gemm", {"m": 8, "n": 4096, "k": 4096})
    orders = [list("mnk")] * 4

    def band(rows: int) -> list[dict]:
        return [{"m": 8, "n": 32, "k": 1}, {"m": 8, "n": 32, "k": rows}, {"m": 8, "n": 32, "k": rows},
                {"m": 8, "n": 2048, "k": rows}]

    wide, narrow = (make_plan(gemm, tall, orders, band(rows)).predicted_seconds for rows in (64, 16))
    assert wide > 1.3 * narrow
    flat = [make_plan(gemm, hw, orders, band(rows)).predicted_seconds for rows in (64, 16)]
    assert flat[0] < 1.05 * flat[1]

    def rows_in_turn(plan) -> int:
        orders, tiles = [lv.order for lv in plan.levels], [dict(lv.tile) for lv in plan.levels]
        padded, eff = effective_tiles(gemm, tiles)
        return band_rows(gemm, "B", eff, padded, orders, gemm.ops[0])[0]

    plan = tune(gemm, tall, top=0).plan
    assert rows_in_turn(plan) <= 32 and plan.predicted_seconds <= narrow * (1 + 1e-9)

def test_an_input_read_in_place_pays_its_runs_and_bands_once_per_pass_over_it():
    """llama's prefill 128x4096x4096 reading B in place under 13-row L2 blocks (m outermost above
    them) streams all of B once per block of rows: ceil(128 / 13) = 10 passes, each paying its
    runs' starts and its 32-row bands' stall again. The decode GEMM's 8 rows are one block: one
    pass. Checked against the plans' row blocks and the stall's share of B's stream."""
    from cachetile.models.kernel_costs import band_stall, input_passes, kernel_costs, run_start_reach, stream_level

    hw = WARM_L3.model_copy(update={"band_stall": [(8.0, 0.0), (64.0, 0.3)],
                                    "run_start_reach": [(4 << 20, 0.0), (64 << 20, 0.8), (256 << 20, 1.0)]})
    size = 4096 * 4096 * 4
    for dims, spec, passes in [({"m": 128, "n": 4096, "k": 4096}, "mnk:13,32,1/nmk:13,32,1/mnk:13,4096,32/mnk:128,4096,2048", 10),
                               ({"m": 8, "n": 4096, "k": 4096}, "mnk:8,32,1/mnk:8,32,32/mnk:8,2048,32/mnk:8,2048,32", 1)]:
        w, plan = gemm_plan(dims, spec, hw)
        orders, tiles = [lv.order for lv in plan.levels], [dict(lv.tile) for lv in plan.levels]
        assert input_passes(w, hw, orders, tiles, "B", size) == pytest.approx(passes)
        costs = kernel_costs(w, hw, orders, tiles)
        (name, runs, run), = costs.runs
        assert runs == pytest.approx(passes * 4096 * 4096 / run)
        calm = kernel_costs(w, hw.model_copy(update={"band_stall": [(8.0, 0.0), (64.0, 0.0)]}), orders, tiles)
        share = band_stall(hw, 32, 8.0)
        assert costs.bands == [("B", 32, pytest.approx(share))]
        bandwidth = hw.levels[stream_level(hw, size)].bandwidth_bytes_per_s
        # (A's small copy pays a band stall of its own as well: within 0.1%)
        assert costs.seconds - calm.seconds == pytest.approx(size * passes * share * run_start_reach(hw, size) / bandwidth,
                                                             rel=1e-3)

def test_polish_narrows_a_band_the_prefetcher_cannot_follow():
    """A decode GEMM whose B (64 MiB, past the last cache) is read unpacked: on hardware whose
    bands stall from 64 rows on (the prefetcher follows 32), the plan's L1 block of B takes at
    most 32 rows, its rows continue across the blocks (runs at least 2048 wide), and it is
    predicted no slower than the plan tuned without the stall, costed with it (64-row bands).
    The band is several moves away from what the search finds (_band_moves): without them, a
    plan of 256-byte runs down 64-wide panels, predicted 1.8x slower."""
    from cachetile.models.caches import effective_tiles
    from cachetile.models.kernel_costs import parallel_ops, contiguous_run

    gemm = builtin("gemm", {"m": 8, "n": 4096, "k": 4096})
    hw = Hardware(name="cpu", peak_flops=5e11, cores=2, vector_bytes=64, run_start_bytes=400.0,
                  short_run_start_bytes=200.0, band_stall=[(32.0, 0.0), (64.0, 1.0)], levels=[
                      Level(name="registers", capacity_bytes=2048, bandwidth_bytes_per_s=4e12),
                      Level(name="L1", capacity_bytes=49152, bandwidth_bytes_per_s=3.6e11, ways=12),
                      Level(name="L2", capacity_bytes=2 << 20, bandwidth_bytes_per_s=5.8e10, ways=16),
                      Level(name="L3", capacity_bytes=8 << 20, bandwidth_bytes_per_s=3e10, ways=16)])
    free = tune(gemm, hw.model_copy(update={"band_stall": None}), time_limit=5).plan
    plan = tune(gemm, hw, time_limit=5).plan
    orders, tiles = [lv.order for lv in plan.levels], [dict(lv.tile) for lv in plan.levels]
    assert not any(c.tensor == "B" and not c.skipped_thrifty for c in plan.caches)  # read where it lies
    assert tiles[1]["k"] <= 32
    padded, eff = effective_tiles(gemm, tiles)
    split = parallel_ops(gemm, orders, tiles, hw.cores).get("gemm", (None,))[0]
    assert contiguous_run(gemm, orders, gemm.ops[0], "B", eff, padded, split, hw.cores) >= 2048
    assert plan.predicted_seconds <= make_plan(gemm, hw, [lv.order for lv in free.levels],
                                               [lv.tile for lv in free.levels]).predicted_seconds * (1 + 1e-9)


def test_simd_plans_take_more_than_one_reduction_step_per_accumulator_load():
    """Given the orders, the SIMD target admits only plans whose accumulators take at least
    MIN_CHAIN reduction steps per load (reduction_chain), or the whole reduction when shorter."""
    from cachetile.models.targets.simd_cpu import MIN_CHAIN, reduction_chain

    hw = REGISTERS_AND_L1
    gemm = builtin("gemm", {"m": 64, "n": 64, "k": 64})
    tiles = [{"m": 8, "n": 16, "k": 1}, dict(gemm.dims)]  # 8 accumulator vectors
    assert MIN_CHAIN == 2
    for order, chain in [(("m", "n", "k"), 64), (("k", "m", "n"), 1), (("m", "k", "n"), 1)]:
        orders = [order, ("m", "n", "k")]
        assert float(reduction_chain(gemm, gemm.ops[0], orders, tiles)) == chain
        assert bool(hw.target.admits(gemm, tiles, 1, orders)) == (chain >= MIN_CHAIN)
    assert bool(hw.target.admits(gemm, tiles, 1))  # without orders: the register tile alone
    deep = [{"m": 8, "n": 16, "k": 2}, dict(gemm.dims)]  # two steps inside the register tile
    assert bool(hw.target.admits(gemm, deep, 1, [("k", "m", "n"), ("m", "n", "k")]))
    flat = builtin("gemm", {"m": 64, "n": 64, "k": 1})  # a one-step reduction: nothing longer exists
    assert bool(hw.target.admits(flat, [{"m": 8, "n": 16, "k": 1}, dict(flat.dims)], 1,
                                 [("k", "m", "n"), ("m", "n", "k")]))
    result = tune(gemm, hw, time_limit=3, top=5)
    for plan in [result.plan, *result.alternatives]:
        tiles = [lv.tile for lv in plan.levels]
        assert float(reduction_chain(gemm, gemm.ops[0], [lv.order for lv in plan.levels], tiles)) >= MIN_CHAIN


def test_private_caches_receive_every_input_the_parallel_loop_does_not_split_once_per_core():
    """objective.private_floor: outputs once, each input once per core that runs part of the
    parallel loop unless that loop indexes it; and the predicted time follows it. gpt-2's decode
    GEMM split over its 4 row tiles (both cores read all of B) ran in 0.52 ms, over 48 column
    tiles in 0.33 ms, at the same DV (BENCHMARKS.md)."""
    from golden_cases import SIMD
    from cachetile.models.hardware import hardware_from, on_cores
    from cachetile.models.objective import private_floor

    hw = hardware_from(SIMD)
    m, n, k = 16, 3072, 768
    w = builtin("gemm", {"m": m, "n": n, "k": k})
    tiles = [{"m": 4, "n": 64, "k": 1}, {"m": 4, "n": 64, "k": 1}, {"m": 16, "n": 3072, "k": 48},
             {"m": 16, "n": 3072, "k": 48}]
    rows = [("m", "n", "k"), ("m", "n", "k"), ("m", "n", "k"), ("m", "n", "k")]  # L1's rows outermost
    cols = [("m", "n", "k"), ("n", "m", "k"), ("m", "n", "k"), ("m", "n", "k")]  # its columns
    a, b, c = 4 * m * k, 4 * k * n, 4 * m * n
    assert float(private_floor(w, hw, rows, tiles)) == c + a + 2 * b
    assert float(private_floor(w, hw, cols, tiles)) == c + 2 * a + b
    assert float(private_floor(w, on_cores(hw, 1), rows, tiles)) == 0.0
    row_plan, col_plan = make_plan(w, hw, rows, tiles), make_plan(w, hw, cols, tiles)
    assert [lv.dv_bytes for lv in row_plan.levels] == [lv.dv_bytes for lv in col_plan.levels]
    assert row_plan.predicted_seconds >= col_plan.predicted_seconds
    # With this machine's L2 link (37 GB/s) the floor binds: both cores reading B costs.
    slow = hardware_from({**SIMD, "levels": [{**lv, "bandwidth_bytes_per_s": 3.7e10} if lv["name"] == "L2" else lv
                                             for lv in SIMD["levels"]]})
    assert make_plan(w, slow, rows, tiles).predicted_seconds > 1.1 * make_plan(w, slow, cols, tiles).predicted_seconds


def test_every_levels_dv_is_reported_in_bytes_equal_to_the_simulators():
    """The registers' DV too is the register tile's refills in bytes, although their link is
    charged in load slots (data_volume with the hardware); their expected traffic is the padded
    problem's (50 rows of 6-row tiles run as 54). A small gemm: the simulator walks every point."""
    from cachetile.models.costmodel import data_volume
    from cachetile.models.traffic import padded_problem

    hw = AVX2_CACHES.model_copy(update={"vector_bytes": 64})
    w = builtin("gemm", {"m": 50, "n": 70, "k": 30})
    orders = [["m", "n", "k"], ["m", "n", "k"], ["n", "m", "k"], ["m", "n", "k"]]
    tiles = [{"m": 6, "n": 16, "k": 1}, {"m": 12, "n": 32, "k": 10}, {"m": 24, "n": 64, "k": 30}, dict(w.dims)]
    plan = make_plan(w, hw, orders, tiles)
    assert [lp.dv_bytes for lp in plan.levels] == [simulate_dv(w, orders, tiles, j) for j in range(4)]
    padded, inside = padded_problem(w, tiles)
    assert plan.levels[0].expected_bytes == simulate_dv(padded, orders, inside, 0) > plan.levels[0].dv_bytes
    loads = [float(d) for d in data_volume(w, orders, tiles, hardware=hw)]
    assert loads[0] > 2 * plan.levels[0].dv_bytes and loads[1:] == [lp.dv_bytes for lp in plan.levels[1:]]


def test_the_plan_reports_each_levels_expected_traffic_and_charged_link_time():
    """LevelPlan.expected_bytes is models/traffic.py's expected traffic, and link_seconds the
    charged bytes (objective.charged_dv) at the level's bandwidth; with compute and the serial
    costs, costmodel.predicted_seconds combines them into the plan's time. gpt-2's projection
    1024x768x768 in 6x64 tiles walks the row strips inside each column panel: L2's refills are
    424 MiB, more than the predicted time at its bandwidth, but L2 keeps B's 192 KiB panel
    across the strips (its tile swept along k), so the report's time share stays at most 100%."""
    from cachetile.api.report import format_table
    from cachetile.models.costmodel import compute_seconds, data_volume, predicted_seconds
    from cachetile.models.objective import warm_levels, whole_problem
    from cachetile.models.plan import SolverInfo, TuneResult
    from cachetile.models.traffic import expected_traffic

    # 2 MiB: the L2 sweep's B panel (768 rows 3 KiB apart) uses a quarter of its sets (crowding)
    levels = [lv.model_copy(update={"bandwidth_bytes_per_s": 1e11, "capacity_bytes": 1 << 21}) if lv.name == "L2"
              else lv for lv in AVX2_CACHES.levels]
    hw = AVX2_CACHES.model_copy(update={"vector_bytes": 64, "levels": levels})
    w = builtin("gemm", {"m": 1024, "n": 768, "k": 768})
    orders = [["m", "n", "k"], ["m", "n", "k"], ["n", "m", "k"], ["m", "n", "k"]]
    tiles = [{"m": 6, "n": 64, "k": 1}] * 3 + [dict(w.dims)]
    plan = make_plan(w, hw, orders, tiles)
    assert [lp.expected_bytes for lp in plan.levels] == expected_traffic(w, hw, orders, tiles)
    loads = [float(d) for d in data_volume(w, orders, tiles, hardware=hw)]
    assert loads[0] > 2 * plan.levels[0].dv_bytes and loads[1:] == [lp.dv_bytes for lp in plan.levels[1:]]
    charged = charged_dv(w, hw, loads, [lp.mu_bytes for lp in plan.levels], orders, tiles)
    # The L3 holds the whole problem (7.5 MiB) and the L2 does not: its memory link idles (warm_levels).
    warm = warm_levels(whole_problem(w, hw).mu, [hw.target.cache_bytes(i) for i in range(len(hw.levels))])
    assert warm == [3]
    links = [0.0 if i in warm else float(c) / lv.bandwidth_bytes_per_s for i, (c, lv) in enumerate(zip(charged, hw.levels))]
    assert [lp.link_seconds for lp in plan.levels] == pytest.approx(links)
    target = hw.target
    time, _ = predicted_seconds(compute_seconds(w, hw, orders, tiles), links, target.registers_share_issue,
                                target.overlap_norm)
    assert float(time) + plan.serial_seconds == pytest.approx(plan.predicted_seconds)
    l2 = plan.levels[2]
    # per column panel: B's panel once per strip (171, the last of 4 rows), A and C's columns once
    assert l2.dv_bytes == 12 * (171 * 768 * 64 + 1024 * 768 + 1024 * 64) * 4
    assert l2.dv_bytes / hw.levels[2].bandwidth_bytes_per_s > 1.2 * plan.predicted_seconds
    assert l2.expected_bytes < l2.dv_bytes / 5
    report = format_table(TuneResult(workload=w, hardware=hw, plan=plan,
                                     solver=SolverInfo(name="enumerate", status="optimal", seconds=0.0, evaluated=1)))
    shares = [float(line.split()[-1].rstrip("%")) for line in report.splitlines()
              if line.split() and line.split()[0] in {lv.name for lv in hw.levels}]
    assert len(shares) == 4 and max(shares) <= 100.0
    assert shares[2] == pytest.approx(100 * l2.link_seconds / plan.predicted_seconds, abs=0.05)


# gpt-2's projection in small (its returned plan before the stride stall): B's 768-float rows lie
# 3 KiB apart, and every 6x64 register tile reads a 64-float piece of each of them from L2.
STRIDED = builtin("gemm", {"m": 96, "n": 768, "k": 64})
STRIDED_ORDERS = [list("mnk"), list("mnk"), list("nmk"), list("mnk")]
STRIDED_TILES = [{"m": 6, "n": 64, "k": 1}] * 3 + [{"m": 96, "n": 768, "k": 64}]


def _strided_hardware(stalls) -> Hardware:
    """Registers, L1, L2 and L3 of an AVX-512 CPU on 2 cores, with the stride stalls `stalls`."""
    return Hardware(name="cpu", peak_flops=5e11, cores=2, vector_bytes=64, stride_stall=stalls, levels=[
        Level(name="registers", capacity_bytes=2048, bandwidth_bytes_per_s=4e12),
        Level(name="L1", capacity_bytes=49152, bandwidth_bytes_per_s=4e11, ways=12),
        Level(name="L2", capacity_bytes=1 << 21, bandwidth_bytes_per_s=6e10, ways=16),
        Level(name="L3", capacity_bytes=1 << 27, bandwidth_bytes_per_s=3e10, ways=16)])


def test_an_input_read_in_place_a_piece_of_each_row_at_a_time_stalls_by_its_stride():
    """B is read where it lies, 64 floats of each 3 KiB row per register tile: the FMA loop stalls
    for the share calibrated at 3 KiB of the L1 link's time for B's bytes into L1 (the
    simulator's count), times how much compute sets the plan's time: d/dc of the 3-norm of
    compute and the compulsory memory link (a finite difference). None without figures, for a
    packed B, for a B read once, or for rows read whole one after another."""
    from simulator import simulate_dv

    from cachetile.models.costmodel import compute_seconds, overlapped
    from cachetile.models.kernel_costs import stride_stall

    stalls = [(256.0, 0.0), (3072.0, 0.25), (12288.0, 0.5)]
    hw = _strided_hardware(stalls)
    assert stride_stall(hw, 6144.0) == pytest.approx(0.375, rel=1e-12)  # halfway in the log of the stride
    assert [stride_stall(hw, b) for b in (128.0, 65536.0)] == [0.0, 0.5]
    costs = kernel_costs(STRIDED, hw, STRIDED_ORDERS, STRIDED_TILES)
    plain = kernel_costs(STRIDED, _strided_hardware(None), STRIDED_ORDERS, STRIDED_TILES)
    streamed = simulate_dv(STRIDED, STRIDED_ORDERS, STRIDED_TILES, 1, ["B"])
    assert streamed == 16 * 64 * 768 * 4  # all of B for each of the 16 row tiles
    assert costs.strides == [("B", 3072, streamed, 0.25)] and plain.strides == []
    compute = float(compute_seconds(STRIDED, hw, STRIDED_ORDERS, STRIDED_TILES))
    memory = (96 * 64 + 64 * 768 + 96 * 768) * 4 / 3e10
    h = compute * 1e-6
    norm = hw.target.overlap_norm
    weight = float(overlapped([compute + h, memory], norm) - overlapped([compute - h, memory], norm)) / (2 * h)
    assert 0.5 < weight < 1
    assert costs.seconds - plain.seconds == pytest.approx(streamed * 0.25 * weight / 4e11, rel=1e-6)
    assert costs.stream_bytes[1] - plain.stream_bytes[1] == pytest.approx(streamed * 0.25 * weight, rel=1e-6)
    # B packed: its L3 blocks are 64-column panels, which the layout stores contiguously.
    panels = STRIDED_TILES[:3] + [{"m": 96, "n": 64, "k": 64}]
    packed = kernel_costs(STRIDED, hw, STRIDED_ORDERS, panels)
    assert "B" in {c[0] for c in packed.copies} and packed.strides == []
    # Every row of C in the register tile: B is read once, from memory (its runs are charged).
    once = [{"m": 96, "n": 64, "k": 1}] * 3 + [{"m": 96, "n": 768, "k": 64}]
    assert kernel_costs(STRIDED, hw, STRIDED_ORDERS, once).strides == []
    # Register tiles walking along B's rows before k: whole rows, one after another.
    along = [list("mnk"), list("mnk"), list("mkn"), list("mkn")]
    assert kernel_costs(STRIDED, hw, along, STRIDED_TILES).strides == []
    with pytest.raises(ValueError, match="stride_stall needs strides > 0, finite and increasing"):
        hw.model_validate({**hw.model_dump(), "stride_stall": [(3072.0, 0.25), (256.0, 0.0)]})
    with pytest.raises(ValueError, match="stride_stall shares must be finite and >= 0"):
        hw.model_validate({**hw.model_dump(), "stride_stall": [(256.0, float("inf"))]})


def _crowding_hardware() -> Hardware:
    """One core: registers, a 48 KiB 12-way L1, a 512 KiB 16-way L2 (384 KiB usable), an L3."""
    return Hardware(name="cpu", peak_flops=5e11, vector_bytes=64, levels=[
        Level(name="registers", capacity_bytes=2048, bandwidth_bytes_per_s=4e12),
        Level(name="L1", capacity_bytes=49152, bandwidth_bytes_per_s=4e11, ways=12),
        Level(name="L2", capacity_bytes=1 << 19, bandwidth_bytes_per_s=6e10, ways=16),
        Level(name="L3", capacity_bytes=1 << 27, bandwidth_bytes_per_s=3e10, ways=16)])


def test_rows_a_multiple_of_the_page_apart_crowd_into_a_few_sets_and_are_not_kept():
    """crowding: B read in place, one line of each of its 128 rows per L2 tile, walked n, m, k.
    An L2 that holds the L2 tile grown along k (B's 8 KiB panel, A's 6 rows and C) keeps the panel
    across the row tiles and moves that grown tile's DV (the simulator's). With rows 12 KiB
    apart, each starts at the same offset in its page: the panel has 1 of the 64 sets a page
    spans, as if it took 512 KiB, and L2 moves its own tile's refills (the simulator's DV).
    193 lines apart, the rows start at every offset. Packed (a 1024-column L3 tile), B crowds
    nothing."""
    from simulator import simulate_dv

    from cachetile.models.crowding import in_place, page_sets, set_share

    hw = _crowding_hardware()
    assert page_sets(hw) == 64
    assert [float(set_share(s, r, 64)) for s, r in ((12288, 64), (12288, 128), (3072, 256), (12352, 64))] == \
        [1 / 64, 2 / 64, 16 / 64, 1.0]
    orders = [list("mnk"), list("mnk"), list("nmk"), list("mnk")]
    charged = {}
    for n in (3072, 3088):
        w = builtin("gemm", {"m": 12, "n": n, "k": 128})
        tiles = [{"m": 6, "n": 16, "k": 1}] * 3 + [{"m": 12, "n": n, "k": 128}]
        assert {name: bool(v) for name, v in in_place(w, tiles).items()} == {"A": False, "B": True}
        dvs, mu = _dv_and_mu(w, hw, orders, tiles)
        charged[n] = charged_dv(w, hw, dvs, mu, orders, tiles)[2]
        grown = [*tiles[:2], {"m": 6, "n": 16, "k": 128}, tiles[3]]
        own, held = simulate_dv(w, orders, tiles, 2), simulate_dv(w, orders, grown, 2)
        assert dvs[2] == own and held < own / 1.5
        assert charged[n] == (own if n == 3072 else held)
    w = builtin("gemm", {"m": 12, "n": 3072, "k": 128})
    packed = [{"m": 6, "n": 16, "k": 1}] * 3 + [{"m": 12, "n": 1024, "k": 128}]
    assert not in_place(w, packed)["B"]


# Two cores, a private 1 MiB L2 and a shared L3: where a packed buffer is handed between cores.
TWO_CORES = Hardware(name="cpu", peak_flops=4e11, vector_bytes=64, cores=2, handoff_seconds=1e-10, levels=[
    Level(name="registers", capacity_bytes=2048, bandwidth_bytes_per_s=8e12),
    Level(name="L1", capacity_bytes=32768, bandwidth_bytes_per_s=4e11),
    Level(name="L2", capacity_bytes=1 << 20, bandwidth_bytes_per_s=2e11),
    Level(name="L3", capacity_bytes=32 << 20, bandwidth_bytes_per_s=1e11)])


def test_a_buffer_packed_at_the_root_costs_what_the_cores_read_of_each_others_part():
    """gemm 127x251x509 packing B (510 x 256 padded) at the root, split over the cores by n
    halves, then running m in parallel: each core reads all of B, half of it written by the other
    core. Run n in parallel in the same halves and none of B is handed over (but half of A, packed
    by m halves); pack both inside the parallel loop and each core packs what it reads."""
    w = builtin("gemm", {"m": 127, "n": 251, "k": 509})
    orders = [["m", "n", "k"]] * 4
    handed_at_root = [{"m": 8, "n": 32, "k": 1}, {"m": 8, "n": 32, "k": 3}, {"m": 16, "n": 128, "k": 509},
                      {"m": 16, "n": 251, "k": 509}]
    costs = kernel_costs(w, TWO_CORES, orders, handed_at_root)
    assert [c[:2] + (c[4],) for c in costs.copies] == [("A", 3, ("m", 3)), ("B", 3, None)]
    assert costs.handoffs == [("B", 510 * 256 * 4 / 2)]
    free = kernel_costs(w, TWO_CORES.model_copy(update={"handoff_seconds": 0.0}), orders, handed_at_root)
    assert costs.copy_seconds - free.copy_seconds == pytest.approx(510 * 256 * 4 / 2 * 1e-10, rel=1e-12)
    # The IR: B's root copy (axes k, n) splits n over the cores, the FMA loop (m, n, k) splits m.
    body = build(w, TWO_CORES, make_plan(w, TWO_CORES, orders, handed_at_root)).emitted.schedule.mod["main"].body
    split = parallel_axes(body)
    assert (split["B_pad_global"], split["gemm_update"]) == ([1], [0])
    same_halves = [{"m": 8, "n": 32, "k": 1}, {"m": 8, "n": 32, "k": 3}, {"m": 127, "n": 128, "k": 509},
                   {"m": 127, "n": 251, "k": 509}]
    same_orders = [["m", "n", "k"]] * 2 + [["n", "m", "k"]] * 2
    costs = kernel_costs(w, TWO_CORES, same_orders, same_halves)
    # A, packed at the root by m halves, is read whole by each core: half of it is handed over.
    assert [c[:2] + (c[4],) for c in costs.copies] == [("A", 3, None), ("B", 3, None)]
    assert costs.handoffs == [("A", 128 * 510 * 4 / 2)]
    body = build(w, TWO_CORES, make_plan(w, TWO_CORES, same_orders, same_halves)).emitted.schedule.mod["main"].body
    split = parallel_axes(body)
    assert (split["A_pad_global"], split["B_pad_global"], split["gemm_update"]) == ([0], [1], [1])
    inside = [{"m": 8, "n": 32, "k": 2}, {"m": 8, "n": 32, "k": 10}, {"m": 8, "n": 128, "k": 170},
              {"m": 8, "n": 128, "k": 170}]
    costs = kernel_costs(w, TWO_CORES, [list("kmn"), list("nkm"), list("knm"), list("nkm")], inside)
    assert all(c[4] is not None for c in costs.copies) and costs.handoffs == []


@pytest.mark.parametrize("piece", [8, 10, 14, 15, 16, 20, 24, 31, 32])
def test_a_vectorised_copy_of_a_piece_issues_what_vector_ops_counts(piece):
    """LLVM splits a vector that is not a whole number of registers into power-of-two parts, each
    a load and a store: count the loads in the assembly of a TensorIR copy of 32 pieces per row
    against those of 16-float pieces (one zmm load each)."""
    import re

    import tvm
    from tvm.script import tirx as T

    from cachetile.models.kernel_costs import vector_ops

    def loads(p):
        @T.prim_func
        def copy(A: T.Buffer((64, 1024), "float32"), B: T.Buffer((64, 32, 32), "float32")):
            for i, j in T.grid(64, 32):
                for v in T.vectorized(p):
                    B[i, j, v] = A[i, j * 32 + v]

        lib = tvm.compile(tvm.IRModule({"main": copy}), target={"kind": "llvm", "mcpu": "znver4"})
        load = re.compile(r"^\s+v?mov\w*\s+-?\d*\(%\w+(,%\w+(,\d)?)?\), %\w+$")
        return sum(bool(load.match(line)) for line in lib.mod.inspect_source("asm").splitlines())

    assert loads(piece) - loads(16) == 32 * (vector_ops(piece, 16) - 1)


def _copy_reads(layout, level: int, row_bytes: int, elem: int):
    """Byte addresses a packing copy reads for its first block, in backends/llvm_emit._copy_loops'
    order: each level's tiles in the array's order, then the innermost tile in the pack's order."""
    import itertools

    first = len(layout.bounds[0]) - level
    bounds = [b[first:] for b in layout.bounds]
    loops = [(i, k) for k in range(len(bounds[0]) - 1) for i in range(len(bounds))]
    trips = [range(bounds[i][k] // bounds[i][k + 1]) for i, k in loops]
    inner = [range(bounds[i][-1]) for i in layout.inner_order]
    for outer in itertools.product(*trips):
        base = [0] * len(bounds)
        for (i, k), t in zip(loops, outer):
            base[i] += t * bounds[i][k + 1]
        for point in itertools.product(*inner):
            index = list(base)
            for i, p in zip(layout.inner_order, point):
                index[i] += p
            yield index[0] * row_bytes + index[1] * elem


def _lru_misses(addresses, capacity: int, ways: int, line: int = 64) -> int:
    sets = capacity // (ways * line)
    cache, misses = [[] for _ in range(sets)], 0
    for a in addresses:
        tag = a // line
        s = cache[tag % sets]
        if tag in s:
            s.remove(tag)
        else:
            misses += 1
            if len(s) == ways:
                s.pop(0)
        s.append(tag)
    return misses


@pytest.mark.parametrize("size,k", [(1024, 19), (1024, 16), (1000, 19)])
def test_a_copy_whose_narrow_pieces_crowd_one_l1_set_fetches_a_line_per_piece(size, k):
    """A's pack of 16-row, 1-wide pieces (k tile 19, prime: nothing to widen to) from rows 4 KiB
    apart misses an 8-way L1 at every read, which an LRU simulation of the copy's reads shows;
    16-wide pieces (k tile 16), or rows 4000 bytes apart, keep their lines."""
    from cachetile.models.caches import effective_tiles, input_caches
    from cachetile.models.kernel_costs import thrashed_bytes

    hw = Hardware(name="cpu", peak_flops=2e11, vector_bytes=64, cores=1, levels=[
        Level(name="registers", capacity_bytes=2048, bandwidth_bytes_per_s=8e12),
        Level(name="L1", capacity_bytes=32768, bandwidth_bytes_per_s=2e11, ways=8),
        Level(name="L2", capacity_bytes=1 << 20, bandwidth_bytes_per_s=1e11, ways=8),
        Level(name="L3", capacity_bytes=1 << 25, bandwidth_bytes_per_s=5e10, ways=16)])
    w = builtin("gemm", {"m": size, "n": size, "k": size})
    orders = [list("nkm"), list("nkm"), list("kmn"), list("knm")]
    tiles = [{"m": 16, "n": 16, "k": 1}, {"m": 16, "n": 16, "k": 1}, {"m": 16, "n": 16, "k": k}, {"m": 64, "n": 32, "k": k}]
    padded, eff = effective_tiles(w, tiles)
    site = next(s for s in input_caches(w, orders, eff, padded) if s.tensor == "A" and not s.skipped)
    reads = list(_copy_reads(site.layout, site.level, size * 4, 4))
    misses = _lru_misses(reads, 32768, 8)
    again = thrashed_bytes(w, hw, site, len(reads))
    if again:
        assert misses == len(reads)  # every read a miss
        assert (len(reads) * 4 + again) / 64 == misses  # a line per piece of one element
    else:
        assert misses < len(reads) / 4  # the lines serve the next pieces
    assert bool(again) == (size == 1024 and k == 19)
    kc = kernel_costs(w, hw, orders, tiles)
    assert [t for t, _ in kc.thrashed] == (["A"] if again else [])


def test_a_copy_reads_its_source_in_the_runs_and_bands_its_loops_walk():
    """llama's decode step copying B in 64x2048 blocks walks them 64x16 tile by tile
    (llvm_emit._copy_loops): 64-byte pieces of 64 rows in turn. On the AMD EPYC Zen 3 that ran
    in 15.0 ms, predicted 6.0 as one run per row; under 4x16x1 tiles the copy reads whole rows.
    Where the hardware follows bands of 8 rows, not 64, each piece is a run of its own; where
    64-row bands are followed the pieces join into the block's rows, read in a band. Each run
    pays a run start on the first pass over B (kernel_costs.copy_runs), which is B once."""
    w = builtin("gemm", {"m": 8, "n": 8192, "k": 4096})  # B (128 MiB) outgrows XEON's 64 MiB L3
    banded = [["m", "n", "k"]] * 4, [{"m": 4, "n": 16, "k": 1}, {"m": 4, "n": 16, "k": 1},
                                     {"m": 8, "n": 16, "k": 64}, {"m": 8, "n": 2048, "k": 64}]
    rows = banded[0], [*banded[1][:2], {"m": 4, "n": 16, "k": 1}, banded[1][3]]
    elements = 8192 * 4096

    def runs(hw, plan):
        (entry,) = [r for r in kernel_costs(w, hw, *plan).copy_runs if r[0] == "B"]
        _, count, run, band, share = entry
        assert count * run == elements
        return run, band, share

    eight = XEON.model_copy(update={"band_stall": [(8.0, 0.0), (64.0, 0.95), (256.0, 1.0)]})  # levelled off at 64
    assert runs(eight, banded) == (16, 1, 0.0)
    assert runs(eight, rows) == (2048, 1, 0.0)
    follows = XEON.model_copy(update={"band_stall": [(8.0, 0.0), (64.0, 0.2), (256.0, 1.0)]})
    assert runs(follows, banded) == (2048, 64, 0.2)
    assert runs(XEON, banded) == (2048, 64, 0.0)  # no band calibrated: followed, and no stall
    assert kernel_costs(w, eight, *banded).copy_seconds > kernel_costs(w, eight, *rows).copy_seconds


def _row_pieces(order: str, tile: dict, dims: dict, share: dict, followed: int) -> tuple[int, int]:
    """(elements per run, widest band) of B's rows as the copies of its outermost blocks read them,
    one core's `share` of the trips per loop: the outermost level's loops walked in `order`, each
    block's rows read a piece each, whole blocks one after another. A piece continues its row's
    run when it starts where the row's last piece ended, with at most `followed` other rows read
    in between (the prefetcher's streams); the band is the most rows read in between, plus one."""
    trips = {x: share.get(x, -(-dims[x] // tile[x])) for x in "mnk"}
    last, pieces, runs, elements, band = {}, 0, 0, 0, 1
    latest = []  # the piece each row was last read in, ascending: the rows read since piece p are those past p
    for index in itertools.product(*(range(trips[x]) for x in order)):
        at = dict(zip(order, index))
        for row in range(at["k"] * tile["k"], min((at["k"] + 1) * tile["k"], dims["k"])):
            start, end = at["n"] * tile["n"], min((at["n"] + 1) * tile["n"], dims["n"])
            ended, when = last.get(row, (None, None))
            between = None  # a row's first piece starts its run
            if when is not None:
                between = len(latest) - bisect.bisect_right(latest, when)
                latest.pop(bisect.bisect_left(latest, when))
            if ended == start and between <= followed:
                band = max(band, between + 1)
            else:
                runs += 1
            last[row] = (end, pieces)
            latest.append(pieces)
            pieces += 1
            elements += end - start
    return elements // runs, band


@pytest.mark.parametrize("outer,continued", [("kmn", True), ("nmk", False)])
def test_copies_that_follow_one_another_along_the_rows_continue_their_runs(outer, continued):
    """The decode GEMM 8x4096x1024 copying B in 25x16 blocks: with n innermost among the outermost
    loops each copy continues the rows of the one before (a band of 25 rows, each one run along
    the whole row); with k innermost the next copy reads other rows, and each 16-float piece is a
    run of its own. The plan with n innermost ran in 1.98 ms, predicted 6.55 with every piece a
    run from memory (AMD EPYC Zen 3, bench/fidelity.py). m's two trips are the parallel loop,
    one per core, so each core's copies walk n whole."""
    from cachetile.models.kernel_costs import followed_rows

    dims = {"m": 8, "n": 4096, "k": 1024}
    tiles = [{"m": 7, "n": 8, "k": 1}, {"m": 7, "n": 8, "k": 1}, {"m": 7, "n": 8, "k": 5}, {"m": 7, "n": 16, "k": 25}]
    orders = [list("mkn"), list("mnk"), list("nmk"), list(outer)]
    w = builtin("gemm", dims)
    (entry,) = [r for r in kernel_costs(w, ZEN3, orders, tiles).copy_runs if r[0] == "B"]
    _, runs, run, rows, _ = entry
    padded = {**dims, "k": 1025}  # 41 blocks of 25 rows: the copy reads the padding's row too
    expected = _row_pieces(outer, tiles[3], padded, {"m": 1}, followed_rows(ZEN3))
    assert (run, rows) == expected
    assert expected == ((4096, 25) if continued else (16, 1))


def _packed_offset(layout, index) -> int:
    """Where the element at `index` lies in the pack: its digits (Layout.digits) as one number."""
    offset = 0
    for value, size, _ in layout.digits(index):
        offset = offset * size + int(value)
    return offset


@pytest.mark.parametrize("width,places", [(512, 32), (64, 4), (16, 1)])
def test_a_copy_that_spreads_a_row_over_panels_pays_a_band_stall_on_its_writes(width, places):
    """Copying B in 64 x `width` blocks of 16-float panels stored one after another, each row the
    copy reads lands in width / 16 places in turn, a line at each, each place a stream of lines it
    writes (write_streams, counted here by walking the copy's first row through the pack's layout). Past the bands the
    hardware follows, the buffer's stream takes band_stall's share longer: llama's prefill copying
    B into 2048-wide blocks ran 50.4 ms, 128-wide ones 38.2, both predicted alike before."""
    from cachetile.models.caches import effective_tiles, input_caches
    from cachetile.models.kernel_costs import band_stall, write_streams

    w = builtin("gemm", {"m": 16, "n": 1024, "k": 256})  # B read twice, in blocks not contiguous: packed
    orders = [list("mnk"), list("mnk"), list("nmk"), list("mnk")]
    tiles = [{"m": 4, "n": 16, "k": 1}, {"m": 4, "n": 16, "k": 1}, {"m": 4, "n": 16, "k": 1},
             {"m": 8, "n": width, "k": 64}]
    padded, eff = effective_tiles(w, tiles)
    site = next(s for s in input_caches(w, orders, eff, padded) if s.tensor == "B" and not s.skipped)
    row = sorted(_packed_offset(site.layout, [0, j]) for j in range(width))
    pieces = 1 + sum(b != a + 1 for a, b in zip(row, row[1:]))  # runs of the pack the first row fills
    assert pieces == places
    assert write_streams(w, site) == ((places, 16) if places > 1 else (1, 0))  # a line per visit
    hw = XEON.model_copy(update={"band_stall": [(8.0, 0.0), (16.0, 0.5), (64.0, 2.0)]})
    spread = [e for e in kernel_costs(w, hw, orders, tiles).copy_writes if e[0] == "B"]
    assert spread == ([("B", places, band_stall(hw, places))] if places > 8 else [])
    flat = XEON.model_copy(update={"band_stall": [(8.0, 0.0), (16.0, 0.0), (64.0, 0.0)]})
    extra = kernel_costs(w, hw, orders, tiles).copy_seconds - kernel_costs(w, flat, orders, tiles).copy_seconds
    nbytes = 2 * 256 * 1024 * 4  # B, copied for each of the two 8-row blocks
    assert extra == pytest.approx(nbytes * band_stall(hw, places) / XEON.levels[1].bandwidth_bytes_per_s
                                  if places > 8 else 0.0, rel=1e-9)


@pytest.mark.parametrize("spec,rows", [
    ("mnk:6,16,1/nmk:6,16,1/mnk:6,768,64/mnk:512,768,768", 64),  # 64 k steps down B before n moves
    ("mnk:6,16,1/mkn:6,16,1/mnk:6,768,64/mnk:512,768,768", 1),  # n inside k: B's rows one by one
    ("mnk:6,16,1/nkm:6,16,1/mnk:12,768,64/mnk:512,768,768", 64),  # m's 2 trips inside re-read the rows
])
def test_an_unpacked_inputs_band_counts_the_rows_the_loops_above_l1_walk_before_the_next_piece(spec, rows):
    """bert-base ffn2 reading B in place: its 1x16 L1 blocks are one row's piece, but the L2 tile's
    k loop inside its n loop reads 64 rows in turn before the next piece of the first (band_rows
    with the plan's orders), and the stream pays that band's stall: the plan ran 25.1 ms against
    18.9 for the one packing B, predicted 29.8 and 30.1 as bands of one row (AMD EPYC Zen 3)."""
    from cachetile.models.caches import effective_tiles
    from cachetile.models.kernel_costs import band_rows, band_stall

    w, plan = gemm_plan({"m": 512, "n": 768, "k": 3072}, spec, ZEN3)
    orders, tiles = [lv.order for lv in plan.levels], [lv.tile for lv in plan.levels]
    padded, eff = effective_tiles(w, tiles)
    piece = eff[1]["n"]
    assert band_rows(w, "B", eff, padded, orders, w.ops[0]) == (rows, piece)
    costs = kernel_costs(w, ZEN3, orders, tiles)
    assert "B" not in [c[0] for c in costs.copies]  # read in place
    assert costs.bands == ([("B", rows, band_stall(ZEN3, rows))] if band_stall(ZEN3, rows) else [])


def test_a_copy_joins_its_pieces_in_bands_below_the_stalls_level_off():
    """The AMD EPYC Zen 3's band stalls levelled off at 64 rows (0, 49, 155 and 205% for 8, 16, 32
    and 64+ rows): gemm 8x4096x1024 copying B in 64-byte pieces of 18 rows ran in 2.01 ms,
    predicted 9.38 with every piece a run of its own, as half the top stall had it (16 rows
    followed). Below the level-off the pieces join into each row's 2048 columns, read in an
    18-row band whose stall is charged instead; at it, each piece is a run again."""
    from cachetile.models.kernel_costs import band_stall, followed_rows

    stalls = [(8.0, 0.0), (16.0, 0.49), (32.0, 1.55), (64.0, 2.05), (128.0, 2.05), (256.0, 2.05)]
    hw = ZEN3.model_copy(update={"band_stall": stalls})
    assert followed_rows(hw) == 32
    w = builtin("gemm", {"m": 8, "n": 4096, "k": 1024})
    orders = [list("knm"), list("mkn"), list("nmk"), list("mnk")]
    tiles = [{"m": 6, "n": 8, "k": 1}, {"m": 6, "n": 8, "k": 1}, {"m": 6, "n": 8, "k": 18}, {"m": 6, "n": 2048, "k": 18}]
    (entry,) = [r for r in kernel_costs(w, hw, orders, tiles).copy_runs if r[0] == "B"]
    _, _, run, rows, share = entry
    assert (run, rows) == (2048, 18)
    assert share == pytest.approx(band_stall(hw, 18))
    level = hw.model_copy(update={"band_stall": [(8.0, 0.0), (16.0, 1.9), (32.0, 2.05)]})
    (entry,) = [r for r in kernel_costs(w, level, orders, tiles).copy_runs if r[0] == "B"]
    assert entry[2:4] == (16, 1)
