"""Plans must not change when the code is restructured: each golden case solves to the
recorded plan, alternatives, status and candidate count, byte for byte (see golden_cases.py)."""
import json

import pytest
from golden_cases import CASES, GOLDEN, solve

RECORDED = json.loads(GOLDEN.read_text())


def test_golden_set_is_large_and_varied():
    assert len(CASES) >= 20 and set(RECORDED) == {c[0] for c in CASES}
    assert {c[3] for c in CASES} == {"auto", "enumerate", "pyomo-ipopt", "pyomo-scip"}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_plan_is_byte_identical_to_the_recorded_one(case):
    doc = solve(case)
    doc.pop("seconds")
    assert json.dumps(doc, sort_keys=True) == json.dumps(RECORDED[case[0]], sort_keys=True)
