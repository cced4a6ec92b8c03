# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # DV/MU trade-offs for a GEMM chain and a convolution
#
# How much data each memory level moves (DV) against how much it holds (MU),
# for the chain `C[m,l] = A[m,k]·B[k,l]; E[m,n] = C[m,l]·D[l,n]` — attention's
# `(Q·Kᵀ)·V` for one head with sequence length 256 and head size 64.
# Everything below uses only cachetile's public API (see README, "Python API").
#
# Run it with `jupytext --to ipynb notebooks/dv_mu_tradeoffs.py` and open the
# notebook, or as CI does: `make notebooks`.

# %%
import itertools
import time

import matplotlib.pyplot as plt

from cachetile import Hardware, Level, builtin, make_plan, pareto, preset, tune

start = time.perf_counter()
chain = builtin("gemm-chain", {"m": 256, "k": 64, "l": 256, "n": 64})
# A fixed three-level CPU-like hierarchy, so the figures do not depend on the machine running this.
cpu = Hardware(name="cpu", peak_flops=2e11, levels=[
    Level(name="registers", capacity_bytes=2048, bandwidth_bytes_per_s=4e11),
    Level(name="L1", capacity_bytes=48 * 1024, bandwidth_bytes_per_s=2e11),
    Level(name="L2", capacity_bytes=2 * 2**20, bandwidth_bytes_per_s=5e10),
])
best = tune(chain, cpu, time_limit=5)
print(f"{best.solver.status}: {best.plan.predicted_seconds * 1e6:.1f} us, bound by {best.plan.bottleneck}")
for lp in best.plan.levels:
    print(f"  {lp.name:<10} order {' '.join(lp.order)}  tile {lp.tile}  DV {lp.dv_bytes:.0f} B  MU {lp.mu_bytes:.0f} B")

# %% [markdown]
# ## The Pareto front of DV against MU, per level
#
# `pareto(workload, hardware, level)` sweeps the level's capacity and, for each,
# finds the plan with the least DV at that level whose MU fits. Each point is a
# solve (status `optimal` when proven). The front is the non-dominated points:
# past the knee, more capacity buys no less traffic.

# %%
fronts = {lv.name: pareto(chain, cpu, lv.name, points=8, time_limit=0.5) for lv in cpu.levels}

fig, ax = plt.subplots(figsize=(7, 4.5))
for name, front in fronts.items():
    line, = ax.plot([p.mu_bytes for p in front.points], [p.dv_bytes for p in front.points], "-", alpha=0.4)
    ax.plot([p.mu_bytes for p in front.front], [p.dv_bytes for p in front.front], "o", color=line.get_color(),
            label=f"{name} (capacity {cpu.levels[[lv.name for lv in cpu.levels].index(name)].capacity_bytes} B)")
ax.set(xscale="log", yscale="log", xlabel="MU at the level (bytes)", ylabel="least DV into the level (bytes)",
       title="DV against MU as each level's capacity varies")
ax.legend()
plt.show()

for name, front in fronts.items():
    print(name, [(p.capacity_bytes, int(p.dv_bytes), p.status) for p in front.front])

# %% [markdown]
# ## DV per loop order
#
# The tuned plan's tiles held fixed, each valid order (loops shared by both
# GEMMs first) at one level at a time, costed with `make_plan`.

# %%
shared = chain.shared_loops
orders = [o for o in itertools.permutations(chain.dims)
          if all(x in shared for x in o[: len(shared)])]
tiles = [lp.tile for lp in best.plan.levels]
base = [lp.order for lp in best.plan.levels]

fig, ax = plt.subplots(figsize=(7, 4))
width = 0.8 / len(cpu.levels)
for j, lv in enumerate(cpu.levels):
    dv = []
    for order in orders:
        trial = list(base)
        trial[j] = list(order)
        dv.append(make_plan(chain, cpu, trial, tiles).levels[j].dv_bytes)
    ax.bar([i + j * width for i in range(len(orders))], dv, width, label=lv.name)
ax.set_xticks([i + width for i in range(len(orders))], [" ".join(o) for o in orders])
ax.set(yscale="log", ylabel="DV into the level (bytes)", xlabel="order at that level (outermost first)",
       title="DV per loop order, tiles fixed")
ax.legend()
plt.show()

# %% [markdown]
# ## How the optimal tile moves
#
# With capacity: the L1 tile of each least-DV point from the sweep above.
# With the bandwidth ratio: compute made free (so memory decides), the L2
# link held at 50 GB/s and the L1 link's bandwidth scaled; `tune` picks the
# tiles minimising the slowest link.

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
l1 = fronts["L1"].points
for x in chain.dims:
    left.plot([p.capacity_bytes for p in l1], [p.plan.levels[1].tile[x] for p in l1], "o-", label=x)
left.set(xscale="log", yscale="log", xlabel="L1 capacity (bytes)", ylabel="L1 tile extent",
         title="L1 tile against L1 capacity")
left.legend()

