"""ref_f64.py - float64 reference logits for a GGUF: architectures llama (with
linear / YaRN RoPE scaling and llama3 rope_freqs), qwen2, qwen3, phi3, gemma3;
weights F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K.

Every weight is dequantized straight to float64 (d*q + m, d*sc*q - dmin*m
computed in float64, exact), activations are float64 throughout, no activation
quantization, exact functions (tanh GELU, exp, cos/sin): the yardstick for how
accurate an engine is (KL divergence, max |logit difference|: tools/accuracy.py).
It follows llama.cpp's reading of the file (src/models/*.cpp of the vendored
llama.cpp): the same norms, RoPE flavour and bases, attention windows and
scales, where an exact real-number computation differs only by rounding.

  pip install numpy gguf          # gguf = llama.cpp's GGUF reader, from the package registry
  python3 ref_f64.py MODEL.gguf ID ID ...   # prints the logits after the last id, one a line
  python3 ref_f64.py MODEL.gguf --golden G.json --steps K --out REF.npy
      # for each case of a peer-golden / llama.cpp golden JSON (prompt_ids,
      # generated_ids): the logits after prompt + s generated ids, s < K, as a
      # float64 array (n_cases, K, n_vocab); for tests/data/arch-goldens.json
      # add --case NAME (its results, on the model its gguf_synth line makes)
  python3 ref_f64.py MODEL.gguf --ids 2,818,3823 --greedy N
      # the reference's own greedy continuation and top-2 margins, as JSON

Slow (float64 numpy), fine for models of a few hundred million parameters and short prompts.
Extended from ../shared/tools/ref_f64.py (llama, F32/F16/Q4_1/Q8_0), whose
results it reproduces on llama files.
"""
import json
import math
import sys

import numpy as np

from gguf import GGUFReader, GGMLQuantizationType as QT  # noqa: E402
import gguf.quants  # noqa: E402


def _f16(b):  # (n,2) uint8 -> float64
    return np.ascontiguousarray(b).view(np.float16).astype(np.float64)


def _scale_min_k4(sc):
    """llama.cpp's get_scale_min_k4 for the 8 sub-blocks: (n,12) uint8 -> (n,8), (n,8)"""
    sc = sc.astype(np.int64)
    d = np.empty((sc.shape[0], 8), np.int64)
    m = np.empty((sc.shape[0], 8), np.int64)
    d[:, :4] = sc[:, 0:4] & 63
    m[:, :4] = sc[:, 4:8] & 63
    d[:, 4:] = (sc[:, 8:12] & 0xF) | ((sc[:, 0:4] >> 6) << 4)
    m[:, 4:] = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    return d.astype(np.float64), m.astype(np.float64)


