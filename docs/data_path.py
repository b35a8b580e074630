"""Draws docs/data_path.png, the picture of docs/design.md: python docs/data_path.py"""
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch, FancyArrowPatch

fig, ax = plt.subplots(figsize=(13, 8.6), dpi=96)
ax.set_xlim(0, 130); ax.set_ylim(0, 86); ax.axis("off")

C = {"mask": "#dbe9f6", "api": "#fde2c8", "k": "#d9f0d3", "sh": "#eadcf2", "aux": "#f2f2f2"}

def box(x, y, w, h, title, body, color, where):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.4,rounding_size=1.2",
                                fc=color, ec="#444", lw=1.0))
    ax.text(x + w / 2, y + h - 2.0, title, ha="center", va="top", fontsize=9.5, weight="bold")
    ax.text(x + w / 2, y + h - 5.2, body, ha="center", va="top", fontsize=7.8, linespacing=1.25)
    ax.text(x + w / 2, y + 0.9, where, ha="center", va="bottom", fontsize=7, family="monospace", color="#333")

def arrow(x0, y0, x1, y1, label=None, style="-|>"):
    ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle=style, mutation_scale=12, lw=1.1, color="#333"))
    if label:
        ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.8, label, ha="center", va="bottom", fontsize=7, color="#333")

def band(y, h, text):
    ax.text(1, y + h / 2, text, rotation=90, ha="center", va="center", fontsize=9, color="#555", weight="bold")

# row 1: the mask
band(66, 18, "mask")
box(4, 67, 27, 16, "mask vectors", "startend_row_indices\n[B, Hm, Sk, D], D ∈ {1, 2, 4}\nor FlashMask (+ causal)", C["mask"], "masks/")
box(36, 67, 27, 16, "canonical bounds", "D = 4 form, int32\n[B, Hm, 4, Sk]\n(LTS, LTE, UTS, UTE)", C["mask"], "masks.canonical_bounds")
box(68, 67, 27, 16, "block metadata", "min / max of each vector\nper key block (+ groups\nof 32 blocks): O(Sk / Bn)", C["mask"], "_blocks.py · block_meta.cu")
box(100, 67, 27, 16, "tile classes", "query tile × key block:\nskip · partial · visible\n(SPEC §3 tests)", C["mask"], "_blocks.classify · mask walk")
for x in (31, 63, 95):
    arrow(x + 0.6, 75, x + 4.4, 75)

# row 2: the API
band(44, 18, "API")
box(4, 45, 27, 16, "attention()", "checks, scale, GQA / Hm\nimplementation choice\nconfig (head dim, structure)", C["api"], "_api.py")
box(36, 45, 27, 16, "custom_vjp", "fwd → (out, lse)\nresiduals q, k, v, out, lse\n(checkpoint names)", C["api"], "_api._flash")
box(68, 45, 27, 16, "sharding rule", "custom_partitioning:\nbatch / heads local; seq.:\nall-gather K/V + localize", C["sh"], "_sharding.py")
box(100, 45, 27, 16, "backends", "cuda: FFI custom calls\nxla: blocked JAX (portable)\nreference: dense", C["api"], "backends/ · backends/cuda/")
for x in (31, 63, 95):
    arrow(x + 0.6, 53, x + 4.4, 53)
arrow(17.5, 66.4, 17.5, 61.6, "bounds")

# row 3: kernels
band(22, 18, "kernels")
box(4, 23, 38, 16, "forward CTA (per query tile)", "producer WG: TMA warp (Q; K/V of kept blocks)\n+ mask-bit builders (partial blocks)\n→ smem ring (mbarriers) → 2–3 consumer WGs:\nQKᵀ · mask on partial · online softmax · PV", C["k"], "cc/sm90/fwd_kernel.cuh")
box(46, 23, 38, 16, "backward CTA (per key block)", "prep pass: lse·log2e, D, dQ zeroing\nTMA warp (Q/dO of kept tiles, O(1) walk)\nconsumers: Sᵀ, dPᵀ, dV, dK, dQ (WGMMA)\ndQ writer: bulk reduce-add → convert pass", C["k"], "cc/sm90/bwd_*.cuh · bwd_aux.cu")
box(88, 23, 39, 16, "deterministic mode", "dQ of a query tile added in a fixed\nkey-block order (ordering bits);\nlaunch groups / arrival order\nfrom a metadata pre-pass", C["k"], "bwd_aux.cu · bwd_kernel.cuh")
arrow(113.5, 44.4, 113.5, 39.6)
arrow(113.5, 44.4, 23, 39.6)
arrow(113.5, 44.4, 65, 39.6)

# row 4: context parallelism
band(2, 18, "context parallel")
box(4, 3, 27, 15, "plan (host)", "chunk workloads from metadata\nLPT + re-partition\nint32 [P, m]: data", C["sh"], "context_parallel/balance.py")
box(36, 3, 27, 15, "layout + localize", "permute tokens once a step;\nr_loc = Σ clip(r − c·C, 0, C)\nno communication", C["sh"], "layout.py · localize.py")
box(68, 3, 27, 15, "communication", "all-gather · relay ring ·\npruned direct sends ·\nhierarchical (node relay)", C["sh"], "comm.py")
box(100, 3, 27, 15, "pieces", "attention per K/V piece,\nlse merge in one custom VJP;\nremote pieces first in bwd", C["sh"], "pieces.py · attention.py")
for x in (31, 63, 95):
    arrow(x + 0.6, 10.5, x + 4.4, 10.5)
ax.text(65, 20.3, "shard_map over the sequence axis; each rank calls attention() on its pieces", ha="center", fontsize=7.8, style="italic", color="#333")

import pathlib

fig.savefig(pathlib.Path(__file__).with_suffix(".png"), bbox_inches="tight", facecolor="white")
