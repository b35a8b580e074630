"""CPU checks of the fused backward prep and the dQ convert (cc/sm90/bwd_aux.cu).

The kernels' index math is transcribed here and compared, for a grid of workspace shapes of every
backward configuration (64-, 80- and 128-row query tiles; d = 64 / 128 / 256), with what it
replaced:
- bwd_prep_fused_kernel zeroes exactly the bytes the removed cudaMemsetAsync of dq_accum zeroed
  (every float once, nothing outside), and writes the row statistics of every (b, h, i < sq_pad)
  exactly once (real rows from the input-order rows, padded rows from the grid-stride loop);
- D's summation: per row, the expression tree of the new 8-threads-per-row reduction equals the
  old warp-per-row one (same fmaf chains per old lane, same xor tree; + compared as commutative);
- bwd_convert80_kernel's new read split (warp w: blocks 20w .. 20w + 19) puts every float of the
  tile at the same shared-memory place as the old loop over p, and its write phase (8 columns per
  thread) writes each output once from the same place;
- bwd_convert_kernel (64-row fragment order, d = 64 / 128) and bwd_convert_quad_kernel (the d = 256
  kernel's quad order): their 8- / 16-float runs are the order's elements, each output is written
  once from its own element, and a warp reads whole runs back to back;
- the d = 256 kernel's 16-byte dQ adds put each accumulator element at its quad-order place.
"""
from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest

from jax_flashmask.backends.cuda import configs

ROOT = Path(__file__).resolve().parents[1]
SM90 = ROOT / "cc" / "sm90"
AUX = (SM90 / "bwd_aux.cu").read_text()
# the backward's host launcher and the parts it composes (the d = 256 kernel's launcher apart)
KERNEL = "\n".join(p.read_text() for p in sorted(SM90.glob("*.cuh")) if p.name != "bwd_d256_kernel.cuh")
D256 = (SM90 / "bwd_d256_kernel.cuh").read_text()

PREP_THREADS = 256
ROW_THREADS = 8
ROWS_PER_BLOCK = PREP_THREADS // ROW_THREADS


def shapes():
    out = []
    for c in configs.BACKWARD_CONFIGS:
        for B, Sq, N in ((1, 1, 1), (1, 79, 3), (2, 80, 2), (1, 81, 4), (3, 127, 1),
                         (1, 129, 2), (2, 200, 3), (1, 333, 5)):
            out.append((B, Sq, N, c.head_dim, c.block_m))
    return out


