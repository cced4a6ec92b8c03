"""What LLVM made of a built CPU kernel's micro-kernel, read from its assembly.

The plan fixes the register tile; LLVM decides what becomes of the loops
around it. At O3 it fully unrolls short constant-trip loops, which can put
several register tiles in one loop body whose accumulators no longer fit the
registers: they spill to the stack, and the FMA loop waits on stores. (A
19x16 tile of gemm 1000^3 under 2 x 2 such loops: 76 FMAs, 137 stack moves,
the FMA pipes at 16% of peak, 2.7x the predicted time; BENCHMARKS.md,
"Outer-sweep session".) The cost model does not see this, so the fidelity
benchmark reports it beside its ranking.
"""
from __future__ import annotations

import re

FMA = re.compile(r"\bvfmadd\w*ps\b")
# A vector register stored to the stack: `vmovups %zmm3, 64(%rsp)` and the like.
STACK_STORE = re.compile(r"%[xyz]mm\d+, -?\d*\(%rsp[,)]")


def fma_blocks(asm: str) -> list[str]:
    """Basic blocks (split at labels, up to their first jump) that hold the vector FMAs: the
    micro-kernel's loop, without what follows its exit."""
    blocks = [re.split(r"\n\tj\w+\t", b)[0] for b in re.split(r"\n[.\w]+:", asm)]
    return [b for b in blocks if len(FMA.findall(b)) >= 4]


def vector_spills(blocks: list[str]) -> list[str]:
    """The stores of vector registers to the stack in `blocks` (fma_blocks): a value the loop
    changes (an accumulator) moved out of the registers. Reloads alone are not spills of that
    kind: for rocketlake, LLVM parks a depthwise conv's 9 loop-invariant weight vectors on the
    stack before the loop and reads them from there, one L1 load each, as it would from the
    weights' buffer."""
    return [line for b in blocks for line in b.splitlines() if STACK_STORE.search(line)]


def fma_loop_spills(module) -> int:
    """Vector spills in the FMA loops of a built kernel (a tvm runtime module of the host)."""
    return len(vector_spills(fma_blocks(module.inspect_source("asm"))))
