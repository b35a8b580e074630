"""Compare the SASS of the kernels in two CUDA object files (or `cuobjdump --dump-sass` dumps).

A refactor that should not change a kernel (deleting other variants, renaming template
parameters) is checked here without a GPU: each kernel's instruction text, without addresses,
encodings and spacing, is hashed and matched by kernel name (`--map old=new` pairs substrings of
mangled names whose template arguments changed).
"renamed registers only": the same instructions with other register numbers; "same
instructions, reordered": the same multiset of instructions (up to registers) in another order.
Usage: python benchmarks/sass_compare.py before.o after.o [--map SUBSTR_BEFORE=SUBSTR_AFTER ...]
Needs cuobjdump on PATH for object files.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys


def kernels(path: str, mode: str = "exact") -> dict[str, str]:
    """Mangled kernel name -> hash of its normalized SASS. mode "exact": addresses and whitespace
    dropped; "renamed": register numbers and .reuse hints dropped too; "reordered": and the
    instruction order (a multiset of instructions)."""
    text = (open(path).read() if path.endswith(".sass")
            else subprocess.run(["cuobjdump", "--dump-sass", path], check=True,
                                capture_output=True, text=True).stdout)
    out = {}
    for part in re.split(r"\n\s*Function : ", text)[1:]:
        name, body = part.split("\n", 1)
        body = body.split("..........")[0]
        # drop the address and encoding comments (/*0a40*/, /* 0x... */) and the spacing
        lines = [" ".join(re.sub(r"/\*[^*]*\*/", "", l).split()) for l in body.splitlines()]
        if mode != "exact":
            lines = [re.sub(r"\bU?R\d+\b", "R", l).replace(".reuse", "") for l in lines]
        if mode == "reordered":
            lines = sorted(lines)
        out[name.strip()] = hashlib.sha1("\n".join(l for l in lines if l).encode()).hexdigest()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--map", nargs="*", default=[], help="SUBSTR_BEFORE=SUBSTR_AFTER")
    a = ap.parse_args()
    before, after = kernels(a.before), kernels(a.after)
    before_nr, after_nr = kernels(a.before, "renamed"), kernels(a.after, "renamed")
    before_ro, after_ro = kernels(a.before, "reordered"), kernels(a.after, "reordered")
    renames = [m.split("=", 1) for m in a.map]
    by_hash = {h: n for n, h in before.items()}
    bad = 0
    for name, h in sorted(after.items()):
        old = name
        for x, y in renames:
            old = old.replace(y, x)
        if before.get(old) == h:
            verdict = "identical"
        elif h in by_hash:
            verdict = "identical (to " + by_hash[h][:60] + "...)"
        elif after_nr[name] in before_nr.values():
            verdict = "renamed registers only"
        elif after_ro[name] in before_ro.values():
            verdict = "same instructions, reordered"
        else:
            verdict, bad = "DIFFERENT", bad + 1
        print(f"{verdict:28s} {name[:100]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
