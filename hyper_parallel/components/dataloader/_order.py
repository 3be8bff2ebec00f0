"""The sample order of every source, computed: no index of the corpus held in memory (``DataLoader``).

One scheme for every source. A dataset is one or more sources of samples (sizes ``N_s``); position ``g``
of the endless blended stream names source ``s`` and its ``j``-th sample; epoch ``e`` of the loader is
positions ``[e * N, (e + 1) * N)`` with ``N = sum(N_s)``.

- Blending (Megatron's semantics, exact and computed): source ``s`` with weight ``w_s`` (normalized) takes
  its ``k``-th sample at the ideal time ``(k + 1/2) / w_s``; the stream is every source's samples merged by
  that time (ties to the lower source index). In every window of positions each source's count is within
  one sample of its weight's share. The state before any position ``g`` (how many samples each source has
  given) is found in ``O(K^2)`` from ``g`` alone, so resuming needs no replay.
- Each source cycles through its own epochs: its ``j``-th sample is sample ``j mod N_s`` of its own epoch
  ``j // N_s``, shuffled per (seed, source, epoch) by a keyed permutation (a Feistel network on the next
  power of four, walked back into ``[0, N_s)``): a bijection computed per index, so neither the order nor
  its inverse is stored, whatever the corpus size.

With one source (every ``jsonl``/``text``/``python_docs`` dataset) position ``g`` of epoch ``e`` is
sample ``perm_e(g - e * N)``: a plain per-epoch shuffle.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from fractions import Fraction
from math import lcm
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Permutation", "SampleOrder"]

_ROUNDS = 6
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """A 64-bit finalizer (splitmix64's): every input bit moves every output bit."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    mixed: npt.NDArray[np.uint64] = x ^ (x >> np.uint64(31))
    return mixed


def _key(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "little")


class Permutation:
    """A keyed bijection of ``[0, n)``, evaluated on arrays of indices."""

    def __init__(self, n: int, key: int) -> None:
        self.n = n
        bits = max(2, (n - 1).bit_length())
        bits += bits % 2
        self.half = np.uint64(bits // 2)
        self.low = np.uint64((1 << (bits // 2)) - 1)
        self.keys = [np.uint64(_key(key, r)) for r in range(_ROUNDS)]

    def _encrypt(self, x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        left, right = x >> self.half, x & self.low
        for key in self.keys:
            left, right = right, left ^ (_mix(right ^ key) & self.low)
        result: npt.NDArray[np.uint64] = (left << self.half) | right
        return result

    def __call__(self, index: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
        out = self._encrypt(np.asarray(index, dtype=np.uint64))
        outside = out >= self.n
        while outside.any():  # cycle-walk back into [0, n): a bijection of [0, n)
            out[outside] = self._encrypt(out[outside])
            outside = out >= self.n
        return out.astype(np.int64)


class SampleOrder:
    """Positions of the loader's epochs to flat sample indices (sources concatenated in order)."""

    def __init__(
        self, sizes: Sequence[int], weights: Sequence[float] | None, *, seed: int, shuffle: bool
    ) -> None:
        if not sizes or min(sizes) < 1:
            raise ValueError(f"every source needs at least one sample, got sizes {list(sizes)}")
        self.sizes = [int(n) for n in sizes]
        self.total = sum(self.sizes)
        self.starts = [sum(self.sizes[:s]) for s in range(len(self.sizes))]
        self.seed, self.shuffle = seed, shuffle
        exact = [Fraction(str(w)) for w in (weights if weights is not None else self.sizes)]
        scale = lcm(*(f.denominator for f in exact))
        self.units = [int(f * scale) for f in exact]  # integer weights: the merge compares exactly
        self.unit_total = sum(self.units)
        self._perms: dict[tuple[int, int], Permutation] = {}

    def digest(self) -> int:
        """A 63-bit digest of the sources' sizes and weights: two orders with the same digest are equal."""
        return _key(*self.sizes, "/", *self.units) >> 1

    # -- blending --------------------------------------------------------------------------------------
    def _before(self, source: int, count: int) -> tuple[int, int]:
        """Sort key of source's ``count``-th sample: ideal time ``(2 count + 1) / (2 u)``, as a fraction."""
        return 2 * count + 1, self.units[source]

    def _less(self, a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
        """``(numerator, denominator, source)`` keys compared exactly, ties to the lower source."""
        left, right = a[0] * b[1], b[0] * a[1]
        return left < right or (left == right and a[2] < b[2])

    def counts(self, position: int) -> list[int]:
        """How many samples each source gives before ``position`` of the blended stream."""
        if len(self.units) == 1:
            return [position]
        total = self.unit_total
        # Keys below time ``position`` (in units where the whole stream advances one per position).
        counts = [max(0, -((total - 2 * position * u) // (2 * total))) for u in self.units]
        while sum(counts) > position:  # drop the latest keys taken
            last = max(
                (s for s in range(len(counts)) if counts[s] > 0),
                key=lambda s: (Fraction(2 * counts[s] - 1, self.units[s]), s),
            )
            counts[last] -= 1
        while sum(counts) < position:  # take the earliest keys left
            counts[self._next(counts)] += 1
        return counts

    def _next(self, counts: Sequence[int]) -> int:
        best = 0
        for s in range(1, len(counts)):
            a = (*self._before(s, counts[s]), s)
            b = (*self._before(best, counts[best]), best)
            if self._less(a, b):
                best = s
        return best

    def sources(self, position: int, length: int) -> list[tuple[int, int]]:
        """``(source, its sample number)`` at positions ``[position, position + length)``."""
        counts = self.counts(position)
        out = []
        for _ in range(length):
            source = self._next(counts)
            out.append((source, counts[source]))
            counts[source] += 1
        return out

    # -- each source's own epochs ----------------------------------------------------------------------
    def _permutation(self, source: int, epoch: int) -> Permutation:
        key = (source, epoch)
        if key not in self._perms:
            if len(self._perms) > 64:
                self._perms.clear()
            seed_key = _key(self.seed, epoch) if len(self.sizes) == 1 else _key(self.seed, source, epoch)
            self._perms[key] = Permutation(self.sizes[source], seed_key)
        return self._perms[key]

    def indices(self, epoch: int, positions: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
        """Flat sample indices of ``positions`` of loader epoch ``epoch``."""
        if len(self.sizes) == 1:  # one source: its epoch is the loader's
            local = np.asarray(positions, dtype=np.int64)
            return self._permutation(0, epoch)(local) if self.shuffle else local
        flat = np.empty(len(positions), dtype=np.int64)
        for i, p in enumerate(np.asarray(positions, dtype=np.int64).tolist()):
            ((source, j),) = self.sources(epoch * self.total + p, 1)
            n = self.sizes[source]
            within = j % n
            if self.shuffle:
                within = int(self._permutation(source, j // n)(np.asarray([within]))[0])
            flat[i] = self.starts[source] + within
        return flat
