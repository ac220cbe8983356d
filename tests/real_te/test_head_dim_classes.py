"""The training table holds one representative per class of head dims: every sampled pair of a class
gets its representative's answer from TE's real selector, at every TE version the table holds."""

from __future__ import annotations

import pytest

from tests.conftest import module_json
from tests.real_te import TE_PATHS

pytestmark = pytest.mark.real_te


@pytest.mark.parametrize("te_path", [None, *TE_PATHS])
def test_every_head_dim_of_a_class_gets_its_representatives_answer(te_path):
    assert module_json("tests.real_te.head_dim_classes", first_on_path=te_path, timeout=600) == []
