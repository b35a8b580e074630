"""Protocol model of backward kernel variant 5 (flashmask_bwd_pp_kernel, cc/sm90/bwd_kernel.cuh;
variant 7 is the same kernel with 128-row query tiles) and of variant 12 (the same kernel with
lock-step consumers: one named barrier per tile guards the dS buffers, the dQ of a tile in its own
iteration, the tile info slots written by the producer before its `full` arrive; 13 = 12's protocol).
Agents: producer (TMA warp), dQ-writer warp, consumer warpgroups 0 and 1, run in random
interleavings (CPU only, no CUDA). Checks deadlock freedom, that every buffer read (Q/dO stage, dS
tile, dQ tile) sees the right tile and is never overwritten while a read is in flight, and that
every mbarrier and named-barrier phase is balanced at exit. `python benchmarks/bwd_pp_model.py`."""
import random, sys

class MBar:
    def __init__(s, count): s.count, s.pend, s.phase = count, 0, 0
    def arrive(s, n=1):
        s.pend += n
        assert s.pend <= s.count
        if s.pend == s.count: s.pend, s.phase = 0, s.phase + 1
    def ready(s, parity): return (s.phase & 1) != parity

class NBar:  # named barrier, 2 warpgroups
    def __init__(s): s.arr, s.gen = 0, 0
    def arrive(s):
        s.arr += 1
        assert s.arr <= 2
        if s.arr == 2: s.arr, s.gen = 0, s.gen + 1

