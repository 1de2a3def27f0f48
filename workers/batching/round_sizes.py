"""How many inputs of a model one online round on this worker takes: what it computes within the round time.

An online round is not preempted (online_groups): a request that comes while
one computes waits for it whole, then for its own. A round of a fixed size (a
forward batch's worth, up to 512 inputs) takes milliseconds on a GPU and
seconds on a small CPU, where every small request beside a large one would
wait that long. So the worker measures its rounds, and its online pulls ask
for the inputs it computes within `Profile.online_round_seconds`
(`WorkerView.online_rows`; placement leases at most that many, and never more
than the model's online batch).

A round of n inputs takes about a + b x n seconds: the call's own cost a, and
b an input. The last rounds of a model give a and b (least squares; one size
alone gives b = seconds / inputs), and a round takes the inputs that fill
what the round time leaves after a, but never less than a's worth: for a
model whose call alone outlasts the round time, fewer inputs would not make
a round short, only make more of them. A round takes two inputs at least:
rounds of one alone never tell the call's cost from an input's, and one slow
outlier among few rounds (a round run inside another's device turn) would hold
a model at one input a round, a burst of requests then answered one by one.
A model not measured yet is not named: its first round is the online batch.
"""

from __future__ import annotations

from collections import deque

WINDOW = 16  # rounds per model the fit is taken over
MOST = 1 << 20  # an unbounded size, as an int (placement caps it at the online batch)
LEAST = 2  # inputs a round may take at least (see above)


class RoundSizes:
    """Per model, the inputs of one online round: `seconds` of it at its measured costs, at least LEAST."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._rounds: dict[str, deque[tuple[int, float]]] = {}

    def measured(self, model: str, inputs: int, seconds: float) -> None:
        """A group call of `model` computed `inputs` inputs in `seconds`."""
        if inputs > 0 and seconds > 0:
            self._rounds.setdefault(model, deque(maxlen=WINDOW)).append((inputs, seconds))

    def rows(self) -> dict[str, int]:
        """What an online pull asks for, per measured model."""
        return {model: self._size(rounds) for model, rounds in self._rounds.items()}

    def _size(self, rounds: deque[tuple[int, float]]) -> int:
        fixed, per_input = fit(rounds)
        if per_input <= 0:  # its time does not grow with its inputs: nothing to gain from a small round
            return MOST
        return max(LEAST, min(MOST, int(max(self.seconds - fixed, fixed) / per_input)))


def fit(rounds: deque[tuple[int, float]]) -> tuple[float, float]:
    """(a, b) of seconds = a + b x inputs over `rounds`, least squares, a >= 0; a = 0 when one size was seen."""
    count = len(rounds)
    mean_n = sum(n for n, _ in rounds) / count
    mean_t = sum(t for _, t in rounds) / count
    spread = sum((n - mean_n) ** 2 for n, _ in rounds)
    if spread == 0:
        return 0.0, mean_t / mean_n
    per_input = sum((n - mean_n) * (t - mean_t) for n, t in rounds) / spread
    fixed = mean_t - per_input * mean_n
    if fixed < 0:  # noise: no call costs less than nothing; the inputs carry it all
        return 0.0, sum(t for _, t in rounds) / sum(n for n, _ in rounds)
    return fixed, per_input
