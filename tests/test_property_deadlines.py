"""Property tests have no deadline (tests/conftest.py loads the profile): with Hypothesis' default
of 200 ms an example, a machine that descheduled the test process for a fifth of a second during
one example failed a property that holds ("Unreliable test timings"), as a loaded CI machine does
now and then. The profile holds for a test's own @settings(...) too."""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.backend_independent

_plain = itertools.count()
_own = itertools.count()


def _descheduled_once(calls: itertools.count[int]) -> None:
    if next(calls) == 3:
        time.sleep(0.3)  # what a loaded machine does to one example, at any moment


@given(st.integers())
def test_a_property_holds_however_long_one_of_its_examples_takes(n: int) -> None:
    _descheduled_once(_plain)
    assert n + 0 == n


@settings(max_examples=20)
@given(st.text(max_size=3))
def test_a_tests_own_settings_keep_the_profiles_no_deadline(text: str) -> None:
    _descheduled_once(_own)
    assert text[::-1][::-1] == text
