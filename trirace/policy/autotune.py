"""Tuning chunk and credit sizes while training, as ByteScheduler does, but deterministic.

Every rank feeds the tuner the same numbers (step times summed over the world by the
metrics all-reduce), so every rank reaches the same decision at the same step without a
broadcast: the chunking of a collective must be agreed by its whole group.
Trials are a fixed, short list of (partition, credit) pairs, each run for `warmup + measure`
steps; the winner applies once every rank is sure to have seen all trials. A grid this
small needs no Bayesian optimisation: 6 trials x 3 steps cost ~18 steps.
"""

from __future__ import annotations

import dataclasses
import statistics

from .policies import MiB, Policy

# (partition MiB, credit MiB); credit None = unbounded. Spans 0.5-8 MiB chunks with one
# to four chunks in flight: the range where a P2P transfer waits at most a few chunks.
TRIALS = ((0.5, 1.0), (1.0, 2.0), (2.0, 4.0), (4.0, 8.0), (2.0, 8.0), (8.0, 16.0))


class Tuner:
    def __init__(self, policy: Policy, lag: int, warmup: int = 1, measure: int = 2, first_step: int = 1):
        self.base = policy
        self.trials = [self._policy(p, c) for p, c in TRIALS]
        self.warmup, self.measure = warmup, measure
        self.first = first_step  # step 0 carries start-up costs
        self.per_trial = warmup + measure
        self.trials_end = first_step + len(self.trials) * self.per_trial
        # The winner is known once step trials_end - 1 is observed, which on every rank
        # happens before it plans step trials_end - 1 + lag + 3 (see StepMetrics in runtime/step_metrics.py).
        self.apply_from = self.trials_end + lag + 3
        self.times: dict[int, float] = {}
        self.best: Policy | None = None

    def _policy(self, partition_mb: float, credit_mb: float | None) -> Policy:
        credit = None if (credit_mb is None or self.base.credit_bytes is None) else int(credit_mb * MiB)
        return dataclasses.replace(self.base, partition_bytes=int(partition_mb * MiB), credit_bytes=credit)

    def policy_for(self, step: int) -> Policy:
        if self.first <= step < self.trials_end:
            return self.trials[(step - self.first) // self.per_trial]
        if step >= self.apply_from:
            assert self.best is not None, "tuner decision needed before it was made"
            return self.best
        return self.base

    def observe(self, step: int, step_time_s: float) -> None:
        if self.first <= step < self.trials_end and (step - self.first) % self.per_trial >= self.warmup:
            self.times[step] = step_time_s
        if step == self.trials_end - 1:
            score = [statistics.mean(self.times[s] for s in range(self.first + i * self.per_trial + self.warmup,
                                                                   self.first + (i + 1) * self.per_trial))
                     for i in range(len(self.trials))]
            self.best = self.trials[min(range(len(score)), key=score.__getitem__)]
            self.scores = score
