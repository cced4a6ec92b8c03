"""A tensor-core plan as a TensorIR schedule: mma.sync + ldmatrix, cp.async pipelines.

The model is models/targets/tensor_cores.py; this module turns a plan it costed
into schedule primitives (the pattern of TVM's dlight GPU matmul rule and
MetaSchedule's MultiLevelTilingTensorCore):

1. inputs are cast to fp32 before the sum, so the 16-bit product accumulates in
   fp32; the output is a cast of it. Tensors carry lower-case names: TVM 0.27's
   mma codegen fills its asm template by replacing the letters A, B, C and D in
   turn, so an operand expression holding a later capital letter is mangled;
2. GEMM: padded by `pad_einsum` where a tile does not divide, split into
   16x16x16 steps that `blockize` makes the unit tensorize replaces; the grid
   loops (level-2 tiles outermost, as the cost model walks them) fused onto
   blockIdx.x, the warps of a block onto threadIdx.y;
3. A and B copied into dynamic shared memory at the k-tile loop, 16 bytes per
   thread and pass (one cp.async), rows padded by 8 halves (ldmatrix without bank
   conflicts; issued after tensorize, which drops earlier `storage_align`s);
   fragments loaded with ldmatrix (`transform_layout` to the 32x8 lane layout);
4. accumulators in "warp" fragments, stored through a padded fp32 shared tile and
   copied out with the crop and the cast fused in;
5. `software_pipeline_stage/order` on the k-tile loop with
   `software_pipeline_async_stages` (cp.async, `stages` rotating buffers), and the
   fragment loads one step ahead of the mma;
6. chains (warps split m; the block walks l): the first product's tile computed per
   l tile, its fp32 fragments cast in place to the second mma's A operands
   (registers) or stored to shared memory as 16-bit and read back with ldmatrix.
"""
from __future__ import annotations

from tvm import s_tir, te, tirx

from ..models.caches import effective_tiles, trips, walk
from ..models.errors import InvalidInput
from ..models.gpu import block_loops
from ..models.targets.tensor_cores import (COPY_ELEMENTS, FRAGMENT, ROW_PAD, STAGING_PAD, arch_number,
                                           effective_stages, products)
from .base import Emitted
from .cuda_intrin import (cast_fragment_intrin, emulated, intrin_names, shared_16x16_to_ldmatrix_32x8_layout,
                          store_cast_intrin)

SHARED = "shared.dyn"
WARP = 32
OUT_LANES = 4  # fp32 elements per thread in the epilogue copy (16 bytes; 8 do not compile in TVM 0.27)


def check_arch(plan, arch: str) -> None:
    """Tensor-core plans need mma.sync.m16n8k16 (sm_80 or newer): one line otherwise."""
    if plan.launch is not None and plan.launch.tensor_cores and arch_number(arch) < 80:
        raise InvalidInput(f"--arch {arch} cannot run this plan's tensor-core kernel (mma.sync.m16n8k16 needs "
                           "sm_80 or newer); plan for --hardware v100 to get a CUDA-core kernel")


def tir_names(workload) -> dict[str, str]:
    """TensorIR names of the workload's tensors: lower case (see the module docstring), or
    t0, t1, ... when lower-casing would merge two."""
    lower = {n: n.lower() for n in workload.tensors}
    if len(set(lower.values())) == len(lower) and all(v.isidentifier() for v in lower.values()):
        return lower
    return {n: f"t{i}" for i, n in enumerate(workload.tensors)}


def primfunc(workload, names: dict[str, str]) -> tirx.PrimFunc:
    """`main(*signature)` with fp32 accumulation: op o computes `<o>_f32` (a chain's first op,
    then `<o>` cast to the dtype, which the second reads)."""
    dims, dtype = workload.dims, workload.dtype
    values = {n: te.placeholder(workload.shape(n), dtype=dtype, name=names[n])
              for n, t in workload.tensors.items() if t.role == "input"}
    for op, p in zip(workload.ops, products(workload)):
        r = te.reduce_axis((0, dims[p.r]), name=f"r{p.r}")
        a, b = values[p.a], values[p.b]
        acc = te.compute(workload.shape(p.out), _fp32_product(a, b, r, len(p.batch)), name=f"{names[p.out]}_f32")
        values[p.out] = te.compute(acc.shape, _cast(acc, dtype), name=names[p.out])
    return te.create_prim_func([values[n] for n in workload.signature]).with_attr("global_symbol", "main")


