"""Shared test fixtures."""
import numpy as np
import pytest


@pytest.fixture
def rng():
    """A fresh seeded generator per test (tests never depend on global random state)."""
    return np.random.default_rng(12345)
