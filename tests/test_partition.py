"""Zero-padding copies split before their last trip (backends/llvm_partition.py)."""
import tvm
import tvm_ffi
from conftest import gemm_plan
from tvm import s_tir, tirx

from cachetile import preset
from cachetile.backends.llvm_build import build
from cachetile.backends.llvm_emit import emit
from cachetile.backends.llvm_measure import check
from cachetile.backends.llvm_partition import partition_edges

HOST = preset("host")


def _guarded_stores(mod, buffer: str) -> list[bool]:
    """Per store into `buffer` once the blocks are plain loops and the IR simplified: whether it
    still tests the padding (an if_then_else)."""
    mod = tvm.ir.transform.Sequential([s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.LowerOpaqueBlock(),
                                       tvm.tirx.transform.StmtSimplify()])(mod)
    stores = []
    tvm_ffi.structural_map(mod["main"].body, [(tirx.BufferStore, lambda x: stores.append(x) or x)])
    return ["if_then_else" in str(store.value) for store in stores if store.buffer.name == buffer]


def test_a_padded_copy_moves_its_inside_without_the_padding_condition():
    # A (127x509) is packed in 8-row, 16-column tiles of a 64x512 block: one row and three columns
    # of padding, each within the last trip of its loop. B (509x251) in 32-wide strips of a 512x128
    # block: three rows and five columns. Each copy's loops split before their last trip: of the
    # three copies that makes, the first tests nothing.
    w, plan = gemm_plan({"m": 127, "n": 251, "k": 509}, "mnk:8,32,1|mnk:8,32,1|mnk:8,32,4|mnk:64,128,509", HOST)
    emitted = emit(w, HOST, plan)
    assert sorted(name for name, _ in emitted.edges) == ["A_pad_global", "B_pad_global"]
    assert all(len(depths) == 2 for _, depths in emitted.edges)
    for buffer in ("A_pad_global", "B_pad_global"):
        assert _guarded_stores(emitted.schedule.mod, buffer) == [True]
        assert sorted(_guarded_stores(partition_edges(emitted.schedule.mod, emitted.edges), buffer)) == [False, True, True]
    check(w, build(w, HOST, plan).lib)


def test_padding_wider_than_a_loops_step_leaves_the_copy_whole():
    # 97 rows padded to 112 in 14-row tiles: rows 97-111 span the last two tiles, so the loop over
    # tiles has no last trip that holds all of the padding; B's 211 columns padded to 224 lie in
    # one 32-wide block per copy, a loop of one trip. Nothing is split, and the kernel is right.
    w, plan = gemm_plan({"m": 97, "n": 211, "k": 131}, "mnk:14,32,1|mnk:14,32,131|mnk:14,32,131|mnk:56,32,131", HOST)
    built = build(w, HOST, plan)
    assert built.emitted.edges == []
    check(w, built.lib)
