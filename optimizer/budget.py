"""Every share of a solve's time limit, and every fixed cap inside it, with its reason.

Solvers read these at call time (`budget.NAME`), so a test may raise the caps
to make a solve depend on the search alone (tests/golden_cases.py does).
"""

# Shares of the time left, for passes that precede others.
COARSE_SHARE = 0.25  # enumerate: the coarse candidate pass, which finds incumbents for the fine pass
SEED_SHARE = 0.3  # enumerate on SIMD CPUs: the pass around the best register tiles, before the full passes
ENUMERATE_SHARE = 0.6  # auto: enumeration is exact and usually fastest; the rest is kept for the NLP fallback

# Fixed caps, in seconds, whatever the limit.
# auto on SIMD CPUs: the widening passes around the best register tiles (enumeration.seeded);
# their greedy dive may take longer. Plans found within 0.4 s matched those of 4 s passes
# within 2% of predicted time on 8 workloads (BENCHMARKS.md), and the CLI must answer a
# 1024^3 GEMM in under a second, imports included.
SEED_SECONDS = 0.4
# auto on GPUs: many launches come within a few percent of each other (wave quantisation), so
# proving the best takes long; enumerate's best plan after this long is returned.
GPU_SECONDS = 1.5
# tune: polishing breaks ties and trims data movement, so it gets a short slice.
POLISH_SECONDS = 0.15
# pyomo solvers: the polish of each rounded relaxed solution.
ROUND_POLISH_SECONDS = 0.2

CAPS = ("SEED_SECONDS", "GPU_SECONDS", "POLISH_SECONDS", "ROUND_POLISH_SECONDS")
