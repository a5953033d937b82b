"""The seeded sweep (tests/sweep.py) on the XLA paths: the fallbacks keep the
kernels' semantics for every op, form, grouping and activation it draws."""

import pytest
import sweep


@pytest.mark.parametrize("index", range(48))
def test_sweep_case(index):
    failure = sweep.check(sweep.case(index))
    assert not failure, failure
