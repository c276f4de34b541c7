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

  gguf_synth.py SRC DST --recipe f32|f16|like-src [--arch ARCH] [--layers N] [--embd N]
                [--ff N] [--heads N] [--kv-heads N] [--head-dim N] [--seed N]
                [--rope-scaling linear:FACTOR|yarn:FACTOR:ORIG_CTX] [--window N]
                [--phi3-longrope ORIG_CTX]

A small model of architecture ARCH (llama, llama3, qwen2, qwen3, phi3,
gemma3) whose tensor names, shapes and metadata keys are the ones llama.cpp's
converter (convert_hf_to_gguf.py) writes for it, with random float weights
(all F32, or F16 matrices and F32 vectors as the converter's --outtype f16
does), for checking an engine against llama.cpp on each architecture.  Only
SRC's tokenizer (the tokenizer.* keys) is taken: SmolLM2's for the gpt2-BPE
archs, Gemma 3's for gemma3 (SRC may be a --head copy).  The weights are a
pure function of --seed and the tensor's name (SHAKE-256 bytes, each value a
12-bit integer times a power of two, exact in F16 too), so the output is
byte-identical on every machine and Python version.  Shapes default to the
arch's small defaults (see ARCH_DEFAULTS), not SRC's.  Per architecture:
  llama   llama.* keys as LlamaModel writes them (vocab_size,
          rope.dimension_count); --rope-scaling linear:F writes
          rope.scaling.type "linear" and rope.scaling.factor; yarn:F:N adds
          rope.scaling.original_context_length N (the keys a HF
          rope_scaling {"type": "yarn", ...} without extra factors gives).
  llama3  arch "llama", tokenizer.ggml.pre "llama-bpe", add_bos_token true,
          rope.freq_base 500000, untied output, and rope_freqs.weight: the
          llama3 rope factors (--llama3-rope FACTOR:LOW:HIGH:ORIG, default
          8:1:4:64, a small original context so that they act within a short
          prompt) computed like LlamaModel.generate_extra_tensors.
  qwen2   q/k/v biases, tokenizer.ggml.pre "qwen2", freq_base 1e6, tied.
  qwen3   attn_q_norm/attn_k_norm ([head_dim]), no biases, key_length and
          value_length (head_dim * heads != embd by default), pre "qwen2".
  phi3    fused attn_qkv ([embd, embd + 2 * kv_heads * head_dim], rows q, k,
          v), ffn_up of 2 * ff rows (gate rows first, then up: llama.cpp's
          swiglu takes silu of the first half), untied output,
          rope.scaling.original_context_length, attention.sliding_window 2047
          (llama.cpp ignores phi3's window), no rope factors; with
          --phi3-longrope ORIG_CTX, rope_factors_long/short (Phi-3 128k's
          per-pair divisors: the long ones where the context exceeds
          ORIG_CTX) and the converter's rope.scaling.attn_factor.
  gemma3  attn_q_norm/attn_k_norm, post_attention_norm, post_ffw_norm (norm
          weights stored as llama.cpp's converter stores them, 1 + w: used as
          is), key_length/value_length, attention.sliding_window (--window,
          default 8; every 6th layer, il % 6 == 5, global), rope.freq_base 1e6
          (global layers) and rope.freq_base_swa 10000, tied, no softcapping.
--recipe like-src: as f16, but every 2-D weight whose name and shape SRC
has (a --head copy of a real file keeps its tensor infos) gets SRC's type
(Q4_K, Q5_0, Q6_K, Q8_0...) with random codes and small finite scales: a
file of the real one's size and types, for speed runs where the real file
cannot travel (Gemma 3 270M Q4_K_M from its 6.5 MB header).
"""

import argparse
import hashlib
import math
import os
import random
import struct
import sys
from array import array

# ggml types: (id, elements per block, bytes per block, offsets of f16 scales)
TYPES = {
    "F32": (0, 1, 4, ()),
    "Q4_0": (2, 32, 18, (0,)),
    "Q4_1": (3, 32, 20, (0, 2)),
    "Q5_0": (6, 32, 22, (0,)),
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
    global SRC_TENSORS
    SRC_TENSORS = {}
    for _ in range(n_tensors):
        names.append(r.string())
        nd = r.take("<I")
        dims = tuple(r.take("<Q") for _ in range(nd))
        SRC_TENSORS[names[-1]] = (dims, r.take("<I"))
        r.o += 8
    return kvs, names, head[:r.o]


SRC_TENSORS = {}  # name -> (dims, ggml type id) of the source file's tensors
TYPE_NAMES = {v[0]: k for k, v in TYPES.items()}
TYPE_NAMES[1] = "F16"


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


# -- float models of each architecture (--recipe f32|f16) --------------------

# shapes: layers, embd, ff, heads, kv heads, head dim (None: embd / heads),
# tied output (no output.weight)
ARCH_DEFAULTS = {
    "llama": dict(layers=2, embd=64, ff=128, heads=4, kv_heads=2, head_dim=None, tied=True),
    "llama3": dict(layers=3, embd=64, ff=192, heads=4, kv_heads=2, head_dim=None, tied=False),
    "qwen2": dict(layers=3, embd=64, ff=192, heads=4, kv_heads=2, head_dim=None, tied=True),
    "qwen3": dict(layers=3, embd=64, ff=192, heads=4, kv_heads=2, head_dim=32, tied=True),
    "phi3": dict(layers=3, embd=64, ff=128, heads=4, kv_heads=2, head_dim=None, tied=False),
    "gemma3": dict(layers=7, embd=64, ff=192, heads=4, kv_heads=1, head_dim=32, tied=True),
}


def kv_entry(key, vt, v):
    if vt == VT_STR and isinstance(v, str):
        v = v.encode()
    return (key.encode() if isinstance(key, str) else key, vt, v)


def shake_values(name, seed, n, center, exp):
    """N codes (uint16; code >> 4 picks a level) from SHAKE-256 of (seed, name),
    and the 4096 levels center + k * 2**-exp, k = -2048..2047: uniform values
    of std 2048 / sqrt(3) * 2**-exp (about 1182 * 2**-exp)."""
    raw = hashlib.shake_256(b"gguf_synth/%d/%s" % (seed, name.encode())).digest(2 * n)
    u = array("H", raw)
    if sys.byteorder != "little":
        u.byteswap()
    step = 2.0 ** -exp
    return u, [center + (i - 2048) * step for i in range(4096)]


def exp_for_std(std):
    """the power of two that gives a 12-bit uniform integer about this std"""
    return round(math.log2(2048 / math.sqrt(3) / std))


def tensor_bytes(name, seed, n, center, exp, gtype):
    """the little-endian bytes of N values (F32 or F16)"""
    u, levels = shake_values(name, seed, n, center, exp)
    if gtype == "F16":
        table = array("H", struct.unpack("<4096H", struct.pack("<4096e", *levels)))
        out = array("H", map(table.__getitem__, (x >> 4 for x in u)))
    else:
        table = array("f", levels)
        if any(table[i] != levels[i] for i in range(4096)):
            sys.exit(f"{name}: values not exact in f32")
        out = array("f", map(table.__getitem__, (x >> 4 for x in u)))
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes()


def f32_round(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def llama3_rope_factors(base, dim, factor, low, high, orig):
    """LlamaModel.generate_extra_tensors (convert_hf_to_gguf): the factors by
    which llama.cpp divides each rotary frequency (in float64 here, then
    rounded to f32; the converter's torch float32 arithmetic may differ in
    the last bit)."""
    low_wavelen, high_wavelen = orig / low, orig / high
    out = []
    for i in range(0, dim, 2):
        freq = 1.0 / (base ** (i / dim))
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(float(factor))
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return [f32_round(x) for x in out]


def float_model(a, kvs):
    arch = a.arch or "llama"
    if a.recipe not in ("f32", "f16", "like-src"):
        sys.exit(f"--arch {arch}: recipes f32, f16 and like-src only")
    meta = {k: (vt, v) for k, vt, v in kvs}
    D = dict(ARCH_DEFAULTS[arch])
    for k in ("layers", "embd", "ff", "heads", "kv_heads", "head_dim"):
        if getattr(a, k) is not None:
            D[k] = getattr(a, k)
    L, d, ff, nh, nkv = D["layers"], D["embd"], D["ff"], D["heads"], D["kv_heads"]
    hd = D["head_dim"] or d // nh
    if arch in ("llama", "llama3", "qwen2", "phi3") and hd * nh != d:
        sys.exit(f"{arch}: head_dim * heads must be embd")
    if nh % nkv:
        sys.exit("heads must be a multiple of kv heads")
    if arch == "gemma3" and meta.get(b"tokenizer.ggml.model", (0, b""))[1] != b"llama":
        print("gguf_synth: warning: gemma3 with a non-SentencePiece tokenizer", file=sys.stderr)
    n_vocab = len(meta[b"tokenizer.ggml.tokens"][1][1])
    tied = D["tied"]
    mm = "F16" if a.recipe in ("f16", "like-src") else "F32"
    gname = "llama" if arch == "llama3" else arch
    P = gname + "."

    # metadata, in the order the converter writes it
    out_kv = [kv_entry("general.architecture", VT_STR, gname),
              kv_entry("general.type", VT_STR, "model"),
              # (not "phi3" in the name: llama.cpp's vocabulary loader then
              # sets Phi-3's attributes on special tokens, and wants "</s>")
              kv_entry("general.name", VT_STR,
                       f"synthetic {'Phi 3' if arch == 'phi3' else arch} {a.recipe} seed {a.seed}")]
    ctx = {"llama": 8192, "llama3": 131072, "qwen2": 32768, "qwen3": 40960, "phi3": 4096,
           "gemma3": 32768}[arch]
    theta = {"llama": 100000.0, "llama3": 500000.0, "qwen2": 1000000.0, "qwen3": 1000000.0,
             "phi3": 10000.0, "gemma3": 1000000.0}[arch]
    eps = {"llama": 1e-5, "llama3": 1e-5, "qwen2": 1e-6, "qwen3": 1e-6, "phi3": 1e-5,
           "gemma3": 1e-6}[arch]
    rs = None
    if a.rope_scaling:
        if arch != "llama":
            sys.exit("--rope-scaling: --arch llama only")
        f = a.rope_scaling.split(":")
        if f[0] == "linear" and len(f) == 2:
            rs = ("linear", float(f[1]), None)
        elif f[0] == "yarn" and len(f) == 3:
            rs = ("yarn", float(f[1]), int(f[2]))
        else:
            sys.exit("--rope-scaling: linear:FACTOR or yarn:FACTOR:ORIG_CTX")
        ctx = int(ctx * rs[1]) if rs[0] == "linear" else int(rs[2] * rs[1])
    orig = ctx
    if a.phi3_longrope:
        if arch != "phi3":
            sys.exit("--phi3-longrope: --arch phi3 only")
        orig = a.phi3_longrope
    if arch == "phi3":
        out_kv += [kv_entry(P + "context_length", VT_U32, ctx),
                   kv_entry(P + "rope.scaling.original_context_length", VT_U32, orig),
                   kv_entry(P + "embedding_length", VT_U32, d),
                   kv_entry(P + "feed_forward_length", VT_U32, ff),
                   kv_entry(P + "block_count", VT_U32, L),
                   kv_entry(P + "attention.head_count", VT_U32, nh),
                   kv_entry(P + "attention.head_count_kv", VT_U32, nkv),
                   kv_entry(P + "attention.layer_norm_rms_epsilon", VT_F32, eps),
                   kv_entry(P + "rope.dimension_count", VT_U32, hd),
                   kv_entry(P + "rope.freq_base", VT_F32, theta),
                   kv_entry("general.file_type", VT_U32, 1 if mm == "F16" else 0),
                   kv_entry(P + "attention.sliding_window", VT_U32, 2047)]
        if a.phi3_longrope:  # the converter's attn factor for su/longrope
            out_kv.append(kv_entry(P + "rope.scaling.attn_factor", VT_F32,
                                   f32_round(math.sqrt(1 + math.log(ctx / orig) / math.log(orig)))))
    else:
        out_kv += [kv_entry(P + "block_count", VT_U32, L),
                   kv_entry(P + "context_length", VT_U32, ctx),
                   kv_entry(P + "embedding_length", VT_U32, d),
                   kv_entry(P + "feed_forward_length", VT_U32, ff),
                   kv_entry(P + "attention.head_count", VT_U32, nh),
                   kv_entry(P + "attention.head_count_kv", VT_U32, nkv)]
        if rs:
            out_kv += [kv_entry(P + "rope.scaling.type", VT_STR, rs[0]),
                       kv_entry(P + "rope.scaling.factor", VT_F32, rs[1])]
            if rs[0] == "yarn":
                out_kv.append(kv_entry(P + "rope.scaling.original_context_length", VT_U32, rs[2]))
        out_kv.append(kv_entry(P + "rope.freq_base", VT_F32, theta))
        if arch == "gemma3":
            out_kv.append(kv_entry(P + "rope.freq_base_swa", VT_F32, 10000.0))
        out_kv.append(kv_entry(P + "attention.layer_norm_rms_epsilon", VT_F32, eps))
        if arch in ("qwen3", "gemma3"):
            out_kv += [kv_entry(P + "attention.key_length", VT_U32, hd),
                       kv_entry(P + "attention.value_length", VT_U32, hd)]
        out_kv.append(kv_entry("general.file_type", VT_U32, 1 if mm == "F16" else 0))
        if arch in ("llama", "llama3"):
            out_kv += [kv_entry(P + "vocab_size", VT_U32, n_vocab),
                       kv_entry(P + "rope.dimension_count", VT_U32, hd)]
        if arch == "gemma3":
            out_kv.append(kv_entry(P + "attention.sliding_window", VT_U32, a.window))
    over = {}
    if arch == "llama3":
        over = {b"tokenizer.ggml.pre": (VT_STR, b"llama-bpe"), b"tokenizer.ggml.add_bos_token": (VT_BOOL, 1)}
    elif arch in ("qwen2", "qwen3"):
        over = {b"tokenizer.ggml.pre": (VT_STR, b"qwen2")}
    for key, vt, v in kvs:
        if key.startswith(b"tokenizer."):
            if key in over:
                vt, v = over.pop(key)
            out_kv.append((key, vt, v))
    out_kv += [(k, vt, v) for k, (vt, v) in over.items()]
    out_kv.append(kv_entry("general.quantization_version", VT_U32, 2))

    # tensors: (name, dims (ggml order), type, center, exponent) or (.., values)
    W = lambda n_in, gain=1.0: exp_for_std(gain / math.sqrt(n_in))  # noqa: E731
    NORM = (1.0, 13)        # 1 +- 0.25
    OUT_NORM = (16.0, 9)    # 16 +- 4: logits of std about 16 (few near ties)
    tensors = []
    if arch == "llama3":
        t3 = [float(x) for x in a.llama3_rope.split(":")]
        tensors.append(("rope_freqs.weight", (hd // 2,), "F32",
                        llama3_rope_factors(theta, hd, t3[0], t3[1], t3[2], int(t3[3]))))
    if a.phi3_longrope:  # Phi-3 128k's per-pair divisors: long ones past the original context
        tensors.append(("rope_factors_long.weight", (hd // 2,), "F32",
                        [f32_round(1.0 + 15.0 * i / max(1, hd // 2 - 1)) for i in range(hd // 2)]))
        tensors.append(("rope_factors_short.weight", (hd // 2,), "F32",
                        [f32_round(1.0 + 0.5 * i / max(1, hd // 2 - 1)) for i in range(hd // 2)]))
    tensors.append(("token_embd.weight", (d, n_vocab), mm, 0.0, W(d)))
    q, kvd = nh * hd, nkv * hd
    for i in range(L):
        b = f"blk.{i}."
        tensors.append((b + "attn_norm.weight", (d,), "F32") + NORM)
        if arch == "phi3":
            tensors.append((b + "attn_qkv.weight", (d, q + 2 * kvd), mm, 0.0, W(d, 1.5)))
        else:
            tensors += [(b + "attn_q.weight", (d, q), mm, 0.0, W(d, 2.0)),
                        (b + "attn_k.weight", (d, kvd), mm, 0.0, W(d)),
                        (b + "attn_v.weight", (d, kvd), mm, 0.0, W(d))]
        if arch == "qwen2":
            tensors += [(b + "attn_q.bias", (q,), "F32", 0.0, exp_for_std(0.3)),
                        (b + "attn_k.bias", (kvd,), "F32", 0.0, exp_for_std(0.3)),
                        (b + "attn_v.bias", (kvd,), "F32", 0.0, exp_for_std(0.3))]
        if arch in ("qwen3", "gemma3"):
            tensors += [(b + "attn_q_norm.weight", (hd,), "F32") + NORM,
                        (b + "attn_k_norm.weight", (hd,), "F32") + NORM]
        tensors.append((b + "attn_output.weight", (q, d), mm, 0.0, W(q)))
        if arch == "gemma3":
            tensors.append((b + "post_attention_norm.weight", (d,), "F32") + NORM)
        tensors.append((b + "ffn_norm.weight", (d,), "F32") + NORM)
        if arch == "phi3":
            tensors.append((b + "ffn_up.weight", (d, 2 * ff), mm, 0.0, W(d)))
        else:
            tensors += [(b + "ffn_gate.weight", (d, ff), mm, 0.0, W(d)),
                        (b + "ffn_up.weight", (d, ff), mm, 0.0, W(d))]
        tensors.append((b + "ffn_down.weight", (ff, d), mm, 0.0, W(ff)))
        if arch == "gemma3":
            tensors.append((b + "post_ffw_norm.weight", (d,), "F32") + NORM)
    tensors.append(("output_norm.weight", (d,), "F32") + OUT_NORM)
    if not tied:
        tensors.append(("output.weight", (d, n_vocab), mm, 0.0, W(d)))

    align = 32
    out = bytearray(b"GGUF") + struct.pack("<IQQ", 3, len(tensors), len(out_kv))
    for key, vt, v in out_kv:
        out += struct.pack("<Q", len(key)) + key + struct.pack("<I", vt)
        put_value(out, vt, v)
    if a.recipe == "like-src":  # the source's type for every 2-D weight of the same name and shape
        for i, t in enumerate(tensors):
            src = SRC_TENSORS.get(t[0].encode())
            if len(t[1]) == 2 and src and tuple(src[0]) == tuple(t[1]) and TYPE_NAMES.get(src[1]) in TYPES:
                tensors[i] = (t[0], t[1], TYPE_NAMES[src[1]]) + tuple(t[3:])
    offset, sizes = 0, []
    for t in tensors:
        name, dims, gt = t[0], t[1], t[2]
        n = 1
        for x in dims:
            n *= x
        if gt in ("F16", "F32"):
            size = n * (2 if gt == "F16" else 4)
        else:
            size = n // TYPES[gt][1] * TYPES[gt][2]
        nb = name.encode()
        out += struct.pack("<Q", len(nb)) + nb + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", x) for x in dims)
        out += struct.pack("<IQ", 1 if gt == "F16" else TYPES[gt][0], offset)
        sizes.append((n, size))
        offset += (size + align - 1) // align * align
    out += bytes(-len(out) % align)
    sha = hashlib.sha256()
    with open(a.dst, "wb") as f:
        def put(data):
            f.write(data)
            sha.update(data)
        put(bytes(out))
        for t, (n, size) in zip(tensors, sizes):
            if len(t) == 4:  # explicit values
                data = struct.pack("<%df" % n, *t[3])
            elif t[2] not in ("F16", "F32"):  # random codes, small finite scales (speed runs)
                data = block_template(t[2], n // TYPES[t[2]][1], random.Random(a.seed * 7919 + len(t[0])))
            else:
                data = tensor_bytes(t[0], a.seed, n, t[3], t[4], t[2])
            assert len(data) == size, t[0]
            put(data + bytes(-size % align))
    total = os.path.getsize(a.dst)
    print(f"{a.dst}: {arch} {a.recipe}, {L} layers, embd {d}, ff {ff}, heads {nh}/{nkv}, head_dim {hd}, "
          f"vocab {n_vocab}, {'tied' if tied else 'untied'}, {len(tensors)} tensors, {total / 1e6:.1f} MB, "
          f"sha256 {sha.hexdigest()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    for k in ("layers", "embd", "ff", "heads", "kv-heads", "head-dim"):
        ap.add_argument("--" + k, type=int)
    ap.add_argument("--recipe", default=None,
                    choices=("q4_1", "q4_0", "q8_0", "q4_k_m", "f32", "f16", "like-src"))
    ap.add_argument("--arch", choices=tuple(ARCH_DEFAULTS))
    ap.add_argument("--rope-scaling")
    ap.add_argument("--llama3-rope", default="8:1:4:64")
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--phi3-longrope", type=int, metavar="ORIG_CTX")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--head", action="store_true")
    a = ap.parse_args()

    kvs, src_names, header = read_metadata(a.src)
    if a.head:
        with open(a.dst, "wb") as f:
            f.write(header)
        print(f"{a.dst}: the {len(header)}-byte header of {a.src}")
        return
    if a.recipe is None:
        a.recipe = "f32" if a.arch else "q4_1"
    if a.recipe in ("f32", "f16", "like-src") or a.arch not in (None, "llama"):
        return float_model(a, kvs)
    if a.head_dim or a.rope_scaling:
        sys.exit("--head-dim and --rope-scaling: with --recipe f32 or f16 only")
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
                 for t in sorted({t for _, _, t in tensors}) if t != "F32"}  # (sorted: the same bytes every run)
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
