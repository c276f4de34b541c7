#!/usr/bin/env python3
"""gguf_synth.py - a Llama-shaped GGUF of random weights, for speed runs.

  gguf_synth.py SRC DST [--layers N] [--embd N] [--ff N] [--heads N]
                [--kv-heads N] [--recipe q4_1|q4_0|q8_0|q4_k_m]
  gguf_synth.py --head SRC DST    DST = SRC's header alone (metadata and
                                  tensor infos): a small SRC for the above

Copies SRC's metadata (tokenizer, chat template, rope and norm settings),
sets the shape given (the rest stays SRC's), and writes every tensor of that
shape with random codes and small, finite block scales: the bytes a real
model of that shape and type moves per token, without fetching one (a GPU
machine that reaches no registry can make an 8B-shaped file in seconds).
The tokens it generates mean nothing; only timings and memory do.

Recipes: q4_1 (SmolLM2's file: Q4_1 matmuls, Q8_0 token embedding, tied
output), q4_0 and q8_0 likewise, q4_k_m (Q4_K, with Q6_K attn_v and
ffn_down in the layers llama.cpp's Q4_K_M gives them, Q4_K embedding, Q6_K
output).  Standard library only.
"""

import argparse
import os
import random
import struct
import sys

# ggml types: (id, elements per block, bytes per block, offsets of f16 scales)
TYPES = {
    "F32": (0, 1, 4, ()),
    "Q4_0": (2, 32, 18, (0,)),
    "Q4_1": (3, 32, 20, (0, 2)),
    "Q8_0": (8, 32, 34, (0,)),
    "Q4_K": (12, 256, 144, (0, 2)),
    "Q6_K": (14, 256, 210, (208,)),
}
VT_U8, VT_I8, VT_U16, VT_I16, VT_U32, VT_I32, VT_F32, VT_BOOL, VT_STR, VT_ARR, VT_U64, VT_I64, \
    VT_F64 = range(13)
SCALAR = {VT_U8: "<B", VT_I8: "<b", VT_U16: "<H", VT_I16: "<h", VT_U32: "<I", VT_I32: "<i",
          VT_F32: "<f", VT_BOOL: "<B", VT_U64: "<Q", VT_I64: "<q", VT_F64: "<d"}


