#!/usr/bin/env python3
"""make_gguf_corpus.py - writes the GGUF fuzzing seed corpus (tests/corpus/gguf).

Tiny valid files (v2 and v3, every metadata value type, string arrays,
several tensor types, a few alignments) and a few corrupt ones, each under
4 KiB.  Standard library only; the output is deterministic.

    python3 tests/corpus/make_gguf_corpus.py [OUTDIR]
"""
import os
import struct
import sys

# value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i",
       F32: "<f", BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}

# ggml type id -> (block elements, block bytes)
TYPES = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20),
         "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176),
         "Q6_K": (14, 256, 210), "BF16": (30, 1, 2)}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value(vtype, v):
    if vtype == STR:
        return gstr(v)
    if vtype == ARR:
        etype, items = v
        out = struct.pack("<IQ", etype, len(items))
        return out + b"".join(value(etype, x) for x in items)
    return struct.pack(FMT[vtype], v)


def build(version=3, kvs=(), tensors=(), align=32, magic=b"GGUF", offsets=None):
    """kvs: (key, type, value); tensors: (name, type name, ne list[, type id
    written instead]); offsets: written instead of the computed ones."""
    head = magic + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, vtype, v in kvs:
        head += gstr(key) + struct.pack("<I", vtype) + value(vtype, v)
    data, offs = b"", []
    for name, tname, ne, *_ in tensors:
        tid, blck, size = TYPES[tname]
        n = 1
        for d in ne:
            n *= d
        data += b"\0" * (-len(data) % align)
        offs.append(len(data))
        data += bytes((i * 37 + len(name)) & 0xff for i in range(n // blck * size))
    for i, (name, tname, ne, *tid) in enumerate(tensors):
        off = offsets[i] if offsets else offs[i]
        head += gstr(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        head += struct.pack("<IQ", tid[0] if tid else TYPES[tname][0], off)
    if tensors:
        head += b"\0" * (-len(head) % align)
    return head + data


LLAMA_KVS = [
    ("general.architecture", STR, "llama"),
    ("general.name", STR, "corpus"),
    ("llama.embedding_length", U32, 32),
    ("llama.block_count", U32, 1),
    ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
    ("tokenizer.ggml.model", STR, "llama"),
    ("tokenizer.ggml.tokens", ARR, (STR, ["<unk>", "<s>", "</s>", "\u2581a", "\u00e9", ""])),
    ("tokenizer.ggml.scores", ARR, (F32, [0.0, 0.0, 0.0, -1.5, -2.0, -3.0])),
    ("tokenizer.ggml.token_type", ARR, (I32, [2, 3, 3, 1, 1, 1])),
    ("tokenizer.ggml.bos_token_id", U32, 1),
    ("tokenizer.ggml.padding_token_id", U32, 0xffffffff),
    ("tokenizer.ggml.add_bos_token", BOOL, True),
]

ALL_SCALARS = [
    ("t.u8", U8, 255), ("t.i8", I8, -128), ("t.u16", U16, 65535), ("t.i16", I16, -32768),
    ("t.u32", U32, 4000000000), ("t.i32", I32, -7), ("t.f32", F32, 0.5), ("t.bool", BOOL, False),
    ("t.u64", U64, 1 << 40), ("t.i64", I64, -(1 << 40)), ("t.f64", F64, 1e300),
    ("t.arr_u8", ARR, (U8, [1, 2, 3])), ("t.arr_bool", ARR, (BOOL, [True, False])),
    ("t.arr_u64", ARR, (U64, [7])), ("t.arr_f64", ARR, (F64, [0.25, -0.5])),
    ("t.arr_empty", ARR, (I16, [])), ("t.arr_str_empty", ARR, (STR, [])),
]

MIXED_TENSORS = [
    ("token_embd.weight", "Q8_0", [32, 6]),
    ("output_norm.weight", "F32", [32]),
    ("blk.0.attn_q.weight", "Q4_0", [32, 2]),
    ("blk.0.ffn_down.weight", "Q4_K", [256, 1]),
    ("blk.0.ffn_up.weight", "Q6_K", [256, 1, 1, 1]),
    ("blk.0.attn_norm.weight", "F16", [4, 2, 2]),
    ("blk.0.ffn_norm.weight", "BF16", [8]),
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "gguf")
    os.makedirs(out, exist_ok=True)
    files = {}
    valid = build(3, LLAMA_KVS + ALL_SCALARS, MIXED_TENSORS)
    files["valid_v3_mixed.gguf"] = valid
    files["valid_v2_align64.gguf"] = build(
        2, [("general.alignment", U32, 64)] + LLAMA_KVS[:7],
        [("a", "Q4_1", [64]), ("b", "Q5_K", [256]), ("c", "F32", [1, 2, 3, 4])], align=64)
    files["valid_v3_align8_u8.gguf"] = build(
        3, [("general.alignment", U8, 8), ("x", STR, "")], [("x", "F16", [3]), ("y", "F32", [1])],
        align=8)
    files["valid_v3_metadata_only.gguf"] = build(3, ALL_SCALARS)
    files["valid_v2_empty.gguf"] = build(2)

    files["bad_magic.gguf"] = build(3, LLAMA_KVS[:2], magic=b"GGML")
    files["bad_version1.gguf"] = build(1, LLAMA_KVS[:2])
    files["bad_big_endian.gguf"] = b"GGUF" + struct.pack(">IQQ", 3, 0, 0)
    files["bad_truncated_header.gguf"] = valid[:20]
    tokens = build(3, LLAMA_KVS[6:7])
    files["bad_truncated_tokens.gguf"] = tokens[:tokens.index("\u2581a".encode()) + 1]
    files["bad_truncated_data.gguf"] = valid[:-1]
    files["bad_huge_strlen.gguf"] = build(3, [("k", STR, "v")]).replace(
        struct.pack("<Q", 1) + b"v", struct.pack("<Q", 1 << 62) + b"v")
    files["bad_huge_counts.gguf"] = b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 1 << 62) + b"\0" * 32
    files["bad_nested_array.gguf"] = build(3, [("k", ARR, (U8, [1]))]).replace(
        struct.pack("<IIQ", ARR, U8, 1), struct.pack("<IIQ", ARR, ARR, 1))
    files["bad_alignment.gguf"] = build(3, [("general.alignment", U32, 48)], [("a", "F32", [1])])
    files["bad_misaligned.gguf"] = build(3, [], [("a", "F32", [1]), ("b", "F32", [1])],
                                         offsets=[0, 4])
    files["bad_dup_tensor.gguf"] = build(3, [], [("a", "F32", [1]), ("a", "F32", [1])])
    files["bad_dup_key.gguf"] = build(3, [("k", U8, 1), ("k", U8, 2)])
    files["bad_past_eof.gguf"] = build(3, [], [("a", "F32", [4])], offsets=[1 << 20])
    files["bad_unknown_type.gguf"] = build(3, [], [("a", "F32", [1], 99)])
    files["bad_ndims5.gguf"] = build(3, [], [("a", "F32", [1, 1, 1, 1])]).replace(
        struct.pack("<I", 4) + struct.pack("<4Q", 1, 1, 1, 1),
        struct.pack("<I", 5) + struct.pack("<4Q", 1, 1, 1, 1))

    for name, data in sorted(files.items()):
        assert len(data) < 4096, name
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print("wrote %d files to %s" % (len(files), out))


if __name__ == "__main__":
    main()
