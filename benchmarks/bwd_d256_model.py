"""Protocol model of the head-dim-256 backward kernel (flashmask_bwd_d256_kernel,
cc/sm90/bwd_d256_kernel.cuh), both orders (default and EarlySdP = variant 4, which measured 21 % slower on the H200 and was removed from the kernel), both dQ modes.

Agents: producer (TMA warp, with asynchronous TMA completion), dQ-writer warp (bulk mode, with an
asynchronous reduce read), consumer warpgroups 0 and 1 (wgmma reads modelled as windows from issue
to wait), run in random interleavings (CPU only, no CUDA). Checks: no deadlock; every read of a
Q/dO stage, a row-statistics slot or a P/dS buffer half sees the right tile and is never
overwritten while in flight; the dQ halves staged over a stage are the right tile when the writer
reduces them and are not overwritten before that read ends; every mbarrier phase balanced at exit.
`python benchmarks/bwd_d256_model.py` (a few seconds). Mutations of the protocol (dropped waits) are
checked to be caught."""
import random
import sys


class MBar:
    def __init__(s, count):
        s.count, s.pend, s.phase = count, 0, 0

    def arrive(s, n=1):
        s.pend += n
        assert s.pend <= s.count
        if s.pend == s.count:
            s.pend, s.phase = 0, s.phase + 1

    def ready(s, parity):
        return (s.phase & 1) != parity


class Violation(Exception):
    pass


def check(c, msg):
    if not c:
        raise Violation(msg)


