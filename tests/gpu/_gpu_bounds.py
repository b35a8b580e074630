"""Canonical bounds ([B, Hm, 4, Sk] int32) for the GPU kernel tests, shared by forward and backward."""

import numpy as np


def causal_bounds(B, Hm, Sq, Sk):
    j = np.arange(Sk)
    b = np.zeros((B, Hm, 4, Sk), np.int32)
    b[:, :, 0] = Sq
    b[:, :, 1] = Sq
    b[:, :, 3] = np.clip(j - (Sk - Sq), 0, Sq)
    return b


def random_bounds(rng, B, Hm, Sq, Sk, p_unmasked=0.3):
    lts = rng.integers(0, Sq + 1, (B, Hm, Sk))
    lte = lts + rng.integers(0, Sq + 1, (B, Hm, Sk))
    uts = rng.integers(0, Sq + 1, (B, Hm, Sk))
    ute = uts + rng.integers(0, Sq // 2 + 1, (B, Hm, Sk))
    b = np.stack([lts, np.minimum(lte, Sq), uts, np.minimum(ute, Sq)], axis=2)
    free = rng.random((B, Hm, 1, Sk)) < p_unmasked
    b = np.where(free, np.array([Sq, Sq, 0, 0])[None, None, :, None], b)
    return b.astype(np.int32)