# te.compute reads its body's argument names (no keyword defaults), so bodies come from factories.
def _fp32_product(a, b, r, nb: int):
    return lambda *ix: te.sum(a(*ix[:nb], ix[nb], r).astype("float32") * b(*ix[:nb], r, ix[nb + 1]).astype("float32"),
                              axis=r)


def _cast(src, dtype: str):
    return lambda *ix: src(*ix).astype(dtype)


def _fragment(i, j):
    return (i // FRAGMENT, j // FRAGMENT, *shared_16x16_to_ldmatrix_32x8_layout(i % FRAGMENT, j % FRAGMENT))


_FRAGMENT_MAPS = {  # (.., row, col) of a fragmented buffer -> (.., row / 16, col / 16, lane, element)
    2: lambda i, j: _fragment(i, j),
    3: lambda b, i, j: (b, *_fragment(i, j)),
    4: lambda a, b, i, j: (a, b, *_fragment(i, j)),
}


def _fragment_map(ndim: int):
    if ndim not in _FRAGMENT_MAPS:
        raise InvalidInput(f"tensor cores take at most two batch loops, got {ndim - 2}")
    return _FRAGMENT_MAPS[ndim]


def emit_tensor_cores(workload, hardware, plan, cpu_twins: bool = False, intrins: dict | None = None) -> Emitted:
    """Schedule a tensor-core plan (see the module docstring). `cpu_twins`: tensorize onto
    the CPU twins of ldmatrix/mma (backends/cuda_check.py) and leave out the async copies
    an LLVM build cannot lower; `intrins` overrides the intrinsic names."""
    names = tir_names(workload)
    padded, tiles = effective_tiles(workload, [lv.tile for lv in plan.levels])
    orders = [lv.order for lv in plan.levels]
    sch = s_tir.Schedule(primfunc(workload, names))
    if intrins is None:
        intrins = emulated(intrin_names(workload.dtype)) if cpu_twins else intrin_names(workload.dtype)
    ps = products(workload)
    args = dict(workload=workload, names=names, tiles=tiles, padded=padded, orders=orders, stages=plan.launch.stages,
                intrins=intrins, use_async=not cpu_twins)
    if len(ps) == 1:
        stages, warps, grid = _gemm(sch, ps[0], **args)
    else:
        stages, warps, grid = _chain(sch, ps, in_registers=plan.launch.intermediate == "registers", **args)
    records = [r.model_copy(update={"stages": stages, "double_buffer": stages > 1}) if r.stages > 1 else r
               for r in plan.caches]
    launch = {"threads": warps * WARP, "blocks": grid, "block": [WARP, warps, 1], "names": names, "stages": stages,
              "chain": len(ps) == 2, "async": stages > 1 and not cpu_twins}
    return Emitted(sch, records, padded, launch)


def _grid(workload, loops: dict, orders, op) -> list:
    """The loops of the grid positions (levels >= 1 of the block loops) in the cost model's
    walk, outermost level first; `loops` maps each position to its loop."""
    grid = [p for p in walk(workload, orders, op) if p[0] in block_loops(workload) and p[1] >= 1]
    return [loops[p] for p in grid]


def _split_levels(sch, loop, x, tiles, padded, inner: list[int]) -> tuple[dict, list]:
    """Split a loop into its trips at levels top..1, then `inner` factors; returns the level
    positions' loops and the inner loops."""
    top = len(tiles) - 1
    factors = [trips(tiles, padded, x, j) for j in range(top, 0, -1)]
    parts = sch.split(loop, factors=factors + inner)
    return {(x, j): part for j, part in zip(range(top, 0, -1), parts)}, parts[len(factors):]


def _copy(sch, block, index: int, at, warps: int, pad: bool = True):
    """Copy operand `index` of `block` into shared memory at loop `at`: 16 bytes per thread
    and pass (cp.async), rows padded unless `pad` is False."""
    copy = sch.cache_read(block, index, SHARED)
    sch.compute_at(copy, at, preserve_unit_loops=True)
    fused = sch.fuse(*sch.get_loops(copy)[-2:])
    _, ty, tx, vec = sch.split(fused, factors=[None, warps, WARP, COPY_ELEMENTS])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(vec)
    if pad:
        sch.storage_align(copy, 0, axis=-2, factor=32, offset=ROW_PAD)
    return copy


def _to_fragments(sch, block, index: int, at):
    """Load operand `index` of `block` from shared memory into warp fragments at loop `at`;
    returns the loop tensorize replaces with ldmatrix."""
    frag = sch.cache_read(block, index, "warp")
    sch.compute_at(frag, at, preserve_unit_loops=True)
    rows, cols = sch.get_loops(frag)[-2:]
    r0, r1 = sch.split(rows, factors=[None, FRAGMENT])
    c0, c1 = sch.split(cols, factors=[None, FRAGMENT])
    sch.reorder(r0, c0, r1, c1)
    sch.transform_layout(frag, ("write", 0), _fragment_map(len(sch.get(frag).writes[0].region)))
    return r1


def _read_index(sch, block, name: str) -> int:
    return [r.source.name for r in sch.get(block).reads].index(name)


def _tile16(sch, block, n: int):
    """Split the block's last n loops by 16 and blockize the 16x16(x16) step; returns the outer
    block and the outer loops."""
    outer, inner = [], []
    for loop in sch.get_loops(block)[-n:]:
        o, i = sch.split(loop, factors=[None, FRAGMENT])
        outer.append(o)
        inner.append(i)
    sch.reorder(*outer, *inner)
    return sch.blockize(inner[0]), outer


def _store_out(sch, staged, warps: int, vec: int, bind_warps: bool) -> None:
    """The staged fp32 tile copied to the output, crop and cast inlined, `vec` floats per thread."""
    while consumers := sch.get_consumers(staged):
        sch.reverse_compute_inline(consumers[0])
    fused = sch.fuse(*sch.get_loops(staged)[-2:])
    if bind_warps:
        _, ty, tx, v = sch.split(fused, factors=[None, warps, WARP, vec])
        sch.bind(ty, "threadIdx.y")
    else:
        _, tx, v = sch.split(fused, factors=[None, WARP, vec])
    sch.bind(tx, "threadIdx.x")
    if vec > 1:
        sch.vectorize(v)


def _gemm(sch, p, workload, names, tiles, padded, orders, stages, intrins, use_async):
    dims = workload.dims
    bm, bn, bk = (tiles[1][x] for x in (p.i, p.j, p.r))
    wm, wn = tiles[0][p.i], tiles[0][p.j]
    warps = (bm // wm) * (bn // wn)
    main = sch.get_sblock(f"{names[p.out]}_f32")
    pad = any(padded[x] != dims[x] for x in (p.i, p.j, p.r))
    if pad:
        # Zero-padded copies of A and B (inlined into the shared copies below) and a crop.
        sch.pad_einsum(main, [padded[x] if padded[x] != dims[x] else 1 for x in (*p.batch, p.i, p.j, p.r)])
    loops = sch.get_loops(main)
    nb = len(p.batch)
    i, j, k = loops[nb:]
    i, i16 = sch.split(i, factors=[None, FRAGMENT])
    j, j16 = sch.split(j, factors=[None, FRAGMENT])
    k, k16 = sch.split(k, factors=[None, FRAGMENT])
    sch.reorder(i, j, k, i16, j16, k16)
    outer = sch.blockize(i16)
    positions = {}
    for x, loop in zip(p.batch, loops[:nb]):
        positions.update(_split_levels(sch, loop, x, tiles, padded, [])[0])
    level_i, (i1, i2) = _split_levels(sch, i, p.i, tiles, padded, [bm // wm, wm // FRAGMENT])
    level_j, (j1, j2) = _split_levels(sch, j, p.j, tiles, padded, [bn // wn, wn // FRAGMENT])
    positions.update(level_i | level_j)
    k0, k1 = sch.split(k, factors=[padded[p.r] // bk, bk // FRAGMENT])
    grid = _grid(workload, positions, orders, workload.ops[0])
    sch.reorder(*grid, i1, j1, k0, k1, i2, j2)
    bx = sch.fuse(*grid)
    sch.bind(bx, "blockIdx.x")
    blocks = int(sch.get(bx).extent)
    ty = sch.fuse(i1, j1)
    sch.bind(ty, "threadIdx.y")

    _copy(sch, outer, 0, k0, warps)
    _copy(sch, outer, 1, k0, warps)
    if pad:
        for name in (p.a, p.b):
            if any(padded[x] != dims[x] for x in workload.tensors[name].dims):
                sch.compute_inline(sch.get_sblock(f"{names[name]}_pad"))  # zero-filled in the copy
    loop_a = _to_fragments(sch, outer, 0, k1)
    loop_b = _to_fragments(sch, outer, 1, k1)

    staged = sch.cache_write(outer, 0, SHARED)
    acc = sch.cache_write(outer, 0, "warp")
    sch.reverse_compute_at(acc, ty)
    sch.reverse_compute_at(staged, ty)
    rows, cols = sch.get_loops(acc)[-2:]
    r0, r1 = sch.split(rows, factors=[None, FRAGMENT])
    c0, c1 = sch.split(cols, factors=[None, FRAGMENT])
    sch.reorder(r0, c0, r1, c1)
    vec = OUT_LANES if (wm * wn) % (WARP * OUT_LANES) == 0 and not pad else 1
    _store_out(sch, staged, warps, vec, bind_warps=False)
    init = sch.decompose_reduction(outer, k0)
    sch.transform_layout(acc, ("read", 0), _fragment_map(nb + 2))

    stages = int(effective_stages(stages, padded[p.r] // bk))
    inner_pipelined = bk // FRAGMENT > 1
    if inner_pipelined:  # ldmatrix A, ldmatrix B, mma: fragments one step ahead
        sch.annotate(k1, "software_pipeline_stage", [0, 0, 1])
        sch.annotate(k1, "software_pipeline_order", [0, 1, 2])
    if stages > 1:
        # k0's statements: copy A, copy B, then the inner loop, which InjectSoftwarePipeline
        # has already expanded into prologue, body, epilogue. With 3+ stages the next tile's
        # first fragments load during this tile's last mma (MultiLevelTilingTensorCore's
        # choice); with 2, a prologue at stage 0 would read the tile just issued (wait_group 0).
        if inner_pipelined and stages >= 3:
            stage, order = [0, 0, stages - 2, stages - 1, stages - 1], [0, 1, 3, 2, 4]
        elif inner_pipelined:
            stage, order = [0, 0, 1, 1, 1], [0, 1, 2, 3, 4]
        else:
            stage, order = [0, 0, stages - 1], [0, 1, 2]
        _pipeline(sch, k0, stage, order, use_async)

    sch.tensorize(loop_a, intrins["load_a"])
    sch.tensorize(loop_b, intrins["load_b"])
    sch.tensorize(sch.get_loops(main)[-3], intrins["compute"])
    sch.tensorize(sch.get_loops(sch.get_child_blocks(init)[0])[-2], intrins["init"])
    acc = _tensorize_store(sch, acc, intrins["store"])
    sch.storage_align(acc, 0, axis=-2, factor=32, offset=STAGING_PAD)
    return stages, warps, blocks


def _pipeline(sch, loop, stage: list[int], order: list[int], use_async: bool) -> None:
    sch.annotate(loop, "software_pipeline_stage", stage)
    sch.annotate(loop, "software_pipeline_order", order)
    if use_async:
        sch.annotate(loop, "software_pipeline_async_stages", [0])


def _tensorize_store(sch, block, intrin: str):
    """Tensorize a fragment store (its last two loops); returns the block tensorize made."""
    name = sch.get(block).name_hint
    sch.tensorize(sch.get_loops(block)[-2], intrin)
    return sch.get_sblock(name + "_o")


def _chain(sch, ps, workload, names, tiles, padded, orders, stages, intrins, use_async, in_registers):
    first, second = ps
    dims = workload.dims
    bm, bl = tiles[1][first.i], tiles[1][first.j]
    wm = tiles[0][first.i]
    warps = bm // wm
    nb = len(first.batch)
    fmap = _fragment_map(nb + 2)
    e_inner = sch.get_sblock(f"{names[second.out]}_f32")

    # Second product: grid (batch, m blocks), the serial l tiles, warps over m, fragments.
    # Bind before blockize: with l0 above the warp loop, bind's compact-dataflow check takes
    # the plain reduction block but not the blockized pair (its inner block has no init).
    loops = sch.get_loops(e_inner)
    positions = {}
    for x, loop in zip(first.batch, loops[:nb]):
        positions.update(_split_levels(sch, loop, x, tiles, padded, [])[0])
    level_m, (i1, i2, i3) = _split_levels(sch, loops[nb], first.i, tiles, padded, [warps, wm // FRAGMENT, FRAGMENT])
    positions.update(level_m)
    j2, j3 = sch.split(loops[nb + 1], factors=[None, FRAGMENT])
    l0, l1, l2 = sch.split(loops[nb + 2], factors=[dims[first.j] // bl, bl // FRAGMENT, FRAGMENT])
    grid = _grid(workload, positions, orders, workload.ops[-1])
    sch.reorder(*grid, l0, i1, l1, i2, j2, i3, j3, l2)
    bx = sch.fuse(*grid)
    sch.bind(bx, "blockIdx.x")
    blocks = int(sch.get(bx).extent)
    sch.bind(i1, "threadIdx.y")
    e_outer = sch.blockize(i3)

    # Its accumulators live across l: warp fragments, stored after the l loop with the same
    # warp mapping, through a padded fp32 shared tile (crop and cast fused into the copy out).
    staged = sch.cache_write(e_outer, 0, SHARED)
    e_acc = sch.cache_write(e_outer, 0, "warp")
    sch.reverse_compute_at(e_acc, bx)
    sch.reverse_compute_at(staged, bx)
    _warp_fragments(sch, e_acc, warps, wm)
    _store_out(sch, staged, warps, OUT_LANES, bind_warps=True)
    e_init = sch.decompose_reduction(e_outer, l0)
    sch.bind(sch.get_loops(e_init)[-3], "threadIdx.y")

    # First product, computed per l tile inside l0: fp32 fragments, then cast to 16 bits.
    c16 = sch.get_sblock(names[first.out])
    c_blk = sch.get_sblock(f"{names[first.out]}_f32")
    sch.compute_at(c16, l0, preserve_unit_loops=True)
    sch.compute_at(c_blk, l0, preserve_unit_loops=True)
    sch.set_scope(c16, 0, "warp" if in_registers else SHARED)
    sch.set_scope(c_blk, 0, "warp")
    c_outer, (ci, cj, ck) = _tile16(sch, c_blk, 3)
    ci0, ci1 = sch.split(ci, factors=[warps, wm // FRAGMENT])
    sch.reorder(ci0, ck, ci1, cj)
    sch.bind(ci0, "threadIdx.y")
    if not nb:
        # Keep the producer's init and update under one loop, as a batch's unit loop does:
        # otherwise LiftThreadBinding dissolves the warp loop and the pipeline below sees
        # them as two statements of l0.
        sch.add_unit_loop(ci0)
    _warp_fragments(sch, c16, warps, wm)
    c_init = sch.decompose_reduction(c_outer, ck)

    a_s = _copy(sch, c_outer, _read_index(sch, c_outer, names[first.a]), bx, warps)  # once per block
    b_s = _copy(sch, c_outer, _read_index(sch, c_outer, names[first.b]), l0, warps)
    d_s = _copy(sch, e_outer, _read_index(sch, e_outer, names[second.b]), l0, warps)
    loop_a = _to_fragments(sch, c_outer, _read_index(sch, c_outer, sch.get(a_s).writes[0].source.name), ck)
    loop_b = _to_fragments(sch, c_outer, _read_index(sch, c_outer, sch.get(b_s).writes[0].source.name), ck)
    loop_c16 = None
    if in_registers:
        sch.transform_layout(c16, ("write", 0), fmap)  # the second mma's A operands, in place
    else:
        loop_c16 = _to_fragments(sch, e_outer, _read_index(sch, e_outer, sch.get(c16).writes[0].source.name), l1)
    loop_d = _to_fragments(sch, e_outer, _read_index(sch, e_outer, sch.get(d_s).writes[0].source.name), l1)
    sch.transform_layout(c_outer, ("write", 0), fmap)
    sch.transform_layout(e_acc, ("read", 0), fmap)

    stages = int(effective_stages(stages, dims[first.j] // bl))
    if stages > 1:
        # l0's statements: copy B, first product, its cast, copy D, second product.
        copies = {sch.get(b_s).name_hint, sch.get(d_s).name_hint}
        stage = [0 if name in copies else stages - 1 for name in _statements(sch, l0)]
        _pipeline(sch, l0, stage, list(range(len(stage))), use_async)

    sch.tensorize(loop_a, intrins["load_a"])
    sch.tensorize(loop_b, intrins["load_b"])
    if loop_c16 is not None:
        sch.tensorize(loop_c16, intrins["load_a"])
    sch.tensorize(loop_d, intrins["load_b"])
    sch.tensorize(sch.get_loops(c_blk)[-3], intrins["compute"])
    sch.tensorize(sch.get_loops(e_inner)[-3], intrins["compute"])
    for init in (c_init, e_init):
        sch.tensorize(sch.get_loops(sch.get_child_blocks(init)[0])[-2], intrins["init"])
    cast = cast_fragment_intrin(workload.dtype) if in_registers else store_cast_intrin(workload.dtype)
    c16 = _tensorize_store(sch, c16, cast)
    e_acc = _tensorize_store(sch, e_acc, intrins["store"])
    # After tensorize, which drops the buffer_dim_align of the blocks it replaces.
    sch.storage_align(e_acc, 0, axis=-2, factor=32, offset=STAGING_PAD)
    if not in_registers:
        sch.storage_align(c16, 0, axis=-2, factor=32, offset=ROW_PAD)
    return stages, warps, blocks


def _warp_fragments(sch, block, warps: int, wm: int) -> None:
    """A warp-fragment store's loops as (warp, fragment rows, fragment cols, 16, 16), warps bound."""
    rows, cols = sch.get_loops(block)[-2:]
    rw, rf, ri = sch.split(rows, factors=[warps, wm // FRAGMENT, FRAGMENT])
    cf, ci = sch.split(cols, factors=[None, FRAGMENT])
    sch.reorder(rw, rf, cf, ri, ci)
    sch.bind(rw, "threadIdx.y")


def _statements(sch, loop) -> list[str]:
    """The statements directly in a loop's body as InjectSoftwarePipeline sees them: each
    child block, or the first block under a child loop nest, by name."""
    body = sch.get(loop).body
    names = []
    for stmt in list(body.seq) if hasattr(body, "seq") else [body]:
        while not hasattr(stmt, "block"):
            stmt = stmt.body if hasattr(stmt, "body") else stmt.seq[0]
        names.append(stmt.block.name_hint)
    return names