class Reader:
    def __init__(self, data):
        self.d, self.o = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.o)[0]
        self.o += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.d[self.o:self.o + n]
        self.o += n
        return s

    def value(self, vt):
        if vt == VT_STR:
            return self.string()
        if vt == VT_ARR:
            et, n = self.take("<I"), self.take("<Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(SCALAR[vt])


def put_value(out, vt, v):
    if vt == VT_STR:
        out += struct.pack("<Q", len(v)) + v
    elif vt == VT_ARR:
        et, items = v
        out += struct.pack("<IQ", et, len(items))
        for x in items:
            put_value(out, et, x)
    else:
        out += struct.pack(SCALAR[vt], v)


def read_metadata(path):
    with open(path, "rb") as f:
        head = f.read(64 << 20)  # metadata (vocabulary included) sits at the front
    r = Reader(head)
    if r.d[:4] != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    r.o = 4
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    if version < 2:
        sys.exit(f"{path}: GGUF v{version} is not supported here")
    kvs = []
    for _ in range(n_kv):
        key = r.string()
        vt = r.take("<I")
        kvs.append((key, vt, r.value(vt)))
    names = []
    for _ in range(n_tensors):
        names.append(r.string())
        nd = r.take("<I")
        r.o += 8 * nd + 4 + 8
    return kvs, names, head[:r.o]


def block_template(tname, n_blocks, rng):
    """N_BLOCKS random blocks of TNAME with f16 scales in [1/512, 1/64)."""
    _, _, bb, scales = TYPES[tname]
    raw = bytearray(rng.randbytes(n_blocks * bb))
    for b in range(n_blocks):
        for off in scales:
            struct.pack_into("<e", raw, b * bb + off, rng.uniform(1 / 512, 1 / 64) *
                             (-1 if off == 2 and tname == "Q4_1" else 1))
    return bytes(raw)


def q4_k_m_uses_q6(i, n):
    """llama.cpp's use_more_bits(i, n) for attn_v and ffn_down in Q4_K_M."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    for k in ("layers", "embd", "ff", "heads", "kv-heads"):
        ap.add_argument("--" + k, type=int)
    ap.add_argument("--recipe", default="q4_1", choices=("q4_1", "q4_0", "q8_0", "q4_k_m"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--head", action="store_true")
    a = ap.parse_args()

    kvs, src_names, header = read_metadata(a.src)
    if a.head:
        with open(a.dst, "wb") as f:
            f.write(header)
        print(f"{a.dst}: the {len(header)}-byte header of {a.src}")
        return
    meta = {k: v for k, _, v in kvs}
    arch = meta.get(b"general.architecture", b"llama")
    p = arch + b"."

    def get(key, default=None):
        return meta.get(p + key, default)

    n_vocab = len(meta[b"tokenizer.ggml.tokens"][1])
    shape = {
        b"block_count": a.layers or get(b"block_count"),
        b"embedding_length": a.embd or get(b"embedding_length"),
        b"feed_forward_length": a.ff or get(b"feed_forward_length"),
        b"attention.head_count": a.heads or get(b"attention.head_count"),
        b"attention.head_count_kv": a.kv_heads or get(b"attention.head_count_kv",
                                                      get(b"attention.head_count")),
    }
    L, d, ff = shape[b"block_count"], shape[b"embedding_length"], shape[b"feed_forward_length"]
    nh, nkv = shape[b"attention.head_count"], shape[b"attention.head_count_kv"]
    if d % nh or nh % nkv:
        sys.exit("embd must divide into heads, and heads into kv heads")
    hd = d // nh
    shape[b"rope.dimension_count"] = hd
    tied = b"output.weight" not in src_names

    mm = {"q4_1": "Q4_1", "q4_0": "Q4_0", "q8_0": "Q8_0", "q4_k_m": "Q4_K"}[a.recipe]
    emb = "Q4_K" if a.recipe == "q4_k_m" else "Q8_0"
    tensors = [("token_embd.weight", (d, n_vocab), emb), ("output_norm.weight", (d,), "F32")]
    if a.recipe == "q4_k_m" or not tied:
        tensors.append(("output.weight", (d, n_vocab), "Q6_K" if a.recipe == "q4_k_m" else mm))
    for i in range(L):
        more = a.recipe == "q4_k_m" and q4_k_m_uses_q6(i, L)
        b = f"blk.{i}."
        tensors += [
            (b + "attn_norm.weight", (d,), "F32"),
            (b + "attn_q.weight", (d, d), mm),
            (b + "attn_k.weight", (d, nkv * hd), mm),
            (b + "attn_v.weight", (d, nkv * hd), "Q6_K" if more else mm),
            (b + "attn_output.weight", (d, d), mm),
            (b + "ffn_norm.weight", (d,), "F32"),
            (b + "ffn_gate.weight", (d, ff), mm),
            (b + "ffn_up.weight", (d, ff), mm),
            (b + "ffn_down.weight", (ff, d), "Q6_K" if more else mm),
        ]
    for name, dims, t in tensors:
        if dims[0] % TYPES[t][1]:
            sys.exit(f"{name}: {dims[0]} elements per row is not whole {t} blocks")

    align = meta.get(b"general.alignment", 32)
    out = bytearray(b"GGUF") + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    overrides = {p + k: v for k, v in shape.items()}
    for key, vt, v in kvs:
        if key in overrides:
            v = overrides.pop(key)
        elif key == b"general.name":
            v = b"synthetic " + a.recipe.encode() + b" " + v
        out += struct.pack("<Q", len(key)) + key + struct.pack("<I", vt)
        put_value(out, vt, v)
    if overrides:  # shape keys SRC did not have
        out[8:16] = struct.pack("<Q", len(tensors))
        out[16:24] = struct.pack("<Q", len(kvs) + len(overrides))
        for key, v in overrides.items():
            out += struct.pack("<Q", len(key)) + key + struct.pack("<I", VT_U32)
            put_value(out, VT_U32, v)
    offset, sizes = 0, []
    for name, dims, t in tensors:
        _, blck, bb, _ = TYPES[t]
        size = dims[0] // blck * bb * (dims[1] if len(dims) > 1 else 1)
        nb = name.encode()
        out += struct.pack("<Q", len(nb)) + nb + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", x) for x in dims)
        out += struct.pack("<IQ", TYPES[t][0], offset)
        sizes.append(size)
        offset += (size + align - 1) // align * align
    out += bytes(-len(out) % align)

    rng = random.Random(a.seed)
    templates = {t: block_template(t, 4096 if TYPES[t][1] > 1 else 0, rng)
                 for t in {t for _, _, t in tensors} if t != "F32"}
    ones = struct.pack("<f", 1.0) * 65536
    with open(a.dst, "wb") as f:
        f.write(out)
        for (name, dims, t), size in zip(tensors, sizes):
            src = ones if t == "F32" else templates[t]
            left = size
            while left > 0:
                n = min(left, len(src))
                f.write(src[:n])
                left -= n
            f.write(bytes(-size % align))
    total = os.path.getsize(a.dst)
    print(f"{a.dst}: {a.recipe}, {L} layers, embd {d}, ff {ff}, heads {nh}/{nkv}, vocab {n_vocab}, "
          f"{len(tensors)} tensors, {total / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
