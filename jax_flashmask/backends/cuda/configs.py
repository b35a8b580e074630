"""The Hopper kernel configurations that exist, and the one table that picks them.

Every compiled kernel is one frozen config below. `cc/generate_kernels.py` reads this file (it
imports nothing but the standard library, so the generator runs without jax) and writes the
instantiation units and the C++ dispatch table under `cc/sm90/instantiations/`; the extension
exports the names it was built with (`compiled_configs`), so a development build of a subset
(`-DJAX_FLASHMASK_HEAD_DIMS=128`) is reported, not mis-called.

`forward_config` / `backward_config` are the table: one row per (head dim, mask structure, soft
cap) or (head dim, deterministic, sm_margin > 0, soft cap), each with the reason it was chosen, an
anchor into docs/decisions.md where the measurements are.
"""

from __future__ import annotations

import dataclasses

__all__ = ["ForwardConfig", "BackwardConfig", "FORWARD_CONFIGS", "BACKWARD_CONFIGS",
           "FORWARD_TABLE", "BACKWARD_TABLE", "STRUCTURES", "HEAD_DIMS", "DTYPES",
           "forward_config", "backward_config", "backward_calls", "config_by_name"]

HEAD_DIMS = (64, 128, 256)
DTYPES = ("bf16", "fp16")
STRUCTURES = ("full", "causal", "general")


