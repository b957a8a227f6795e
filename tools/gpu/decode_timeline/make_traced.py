"""Writes copies of the decode kernel and the split merge with timeline marks.

    python3 make_traced.py OUT_DIR

OUT_DIR/decode_kernel_traced.cuh and OUT_DIR/split_merge_traced.cuh are
cc/splitkv/cuda/decode_kernel.cuh and split_merge.cuh with TIMELINE_MARK(i) calls (thread 0
of each CTA stores %globaltimer in slot i of its trace row; decode_timeline.cu defines the
macro) at fixed places. Each place is found by a line of the kernel; when the kernel changes
and a line is gone, this fails naming it: move the mark, don't drop it. Slots:
  0 entry, 9 seq_lens read (and the barriers set up), 11 first page id read, 1 first copies issued,
  2 first block landed, 3 main loop done, 4 partials written, 6 merge: before the count,
  7 merge: count seen (the tile's last CTA only), 8 merge: loads and math done, 5 exit.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _edit(src, anchor, text, where):
    if src.count(anchor) != 1:
        sys.exit(f"make_traced.py: expected the line once, found {src.count(anchor)}x:\n{anchor}")
    return src.replace(anchor, anchor + text if where == "after" else text + anchor)


def _traced(path, marks, renames=()):
    """The file at `path` (from the repository root) with `renames` ((old, new) pairs) and
    `marks` ((anchor line, mark text, "before" or "after") triples) applied."""
    src = open(os.path.join(ROOT, path)).read()
    for old, new in renames:
        src = src.replace(old, new)
    for anchor, text, where in marks:
        src = _edit(src, anchor, text, where)
    return src


# The kernel gets its own include guard; the merge keeps its own, so that, included first,
# it stands in for the original.
_DECODE_KERNEL_MARKS = [
    ("  T* const s_q = s_kv + S::kSlots * S::kKvElems;\n", "  TIMELINE_MARK(0);\n", "after"),
    ("  const int kv_len = kv.kv_len;\n", "  TIMELINE_MARK_AFTER(9, kv_len);\n", "after"),
    ("  int next_page = page_for(0);\n", "  TIMELINE_MARK_AFTER(11, next_page);\n", "after"),
    ("      if (b < num_blocks) load_kv(b, b);\n    }\n  }\n", "  TIMELINE_MARK(1);\n", "after"),
    ("    MbarrierWait(&stage_full[stage], (block / S::kStages) & 1);\n", "    if (block == 0) TIMELINE_MARK(2);\n",
     "after"),
    ("#pragma unroll\n  for (int i = 0; i < 2; ++i) {\n    row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 1);",
     "  TIMELINE_MARK(3);\n", "before"),
    ("  // The stages and Q are free now: the tile's merge may use them.\n", "  TIMELINE_MARK(4);\n", "before"),
    ("                         static_cast<int32_t>(S::kSmemBytes - S::kAlign));\n  }\n", "  TIMELINE_MARK(5);\n",
     "after"),
]
_SPLIT_MERGE_MARKS = [
    ("  if (threadIdx.x == 0) {\n    uint32_t* counter", "  TIMELINE_MARK(6);\n", "before"),
    ("  if (!last_arrival) return;\n", "  TIMELINE_MARK(7);\n", "after"),
    ("      total = WarpSum(total);\n    }\n", "    TIMELINE_MARK(8);\n", "after"),
    ("        for (int e = 0; e < kElems; ++e) merged[e] += w[u] * part[u][e];\n      }\n    }\n", "    TIMELINE_MARK(8);\n",
     "after"),
]


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: make_traced.py OUT_DIR")
    os.makedirs(argv[1], exist_ok=True)
    outputs = (
        ("decode_kernel_traced.cuh", _traced("cc/splitkv/cuda/decode_kernel.cuh", _DECODE_KERNEL_MARKS,
                                             [("SPLITKV_CUDA_DECODE_KERNEL_CUH_", "TIMELINE_DECODE_KERNEL_CUH_")])),
        ("split_merge_traced.cuh", _traced("cc/splitkv/cuda/split_merge.cuh", _SPLIT_MERGE_MARKS)),
    )
    for name, text in outputs:
        with open(os.path.join(argv[1], name), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main(sys.argv)