def deq64(t):
    """Dequantize a GGUF tensor to float64, shape (rows, ne0) (numpy order = reversed GGUF shape)."""
    shape = tuple(int(s) for s in reversed(t.shape))  # e.g. (n_out, n_in)
    data = np.asarray(t.data)
    if t.tensor_type == QT.F32:
        return data.astype(np.float64).reshape(shape)
    if t.tensor_type == QT.F16:
        return data.view(np.float16).astype(np.float64).reshape(shape)
    raw = data.view(np.uint8).reshape(-1)
    if t.tensor_type == QT.BF16:
        u = raw.view(np.uint16).astype(np.uint32) << 16
        return u.view(np.float32).astype(np.float64).reshape(shape)
    if t.tensor_type == QT.Q4_0:  # d f16, 16 bytes of nibbles; (q - 8) * d
        b = raw.reshape(-1, 18)
        d, qs = _f16(b[:, 0:2]), b[:, 2:18]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64) - 8
        out = d * q
    elif t.tensor_type == QT.Q4_1:  # block: d f16, m f16, 16 bytes of nibbles (32 weights)
        b = raw.reshape(-1, 20)
        d, m, qs = _f16(b[:, 0:2]), _f16(b[:, 2:4]), b[:, 4:20]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64)  # j<16: low nibble, j>=16: high
        out = d * q + m
    elif t.tensor_type == QT.Q5_0:  # d f16, qh u32 (5th bits), 16 bytes of nibbles; (q - 16) * d
        b = raw.reshape(-1, 22)
        d = _f16(b[:, 0:2])
        qh = np.ascontiguousarray(b[:, 2:6]).view("<u4").astype(np.int64)  # (n,1)
        qs = b[:, 6:22].astype(np.int64)
        j = np.arange(16)
        h0 = ((qh >> j) & 1) << 4
        h1 = ((qh >> (j + 16)) & 1) << 4
        q = np.concatenate([(qs & 0x0F) | h0, (qs >> 4) | h1], axis=1).astype(np.float64) - 16
        out = d * q
    elif t.tensor_type == QT.Q8_0:  # block: d f16, 32 int8
        b = raw.reshape(-1, 34)
        d = _f16(b[:, 0:2])
        q = np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(np.float64)
        out = d * q
    elif t.tensor_type == QT.Q4_K:  # d, dmin f16; 12 bytes of 6-bit scales and mins; 128 bytes of nibbles
        b = raw.reshape(-1, 144)
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, mn = _scale_min_k4(b[:, 4:16])
        qs = b[:, 16:144].reshape(-1, 4, 32)  # 4 groups of 64 weights: low nibbles, then high
        q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float64)  # sub-block 2j, 2j+1
        out = ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(-1, 256)
    elif t.tensor_type == QT.Q6_K:  # ql[128], qh[64], int8 scales[16], d f16
        b = raw.reshape(-1, 210)
        ql = b[:, 0:128].astype(np.int64).reshape(-1, 2, 64)
        qh = b[:, 128:192].astype(np.int64).reshape(-1, 2, 32)
        sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float64).reshape(-1, 2, 8)
        d = _f16(b[:, 208:210])  # (n,1)
        q1 = (ql[:, :, 0:32] & 0xF) | (((qh >> 0) & 3) << 4)
        q2 = (ql[:, :, 32:64] & 0xF) | (((qh >> 2) & 3) << 4)
        q3 = (ql[:, :, 0:32] >> 4) | (((qh >> 4) & 3) << 4)
        q4 = (ql[:, :, 32:64] >> 4) | (((qh >> 6) & 3) << 4)
        q = np.stack([q1, q2, q3, q4], axis=2).astype(np.float64) - 32  # (n, half, 4, 32)
        s = sc.reshape(-1, 2, 4, 2)  # scale index is = l/16 + 2*k within a half: (n, half, k, l/16)
        s = np.repeat(s, 16, axis=3)  # (n, half, 4, 32)
        out = (d[:, :, None, None] * s * q).reshape(-1, 256)
    else:
        raise NotImplementedError(t.tensor_type)
    return out.reshape(shape)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


