#!/usr/bin/env python3
"""accuracy.py - how far an engine's logits are from a reference's.

  tools/accuracy.py REF ENGINE [--steps K] [--names golden.json] [--json]

REF and ENGINE hold logits of the same token positions: .npy arrays of
shape (n_prompts, n_steps, n_vocab) (ref_f64.py --golden --out, peer-golden
--logits; (n_vocab,) or (n_steps, n_vocab) are taken as one prompt), raw
float32 files (.f32/.bin: reshaped like REF) or text files of one logit a
line (one position).  Step s of a prompt is the position after its prompt and
s generated tokens: both sides must have used the same tokens (run the
reference on the engine's own greedy ids, as ref_f64.py --golden does with
peer-golden's JSON).  Rows that are all zero (a generation that stopped) are
left out.

For each prompt, over its first K steps (all by default): the mean and the
largest KL(ref || engine) = sum p_ref (log p_ref - log p_engine) of the
softmaxes (float64, nats), the largest |logit difference| (max over the
vocabulary and steps), and how many steps have the same argmax; then the
medians over prompts (and the mean and max).  --names takes the prompts'
names from a golden JSON (its "prompt" fields).  Needs numpy.
"""
import argparse
import json
import sys

import numpy as np


def load(path, like=None):
    if path.endswith(".npy"):
        a = np.load(path)
    elif path.endswith(".txt"):
        a = np.loadtxt(path, dtype=np.float64)
    else:
        a = np.fromfile(path, dtype="<f4")
        if like is not None:
            a = a.reshape(like.shape)
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 1:
        a = a[None, None, :]
    elif a.ndim == 2:
        a = a[None, :, :]
    return a


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def figures(ref, eng, steps=None):
    """per prompt: dict(kl_mean, kl_max, max_abs, argmax_same, steps)"""
    if ref.shape[0] != eng.shape[0] or ref.shape[2] != eng.shape[2]:
        sys.exit(f"shapes differ: reference {ref.shape}, engine {eng.shape}")
    k = min(ref.shape[1], eng.shape[1], steps or 1 << 30)
    out = []
    for p in range(ref.shape[0]):
        kls, mx, same, n = [], 0.0, 0, 0
        for s in range(k):
            r, e = ref[p, s], eng[p, s]
            if not np.any(e) or not np.any(r):
                continue
            lr, le = log_softmax(r), log_softmax(e)
            kls.append(float(np.sum(np.exp(lr) * (lr - le))))
            mx = max(mx, float(np.max(np.abs(r - e))))
            same += int(np.argmax(r) == np.argmax(e))
            n += 1
        out.append({"steps": n, "kl_mean": float(np.mean(kls)) if kls else float("nan"),
                    "kl_max": max(kls) if kls else float("nan"), "max_abs": mx, "argmax_same": same})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ref")
    ap.add_argument("engine")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--names")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    ref = load(a.ref)
    eng = load(a.engine, like=ref)
    rows = figures(ref, eng, a.steps)
    names = [f"prompt {i}" for i in range(len(rows))]
    if a.names:
        g = json.load(open(a.names))
        g = g["cases"] if isinstance(g, dict) else g
        names = [repr(c.get("prompt", c.get("name")))[:40] for c in g]
    summary = {}
    for key in ("kl_mean", "kl_max", "max_abs"):
        v = np.array([r[key] for r in rows])
        summary[key] = {"median": float(np.median(v)), "mean": float(np.mean(v)), "max": float(np.max(v))}
    summary["argmax_same"] = f"{sum(r['argmax_same'] for r in rows)}/{sum(r['steps'] for r in rows)}"
    if a.json:
        json.dump({"prompts": [dict(r, name=n) for r, n in zip(rows, names)], "summary": summary}, sys.stdout,
                  indent=1)
        print()
        return
    print(f"{'prompt':42s} {'steps':>5s} {'KL mean':>10s} {'KL max':>10s} {'max|dlogit|':>11s} {'argmax':>6s}")
    for r, n in zip(rows, names):
        print(f"{n:42s} {r['steps']:5d} {r['kl_mean']:10.3e} {r['kl_max']:10.3e} {r['max_abs']:11.4f} "
              f"{r['argmax_same']:3d}/{r['steps']}")
    for what in ("median", "mean", "max"):
        print(f"{what:42s} {'':5s} {summary['kl_mean'][what]:10.3e} {summary['kl_max'][what]:10.3e} "
              f"{summary['max_abs'][what]:11.4f}")
    print(f"same argmax: {summary['argmax_same']} steps")


if __name__ == "__main__":
    main()
