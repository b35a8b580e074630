"""Instructions one consumer warp executes per tile of a backward kernel, from its SASS: walks the
tile loop of one kernel of a cuobjdump dump from the loop head to the back edge, following
branches with the decisions given (the steady-state full-tile path: no partial-tile mask, dQ bulk
mode, t >= 2), and prints the count and an opcode histogram. Branches to the retry loops of the
mbarrier waits (targets past 0xe000) are not taken, the short `@!P2 BRA` over each element's mask
code is taken; every other conditional branch must be decided on the command line or the walk
stops and names it. Used for benchmarks/NOTES_bwd_full.md (the loop bounds and decisions for the
bf16 d = 128 kernels of the bwdfull build are listed there).
Usage: python benchmarks/sass_tile_path.py DUMP.sass KERNEL HEAD BACKEDGE [TAKEN,...] [NOT_TAKEN,...]
KERNEL: v5 | MR (variant 10) | LS (12) | LS+MR (13); addresses in hex.
"""
import re,sys
def rows_of(f,want):
    t=open(f).read()
    for p in re.split(r"\n\s*Function : ",t)[1:]:
        name,body=p.split("\n",1)
        short=("LS+MR" if "BwdLockstepINS0_11BwdMaskRegs" in name else "LS" if "BwdLockstep" in name else "MR" if "BwdMaskRegs" in name else "persist" if "persist" in name else "v5")
        if short!=want: continue
        rows=[]
        for l in body.splitlines():
            m=re.search(r"/\*([0-9a-f]{4,})\*/",l)
            if not m: continue
            i=re.sub(r"/\*[^*]*\*/","",l).strip()
            if i: rows.append((int(m.group(1),16),i))
        return rows
def walk(rows, head, backedge, decide):
    idx={a:k for k,(a,i) in enumerate(rows)}
    k=idx[head]; n=0; ops={}
    while True:
        a,i=rows[k]; n+=1
        op=(i.split()[1] if i.startswith('@') else i.split()[0]).split('.')[0]
        ops[op]=ops.get(op,0)+1
        if a==backedge: return n,ops
        m=re.search(r"\bBRA (0x[0-9a-f]+)",i)
        if m:
            tgt=int(m.group(1),16)
            cond=i.startswith('@')
            tk = (not cond) or decide(a,i,tgt)
            if tk: k=idx[tgt]; continue
        k+=1
        if n>5000: raise SystemExit("runaway")
f,want,head,back=sys.argv[1],sys.argv[2],int(sys.argv[3],16),int(sys.argv[4],16)
taken=set(int(x,16) for x in sys.argv[5].split(',') if x) if len(sys.argv)>5 else set()
nottaken=set(int(x,16) for x in sys.argv[6].split(',') if x) if len(sys.argv)>6 else set()
rows=rows_of(f,want)
def decide(a,i,tgt):
    if a in taken: return True
    if a in nottaken: return False
    if tgt>0xe000: return False  # retry loops / cold paths at the end
    if re.match(r"@!P2 BRA",i) and 0<tgt-a<=0x100: return True  # masked-element code skipped
    raise SystemExit(f"undecided branch at {a:x}: {i}")
n,ops=walk(rows,head,back,decide)
print(want,"executed per full tile:",n, " ".join(f"{k}{v}" for k,v in sorted(ops.items(),key=lambda z:-z[1])[:16]))
