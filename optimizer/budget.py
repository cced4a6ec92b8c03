"""Every share of a solve's time limit, and every fixed cap inside it, with its reason.

Solvers read these at call time (`budget.NAME`), so a test may raise the caps
to make a solve depend on the search alone (tests/golden_cases.py does).
"""

# Shares of the time left, for passes that precede others.
COARSE_SHARE = 0.25  # enumerate: the coarse candidate pass, which finds incumbents for the fine pass
SEED_SHARE = 0.3  # enumerate on SIMD CPUs: the pass around the best register tiles, before the full passes
ROUNDING_SHARE = 0.5  # pyomo solvers: time to find a feasible rounded solution before enumeration takes over
ENUMERATE_SHARE = 0.6  # auto: enumeration is exact and usually fastest; the rest is kept for the NLP fallback

# Fixed caps, whatever the limit. Passes that stop early and hand their best plan on are capped
# by work, not seconds (registry.Deadline), so they return the same plans on a loaded machine as
# on an idle one, and the CLI, the service's workers and a cache miss agree; the time limit
# still stops them first when it is shorter. A unit of work (Space.work) is one cost-model call
# of a gemm over ROWS_PER_UNIT candidate tiles or fewer, scaled by the terms a workload's call
# sums; on the AMD EPYC of BENCHMARKS.md a second is 1,000 to 3,000 units.
ROWS_PER_UNIT = 4000
# auto on SIMD CPUs: the widening passes around the best register tiles (enumeration.seeded);
# their greedy dive may take longer. Plans found within 0.4 s matched those of 4 s passes
# within 2% of predicted time on 8 workloads (BENCHMARKS.md), and the CLI must answer a
# 1024^3 GEMM in under a second, imports included. At 400 units (0.25-0.3 s on the AMD EPYC
# Zen 4) the 17 shapes of bench/shapes.py plus gemm 256^3, 1024^3 and batch-gemm 8x512^3 got
# the plans 700 units gave, to the predicted nanosecond; at 700, `tune gemm` 1024^3 took
# 1.1-1.2 s there (BENCHMARKS.md "Plan time at 400 units"). With the collapsed start's polish
# (COLLAPSED_WORK) after it, 300 units gave the 21 workloads of bench/shapes.py and
# bench/fidelity.py the plans 400 gave, or ones predicted faster (bert-base ffn1 7.60 -> 7.33 ms,
# which ran 8.87 -> 7.93 ms; its qkv 5.55 -> 5.51, which ran 6.00 -> 6.14), on the Intel Xeon
# ("Relief session").
# As the model grew, a unit came to cost more: on the AMD EPYC Zen 3 of BENCHMARKS.md 300 units
# took 0.6-1.3 s, and the 17 shapes' plans up to 2.5 s. At 100 (and at 75 and 150) the 21 workloads
# of bench/shapes.py and bench/fidelity.py got the plans 300 gave, with a profile and without one (one
# 0.14% faster), as did four batch GEMMs (batch-gemm 4x96x128x64 among them) and five small GEMMs and
# chains; of bench/conv.py's 12 layers, 9 got the same plan, one predicted 1.0% faster, two 1.1-1.3%
# slower. Plan time fell by a quarter ("Seed-cap session").
SEED_WORK = 100.0
# tune(register_tiles=n), for autotuning: the search around each register tile alone
# (enumeration.per_register_tile), about 0.1 s each.
REGISTER_TILE_WORK = 200.0
# auto on GPUs: many launches come within a few percent of each other (wave quantisation), so
# proving the best takes long; enumerate's best plan after this much work (about 1.5 s) is returned.
GPU_WORK = 2500.0
# tune: polishing breaks ties, trims data movement and re-tiles whole levels, so it gets a short
# slice (about 0.3 s). A round of a convolution chain's polish costs about 300 units (its order
# classes and the levels' re-tilings); 250 stopped MobileNet's dw+pw after one round, at a plan
# predicted 14% slower than the next round's.
# With the collapsed start's polish (COLLAPSED_WORK) beside it, 400 gave the same plans as 500 on
# the 21 workloads of bench/shapes.py and bench/fidelity.py, in 9% less time ("Relief session").
POLISH_WORK = 400.0
# tune: polishes of their own, each within POLISH_WORK, for the best candidates of this many
# register tiles. A polish is a local search: the plan it ends at depends on where it starts
# more than on how the start ranks (gemm 1000^3: from 8.24 ms predicted with 13x32 tiles it
# reached 6.37, from 7.05 with 4x64 tiles 6.74). The first start takes the path it always took,
# so the plan returned is never predicted slower than with one start. The starts run side by side
# on a machine with two cores or more (optimizer/forked.py); where the search hands on one register
# tile's plans, the second start costs nothing.
POLISH_STARTS = 2
# tune: the search hands on at least this many plans, whatever `top` asks for, so that the plan
# returned does not depend on how many alternatives the caller wants (the CLI's default top 3
# or a script's top 0). The search and its polishes are heuristic, so more plans handed on is not
# always better: on the Intel Xeon of BENCHMARKS.md's "Warm-L3 session" gpt-2's decode 16x3072x768
# got 0.401 ms predicted with top 0 (ran 0.555) and 0.339 with top 3 (ran 0.412), while on the
# Zen 3 fixture gemm 1000^3 got 24.6 with top 0 and 25.1 with top 3. Either way, one answer.
SEARCH_PLANS = 4
# enumeration.seeded: the greedy dive around the best register tile alone, when the joint passes
# built their best plan on another. It took 35-60 units on the gemms of bench/shapes.py.
DIVE_WORK = 80.0
# tune: a further polish from the best plan with its middle levels collapsed onto the register
# tile (local.collapsed). On gemm 1000^3 it reached 6.29 ms predicted within 50-100 units (0.07-0.11
# s), where every start the search handed on stopped at 6.60; 500 units gained at most 0.8% more.
COLLAPSED_WORK = 100.0
# pyomo solvers: the polish of each rounded relaxed solution.
ROUND_POLISH_SECONDS = 0.2
# pyomo solvers: the least time left in which a process that has not loaded Pyomo yet loads it.
# An import cannot be cut short: `import pyomo.environ` took 0.4 s on the AMD EPYC Zen 4 and
# 0.77-0.90 s on the Skylake-SP Xeon of BENCHMARKS.md, where a first pyomo-ipopt solve of gemm
# 2^31 cubed under a 0.5 s limit returned after 1.67 s. With less than this left the solver
# reports a timeout at once; a process that has loaded Pyomo is not held to it.
PYOMO_LOAD_SECONDS = 1.0

CAPS = ("SEED_WORK", "REGISTER_TILE_WORK", "GPU_WORK", "POLISH_WORK", "COLLAPSED_WORK", "DIVE_WORK",
        "ROUND_POLISH_SECONDS")