class RefModel:
    def __init__(self, path, check_against_gguf=True):
        r = GGUFReader(path)
        f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.")}
        self.arch = arch = f["general.architecture"]
        if arch not in ("llama", "qwen2", "qwen3", "phi3", "gemma3"):
            raise NotImplementedError(f"architecture {arch}")

        def get(k, default=None):
            return f.get(f"{arch}.{k}", default)

        self.n_layer = get("block_count")
        self.n_embd = get("embedding_length")
        self.n_head = get("attention.head_count")
        self.n_head_kv = get("attention.head_count_kv", self.n_head)
        self.eps = float(get("attention.layer_norm_rms_epsilon"))
        self.head_dim = get("attention.key_length", self.n_embd // self.n_head)
        self.n_rot = get("rope.dimension_count", self.head_dim)
        self.rope_base = float(get("rope.freq_base", 10000.0))
        self.neox = arch != "llama"  # llama.cpp: LLAMA_ROPE_TYPE_NORM for llama, NEOX for the others here
        # RoPE scaling as llama.cpp reads it (llama-model.cpp, llama-context.cpp)
        self.rope_scaling = get("rope.scaling.type", "linear")
        factor = float(get("rope.scaling.factor", get("rope.scale_linear", 0.0)) or 0.0)
        self.freq_scale = 1.0 if factor == 0.0 or self.rope_scaling == "none" else 1.0 / factor
        self.n_ctx_orig = get("rope.scaling.original_context_length", get("context_length"))
        self.ext_factor = 1.0 if self.rope_scaling == "yarn" else 0.0
        self.attn_factor = float(get("rope.scaling.attn_factor", 1.0))
        # sliding window (gemma3: every n_pattern-th layer global, il % n < n - 1 sliding)
        self.n_swa = 0
        self.swa = [False] * self.n_layer
        self.rope_base_swa = float(get("rope.freq_base_swa", 10000.0))
        if arch == "gemma3" and get("attention.sliding_window", 0) > 0:
            self.n_swa = get("attention.sliding_window")
            pat = get("attention.sliding_window_pattern", 6)
            if isinstance(pat, list):
                self.swa = [bool(x) for x in pat]
            else:
                self.swa = [pat == 0 or il % pat < pat - 1 for il in range(self.n_layer)]
        self.softcap = float(get("final_logit_softcapping", 0.0) or 0.0) if arch == "gemma3" else 0.0
        self.kq_scale = 1.0 / math.sqrt(self.head_dim)
        T = {t.name: t for t in r.tensors}
        self.W = {}
        for name, t in T.items():
            w = deq64(t)
            if check_against_gguf:  # layout check vs. gguf-py's float32 dequantizer
                g = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float64).reshape(w.shape)
                assert np.max(np.abs(g - w)) <= 1e-5 * max(1.0, np.max(np.abs(w))), name
            self.W[name] = w
        self.tok_embd = self.W["token_embd.weight"]  # (n_vocab, n_embd)
        self.output = self.W.get("output.weight", self.tok_embd)  # tied if absent
        self.tied = "output.weight" not in self.W
        self.rope_freqs = self.W.get("rope_freqs.weight")

    @staticmethod
    def q8act(x):
        """Diagnostic only: round activations like ggml's Q8_0/Q8_1 (blocks of 32, d=amax/127, fp16 d)."""
        sh = x.shape
        b = x.reshape(-1, 32)
        d = np.abs(b).max(axis=1, keepdims=True) / 127.0
        inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
        q = np.clip(np.sign(b * inv) * np.floor(np.abs(b * inv) + 0.5), -127, 127)  # roundf: half away from 0
        return (d.astype(np.float16).astype(np.float64) * q).reshape(sh)

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope_cs(self, pos, base, freq_scale):
        """cos and sin (T, n_rot/2) of ggml's rope_yarn, in float64"""
        n = self.n_rot
        i = np.arange(n // 2, dtype=np.float64)
        theta_extrap = pos[:, None].astype(np.float64) * base ** (-2.0 * i / n)[None, :]
        if self.rope_freqs is not None:
            theta_extrap = theta_extrap / self.rope_freqs[None, :]
        theta = freq_scale * theta_extrap
        mscale = self.attn_factor
        if self.ext_factor != 0.0:
            def corr_dim(n_rot):
                return n * math.log(self.n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
            low = max(0.0, math.floor(corr_dim(32.0)))   # yarn_beta_fast
            high = min(n - 1.0, math.ceil(corr_dim(1.0)))  # yarn_beta_slow
            y = (i - low) / max(0.001, high - low)
            ramp = (1 - np.clip(y, 0, 1)) * self.ext_factor
            theta = theta * (1 - ramp)[None, :] + theta_extrap * ramp[None, :]
            mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
        return np.cos(theta) * mscale, np.sin(theta) * mscale

    def rope(self, x, cs):
        """x: (T, H, D). NORM: rotate adjacent pairs (2i, 2i+1); NEOX: pairs (i, i + n/2)."""
        n = self.n_rot
        c, s = cs[0][:, None, :], cs[1][:, None, :]
        y = x.copy()
        if not self.neox:
            x0, x1 = x[..., 0:n:2], x[..., 1:n:2]
            y[..., 0:n:2] = x0 * c - x1 * s
            y[..., 1:n:2] = x0 * s + x1 * c
        else:
            x0, x1 = x[..., : n // 2], x[..., n // 2: n]
            y[..., : n // 2] = x0 * c - x1 * s
            y[..., n // 2: n] = x0 * s + x1 * c
        return y

    def forward(self, ids, n_out=1, act_q8=False):
        """Return float64 logits (n_out, n_vocab) at the last n_out positions (a vector if n_out is None).
        act_q8=True is a diagnostic variant that rounds every matmul input to 8-bit blocks (not the reference)."""
        Q = self.q8act if act_q8 else (lambda t: t)
        ids = np.asarray(ids)
        Tn = len(ids)
        H, Hkv, D = self.n_head, self.n_head_kv, self.head_dim
        g = H // Hkv
        arch = self.arch
        pos = np.arange(Tn)
        x = self.tok_embd[ids].copy()
        if arch == "gemma3":
            x *= math.sqrt(self.n_embd)
        causal = np.triu(np.full((Tn, Tn), -np.inf), 1)
        mask_swa = causal.copy()
        if self.n_swa:
            mask_swa[(pos[:, None] - pos[None, :]) >= self.n_swa] = -np.inf
        cs_global = self.rope_cs(pos, self.rope_base, self.freq_scale)
        cs_swa = self.rope_cs(pos, self.rope_base_swa, 1.0) if any(self.swa) else None
        for il in range(self.n_layer):
            def W(n, il=il):
                return self.W[f"blk.{il}.{n}.weight"]

            def B(n, il=il):
                return self.W.get(f"blk.{il}.{n}.bias")

            h = Q(self.rmsnorm(x, W("attn_norm")))
            if arch == "phi3":
                qkv = h @ W("attn_qkv").T
                q = qkv[:, : H * D]
                k = qkv[:, H * D: H * D + Hkv * D]
                v = qkv[:, H * D + Hkv * D:]
            else:
                q, k, v = h @ W("attn_q").T, h @ W("attn_k").T, h @ W("attn_v").T
                if B("attn_q") is not None:
                    q, k, v = q + B("attn_q"), k + B("attn_k"), v + B("attn_v")
            q, k, v = q.reshape(Tn, H, D), k.reshape(Tn, Hkv, D), v.reshape(Tn, Hkv, D)
            if arch in ("qwen3", "gemma3"):
                q = self.rmsnorm(q, W("attn_q_norm"))
                k = self.rmsnorm(k, W("attn_k_norm"))
            cs = cs_swa if self.swa[il] else cs_global
            q, k = self.rope(q, cs), self.rope(k, cs)
            mask = mask_swa if self.swa[il] else causal
            out = np.empty((Tn, H, D))
            for hh in range(H):
                kv = hh // g  # ggml broadcast: q head hh uses kv head hh // (H/Hkv)
                s = q[:, hh, :] @ k[:, kv, :].T * self.kq_scale + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                s /= s.sum(axis=1, keepdims=True)
                out[:, hh, :] = s @ v[:, kv, :]
            a = Q(out.reshape(Tn, H * D)) @ W("attn_output").T
            if arch == "gemma3":
                a = self.rmsnorm(a, W("post_attention_norm"))
            x = x + a
            h = Q(self.rmsnorm(x, W("ffn_norm")))
            if arch == "phi3":
                gu = h @ W("ffn_up").T
                n_ff = gu.shape[1] // 2
                gate, up = gu[:, :n_ff], gu[:, n_ff:]  # llama.cpp's swiglu: silu(first half) * second half
            else:
                gate, up = h @ W("ffn_gate").T, h @ W("ffn_up").T
            if arch == "gemma3":
                act = gelu_tanh(gate) * up
            else:
                act = (gate / (1.0 + np.exp(-gate))) * up
            f = Q(act) @ W("ffn_down").T
            if arch == "gemma3":
                f = self.rmsnorm(f, W("post_ffw_norm"))
            x = x + f
        last = x[-(n_out or 1):]
        h = self.rmsnorm(last, self.W["output_norm.weight"])
        logits = Q(h) @ self.output.T
        if self.softcap:
            logits = np.tanh(logits / self.softcap) * self.softcap
        return logits[0] if n_out is None else logits


def main(argv):
    import argparse
    if len(argv) >= 2 and all(a.lstrip("-").isdigit() for a in argv[1:]):  # the shared tool's interface
        logits = RefModel(argv[0], check_against_gguf=False).forward([int(t) for t in argv[1:]], n_out=None)
        sys.stdout.write("".join(f"{v:.6f}\n" for v in logits))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--golden")
    ap.add_argument("--case", help="with an arch-goldens.json --golden: the case's name")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--out")
    ap.add_argument("--ids")
    ap.add_argument("--greedy", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="check the dequantizers against gguf-py's")
    a = ap.parse_args(argv)
    m = RefModel(a.model, check_against_gguf=a.check)
    if a.golden:
        cases = json.load(open(a.golden))
        if isinstance(cases, dict):  # tests/data/arch-goldens.json: one case's results
            cases = [c for c in cases["cases"] if c["name"] == a.case][0]["results"]
        out = np.zeros((len(cases), a.steps, m.tok_embd.shape[0]))
        for ci, c in enumerate(cases):
            ids = list(c["prompt_ids"]) + list(c["generated_ids"][: a.steps - 1])
            out[ci] = m.forward(ids, n_out=a.steps)
            print(f"case {ci}: {len(ids)} ids", file=sys.stderr)
        np.save(a.out, out)
        return
    ids = [int(t) for t in a.ids.split(",")]
    gen, margins = [], []
    for _ in range(a.greedy):
        lg = m.forward(ids + gen, n_out=None)
        top = np.argsort(-lg, kind="stable")[:2]
        gen.append(int(top[0]))
        margins.append(round(float(lg[top[0]] - lg[top[1]]), 6))
    json.dump({"prompt_ids": ids, "generated_ids": gen, "margins": margins}, sys.stdout)
    print()


if __name__ == "__main__":
    main(sys.argv[1:])