@dataclasses.dataclass(frozen=True)
class ForwardConfig:
    """One forward kernel (cc/sm90/fwd_kernel.cuh), compiled for bf16 and fp16.

    head_dim / block_n: the tile's head dim and keys per key block (the block-metadata
    granularity); consumer_warpgroups: 64 query rows each (block_m = 64 * consumer_warpgroups);
    group_walk: key blocks classified in groups of 32 first (second metadata level); mask_bits:
    the element mask of partial key blocks as bit words built by the producer's spare warps;
    paired_tiles: query tiles handed out in pairs (heaviest with lightest), the second walked
    from its last key block down; soft_cap: the scores pass through cap·tanh(s / cap) (the cap
    itself is a run-time argument). Every shipped forward runs on the persistent grid
    (num_SMs - sm_margin CTAs)."""

    head_dim: int
    block_n: int
    consumer_warpgroups: int = 2
    group_walk: bool = False
    mask_bits: bool = False
    paired_tiles: bool = False
    soft_cap: bool = False

    @property
    def name(self) -> str:
        s = f"fwd_d{self.head_dim}_bn{self.block_n}_wg{self.consumer_warpgroups}"
        return s + "".join(f"_{f}" for f, on in (("walk", self.group_walk), ("bits", self.mask_bits),
                                                 ("paired", self.paired_tiles),
                                                 ("softcap", self.soft_cap)) if on)

    @property
    def block_m(self) -> int:
        return 64 * self.consumer_warpgroups

    persistent = True  # every shipped forward: sm_margin is honoured

    def workspace_words(self, B: int, Hm: int, Sk: int) -> int:
        """int32 words of the forward's workspace: the block metadata [B, Hm, 8, nblk], the tile
        counter (padded to 32 words: the group metadata after it is 16-byte aligned), with
        group_walk the group metadata (as much again), then the unseen-column words laid out as
        the block metadata (cc/sm90/unseen.cuh)."""
        nblk = -(-Sk // self.block_n)
        ws = B * Hm * 8 * nblk + 32
        return (2 * ws if self.group_walk else ws) + B * Hm * 8 * nblk


@dataclasses.dataclass(frozen=True)
class BackwardConfig:
    """One backward kernel (cc/sm90/bwd_kernel.cuh, or bwd_d256_kernel.cuh at d = 256), compiled
    for bf16 and fp16.

    block_m: query rows per tile (Sq is padded to a multiple: the dQ / row-statistics
    workspaces); block_n: keys per CTA (the metadata granularity); persistent: a grid of
    num_SMs - sm_margin CTAs taking (key block, kv head, batch) items heaviest first (the only
    kernel that leaves SMs free); mask_regs: the bounds of a thread's key columns kept in
    registers, one bit per element on partial tiles; lockstep: the two consumer warpgroups in
    lock-step, dQ computed transposed (80-row tiles); det_launch_groups: in deterministic mode,
    interleaved launch groups and the key-block order sized on the device from the metadata;
    soft_cap: P from cap·tanh(s / cap) and dS times its derivative."""

    head_dim: int
    block_m: int
    block_n: int
    persistent: bool = False
    mask_regs: bool = False
    lockstep: bool = False
    det_launch_groups: bool = False
    soft_cap: bool = False

    @property
    def name(self) -> str:
        s = f"bwd_d{self.head_dim}_bm{self.block_m}_bn{self.block_n}"
        return s + "".join(f"_{f}" for f, on in (
            ("persistent", self.persistent), ("regs", self.mask_regs), ("lockstep", self.lockstep),
            ("detgroups", self.det_launch_groups), ("softcap", self.soft_cap)) if on)

    def meta_words(self, B: int, Hm: int, K: int, Sk: int, N: int, Sq: int) -> int:
        """int32 words of the metadata workspace, in bwd_host.cuh's bwd_meta_layout order: the
        block metadata [B, Hm, 8, nblk]; the scheduler area (counter, launch group size, order
        flag, spare, then the persistent kernel's key-block order [nblk]); the deterministic
        key-block orders [B, Hm, nblk]; the look-ahead zeroing's counters [K * B]; the
        unseen-column words laid out as the block metadata [B, Hm, 8 * nblk]; the query tiles'
        empty-row flags [B, N, ceil(Sq / block_m)] (cc/sm90/unseen.cuh)."""
        nblk = -(-Sk // self.block_n)
        mblk = -(-Sq // self.block_m)
        return (B * Hm * 8 * nblk + 4 + nblk + B * Hm * nblk + K * B + B * Hm * 8 * nblk
                + B * N * mblk)

    def workspace_shapes(self, B: int, Sq: int, Sk: int, N: int, K: int, Hm: int,
                         deterministic: bool) -> dict:
        """Shapes of the backward's workspaces, in the FFI call's order: the fp32 dQ accumulator
        [B, N, sq_pad, d] (Sq padded to block_m), the row statistics [2, B, N, sq_pad], the
        metadata words, and the deterministic mode's ordering bits [B, N, query tiles,
        ceil(nblk / 32)] (one word otherwise)."""
        sq_pad = -(-Sq // self.block_m) * self.block_m
        nblk = -(-Sk // self.block_n)
        sem = (B, N, sq_pad // self.block_m, -(-nblk // 32)) if deterministic else (1,)
        return {"dq_accum": (B, N, sq_pad, self.head_dim), "rowstats": (2, B, N, sq_pad),
                "meta": (self.meta_words(B, Hm, K, Sk, N, Sq),), "dq_sem": sem}


# ------------------------------------------------------------------ what is compiled (one list)
FWD_D64 = ForwardConfig(64, 128, consumer_warpgroups=3, group_walk=True, mask_bits=True)
FWD_D128 = ForwardConfig(128, 128, group_walk=True, mask_bits=True)
FWD_D256_BN80 = ForwardConfig(256, 80)
FWD_D256_BN80_PAIRED = ForwardConfig(256, 80, paired_tiles=True)
FWD_D256 = ForwardConfig(256, 64, group_walk=True, mask_bits=True)

BWD_D64 = BackwardConfig(64, 128, 128, mask_regs=True)
BWD_D128 = BackwardConfig(128, 80, 128, mask_regs=True, lockstep=True)
BWD_D128_DET = BackwardConfig(128, 80, 128, mask_regs=True, lockstep=True, det_launch_groups=True)
BWD_D256 = BackwardConfig(256, 64, 64)
BWD_D64_PERSISTENT = BackwardConfig(64, 64, 128, persistent=True)
BWD_D128_PERSISTENT = BackwardConfig(128, 64, 128, persistent=True)

# The logits soft cap on the general kernel of each head dim (compiled into the instantiation
# unit of the same config without it: cc/generate_kernels.py).
# d = 64: two consumer warpgroups (232 registers each) with the cap: the three-warpgroup tile's
# 160 registers spill with the tanh (docs/decisions.md#softcap-kernels)
FWD_D64_SOFTCAP = dataclasses.replace(FWD_D64, consumer_warpgroups=2, soft_cap=True)
FWD_D128_SOFTCAP = dataclasses.replace(FWD_D128, soft_cap=True)
FWD_D256_SOFTCAP = dataclasses.replace(FWD_D256, soft_cap=True)
BWD_D64_SOFTCAP = dataclasses.replace(BWD_D64, soft_cap=True)
BWD_D128_SOFTCAP = dataclasses.replace(BWD_D128, soft_cap=True)
BWD_D256_SOFTCAP = dataclasses.replace(BWD_D256, soft_cap=True)

FORWARD_CONFIGS = (FWD_D64, FWD_D128, FWD_D256_BN80, FWD_D256_BN80_PAIRED, FWD_D256,
                   FWD_D64_SOFTCAP, FWD_D128_SOFTCAP, FWD_D256_SOFTCAP)
BACKWARD_CONFIGS = (BWD_D64, BWD_D128, BWD_D128_DET, BWD_D256, BWD_D64_PERSISTENT,
                    BWD_D128_PERSISTENT, BWD_D64_SOFTCAP, BWD_D128_SOFTCAP, BWD_D256_SOFTCAP)


# ------------------------------------------------------------------------------- the table
# (head_dim, structure, soft_cap) -> (config, reason). structure: "full" / "causal" when the caller passed no
# mask vectors (the mask is dense up to the causal edge), "general" otherwise. The result is exact
# for any bounds; the structure only picks the fastest kernel.
FORWARD_TABLE = {
    (64, "full", False): (FWD_D64, "three consumer warpgroups hide softmax under two GEMMs; "
                   "docs/decisions.md#fwd-d64-wg3"),
    (64, "causal", False): (FWD_D64, "as full; docs/decisions.md#fwd-d64-wg3"),
    (64, "general", False): (FWD_D64, "group walk and mask bits keep the three-warpgroup tile ahead on "
                      "masks too; docs/decisions.md#fwd-d64-wg3"),
    (128, "full", False): (FWD_D128, "group walk + mask bits equal or ahead on every mask and length; "
                    "docs/decisions.md#fwd-d128"),
    (128, "causal", False): (FWD_D128, "as full; docs/decisions.md#fwd-d128"),
    (128, "general", False): (FWD_D128, "as full; docs/decisions.md#fwd-d128"),
    (256, "full", False): (FWD_D256_BN80, "key blocks of 80 amortize per-block costs over more GEMM "
                    "work; docs/decisions.md#fwd-d256-bn80"),
    (256, "causal", False): (FWD_D256_BN80_PAIRED, "paired tiles keep the CTAs' K/V reads in step (L2); "
                      "docs/decisions.md#fwd-d256-paired-tiles"),
    (256, "general", False): (FWD_D256, "group walk + mask bits win on bands and documents; "
                       "docs/decisions.md#fwd-d256-general"),
}
# the soft cap: the general kernel of each head dim with the cap, whatever the structure
FORWARD_TABLE.update({
    (d, structure, True): (cfg, "the cap's tanh on the general kernel's walk, one per head dim "
                           "(two consumer warpgroups at d = 64); docs/decisions.md#softcap-kernels")
    for d, cfg in ((64, FWD_D64_SOFTCAP), (128, FWD_D128_SOFTCAP), (256, FWD_D256_SOFTCAP))
    for structure in STRUCTURES})

# (head_dim, deterministic, sm_margin > 0, soft_cap) -> (config, reason)
BACKWARD_TABLE = {
    (64, False, False, False): (BWD_D64, "128-row tiles split the dQ GEMM by rows; mask in registers; "
                         "docs/decisions.md#bwd-d64-rows128"),
    (64, True, False, False): (BWD_D64, "same kernel, dQ summed in the order of the device pre-pass; "
                        "docs/decisions.md#bwd-d64-rows128"),
    (128, False, False, False): (BWD_D128, "80-row tiles, lock-step consumers, clocked walk beyond the "
                          "L2; docs/decisions.md#bwd-d128-rows80"),
    (128, True, False, False): (BWD_D128_DET, "80-row kernel with launch groups and key-block order "
                         "sized on the device; docs/decisions.md#det-arrival-order"),
    (256, False, False, False): (BWD_D256, "its own kernel: 64 keys per CTA, warpgroups split d; "
                          "docs/decisions.md#bwd-d256-kernel"),
    (256, True, False, False): (BWD_D256, "as above, device key-block order; docs/decisions.md#bwd-d256-kernel"),
    (256, False, True, False): (BWD_D256, "one CTA per work item: sm_margin is not honoured at d = 256; "
                         "docs/decisions.md#bwd-d256-kernel"),
    (256, True, True, False): (BWD_D256, "as above; docs/decisions.md#bwd-d256-kernel"),
    (64, False, True, False): (BWD_D64_PERSISTENT, "the persistent grid is the only one that leaves SMs "
                        "free; docs/decisions.md#bwd-sm-margin-persistent"),
    (64, True, True, False): (BWD_D64_PERSISTENT, "as above; docs/decisions.md#bwd-sm-margin-persistent"),
    (128, False, True, False): (BWD_D128_PERSISTENT, "as above; docs/decisions.md#bwd-sm-margin-persistent"),
    (128, True, True, False): (BWD_D128_PERSISTENT, "as above; docs/decisions.md#bwd-sm-margin-persistent"),
}
# the soft cap: the default kernel of each head dim with the cap; deterministic mode on the same
# kernel (its ordering bits; at d = 128 without the launch groups); sm_margin is not honoured (no
# persistent soft-cap kernel), as at d = 256
BACKWARD_TABLE.update({
    (d, det, margin, True): (cfg, "the cap on the default kernel; deterministic through its "
                             "ordering bits, sm_margin not honoured; docs/decisions.md#softcap-kernels")
    for d, cfg in ((64, BWD_D64_SOFTCAP), (128, BWD_D128_SOFTCAP), (256, BWD_D256_SOFTCAP))
    for det in (False, True) for margin in (False, True)})


def forward_config(head_dim: int, structure: str = "general", soft_cap: bool = False) -> ForwardConfig:
    """The forward kernel for `head_dim`, mask `structure` and whether the logits are soft-capped
    (ValueError: name the fix)."""
    if structure not in STRUCTURES:
        raise ValueError(f"structure must be one of {STRUCTURES}, got {structure!r}")
    row = FORWARD_TABLE.get((int(head_dim), structure, bool(soft_cap)))
    if row is None:
        raise NotImplementedError(f"the CUDA kernels support head dims {HEAD_DIMS}, not "
                                  f"{head_dim}; use implementation='xla'")
    return row[0]


def backward_config(head_dim: int, deterministic: bool = False, sm_margin: int = 0,
                    soft_cap: bool = False) -> BackwardConfig:
    """The backward kernel for `head_dim`, `deterministic`, whether SMs are left free and whether
    the logits are soft-capped."""
    row = BACKWARD_TABLE.get((int(head_dim), bool(deterministic), int(sm_margin) > 0,
                              bool(soft_cap)))
    if row is None:
        raise NotImplementedError(f"the CUDA backward supports head dims {HEAD_DIMS}, not "
                                  f"{head_dim}; use implementation='xla'")
    return row[0]


def backward_calls(head_dim: int, soft_cap: bool = False) -> list:
    """(config, deterministic, with sm_margin > 0) of each distinct backward kernel call the table
    makes at `head_dim` (a margin only counts where the config honours it: the persistent grid)."""
    calls = []
    for (d, det, margin, cap), (cfg, _) in BACKWARD_TABLE.items():
        call = (cfg, det, margin and cfg.persistent)
        if d == head_dim and cap == soft_cap and call not in calls:
            calls.append(call)
    return calls


def config_by_name(name: str):
    """The forward or backward config called `name` (ValueError listing the valid names)."""
    for c in FORWARD_CONFIGS + BACKWARD_CONFIGS:
        if c.name == name:
            return c
    valid = ", ".join(c.name for c in FORWARD_CONFIGS + BACKWARD_CONFIGS)
    raise ValueError(f"unknown kernel config {name!r}; valid: {valid}")