def run(T, seed, mutate=None, variant=5):
    rnd = random.Random(seed)
    full = [MBar(1) for _ in range(2)]; empty = [MBar(2) for _ in range(2)]
    dq_full = [MBar(2) for _ in range(2)]; dq_empty = [MBar(1) for _ in range(2)]
    ds_full = [MBar(2) for _ in range(2)]; ds_empty = [MBar(2) for _ in range(2)]
    nb = {1: NBar(), 2: NBar()}
    qdo = [None, None]; ds = [[None, None], [None, None]]  # ds[buf][wg half]
    dqs = [[None, None], [None, None]]
    readers = {}  # (kind, buf) -> set of in-flight readers
    reduced = []
    def rd_begin(kind, buf, who): readers.setdefault((kind, buf), set()).add(who)
    def rd_end(kind, buf, who): readers[(kind, buf)].discard(who)
    def write(kind, buf):
        assert not readers.get((kind, buf)), f"overwrite of {kind}[{buf}] while read by {readers[(kind, buf)]}"

    info = [None, None]  # variant 12: the tile-info slots (in the dS mbarriers' storage)
    def producer():
        for t in range(T):
            s, par = t & 1, (t >> 1) & 1
            yield lambda: empty[s].ready(par ^ 1)
            if variant == 12 and mutate != 'info_early':
                write('info', s); info[s] = t
            write('qdo', s); qdo[s] = t; full[s].arrive()
            if variant == 12 and mutate == 'info_early':  # published after the arrive: a race
                yield None
                write('info', s); info[s] = t
    def writer():
        for t in range(T):
            b, par = t & 1, (t >> 1) & 1
            yield lambda: dq_full[b].ready(par)
            assert dqs[b] == [t, t], (dqs[b], t)
            reduced.append(t); dq_empty[b].arrive()
    def consumer(wg):
        me = f"wg{wg}"
        def turn_begin():
            bid = 1 if wg == 0 else 2
            g0 = nb[bid].gen; nb[bid].arrive()
            return lambda: nb[bid].gen > g0
        def turn_end(last):
            if wg == 0: nb[2].arrive()
            elif not last: nb[1].arrive()
        def dq(u):  # dQ GEMM of tile u (reads ds buffer u&1) + put_dq
            b, par = u & 1, (u >> 1) & 1
            yield lambda: ds_full[b].ready(par)
            assert ds[b] == [u, u], (ds[b], u)
            rd_begin('ds', b, me); yield None; rd_end('ds', b, me)   # wgmma ... wait<0>
            return b, par
        def put(b, par, u, arrive_empty):
            if arrive_empty: ds_empty[b].arrive()
            yield lambda: dq_empty[b].ready(par ^ 1)
            write('dq', b); dqs[b][wg] = u; dq_full[b].arrive()
        if wg == 1: nb[1].arrive()
        t = 0
        while True:
            s, par = t & 1, (t >> 1) & 1
            yield turn_begin()
            if t >= 2:
                b, p = yield from dq(t - 2)
                yield from put(b, p, t - 2, mutate != 'no_ds_empty_arrive')
            yield lambda: full[s].ready(par)
            assert qdo[s] == t
            rd_begin('qdo', s, me)   # S/dP GEMMs issued
            turn_end(False)
            yield None  # math
            if mutate != 'no_ds_empty_wait':
                yield lambda: ds_empty[s].ready(par ^ 1)
            write('ds', s); ds[s][wg] = t; ds_full[s].arrive()
            yield None  # dV/dK, wait<0>
            rd_end('qdo', s, me); empty[s].arrive()
            if t == T - 1: break
            t += 1
        yield turn_begin()
        for u in (t - 1, t):
            if u >= 0:
                b, p = yield from dq(u)
                yield from put(b, p, u, False)
        turn_end(True)

    def consumer12(wg):
        me = f"wg{wg}"
        t = 0
        while True:
            s, par = t & 1, (t >> 1) & 1
            yield lambda: full[s].ready(par)
            assert qdo[s] == t
            rd_begin('info', s, me); assert info[s] == t, (info[s], t)
            last = info[s] == T - 1
            rd_begin('qdo', s, me)   # S/dP GEMMs issued, exp, dS, dV issued
            yield None
            write('ds', s); ds[s][wg] = t   # dS store (buffer s: dQ of tile t-2 retired in both)
            if mutate != 'no_barrier':
                g0 = nb[1].gen; nb[1].arrive()
                yield lambda: nb[1].gen > g0   # bar.sync 1, 256
            assert ds[s] == [t, t], (ds[s], t)
            rd_begin('ds', s, me); yield None; rd_end('ds', s, me)  # dQ issued, dK issued, wait<1>
            yield lambda: dq_empty[s].ready(par ^ 1)
            write('dq', s); dqs[s][wg] = t; dq_full[s].arrive()
            yield None  # wait<0>
            rd_end('qdo', s, me); rd_end('info', s, me); empty[s].arrive()
            if last: break
            t += 1

    cons = consumer if variant == 5 else consumer12
    agents = {'prod': producer(), 'writer': writer(), 'wg0': cons(0), 'wg1': cons(1)}
    cond = {k: None for k in agents}
    steps = 0
    while agents:
        ready = [k for k in agents if cond[k] is None or cond[k]()]
        if not ready:
            raise RuntimeError(f"deadlock T={T} seed={seed}: waiting {list(agents)}")
        k = rnd.choice(ready)
        try: cond[k] = next(agents[k])
        except StopIteration: del agents[k]
        steps += 1
    assert reduced == list(range(T)), reduced
    assert nb[1].arr == 0 and nb[2].arr == 0, (nb[1].arr, nb[2].arr)
    for x in full + empty + dq_full + dq_empty + ds_full + ds_empty: assert x.pend == 0
    return steps

for variant, muts in ((5, ('no_ds_empty_wait', 'no_ds_empty_arrive')),
                      (12, ('no_barrier', 'info_early'))):
    n = 0
    for T in range(1, 12):
        for seed in range(3000):
            run(T, seed, variant=variant); n += 1
    print("ok", f"variant {variant}", n, "random interleavings, T = 1..11")
    # mutations must be caught (deadlock, overwrite during a read, or a wrong tile)
    for mut in muts:
        caught = False
        for T in range(1, 8):
            for seed in range(300):
                try: run(T, seed, mut, variant=variant)
                except (AssertionError, RuntimeError): caught = True; break
            if caught: break
        assert caught, mut
        print("mutation caught:", mut)