ratios = [0.25, 0.5, 1, 2, 4, 8, 16]
tiles_by_ratio = []
for r in ratios:
    levels = [lv.model_copy(update={"bandwidth_bytes_per_s": 5e10 * r}) if lv.name == "L1" else lv for lv in cpu.levels]
    memory_bound = cpu.model_copy(update={"levels": levels, "peak_flops": 1e15})
    tiles_by_ratio.append(tune(chain, memory_bound, time_limit=1, top=0).plan)
for i, x in enumerate(chain.dims):
    right.plot(ratios, [p.levels[2].tile[x] for p in tiles_by_ratio], "o-", color=f"C{i}", label=f"L2 tile {x}")
    right.plot(ratios, [p.levels[1].tile[x] for p in tiles_by_ratio], "x--", color=f"C{i}", label=f"L1 tile {x}")
right.set(xscale="log", yscale="log", xlabel="L1 link bandwidth / L2 link bandwidth", ylabel="tile extent",
          title="Tiles against the bandwidth ratio")
right.legend(fontsize=7, ncol=2)
plt.show()
print("bottlenecks:", [p.bottleneck for p in tiles_by_ratio])

# %% [markdown]
# ## Predicted against measured time
#
# Plans for this machine (`preset("host")`) that trade L1 capacity for
# traffic: the least-DV plan for several L1 capacities up to the real one, so
# their predicted times differ. Each is built with TVM and timed by
# the CPU backend (`cachetile.backends.base.get_backend("llvm").measure`).

# %%
from cachetile.backends.base import get_backend  # noqa: E402

host = preset("host")
result = tune(chain, host, time_limit=2, top=0)
l1 = next(i for i, lv in enumerate(host.levels) if lv.name == "L1")
sweep = pareto(chain, host, "L1", points=4, time_limit=1.5)
plans = [result.plan] + [p.plan for p in sweep.front if p.capacity_bytes <= host.levels[l1].capacity_bytes]
measured = [get_backend("llvm").measure(result, p, repeat=10) for p in plans]
predicted = [p.predicted_seconds for p in plans]
kernel = [m.kernel_seconds for m in measured]
fig, ax = plt.subplots(figsize=(5, 5))
ax.plot(predicted, kernel, "o")
lo, hi = min(predicted + kernel), max(predicted + kernel)
ax.plot([lo, hi], [lo, hi], ":", color="grey", label="measured = predicted")
ax.set(xscale="log", yscale="log", xlabel="predicted (s)", ylabel="measured kernel (s)",
       title=f"{len(plans)} plans on {host.name}")
ax.legend()
plt.show()
for p, m in zip(plans, measured):
    print(f"  L1 tile {p.levels[l1].tile}: predicted {p.predicted_seconds * 1e6:.1f} us, "
          f"measured {m.kernel_seconds * 1e6:.1f} us ({m.kernel_gflops:.1f} GFLOP/s, numpy {m.reference_gflops:.1f})")

# %% [markdown]
# ## A convolution layer: the halo
#
# A 3x3 conv reads its input through windows: the input block of an output
# tile Toh x Tow spans (Toh + 2) x (Tow + 2) rows and columns (stride 1), or
# (2 Toh + 1) x (2 Tow + 1) at stride 2, so neighbouring blocks overlap by the
# halo and every refill moves it again (README, "Equations and convolutions").
# Small tiles pay for the halo many times; large tiles amortise it but need the
# capacity. Below, the L1 fronts of a small ResNet-like layer (16 -> 16
# channels, 16 x 16, 3 x 3, padding 1) at stride 1 and 2 on the same hierarchy, and for
# each front point the input's window against the output pixels it serves.

# %%
convs = {stride: builtin("conv2d", {"n": 1, "c": 16, "h": 16, "w": 16, "k": 16, "r": 3, "s": 3},
                         params={"pad": 1, "stride": stride, "layout": "nhwc"}) for stride in (1, 2)}
conv_fronts = {stride: pareto(w, cpu, "L1", points=4, time_limit=1.5) for stride, w in convs.items()}

fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
for stride, front in conv_fronts.items():
    w = convs[stride]
    left.plot([p.mu_bytes for p in front.points], [p.dv_bytes for p in front.points], "o-", label=f"stride {stride}")
    halo = [float(w.block("I", p.plan.levels[1].tile, within=["oh", "ow", "kh", "kw"]))
            / (p.plan.levels[1].tile["oh"] * p.plan.levels[1].tile["ow"]) for p in front.points]
    right.plot([p.mu_bytes for p in front.points], halo, "o-", label=f"stride {stride}")
left.set(xscale="log", yscale="log", xlabel="MU at L1 (bytes)", ylabel="least DV into L1 (bytes)",
         title="conv 3x3: DV against MU at L1")
right.set(xscale="log", xlabel="MU at L1 (bytes)", ylabel="input window / output pixels",
          title="the halo each L1 input block carries")
left.legend()
right.legend()
plt.show()
for stride, front in conv_fronts.items():
    print(f"stride {stride}:", [(p.capacity_bytes, int(p.dv_bytes), {x: p.plan.levels[1].tile[x] for x in ("oh", "ow")})
                                for p in front.front])

# %%
print(f"notebook ran in {time.perf_counter() - start:.1f} s")
