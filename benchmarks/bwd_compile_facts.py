"""Compile facts of the backward kernels: ptxas registers / spills and SASS counts, per kernel.

* ``--ptxas LOG ...``: ptxas -v output (the build log of a build configured with
  -DJAX_FLASHMASK_PTXAS_VERBOSE=ON, or of nvcc -Xptxas=-v): registers, stack frame, spill
  stores / loads of every backward entry function.
* ``--sass FILE ...``: object files / the extension module (cuobjdump -sass, needs cuobjdump on
  PATH) or saved .sass dumps: total SASS instructions, and the consumer region (from
  `USETMAXREG.TRY_ALLOC` -- the consumer warpgroups' setmaxnreg 240 -- to
  `USETMAXREG.DEALLOC`, the producer's 24; the consumer code comes first in the pp, persistent
  and d = 256 kernels): its instructions, LDL / STL (local memory: spills), the highest register.

Kernels are named by kernel / element type / head dim / Bm (pp = flashmask_bwd_pp_kernel,
persist = flashmask_bwd_persist_kernel (variant 6), d256 = flashmask_bwd_d256_kernel; a traits
wrapper such as BwdMaskRegs is appended).
Usage: python benchmarks/bwd_compile_facts.py --ptxas build.log --sass jax_flashmask/_flashmask_cuda*.so
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys


def short_name(mangled: str) -> str | None:
    m = re.search(r"flashmask_bwd_(pp|persist|d256)_kernel", mangled)
    if not m:
        return None
    kind = m.group(1)
    dt = "bf16" if "bfloat16_t" in mangled.split("TiledCopy")[0] else "fp16"
    if kind == "d256":
        return f"d256 {dt}"
    t = re.search(r"BwdTraitsIN7cutlass\d+\w+?_tELi(\d+)ELb([01])ELi(\d+)E", mangled)
    wrap = re.findall(r"NS0_\d+(Bwd[A-Za-z]+)I", mangled)
    wrap = [w for w in wrap if w != "BwdTraits"]
    s = f"{kind} {dt} d{t.group(1)} Bm{t.group(3)}" if t else f"{kind} {dt}"
    return s + (" " + "+".join(wrap) if wrap else "")


def ptxas_facts(paths):
    out = {}
    for p in paths:
        cur = None
        for line in open(p, errors="replace"):
            m = re.search(r"Function properties for (\S+)", line)
            if m:
                cur = short_name(m.group(1))
                continue
            if cur is None:
                continue
            m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m:
                out.setdefault(cur, {}).update(stack=int(m.group(1)), spill_st=int(m.group(2)),
                                               spill_ld=int(m.group(3)))
                continue
            m = re.search(r"Used (\d+) registers", line)
            if m:
                out.setdefault(cur, {})["regs"] = int(m.group(1))
                cur = None
    return out


def sass_text(path: str) -> str:
    if path.endswith(".sass"):
        return open(path).read()
    return subprocess.run(["cuobjdump", "-sass", path], check=True, capture_output=True,
                          text=True).stdout


def sass_facts(paths):
    out = {}
    for p in paths:
        for part in re.split(r"\n\s*Function : ", sass_text(p))[1:]:
            name, body = part.split("\n", 1)
            sn = short_name(name.strip())
            if sn is None:
                continue
            body = body.split("..........")[0]
            ins = [re.sub(r"/\*[^*]*\*/", "", l).strip().rstrip(";").strip()
                   for l in body.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", l)]
            ins = [i for i in ins if i]
            lo = next((k for k, i in enumerate(ins) if "USETMAXREG.TRY_ALLOC" in i), None)
            hi = next((k for k, i in enumerate(ins) if "USETMAXREG.DEALLOC" in i), None)
            f = dict(instr=len(ins))
            if lo is not None and hi is not None and hi > lo:
                reg = ins[lo:hi]
                regs = [int(r) for i in reg for r in re.findall(r"\bR(\d+)\b", i)]
                f.update(cons_instr=len(reg), cons_ldl=sum(i.split()[-1].startswith("LDL") or " LDL" in i for i in reg),
                         cons_stl=sum(" STL" in i or i.startswith("STL") for i in reg),
                         cons_maxreg=max(regs) if regs else -1)
            f["ldl"] = sum("LDL" in i for i in ins)
            f["stl"] = sum("STL" in i for i in ins)
            out[sn] = f
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptxas", nargs="*", default=[])
    ap.add_argument("--sass", nargs="*", default=[])
    a = ap.parse_args()
    px, sx = ptxas_facts(a.ptxas), sass_facts(a.sass)
    names = sorted(set(px) | set(sx))
    print(f"{'kernel':34s} {'regs':>4s} {'stack':>5s} {'spill st/ld':>11s} {'SASS':>6s} "
          f"{'consumer':>8s} {'LDL/STL':>7s} {'max R':>5s} {'all LDL/STL':>11s}")
    for n in names:
        p, s = px.get(n, {}), sx.get(n, {})
        sp = f"{p['spill_st']}/{p['spill_ld']}" if "spill_st" in p else "-"
        cl = f"{s['cons_ldl']}/{s['cons_stl']}" if "cons_ldl" in s else "-"
        al = f"{s['ldl']}/{s['stl']}" if "ldl" in s else "-"
        print(f"{n:34s} {p.get('regs', '-'):>4} {p.get('stack', '-'):>5} {sp:>11s} "
              f"{s.get('instr', '-'):>6} {s.get('cons_instr', '-'):>8} {cl:>7s} "
              f"{('R' + str(s['cons_maxreg'])) if 'cons_maxreg' in s else '-':>5s} {al:>11s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
