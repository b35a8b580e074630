"""Compare the SASS of two builds kernel by kernel, with HGMMA counts, spills and local memory.

A change that must not alter generated code (deleting configurations, moving code between
headers, renaming) is checked here without a GPU. Each input is a built extension (.so), a
static library or object file (cuobjdump reads them), or a `cuobjdump -sass` dump (.sass). Per
kernel the instruction text without addresses, encodings and spacing is hashed and matched by
mangled name (`--map OLD=NEW` rewrites substrings of the "before" names whose template arguments
were renamed). Verdicts: identical; identical to another kernel; "renamed registers only" (same
instructions, other register numbers); "same instructions, reordered"; DIFFERENT.

Per kernel it also reports the HGMMA count and, from `cuobjdump -res-usage`, registers, stack and
local memory; spill stores / loads come from the ptxas output in a build log (`--log-before`,
`--log-after`: a build with -Xptxas=-v, e.g. pip's -v output with
-C cmake.define.JAX_FLASHMASK_PTXAS_VERBOSE=ON).

Usage: python benchmarks/sass_compare.py BEFORE AFTER [--log-before LOG] [--log-after LOG]
       [--map OLD=NEW ...] [--markdown]
Exit status 1 when a kept kernel differs or spills more. Needs cuobjdump on PATH (pip install
nvidia-cuda-cuobjdump: nvidia/cu13/bin).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys


def norm(name: str) -> str:
    """A kernel's mangled name without the per-file hash of anonymous namespaces (it depends on
    the source path, so two checkouts of the same code differ there)."""
    return re.sub(r"_GLOBAL__N__[0-9a-f]{8}_", "_GLOBAL__N__00000000_", name.strip())


def _dump(path: str, flag: str) -> str:
    if path.endswith(".sass") and flag == "-sass":
        return open(path).read()
    return subprocess.run(["cuobjdump", flag, path], check=True, capture_output=True,
                          text=True).stdout


def sass(path: str) -> dict[str, list[str]]:
    """Mangled kernel name -> its instructions (addresses, encodings, spacing dropped)."""
    out = {}
    for part in re.split(r"\n\s*Function : ", _dump(path, "-sass"))[1:]:
        name, body = part.split("\n", 1)
        body = body.split("..........")[0]
        lines = [" ".join(re.sub(r"/\*[^*]*\*/", "", l).split()) for l in body.splitlines()]
        out[norm(name)] = [l for l in lines if l]
    return out


def resources(path: str) -> dict[str, dict[str, int]]:
    """Mangled kernel name -> {REG, STACK, SHARED, LOCAL} from cuobjdump -res-usage."""
    if path.endswith(".sass"):
        return {}
    out, name = {}, None
    for line in _dump(path, "-res-usage").splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            name = norm(m.group(1))
            continue
        if name and "REG:" in line:
            out[name] = {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}
            name = None
    return out


def spills(log: str | None) -> dict[str, tuple[int, int]]:
    """Mangled kernel name -> (spill store bytes, spill load bytes) from ptxas -v output."""
    if not log:
        return {}
    out, name = {}, None
    for line in open(log, errors="replace"):
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            name = norm(m.group(1))
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            st, ld = int(m.group(1)), int(m.group(2))
            prev = out.get(name, (0, 0))
            out[name] = (max(prev[0], st), max(prev[1], ld))  # units compiled twice: same numbers
            name = None
    return out


def _hash(lines, mode):
    if mode != "exact":
        lines = [re.sub(r"\bU?R\d+\b", "R", l).replace(".reuse", "") for l in lines]
    if mode == "reordered":
        lines = sorted(lines)
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()


def short(name: str) -> str:
    try:
        d = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
    except OSError:
        d = name
    d = re.sub(r"cute::|cutlass::|jfm::sm90::", "", d)
    d = re.sub(r"\bTiledMMA<.*", "...", d)
    return d[:110]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--log-before")
    ap.add_argument("--log-after")
    ap.add_argument("--map", nargs="*", default=[], help="SUBSTR_BEFORE=SUBSTR_AFTER")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    a = ap.parse_args()
    before, after = sass(a.before), sass(a.after)
    res_a = resources(a.after)
    sp_b, sp_a = spills(a.log_before), spills(a.log_after)
    renames = [m.split("=", 1) for m in a.map]
    hashes = {mode: {_hash(v, mode): n for n, v in before.items()}
              for mode in ("exact", "renamed", "reordered")}
    bad = 0
    rows, matched = [], set()
    for name, lines in sorted(after.items()):
        old = name
        for x, y in renames:
            old = old.replace(y, x)
        matched.add(old)
        h = _hash(lines, "exact")
        if old in before and _hash(before[old], "exact") == h:
            verdict = "identical"
        elif h in hashes["exact"]:
            verdict = "identical (other name)"
        elif _hash(lines, "renamed") in hashes["renamed"]:
            verdict = "renamed registers only"
        elif _hash(lines, "reordered") in hashes["reordered"]:
            verdict = "same instructions, reordered"
        elif old not in before:
            verdict, bad = "NEW", bad + 1
        else:
            verdict, bad = "DIFFERENT", bad + 1
        hgmma = sum(1 for l in lines if "HGMMA" in l)
        old_hgmma = sum(1 for l in before.get(old, []) if "HGMMA" in l) if old in before else None
        r = res_a.get(name, {})
        st, ld = sp_a.get(name, (None, None))
        stb, ldb = sp_b.get(old, (None, None))
        if st is not None and stb is not None and (st > stb or ld > ldb):
            verdict, bad = verdict + ", MORE SPILLS", bad + 1
        rows.append((short(name), verdict, hgmma, old_hgmma, r.get("REG"), r.get("STACK"),
                     r.get("LOCAL"), st, ld, stb, ldb))
    gone = sorted(set(before) - matched)
    head = ("kernel", "verdict", "HGMMA", "HGMMA before", "REG", "STACK", "LOCAL",
            "spill st", "spill ld", "spill st before", "spill ld before")
    if a.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join("-" if x is None else str(x) for x in r) + " |")
    else:
        for r in rows:
            print(f"{r[1]:30s} HGMMA {r[2]!s:>4} (before {r[3]!s:>4}) REG {r[4]!s:>3} STACK {r[5]!s:>4} "
                  f"LOCAL {r[6]!s:>3} spills {r[7]}/{r[8]} (before {r[9]}/{r[10]})  {r[0]}")
    print(f"\n{len(after)} kernels after, {len(before)} before; {len(gone)} only before; "
          f"{bad} differ, are new or spill more")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
