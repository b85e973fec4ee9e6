"""The faults of one run, drawn from a seed: the same seed, length and shape give the same
schedule, so a failing run is replayed by its seed.

Faults come at random gaps (a couple of seconds on average), each with a duration drawn
from its kind's range, so they overlap: a kill during a catalog outage, a paused replica
whose clock also jumped, a full disk while the broker restarts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from nemesis.catalogue import KINDS, Kind

__all__ = ["Step", "describe", "draw", "draw_rounds"]

# Mean seconds between two faults' starts.
_MEAN_GAP = 2.5
# The first fault waits for the replicas to have written a little.
_FIRST = 4.0


@dataclass(frozen=True)
class Step:
    at: float  # seconds into the run
    kind: str
    target: int  # a replica slot, a table index, or 0 where the kind has one target
    seconds: float  # how long the fault lasts (0: it happens at once)
    choice: int  # a kind's own pick (which clock step, which disk fault, ...)

    def text(self) -> str:
        return f"{self.at:7.1f}s {self.kind}[{self.target}] {self.seconds:.1f}s #{self.choice}"


def draw(seed: int, seconds: float, replicas: int, variant: str) -> list[Step]:
    """The schedule of a run of ``seconds`` with ``replicas`` slots on ``variant``."""
    rng = random.Random(f"nemesis/{seed}/{replicas}/{variant}")
    kinds = [k for k in KINDS if variant in k.variants]
    weights = [k.weight for k in kinds]
    steps: list[Step] = []
    at = _FIRST
    while at < seconds:
        kind: Kind = rng.choices(kinds, weights)[0]
        low, high = kind.seconds
        steps.append(
            Step(
                at=round(at, 2),
                kind=kind.name,
                target=rng.randrange(kind.targets(replicas)),
                seconds=round(rng.uniform(low, high), 2),
                choice=rng.randrange(1 << 16),
            )
        )
        at += rng.expovariate(1 / _MEAN_GAP)
    return steps


def draw_rounds(seeds: tuple[int, ...], seconds: float, replicas: int, variant: str) -> list[Step]:
    """Each seed's schedule of ``seconds``, one after the other on the same replicas and
    tables: a short run covers several seeds without starting its world once per seed."""
    steps: list[Step] = []
    for n, seed in enumerate(seeds):
        offset = n * seconds
        steps += [
            Step(round(s.at + offset, 2), s.kind, s.target, s.seconds, s.choice)
            for s in draw(seed, seconds, replicas, variant)
        ]
    return steps


def describe(steps: list[Step]) -> str:
    return "\n".join(step.text() for step in steps)
