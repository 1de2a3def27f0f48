import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.workers.batching.token_batching import padding_fraction, plan_batches


@given(
    st.lists(st.integers(1, 512), min_size=0, max_size=400),
    st.integers(256, 16384),
    st.integers(1, 256),
)
@settings(max_examples=200, deadline=None)
def test_batches_cover_every_index_once_within_budget(lengths, budget, cap):
    lengths = np.array(lengths, dtype=np.int64)
    batches = plan_batches(lengths, budget, cap)
    seen = np.concatenate(batches) if batches else np.array([], dtype=np.int64)
    assert sorted(seen.tolist()) == list(range(len(lengths)))
    for batch in batches:
        assert 1 <= len(batch) <= cap
        assert len(batch) == 1 or len(batch) * lengths[batch].max() <= budget


def test_sorted_batches_waste_little_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(8, 256, size=5000)
    batches = plan_batches(lengths, 8192, 256)
    assert padding_fraction(lengths, batches) < 0.05
    arrival_order = [np.arange(i, min(i + 32, 5000)) for i in range(0, 5000, 32)]
    assert padding_fraction(lengths, arrival_order) > 0.4
