"""Tensor-core intrinsics TVM 0.27 lacks, registered on import, and CPU twins of the ones it has.

TVM registers mma/ldmatrix for float16 (and int8/fp8) only: `get_ldmatrix_intrin`
asserts float16 for k = 16, `get_mma_intrin` knows no bfloat16, and the intrinsic
groups assert their input dtype. The bfloat16 ones here are the float16 ones with
the dtype swapped in their TVMScript (ldmatrix moves .b16 either way; PTX
mma.m16n8k16 has a .bf16.bf16.f32 form with the same fragment layouts).

Two more a chain needs: an fp32 accumulator fragment stored to 16-bit shared memory
with a cast (`store_cast_intrin`; TVM's stores copy the accumulator dtype), and an
fp32 accumulator fragment cast in place to a 16-bit A-operand fragment
(`cast_fragment_intrin`: m16n8k16's C and A fragments share one lane layout).

`emulated(names)` gives CPU twins of ldmatrix, mma and fill: the real descriptions
(so tensorize matches exactly what it matches on CUDA) with implementations that
replay, lane by lane, what the PTX instructions do with the offsets TVM's CUDA
implementations pass. backends/cuda_check.py runs schedules tensorized onto them.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import linecache
import sys

import tvm
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ..models.errors import InvalidInput


@contextlib.contextmanager
def cheap_frames():
    """Within the block, inspect.stack() builds its frames from the code objects alone.

    TVMScript's T.prim_func calls inspect.stack() for every function it parses, and
    inspect finds each frame's module by scanning sys.modules: with TVM's 1,200 modules
    loaded, importing its tensor intrinsics (248 prim_funcs) took 19-20 s. The parser
    reads only each frame, its function's name and one line of source, which these
    frames carry the same."""
    def stack(context: int = 1):
        frames, frame = [], sys._getframe(1)
        while frame is not None:
            code, line = frame.f_code, frame.f_lineno
            text = linecache.getline(code.co_filename, line) if context > 0 else ""
            frames.append(inspect.FrameInfo(frame, code.co_filename, line, code.co_name, [text] if text else None,
                                            0 if text else None))
            frame = frame.f_back
        return frames

    saved, inspect.stack = inspect.stack, stack
    try:
        yield
    finally:
        inspect.stack = saved


@functools.cache
def _tvm_cuda():
    """TVM's CUDA tensor intrinsics, imported (which registers the fp16 ones) on first use: it
    parses 248 TVMScript functions, seconds that importing the CUDA backend paid before, and
    with it every test process collecting tests/test_cuda.py (6-8 s of each, AMD EPYC Zen 3)."""
    with cheap_frames():
        from tvm.s_tir.tensor_intrin import cuda
    return cuda


def shared_16x16_to_ldmatrix_32x8_layout(i, j):
    """TVM's map of a 16x16 shared tile's element to its (lane, register) in an ldmatrix fragment."""
    return _tvm_cuda().shared_16x16_to_ldmatrix_32x8_layout(i, j)

def _register_once(name: str, make) -> str:
    """Register the intrinsic `make()` returns (desc, impl) under `name` unless it exists."""
    try:
        TensorIntrin.get(name)
    except Exception:  # noqa: BLE001 - TVM raises its own error for an unknown name
        with cheap_frames():
            TensorIntrin.register(name, *make())
    return name


def _retype(func, src="float16", dst="bfloat16"):
    """The fp16 intrinsic's TVMScript with the dtype swapped, parsed back.

    Gotcha (TVM 0.27): the printer drops the `dtype=` keyword of T.ptx_legacy.ldmatrix (it
    is the Call's dtype, the buffer element type), and the parser then defaults it to int8,
    which makes codegen take its int8 "ldmatrix cannot transpose" manual-loop fallback for
    the B operand and scale offsets as bytes. So the keyword is put back explicitly.
    """
    lines = []
    for line in func.script().splitlines():
        line = line.replace(f'"{src}"', f'"{dst}"').replace('"fp16"', '"bf16"')
        if "T.ptx_legacy.ldmatrix(" in line and "dtype=" not in line:
            line = line.rstrip()[:-1] + f', dtype="{dst}")'
        lines.append(line)
    return tvm.script.from_source("\n".join(lines))


def _register_bf16() -> None:
    for suffix, (mat, trans) in {"a_dyn": ("A", False), "b_dyn": ("B", False),
                                 "b_trans_dyn": ("B", True)}.items():
        _register_once(f"mma_ldmatrix_bf16_{suffix}", lambda m=mat, t=trans: [
            _retype(f) for f in _tvm_cuda().get_ldmatrix_intrin(16, "float16", m, t, "shared.dyn")])
    for trans_b in (False, True):
        _register_once("mma_bf16bf16f32" + ("_trans_b" if trans_b else ""), lambda t=trans_b: [
            _retype(f) for f in _tvm_cuda().get_mma_intrin(16, "float16", "float16", "float32", False, t)])


def register_all() -> None:
    """Register every intrinsic this module defines (what a replayed schedule trace names)."""
    _tvm_cuda()
    _register_bf16()
    for dtype in ("float16", "bfloat16"):
        store_cast_intrin(dtype)
        cast_fragment_intrin(dtype)


def intrin_names(dtype: str, trans_b: bool = False) -> dict[str, str]:
    """init/load_a/load_b/compute/store for `dtype` inputs with fp32 accumulation, operands in
    shared.dyn, results stored from the warp fragment to shared.dyn (BufferStores)."""
    if dtype == "float16":
        g = _tvm_cuda().get_mma_intrin_group("shared.dyn", "shared.dyn", "float16", "float32", False, trans_b)
        return g
    if dtype == "bfloat16":  # the float16 group's names, with the retyped intrinsics
        _tvm_cuda()  # registers mma_fill_16x16_f32
        _register_bf16()
        return {"init": "mma_fill_16x16_f32",
                "load_a": "mma_ldmatrix_bf16_a_dyn",
                "load_b": "mma_ldmatrix_bf16_b_trans_dyn" if trans_b else "mma_ldmatrix_bf16_b_dyn",
                "compute": "mma_bf16bf16f32" + ("_trans_b" if trans_b else ""),
                "store": "mma_store_16x16_f32_shared_dyn_simple_"}
    raise InvalidInput(f"tensor cores take float16 or bfloat16, not {dtype!r}")


# --------------------------------------------------------------------------------------
# CPU twins: same desc, implementation = what the PTX instruction does, lane by lane.
# --------------------------------------------------------------------------------------

def _emu_ldmatrix(dtype: str, trans_in_ldmatrix: bool, transposed_input: bool):
    """ldmatrix.sync.aligned.m8n8.x4[.trans].b16 as TVM's impl issues it: lane L supplies the
    row address smem_offset(L, s0) (TVM's formula, decoded to (row, col0) with s1 == 1, as the
    real impl assumes); matrix m's rows come from lanes 8m..8m+7; lane t receives, in
    registers 2m, 2m+1, elements (t//4, 2(t%4)+h) of matrix m, or with .trans (2(t%4)+h, t//4)."""

    def row_of(lane):
        if transposed_input:  # smem_offset = s0*8*(L//16) + s0*(L%8) + 8*((L%16)//8)
            return 8 * (lane // 16) + lane % 8, 8 * ((lane % 16) // 8)
        return lane % 16, 8 * (lane // 16)  # smem_offset = s0*(L%16) + 8*(L//16)

    @T.prim_func(s_tir=True)
    def impl(warp_handle: T.handle, shared_handle: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        shared = T.match_buffer(shared_handle, (16, 16), dtype, align=64, offset_factor=16,
                                scope="shared.dyn", strides=[s0, s1])
        warp = T.match_buffer(warp_handle, (32, 8), dtype, align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:16, 0:16])
            T.writes(warp[0:32, 0:8])
            for tx, m, h in T.grid(32, 4, 2):
                if trans_in_ldmatrix:
                    r, c0 = T.meta_var(row_of(8 * m + 2 * (tx % 4) + h))
                    warp[tx, 2 * m + h] = shared[r, c0 + tx // 4]
                else:
                    r, c0 = T.meta_var(row_of(8 * m + tx // 4))
                    warp[tx, 2 * m + h] = shared[r, c0 + 2 * (tx % 4) + h]

    return impl


def _emu_mma(in_dtype: str):
    """Two mma.sync.m16n8k16.row.col.f32 as TVM's impl issues them (B and C offset by 4 for
    the second n8 half), with PTX's fragment layouts: g = lane//4, c = lane%4;
    A[g+8(i//2)... ] a_r: row g + 8*((r//2)%2), col 2c + 8*(r//4) + r%2;
    B b_r: k = 2c + 8*(r//2) + r%2, n = g;  C c_r: row g + 8*(r//2), col 2c + r%2."""

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (32, 8), in_dtype, align=64, offset_factor=16, scope="warp")
        B = T.match_buffer(b, (32, 8), in_dtype, align=64, offset_factor=16, scope="warp")
        C = T.match_buffer(c, (32, 8), "float32", align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:32, 0:8], A[0:32, 0:8], B[0:32, 0:8])
            T.writes(C[0:32, 0:8])
            for tx, nh, r, kk in T.grid(32, 2, 4, 16):
                # output element (row, col) of this n8 half, held by lane tx in c_r
                C[tx, 4 * nh + r] = C[tx, 4 * nh + r] + T.Cast(
                    "float32",
                    A[4 * ((tx // 4 + 8 * (r // 2)) % 8) + (kk % 8) // 2,
                      4 * (kk // 8) + 2 * ((tx // 4 + 8 * (r // 2)) // 8) + kk % 2],
                ) * T.Cast(
                    "float32",
                    B[4 * (2 * (tx % 4) + r % 2) + (kk % 8) // 2, 4 * nh + 2 * (kk // 8) + kk % 2],
                )

    return impl


def _emu_fill():
    @T.prim_func(s_tir=True)
    def impl(a: T.handle) -> None:
        C = T.match_buffer(a, (32, 8), "float32", scope="warp", offset_factor=1)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:32, 0:8])
            for tx, i in T.grid(32, 8):
                C[tx, i] = T.float32(0)

    return impl


def emulated(names: dict[str, str]) -> dict[str, str]:
    """CPU twins of a GEMM's intrinsics (registered once): load_a/load_b/compute/init
    replaced, store kept (its "simple" impl is already plain BufferStores)."""
    _tvm_cuda()  # the fp16 intrinsics `names` may name are registered by that import
    out = dict(names)
    for role in ("load_a", "load_b", "compute", "init"):
        name = names[role]
        out[role] = _register_once(name + "__cpu", lambda n=name, r=role: (TensorIntrin.get(n).desc, _twin(n, r)))
    return out


def _twin(name: str, role: str):
    dtype = "bfloat16" if "bf16" in name else "float16"
    if role == "init":
        return _emu_fill()
    if role == "compute":
        return _emu_mma(dtype)  # the schedules use B untransposed ("trans_b" is never asked for)
    trans = "trans" in name
    # TVM's ldmatrix: A is .trans iff transposed, B iff NOT transposed; the row addresses
    # follow the transposed layout iff transposed.
    return _emu_ldmatrix(dtype, trans_in_ldmatrix=(not trans) if role == "load_b" else trans, transposed_input=trans)


# --------------------------------------------------------------------------------------
# fp32 accumulator fragment -> 16-bit shared memory, converting (for a chain's intermediate:
# the producer accumulates in fp32, the consumer's mma reads fp16/bf16 through ldmatrix).
# --------------------------------------------------------------------------------------

def _store_cast_intrin(out_dtype: str):
    index_map = _tvm_cuda().shared_16x16_to_ldmatrix_32x8_layout
    index_map_rev = _tvm_cuda().ldmatrix_32x8_to_shared_16x16_layout

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, c: T.handle) -> None:
        C_warp = T.match_buffer(a, [32, 8], dtype="float32", scope="warp")
        C = T.match_buffer(c, [16, 16], dtype=out_dtype, scope="shared.dyn")
        with T.sblock("root"):
            T.reads(C_warp[0:32, 0:8])
            T.writes(C[0:16, 0:16])
            for i0, i1 in T.grid(16, 16):
                with T.sblock("C_warp"):
                    v0, v1 = T.axis.remap("SS", [i0, i1])
                    thread_id, local_id = T.meta_var(index_map(v0, v1))
                    T.reads(C_warp[thread_id, local_id])
                    T.writes(C[v0, v1])
                    C[v0, v1] = T.Cast(out_dtype, C_warp[thread_id, local_id])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, c: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        C_warp = T.match_buffer(a, [32, 8], dtype="float32", scope="warp", offset_factor=1)
        C = T.match_buffer(c, [16, 16], dtype=out_dtype, scope="shared.dyn", offset_factor=1, strides=[s0, s1])
        with T.sblock("root"):
            T.reads(C_warp[0:32, 0:8])
            T.writes(C[0:16, 0:16])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                for local_id in T.serial(8):
                    row, col = T.meta_var(index_map_rev(tx, local_id))
                    C[row, col] = T.Cast(out_dtype, C_warp[tx, local_id])

    return desc, impl


def store_cast_intrin(out_dtype: str) -> str:
    """An fp32 accumulator fragment stored to 16-bit shared memory, cast on the way."""
    return _register_once(f"mma_store_16x16_f32_to_{out_dtype}_shared_dyn_simple_", lambda: _store_cast_intrin(out_dtype))


# --------------------------------------------------------------------------------------
# fp32 accumulator fragment -> 16-bit A-operand fragment, in registers. For m16n8k16 the
# accumulator of a 16x16 tile (two n8 halves) and the A operand of a 16x16(k) tile have the
# same lane/register layout (TVM maps both with shared_16x16_to_ldmatrix_32x8_layout), so
# a chain can feed the producer's result to the consumer's mma without shared memory:
# each lane converts its own 8 values.
# --------------------------------------------------------------------------------------

def _cast_fragment_intrin(out_dtype: str):
    index_map = _tvm_cuda().shared_16x16_to_ldmatrix_32x8_layout

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, c: T.handle) -> None:
        src = T.match_buffer(a, [32, 8], dtype="float32", scope="warp", offset_factor=1)
        dst = T.match_buffer(c, [32, 8], dtype=out_dtype, scope="warp", offset_factor=1)
        with T.sblock("root"):
            T.reads(src[0:32, 0:8])
            T.writes(dst[0:32, 0:8])
            for i0, i1 in T.grid(16, 16):
                with T.sblock("cast"):
                    v0, v1 = T.axis.remap("SS", [i0, i1])
                    thread_id, local_id = T.meta_var(index_map(v0, v1))
                    T.reads(src[thread_id, local_id])
                    T.writes(dst[thread_id, local_id])
                    dst[thread_id, local_id] = T.Cast(out_dtype, src[thread_id, local_id])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, c: T.handle) -> None:
        src = T.match_buffer(a, [32, 8], dtype="float32", scope="warp", offset_factor=1)
        dst = T.match_buffer(c, [32, 8], dtype=out_dtype, scope="warp", offset_factor=1)
        with T.sblock("root"):
            T.reads(src[0:32, 0:8])
            T.writes(dst[0:32, 0:8])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                for local_id in T.serial(8):
                    dst[tx, local_id] = T.Cast(out_dtype, src[tx, local_id])

    return desc, impl


def cast_fragment_intrin(out_dtype: str) -> str:
    """An fp32 accumulator fragment cast in place to a 16-bit A-operand fragment."""
    return _register_once(f"mma_cast_fragment_f32_to_{out_dtype}", lambda: _cast_fragment_intrin(out_dtype))
