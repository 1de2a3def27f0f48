import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.workers.batching.token_batching import padding_fraction, plan_batches


@given(
    st.lists(st.integers(1, 512), min_size=0, max_size=400),
    st.integers(256, 16384),
    st.integers(1, 256),
    st.sampled_from([None, 0.5, 0.7, 1.0]),
)
@settings(max_examples=200, deadline=None)
def test_batches_cover_every_index_once_within_budget(lengths, budget, cap, similar):
    lengths = np.array(lengths, dtype=np.int64)
    batches = plan_batches(lengths, budget, cap, similar)
    seen = np.concatenate(batches) if batches else np.array([], dtype=np.int64)
    assert sorted(seen.tolist()) == list(range(len(lengths)))
    for batch in batches:
        assert 1 <= len(batch) <= cap
        assert len(batch) == 1 or len(batch) * lengths[batch].max() <= budget
        if similar is not None:
            assert lengths[batch].min() >= similar * lengths[batch].max()


def test_a_small_call_of_mixed_lengths_is_cut_by_length_on_a_cpu():
    """Issue 45: an online round of a few dozen texts fits one batch of the budget, padded to its longest; on a
    CPU, where a forward costs its padded tokens, texts of like lengths go together instead."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(9, 48, size=32)
    (whole,) = plan_batches(lengths, 2048, 256)
    assert padding_fraction(lengths, [whole]) > 0.3
    assert padding_fraction(lengths, plan_batches(lengths, 2048, 256, similar=0.7)) < 0.15


def test_sorted_batches_waste_little_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(8, 256, size=5000)
    batches = plan_batches(lengths, 8192, 256)
    assert padding_fraction(lengths, batches) < 0.05
    arrival_order = [np.arange(i, min(i + 32, 5000)) for i in range(0, 5000, 32)]
    assert padding_fraction(lengths, arrival_order) > 0.4
