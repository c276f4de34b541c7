#!/usr/bin/env python3
"""accuracy.py - llmd's logits on quantized real models against a float64
reference, no worse than llama.cpp's.

For SmolLM2 Q4_1 and Gemma 3 270M Q4_K_M (each when its file is here) and
both KV types (f32, f16): the 32 token sequences of
tests/data/accuracy/MODEL-KV.llamacpp.json (llama.cpp's prompts and greedy
ids) go through tools/logits-dump (llmd, teacher-forced, the logits of 8
steps) and tools/ref_f64.py (float64 numpy: every weight dequantized
exactly, no activation quantization).  Per prompt: the mean KL(ref || llmd)
over the steps and the largest |logit difference|; their medians over the
prompts must be at most 1.2x llama.cpp's on the same sequences
(tests/data/accuracy/llamacpp-figures.json), and llmd's argmax must equal
the reference's wherever the reference's top-2 margin is at least 0.5.
(At 0.2, llama.cpp itself differs at 0-2 of 256 steps; the figures print
llmd's count beside its.)

Needs numpy and gguf (setup.sh check installs them into .pydeps); skips
(77) without them or without both models.
"""
import json
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("LLMD_SRCDIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BUILD = os.environ.get("LLMD_BUILDDIR", SRC)
sys.path.insert(0, os.path.join(BUILD, ".pydeps"))
try:
    import numpy as np
    import gguf  # noqa: F401  (ref_f64.py's reader)
except ImportError as e:
    print("SKIP: %s (setup.sh check installs numpy and gguf into .pydeps)" % e)
    sys.exit(77)

MODELS = {"smol": os.environ.get("LLMD_SMOLLM2", ""), "gemma": os.environ.get("LLMD_GEMMA3", "")}
RATIO = 1.2
MARGIN = 0.5


def logsoftmax(x):
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def figures(ref, eng):
    kl, mx, bad = [], [], {0.2: 0, MARGIN: 0}
    for p in range(ref.shape[0]):
        ks = []
        for s in range(ref.shape[1]):
            a, b = logsoftmax(ref[p, s]), logsoftmax(eng[p, s])
            ks.append(float((np.exp(a) * (a - b)).sum()))
            o = np.sort(ref[p, s])[::-1]
            if np.argmax(eng[p, s]) != np.argmax(ref[p, s]):
                for m in bad:
                    bad[m] += int(o[0] - o[1] >= m)
        kl.append(np.mean(ks))
        mx.append(float(np.abs(ref[p] - eng[p]).max()))
    return float(np.median(kl)), float(np.median(mx)), bad


def main():
    peer = json.load(open(os.path.join(SRC, "tests/data/accuracy/llamacpp-figures.json")))["figures"]
    failures = checked = 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(BUILD, ".pydeps")] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in MODELS.items():
            if not path or not os.path.exists(path):
                print("%s: no model file, left out" % name)
                continue
            for kv in ("f32", "f16"):
                golden = os.path.join(SRC, "tests/data/accuracy/%s-%s.llamacpp.json" % (name, kv))
                ref_f, eng_f = os.path.join(tmp, "ref.npy"), os.path.join(tmp, "llmd.npy")
                r = subprocess.run([sys.executable, os.path.join(SRC, "tools/ref_f64.py"), path, "--golden",
                                    golden, "--steps", "8", "--out", ref_f], capture_output=True, text=True, env=env)
                if r.returncode:
                    sys.exit("tools/ref_f64.py %s: exit %d\n%s" % (path, r.returncode, r.stderr[-2000:]))
                subprocess.run([os.path.join(BUILD, "tools/logits-dump"), path, golden, "8", eng_f, kv], check=True)
                ref = np.load(ref_f).astype(np.float64)
                eng = np.load(eng_f).astype(np.float64)
                kl, mx, bad = figures(ref, eng)
                p = peer["%s-%s" % (name, kv)]
                ok = kl <= RATIO * p["kl_median"] and mx <= RATIO * p["max_abs_median"] and bad[MARGIN] == 0
                checked += 1
                failures += not ok
                print("%-5s %s KV: KL median %.3e (llama.cpp %.3e, %.2fx), max|dlogit| median %.3f "
                      "(llama.cpp %.3f, %.2fx), argmax differs at margin >= 0.2: %d (llama.cpp %d), "
                      ">= %.1f: %d  %s" % (name, kv, kl, p["kl_median"], kl / p["kl_median"], mx,
                                           p["max_abs_median"], mx / p["max_abs_median"], bad[0.2],
                                           p["argmax_differs_margin_0.2"], MARGIN, bad[MARGIN],
                                           "ok" if ok else "FAIL"))
    if not checked:
        print("SKIP: neither SmolLM2 nor Gemma 3 is here (make fetch-models)")
        sys.exit(77)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
