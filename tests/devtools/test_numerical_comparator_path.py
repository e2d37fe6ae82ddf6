"""``devtools.inspector.numerical_comparator``, the reference's import path of the comparators (issue 26): the
same classes, computing the reference's metrics (checked against numpy)."""

from __future__ import annotations

import numpy as np
import torch

from edgetorch.devtools.inspector import comparators
from edgetorch.devtools.inspector.numerical_comparator import (
    L1Comparator,
    MSEComparator,
    NumericalComparatorBase,
    SNRComparator,
)


def test_the_reference_path_gives_the_comparators_and_their_metrics():
    assert (L1Comparator, MSEComparator, SNRComparator, NumericalComparatorBase) == (
        comparators.L1Comparator, comparators.MSEComparator, comparators.SNRComparator,
        comparators.NumericalComparatorBase)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    assert np.isclose(L1Comparator().element_compare(ta, tb), np.abs(a - b).sum())
    assert np.isclose(MSEComparator().element_compare(ta, tb), ((a - b) ** 2).mean())
    snr = 10 * np.log10((a ** 2).mean() / ((a - b) ** 2).mean())
    assert np.isclose(SNRComparator().element_compare(ta, tb), snr)