def run(T, seed, early, bulk, mut=None):
    rnd = random.Random(seed)
    full = [MBar(1) for _ in range(2)]
    empty = [MBar(1 if bulk else 2) for _ in range(2)]
    consumed = [MBar(2) for _ in range(2)]
    dq_full = [MBar(2) for _ in range(2)]
    pds_full = [MBar(2) for _ in range(2)]
    pds_empty = [MBar(2) for _ in range(2)]
    stage = [[None, None], [None, None]]  # [stage][half]: ('qdo', t) / ('loading', t) / ('dq', t) / ('read', t)
    rs = [None, None]
    pds = [[None, None], [None, None]]   # [buffer][warpgroup half]: tile of the stored P^T / dS^T
    readers = {}
    reduced = []

    def rd_begin(kind, buf, half, who, want):
        cur = (stage if kind == "stage" else pds)[buf][half]
        check(cur == want, f"{who} reads {kind}[{buf}][{half}] = {cur}, wants {want}")
        readers.setdefault((kind, buf, half), set()).add(who)

    def rd_end(kind, buf, half, who, want):
        cur = (stage if kind == "stage" else pds)[buf][half]
        check(cur == want, f"{who}: {kind}[{buf}][{half}] changed to {cur} during its read of {want}")
        readers[(kind, buf, half)].discard(who)

    def write(kind, buf, half, val, who):
        r = readers.get((kind, buf, half))
        check(not r, f"{who} overwrites {kind}[{buf}][{half}] while read by {r}")
        (stage if kind == "stage" else pds)[buf][half] = val

    agents = []

    def tma(s, t):
        yield lambda: True
        stage[s] = [("qdo", t), ("qdo", t)]
        rs[s] = t
        full[s].arrive()

    def producer():
        for t in range(T):
            s, par = t & 1, (t >> 1) & 1
            if mut != "no_empty_wait":
                yield lambda: empty[s].ready(par ^ 1)
            for h in range(2):
                if bulk and t >= 2:
                    check(stage[s][h] == ("read", t - 2), f"producer refills stage {s} holding {stage[s][h]}")
                write("stage", s, h, ("loading", t), "producer")
            agents.append(tma(s, t))

    def writer():
        for t in range(T):
            s, par = t & 1, (t >> 1) & 1
            yield lambda: dq_full[s].ready(par)
            for h in range(2):
                rd_begin("stage", s, h, "writer", ("dq", t))
            yield lambda: True  # the reduce reads smem asynchronously
            for h in range(2):
                rd_end("stage", s, h, "writer", ("dq", t))
                stage[s][h] = ("read", t)
            reduced.append(t)
            empty[s].arrive()

    def consumer(wg):
        me = f"wg{wg}"

        def sdp_issue(t):
            s = t & 1
            for h in range(2):
                rd_begin("stage", s, h, me + "-sdp", ("qdo", t))

        def sdp_wait(t):
            s = t & 1
            for h in range(2):
                rd_end("stage", s, h, me + "-sdp", ("qdo", t))

        def math(t):  # S / dP of tile t waited before
            s, par = t & 1, (t >> 1) & 1
            check(rs[s] == t, f"{me} math({t}) reads row statistics of tile {rs[s]}")
            if mut != "no_pds_empty_wait":
                yield lambda: pds_empty[s].ready(par ^ 1)
            write("pds", s, wg, t, me)
            pds_full[s].arrive()

        def big_issue(t):  # dQ, dV, dK of tile t
            s = t & 1
            for h in range(2):
                rd_begin("pds", s, h, me + "-dkvq", t)
                rd_begin("stage", s, h, me + "-dkvq", ("qdo", t))

        def big_wait(t):
            s = t & 1
            for h in range(2):
                rd_end("pds", s, h, me + "-dkvq", t)
                rd_end("stage", s, h, me + "-dkvq", ("qdo", t))

        def release(t):
            s = t & 1
            pds_empty[s].arrive()
            if bulk:
                consumed[s].arrive()
            else:
                empty[s].arrive()

        def write_dq(t, between=None):  # between: the next tile's S/dP issue, between the halves
            s, par = t & 1, (t >> 1) & 1
            if bulk:
                if mut != "no_consumed_wait":
                    yield lambda: consumed[s].ready(par)
                write("stage", s, wg, ("dq", t), me + "-dq")
            if between:
                yield from between()
            if bulk:
                dq_full[s].arrive()

        yield lambda: full[0].ready(0)
        sdp_issue(0)
        yield lambda: True
        sdp_wait(0)
        yield from math(0)
        t = 0
        while True:
            s, par = t & 1, (t >> 1) & 1
            nxt = t + 1 < T
            if mut != "no_pds_full_wait":
                yield lambda: pds_full[s].ready(par)
            if early:
                if nxt:
                    yield lambda: full[s ^ 1].ready(((t + 1) >> 1) & 1)
                    sdp_issue(t + 1)
                    big_issue(t)
                    yield lambda: True
                    sdp_wait(t + 1)
                    yield from math(t + 1)
                else:
                    big_issue(t)
                yield lambda: True
                big_wait(t)
                release(t)
                yield from write_dq(t)
                if not nxt:
                    break
            else:
                big_issue(t)
                yield lambda: True
                big_wait(t)
                release(t)
                if not nxt:
                    yield from write_dq(t)
                    break

                def sdp_next():
                    yield lambda: full[s ^ 1].ready(((t + 1) >> 1) & 1)
                    sdp_issue(t + 1)
                yield from write_dq(t, sdp_next)
                yield lambda: True
                sdp_wait(t + 1)
                yield from math(t + 1)
            t += 1

    agents += [producer(), consumer(0), consumer(1)]
    if bulk:
        agents.append(writer())
    waiting = {id(a): None for a in agents}
    steps = 0
    while agents:
        ready = []
        for a in agents:
            c = waiting.get(id(a))
            if c is None or c():
                ready.append(a)
        if not ready:
            raise Violation(f"deadlock at T={T}")
        a = rnd.choice(ready)
        try:
            waiting[id(a)] = next(a)
        except StopIteration:
            agents.remove(a)
        steps += 1
        assert steps < 100000
    if bulk:
        check(reduced == list(range(T)), f"reduced {reduced}")
    for b in full + empty + consumed + dq_full + pds_full + pds_empty:
        check(b.pend == 0, "unbalanced mbarrier phase at exit")


def main():
    runs = 0
    for early in (False, True):
        for bulk in (True, False):
            for T in range(1, 10):
                for seed in range(400):
                    run(T, seed, early, bulk)
                    runs += 1
    print(f"{runs} runs: no deadlock, no stale or overwritten read, balanced barriers")
    # Mutations: each dropped wait must break some configuration, except the pds_empty wait: it is
    # implied by the others in all four configurations (a warpgroup stores the P/dS of tile t+1 only
    # after the `full` wait of tile t+1, and the producer refilled that stage only after both
    # warpgroups finished the GEMMs of tile t-1, the last readers of the P/dS buffer). The kernel
    # keeps it (an already-completed wait) so that a deeper ring cannot silently break that.
    for mut in ("no_empty_wait", "no_consumed_wait", "no_pds_full_wait", "no_pds_empty_wait"):
        caught, total = 0, 0
        for early in (False, True):
            for bulk in (True, False):
                for seed in range(200):
                    total += 1
                    try:
                        run(5, seed, early, bulk, mut)
                    except (Violation, AssertionError):
                        caught += 1
        print(f"mutation {mut}: caught in {caught}/{total} runs")
        assert caught > 0 or mut == "no_pds_empty_wait", mut


if __name__ == "__main__":
    main()
