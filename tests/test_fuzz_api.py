"""Property-based fuzzing of the served OpenAPI schema with schemathesis: no 5xx, answers as documented.

Runs against a real uvicorn server on loopback whose time limit per solve is
capped at 1 s, so generated problems of any size answer quickly.
"""
import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from service_load import running_server  # noqa: E402

# One server for the module's tests: one xdist worker runs them (make test: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("fuzz")

# Per operation and generation mode; raise it for a deeper run than CI's.
EXAMPLES = int(os.environ.get("CACHETILE_FUZZ_EXAMPLES", "100"))
# Answers by status class each mode must reach, at least: valid bodies are accepted (some are
# infeasible or too large, 422), invalid ones rejected. Checked in the test that made them, so
# the count does not depend on which worker ran what.
REACHED = {GenerationMode.POSITIVE: (200, 20), GenerationMode.NEGATIVE: (400, 50)}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    # No autotuning: it measures kernels, seconds per request (tests/test_autotune_service.py covers it).
    with running_server(tmp_path_factory.mktemp("fuzz") / "plans.sqlite", "--max-time-limit", "1",
                        "--max-autotune", "0") as url:
        yield url, schemathesis.openapi.from_url(f"{url}/openapi.json")


# schemathesis' own pytest plugin does not run under pytest 9, so each operation's
# case strategy is driven by hypothesis directly.
@pytest.mark.parametrize("mode", list(GenerationMode), ids=lambda m: m.value)
def test_api(api, mode):
    url, schema = api
    statuses: Counter = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        raw = operation.definition.raw
        if mode is GenerationMode.NEGATIVE and "requestBody" not in raw:
            continue  # without a body there is nothing to make invalid (every path parameter is a string)

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        def call(case):
            response = case.call(base_url=url, timeout=15)
            statuses[response.status_code // 100 * 100] += 1
            assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text}"
            # A body can fit the schema and still be wrong (a gemm without k): 422 is right there.
            case.validate_response(response, excluded_checks=[positive_data_acceptance])

        call()
    print(f"\nfuzzing {mode.value}: {sum(statuses.values())} requests, by status class {dict(sorted(statuses.items()))}")
    status, least = REACHED[mode]
    assert statuses[500] == 0 and statuses[status] > least