def memset_range(B, Sq, N, d, bm):
    """Bytes the removed cudaMemsetAsync zeroed: sizeof(float) * B * N * sq_pad * T::D."""
    sq_pad = -(-Sq // bm) * bm
    return 4 * B * N * sq_pad * d, sq_pad


def fused_grid(B, Sq, N):
    rows = B * Sq * N
    blocks = -(-rows // ROWS_PER_BLOCK)
    return blocks, blocks * PREP_THREADS


@pytest.mark.parametrize("B,Sq,N,d,bm", shapes())
def test_zeroing_covers_the_memset_range(B, Sq, N, d, bm):
    nbytes, sq_pad = memset_range(B, Sq, N, d, bm)
    zero_floats = B * N * sq_pad * d  # bwd_prepare_workspaces' argument
    assert 4 * zero_floats == nbytes
    _, nthreads = fused_grid(B, Sq, N)
    hits = np.zeros(zero_floats + 64, np.int32)  # + slack: a write past the end would show
    zero4 = zero_floats // 4
    for g in range(nthreads):  # float4 loop, then the scalar tail
        for j in range(g, zero4, nthreads):
            hits[4 * j:4 * j + 4] += 1
        for j in range(zero4 * 4 + g, zero_floats, nthreads):
            hits[j] += 1
    assert (hits[:zero_floats] == 1).all()
    assert (hits[zero_floats:] == 0).all()


@pytest.mark.parametrize("B,Sq,N,d,bm,K", [s + (K,) for s in shapes() for K in (1, 2, 4)
                                             if s[2] % K == 0])  # K kv heads divide N
def test_zero_ahead_prefix(B, Sq, N, d, bm, K):
    """launch_bwd_impl's zeroing amounts: K * B pairs of (N / K) * sq_pad * d floats are the
    whole memset range; unit 0 (pair 0 = kv head 0 of batch 0, or the first G pairs of a
    deterministic group) is a prefix of it, the rows of query heads 0 .. G * N / K - 1."""
    nbytes, sq_pad = memset_range(B, Sq, N, d, bm)
    pairs, pair_floats = K * B, (N // K) * sq_pad * d
    assert 4 * pair_floats * pairs == nbytes
    for g in range(1, pairs + 1):  # dq_accum [B, N, sq_pad, d]: pair u = b * K + hk
        rows = {(u // K, (u % K) * (N // K) + h) for u in range(g) for h in range(N // K)}
        flat = sorted(b * N + h for b, h in rows)
        assert flat == list(range(g * (N // K)))
        assert g * pair_floats == len(flat) * sq_pad * d


@pytest.mark.parametrize("B,Sq,N,d,bm", shapes())
def test_row_statistics_written_once(B, Sq, N, d, bm):
    _, sq_pad = memset_range(B, Sq, N, d, bm)
    blocks, nthreads = fused_grid(B, Sq, N)
    hits = np.zeros(B * N * sq_pad, np.int32)
    src_of = np.full(B * N * sq_pad, -1, np.int64)
    for blk in range(blocks):  # real rows: thread t == 0 of each live row
        for r in range(ROWS_PER_BLOCK):
            row = blk * ROWS_PER_BLOCK + r
            if row >= B * Sq * N:
                continue
            h = row % N
            bi = row // N
            i, b = bi % Sq, bi // Sq
            out = (b * N + h) * sq_pad + i
            hits[out] += 1
            src_of[out] = row
    pad = sq_pad - Sq
    if pad > 0:
        for g in range(nthreads):
            for j in range(g, B * N * pad, nthreads):
                out = (j // pad) * sq_pad + Sq + j % pad
                hits[out] += 1
    assert (hits == 1).all()
    # real rows read lse / dlse / O / dO at the same source row as the old kernel
    for out in range(B * N * sq_pad):
        i = out % sq_pad
        bh = out // sq_pad
        h, b = bh % N, bh // N
        assert src_of[out] == ((b * Sq + i) * N + h if i < Sq else -1)


def _add(a, b):
    return ("+",) + tuple(sorted((a, b), key=repr))  # IEEE addition is commutative


def old_delta_tree(d):
    """bwd_prep_kernel: lane l fmaf-chains the pairs at columns c = 2l + 64k, then the xor tree
    16, 8, 4, 2, 1 (acc += shfl_xor); the value lane 0 writes."""
    acc = []
    for lane in range(32):
        a = "0"
        for c in range(2 * lane, d, 64):
            a = ("fma", c, a)
            a = ("fma", c + 1, a)
        acc.append(a)
    for off in (16, 8, 4, 2, 1):
        acc = [_add(acc[l], acc[l ^ off]) for l in range(32)]
    assert len({repr(x) for x in acc}) == 1  # every lane holds the same value
    return acc[0]


def new_delta_tree(d):
    """bwd_prep_fused_kernel: thread t (of 8) holds chunks at columns 8t + 64k; a[s] chains
    elements 2s, 2s + 1 of each chunk; shuffles 4, 2, 1 across threads; (a0 + a2) + (a1 + a3)."""
    chunks = d // 64
    a = []
    for t in range(ROW_THREADS):
        at = []
        for s in range(4):
            acc = "0"
            for k in range(chunks):
                c = 8 * t + 64 * k + 2 * s
                acc = ("fma", c, acc)
                acc = ("fma", c + 1, acc)
            at.append(acc)
        a.append(at)
    for off in (4, 2, 1):
        a = [[_add(a[t][s], a[t ^ off][s]) for s in range(4)] for t in range(ROW_THREADS)]
    res = [_add(_add(a[t][0], a[t][2]), _add(a[t][1], a[t][3])) for t in range(ROW_THREADS)]
    assert len({repr(x) for x in res}) == 1
    return res[0]


@pytest.mark.parametrize("d", [64, 128, 256])
def test_delta_summation_order_unchanged(d):
    assert repr(new_delta_tree(d)) == repr(old_delta_tree(d))


ROWS80, D80, PAD80 = 80, 128, 132


def old_convert80_places():
    """bwd_convert80_kernel before: float offset o = 2p of the tile -> smem index (x.x; x.y at
    the next row)."""
    place = {}
    for p in range(ROWS80 * D80 // 2):
        o = 2 * p
        wq, w = o // (64 * ROWS80), o % (64 * ROWS80)
        blk, ln = w // 64, (w % 64) // 2
        rg, kk = blk // (ROWS80 // 8), blk % (ROWS80 // 8)
        cc = (rg // 2) * 16 + (rg % 2) * 8 + ln // 4
        r = kk * 8 + 2 * (ln % 4)
        c = wq * 64 + cc
        place[o] = r * PAD80 + c
        place[o + 1] = (r + 1) * PAD80 + c
    return place


def new_convert80_places():
    place = {}
    for tid in range(256):
        warp, lane = tid // 32, tid % 32
        src = warp * 20 * 32 + lane  # float2 index
        dst = 2 * (lane % 4) * PAD80 + (warp // 4) * 64 + (warp % 4) * 16 + lane // 4
        for u in range(20):
            o = 2 * (src + 32 * u)
            dd = dst + (u % 10) * 8 * PAD80 + (u // 10) * 8
            assert o not in place
            place[o] = dd
            place[o + 1] = dd + PAD80
    return place


def test_convert80_read_places_unchanged():
    old, new = old_convert80_places(), new_convert80_places()
    assert len(old) == ROWS80 * D80 and old == new
    assert len(set(new.values())) == ROWS80 * D80
    # bank check of one store instruction: warp's 32 lanes hit 32 distinct banks
    for warp in range(8):
        for u in range(20):
            banks = {new[2 * (warp * 640 + 32 * u + lane)] % 32 for lane in range(32)}
            assert len(banks) == 32


@pytest.mark.parametrize("Sq,mt", [(80, 0), (100, 1), (161, 2), (5, 0)])
def test_convert80_write_phase_unchanged(Sq, mt):
    old = {}
    for p in range(ROWS80 * D80 // 2):
        r, c = p // (D80 // 2), 2 * (p % (D80 // 2))
        if mt * ROWS80 + r >= Sq:
            break
        for j in range(2):
            old[(r, c + j)] = r * PAD80 + c + j
    new = {}
    for q in range(ROWS80 * (D80 // 8) // 256):
        for tid in range(256):
            p = q * 256 + tid
            r, c = p // (D80 // 8), 8 * (p % (D80 // 8))
            if mt * ROWS80 + r >= Sq:
                continue  # the kernel's break: rows ascend with p for a thread
            for j in range(8):
                assert (r, c + j) not in new
                new[(r, c + j)] = r * PAD80 + c + j
    assert old == new


def dq_cols(d):
    """Columns of one fragment-order slab (traits.h kDqCols): the two warpgroups split d >= 128."""
    return d // 2 if d >= 128 else d


def frag_offset(r, c, dqc):
    """The fragment order element by element (traits.h kDqCols, one 64-row block)."""
    wq, cc = c // dqc, c % dqc
    lane = 4 * (r % 8) + (cc % 8) // 2
    return wq * 64 * dqc + (((r // 16) * 2 + (r // 8) % 2) * (dqc // 8) + cc // 8) * 64 + 2 * lane + cc % 2


def frag_run(r, c, dqc):
    """bwd_aux.cu dq_frag_run: row r's floats of columns c .. c + 7 start here."""
    wq, cc = c // dqc, c % dqc
    return wq * 64 * dqc + ((r // 8) * (dqc // 8) + cc // 8) * 64 + 8 * (r % 8)


@pytest.mark.parametrize("d", [64, 128])
def test_convert_runs_are_the_fragment_order(d):
    dqc = dq_cols(d)
    seen = set()
    for r in range(64):
        for c in range(0, d, 8):
            for j in range(8):
                assert frag_offset(r, c + j, dqc) == frag_run(r, c, dqc) + j
                seen.add(frag_run(r, c, dqc) + j)
    assert seen == set(range(64 * d))


def quad_offset(r, c):
    """The d = 256 kernel's quad order element by element (bwd_aux.cu, one 64-row block): the
    fragment order with dqc = 128, a thread's elements of 8-column groups 2kp and 2kp + 1 adjacent."""
    wq, cc = c // 128, c % 128
    lane = 4 * (r % 8) + (cc % 8) // 2
    return wq * 64 * 128 + (((r // 16) * 2 + (r // 8) % 2) * 8 + cc // 16) * 128 + 4 * lane + 2 * ((cc // 8) % 2) + cc % 2


def quad_run(r, c):
    """bwd_aux.cu dq_quad_run: row r's 16 floats of columns c .. c + 15 (c a multiple of 16)."""
    wq, cc = c // 128, c % 128
    return wq * 64 * 128 + ((r // 8) * 8 + cc // 16) * 128 + 16 * (r % 8)


def quad_place(k, comp):
    """Column (within 16) of float4 load k's component comp in bwd_convert_quad_kernel."""
    return 2 * k + comp % 2 + 8 * (comp // 2)


def test_quad_runs_hold_their_row():
    seen = set()
    for r in range(64):
        for c in range(0, 256, 16):
            for k, comp in itertools.product(range(4), range(4)):
                o = quad_run(r, c) + 4 * k + comp
                assert o == quad_offset(r, c + quad_place(k, comp))
                seen.add(o)
    assert seen == set(range(64 * 256))
    # the convert's de-interleave: output half h, element j <- load j // 2, component j % 2 + 2h
    for h, j in itertools.product(range(2), range(8)):
        assert quad_place(j // 2, j % 2 + 2 * h) == 8 * h + j


def test_d256_dq_adds_are_the_quad_order():
    """The d = 256 backward's dQ adds (from registers, or staged for the deterministic writer) put
    accumulator elements (e, e + 1, e + 4, e + 5), e = 8kp + 2i, of consumer thread ctid at their
    (query row, d column)'s quad-order offsets; a warp's 16-byte adds cover 512 contiguous bytes."""
    kk = 128 // 8  # traits.h kDqKK
    seen = set()
    for ctid in range(256):
        wg, warp, lane = ctid // 128, (ctid // 32) % 4, ctid % 32
        fb = warp * 2 * kk * 64 + 4 * lane
        for kp, i in itertools.product(range(8), range(2)):
            o = wg * 64 * 128 + fb + (i * (kk // 2) + kp) * 128  # + wg * kDqHalfFloats
            for q, e in enumerate((8 * kp + 2 * i, 8 * kp + 2 * i + 1, 8 * kp + 2 * i + 4, 8 * kp + 2 * i + 5)):
                # the wgmma C layout (bwd_d256_kernel.cuh): row and column of element e
                r = 16 * warp + lane // 4 + 8 * ((e // 2) % 2)
                c = 128 * wg + 8 * (e // 4) + 2 * (lane % 4) + e % 2
                assert o + q == quad_offset(r, c)
                seen.add(o + q)
    assert seen == set(range(64 * 256))
    for kp, i in itertools.product(range(8), range(2)):  # one warp's add: 128 consecutive floats
        offs = sorted(4 * lane + (i * (kk // 2) + kp) * 128 for lane in range(32))
        assert offs == list(range(offs[0], offs[0] + 128, 4))
    for line in ("const int fb = ((ctid_b / 32) % 4) * 2 * T::kDqKK * 64 + 4 * (ctid_b % 32);",
                 "auto quad_offset = [&](int kp, int i) { return fb + (i * (T::kDqKK / 2) + kp) * 128; };",
                 "return make_float4(tdQrdQ(e), tdQrdQ(e + 1), tdQrdQ(e + 4), tdQrdQ(e + 5));",
                 "const int e = 8 * kp + 2 * i;",
                 "wg * T::kDqHalfFloats;"):
        assert line in D256, line
    assert D256.count("quad_offset(kp, i)") == 2  # the reduce-add and the staged store
    assert "static constexpr int kDqKK = kDCols / 8;" in (SM90 / "traits.h").read_text()


def convert_units(B, Sq, N, d, sq_pad):
    """The dQ convert's thread -> (source floats, output elements) map, as the kernel computes it:
    bwd_convert_kernel (8 columns from one fragment-order run) for d = 64 / 128,
    bwd_convert_quad_kernel (16 columns from one quad-order run) for d = 256."""
    cols = 16 if d == 256 else 8
    groups = d // cols
    units = B * N * sq_pad * groups
    for t in range(units):
        r8, q = t % 8, t // 8
        c = cols * (q % groups)
        g = q // groups
        rg, bh = g % (sq_pad // 8), g // (sq_pad // 8)
        i = 8 * rg + r8
        if i >= Sq:
            yield t, None, None
            continue
        row = bh * sq_pad + i
        h, b = bh % N, bh // N
        dst = ((b * Sq + i) * N + h) * d + c
        if d == 256:
            src = (row - i % 64) * d + quad_run(i % 64, c)
            yield t, [src + 4 * k + comp for k in range(4) for comp in range(4)], \
                [dst + quad_place(k, comp) for k in range(4) for comp in range(4)]
        else:
            src = (row - i % 64) * d + frag_run(i % 64, c, dq_cols(d))
            yield t, [src + j for j in range(8)], [dst + j for j in range(8)]


def element_offset(r, c, d):
    return quad_offset(r, c) if d == 256 else frag_offset(r, c, dq_cols(d))


@pytest.mark.parametrize("B,Sq,N,d,sq_pad", [(1, 64, 1, 64, 64), (2, 100, 3, 64, 128),
                                             (1, 130, 2, 128, 192), (2, 70, 1, 256, 128),
                                             (1, 64, 3, 256, 64)])
def test_convert_writes_each_output_once_from_its_element(B, Sq, N, d, sq_pad):
    out, warps = {}, {}
    for t, srcs, dsts in convert_units(B, Sq, N, d, sq_pad):
        if srcs is None:
            continue
        for src, dst in zip(srcs, dsts):
            assert dst not in out
            out[dst] = src
        warps.setdefault(t // 32, []).append(srcs[0])
    assert len(out) == B * Sq * N * d
    for b, i, h, c in itertools.product(range(B), range(Sq), range(N), range(d)):
        row = (b * N + h) * sq_pad + i
        assert out[((b * Sq + i) * N + h) * d + c] == (row - i % 64) * d + element_offset(i % 64, c, d)
    # a full warp reads whole runs, back to back: 32 runs of 32 (or 64) contiguous bytes
    run = 16 if d == 256 else 8
    for srcs in warps.values():
        if len(srcs) == 32:
            assert sorted(srcs) == list(range(min(srcs), min(srcs) + 32 * run, run))


def test_sources_match_the_model():
    """The transcribed constants and the call site are those of the sources."""
    assert "cudaMemsetAsync(p.dq_accum" not in KERNEL
    assert "e = bwd_prep_sm90(p, sq_pad, dq_zero_floats, tile_flags, T::Bm, stream);" in KERNEL
    # the two callers of bwd_prepare_workspaces: d = 256 zeroes the whole accumulator; the pp
    # launcher all (K * B pairs) or, zeroing ahead, unit 0's pairs (test_zero_ahead_prefix)
    assert re.search(r"bwd_prepare_workspaces<T>\(p, g\.mblk, g\.sq_pad, g\.sem_words,\s+"
                     r"\(size_t\)p\.B \* p\.N \* g\.sq_pad \* T::D, stream\)", D256)
    assert "const int pairs = p.K * p.B;" in KERNEL
    assert "const size_t pair_floats = (size_t)(p.N / p.K) * sq_pad * D;" in KERNEL
    assert re.search(r"p, mblk, sq_pad, sem_words, pair_floats \* \(zero_ahead \? "
                     r"\(size_t\)unit0_pairs : \(size_t\)pairs\),", KERNEL)
    assert re.search(r"constexpr int kPrepThreads = 256;", AUX)
    assert re.search(r"constexpr int kPrepRowThreads = 8;", AUX)
    assert "for (int k = 0; k < kChunks; ++k) xo[k] = orow[t + 8 * k];" in AUX
    assert "const int64_t out = (j / pad) * sq_pad + Sq + j % pad;" in AUX
    assert "const float acc = (a[0] + a[2]) + (a[1] + a[3]);" in AUX
    assert "for (int off = kPrepRowThreads / 2; off > 0; off >>= 1)" in AUX
    assert ("float* dst = s + 2 * (lane % 4) * kRows80Pad + (warp / 4) * 64 + (warp % 4) * 16 + "
            "lane / 4;") in AUX
    assert "float* d = dst + (u % 10) * 8 * kRows80Pad + (u / 10) * 8;" in AUX
    assert "return (int64_t)wq * 64 * dqc + ((r / 8) * (dqc / 8) + cc / 8) * 64 + 8 * (r % 8);" in AUX
    # the unit decoding both row-major converts share (convert_unit / ConvertUnit)
    for line in ("const int r8 = (int)(t % 8);", "u.c = cols * (int)(q % (d / cols));",
                 "const int64_t g = q / (d / cols);", "const int rg = (int)(g % (sq_pad / 8));",
                 "u.bh = g / (sq_pad / 8);", "u.i = 8 * rg + r8;", "return u.i < Sq;",
                 "return bh * sq_pad + i; }", "const int h = (int)(bh % N);",
                 "const int64_t b = bh / N;", "return ((b * Sq + i) * N + h) * d + c;"):
        assert line in AUX, line
    for line in ("if (!convert_unit(t, 8, d, Sq, sq_pad, u)) return;",
                 "const float* src = acc + (row - u.i % 64) * d + dq_frag_run(u.i % 64, u.c, dqc);",
                 "store8<Elem, kVec16>(dq + u.out(Sq, N, d), scale8<Elem>(x0, x1, scale));",
                 "const int64_t units = (int64_t)p.B * p.N * sq_pad * (p.d / 8);"):
        assert line in AUX, line
    # the d = 256 quad order's convert
    assert "return (int64_t)wq * 64 * 128 + ((r / 8) * 8 + cc / 16) * 128 + 16 * (r % 8);" in AUX
    for line in ("constexpr int d = 256;", "if (!convert_unit(t, 16, d, Sq, sq_pad, u)) return;",
                 "const float4* src = reinterpret_cast<const float4*>(acc + (row - u.i % 64) * d + "
                 "dq_quad_run(u.i % 64, u.c));",
                 "store8<Elem, kVec16>(out, scale8<Elem>(make_float4(x[0].x, x[0].y, x[1].x, x[1].y),",
                 "make_float4(x[2].x, x[2].y, x[3].x, x[3].y), scale));",
                 "store8<Elem, kVec16>(out + 8, scale8<Elem>(make_float4(x[0].z, x[0].w, x[1].z, x[1].w),",
                 "make_float4(x[2].z, x[2].w, x[3].z, x[3].w), scale));",
                 "if (p.d == 256) {  // the d = 256 kernel's quad order",
                 "const int64_t units = (int64_t)p.B * p.N * sq_pad * (p.d / 16);"):
        assert line in AUX, line


def _meta_layout_from_source() -> dict:
    """bwd_host.cuh's bwd_meta_layout body, evaluated by transcription: every `l.x = expr;`
    with p.B / p.Hm / p.K / p.N / nblk / mblk / earlier l.* fields as Python names."""
    body = re.search(r"inline BwdMetaLayout bwd_meta_layout\(const BwdParams& p, int nblk, int mblk\) \{"
                     r"(.*?)\n\}", KERNEL, re.S).group(1)
    fields = re.findall(r"\bl\.(\w+) = ([^;]+);", body)
    assert [f for f, _ in fields] == ["sched", "orders", "zero_count", "unseen", "tile_flags",
                                      "end"], fields
    return {f: re.sub(r"\(int64_t\)", "", e).replace("p.", "p_").replace("l.", "l_")
            for f, e in fields}


@pytest.mark.parametrize("B,Hm,K,N,nblk,Sq", [(1, 1, 1, 1, 1, 1), (2, 8, 4, 8, 65, 1000),
                                               (3, 1, 2, 4, 7, 161), (1, 32, 8, 32, 1024, 8192)])
def test_meta_workspace_size_matches_bwd_meta_layout(B, Hm, K, N, nblk, Sq):
    """The metadata workspace the backend allocates (BackwardConfig.meta_words) ends exactly where
    the C++ layout's last field (the query tiles' empty-row flags) ends: one size, written in two
    languages."""
    for c in configs.BACKWARD_CONFIGS:
        env = {"p_B": B, "p_Hm": Hm, "p_K": K, "p_N": N, "nblk": nblk, "mblk": -(-Sq // c.block_m)}
        for field, expr in _meta_layout_from_source().items():
            env["l_" + field] = eval(expr, {}, dict(env))  # noqa: S307 (transcribed source)
        assert env["l_sched"] == B * Hm * 8 * nblk  # the block metadata comes first
        assert c.meta_words(B, Hm, K, nblk * c.block_n, N, Sq) == env["l_end"], c.name
