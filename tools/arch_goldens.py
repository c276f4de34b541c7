#!/usr/bin/env python3
"""arch_goldens.py - makes tests/data/arch-goldens.json: llama.cpp's greedy
continuations of the synthetic models of tools/gguf_synth.py, one per
architecture llmd runs beyond Llama (and Llama's RoPE scalings).

  tools/arch_goldens.py [--peer PEER_GOLDEN] [--models DIR] [--work DIR] [--out FILE]

For each case: gguf_synth.py writes the model (from SmolLM2-135M-Instruct's
or Gemma 3 270M's tokenizer, both in models/), peer-golden (tools/
peer_golden.c, built by tools/peer-cpu-build) decodes the case's prompts
greedily, 32 tokens, f32 KV cache, no flash attention, 2 threads, and the
case is recorded with the exact gguf_synth.py arguments and the sha256 of the
file they make (CI regenerates the file and checks the hash before it tests).
Not run by CI: it needs the llama.cpp build.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = "gemma-3-270m-q4_k_m.gguf"

PROMPT_TEXT = "The quick brown fox jumps over the lazy dog. It's 2024, and we'll see 12345 apples!"
PROMPT_CODE = 'int main(void) {\n    printf("%d\\n", 42);\n    return 0;\n}\n'
PROMPTS = {
    SMOL: [PROMPT_TEXT, PROMPT_CODE,
           "<|im_start|>user\nWhat's the capital of Italy?  Caf\u00e9, na\u00efve \u2014 \u65e5\u672c\u8a9e\t\ttabs"
           "<|im_end|>\n<|im_start|>assistant\n"],
    GEMMA: [PROMPT_TEXT, PROMPT_CODE,
            "<start_of_turn>user\nWhat's the capital of Italy?  Caf\u00e9, na\u00efve \u2014 \u65e5\u672c\u8a9e\t\ttabs"
            "<end_of_turn>\n<start_of_turn>model\n"],
}

# name, source, gguf_synth.py arguments after SRC DST (seeds: the first of
# 1..6 whose three prompts keep every llama.cpp margin above 0.01 for the 32
# tokens, in f32 and f16)
CASES = [
    ("llama3-f32", SMOL, ["--arch", "llama3", "--recipe", "f32", "--seed", "4"]),
    ("llama3-f16", SMOL, ["--arch", "llama3", "--recipe", "f16", "--seed", "4"]),
    ("qwen2-f32", SMOL, ["--arch", "qwen2", "--recipe", "f32", "--seed", "5"]),
    ("qwen3-f32", SMOL, ["--arch", "qwen3", "--recipe", "f32", "--seed", "1"]),
    ("phi3-f32", SMOL, ["--arch", "phi3", "--recipe", "f32", "--seed", "4"]),
    ("gemma3-f32", GEMMA, ["--arch", "gemma3", "--recipe", "f32", "--seed", "1"]),
    ("gemma3-f16", GEMMA, ["--arch", "gemma3", "--recipe", "f16", "--seed", "1"]),
    ("llama-linear-f32", SMOL, ["--arch", "llama", "--recipe", "f32", "--rope-scaling", "linear:2",
                                "--seed", "1"]),
    ("llama-yarn-f32", SMOL, ["--arch", "llama", "--recipe", "f32", "--rope-scaling", "yarn:4:256",
                              "--seed", "1"]),
    # Phi-3 128k's long factors (its context 4096 past the original 64)
    ("phi3-longrope-f32", SMOL, ["--arch", "phi3", "--recipe", "f32", "--phi3-longrope", "64", "--seed", "4"]),
]
# llama.cpp's context for a case (peer-golden -c; default: the prompt and its
# tokens): Phi-3's factors depend on it
PEER_CTX = {"phi3-longrope-f32": 4096}
# cases tools/ref_f64.py does not model (no float64 check)
NO_REF = {"phi3-longrope-f32"}

N_PREDICT = 32


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def against_ref(path, results):
    """llama.cpp's choices against tools/ref_f64.py's float64 logits on the same
    tokens (teacher-forced): how many argmaxes agree, the largest and median
    |llama.cpp margin - float64 margin|, and where they disagree"""
    import numpy as np
    sys.path.insert(0, HERE)
    import ref_f64
    m = ref_f64.RefModel(path, check_against_gguf=False)
    same, n, diffs, where = 0, 0, [], []
    for pi, r in enumerate(results):
        lg = m.forward(r["prompt_ids"] + r["generated_ids"][:-1], n_out=len(r["generated_ids"]))
        top = np.sort(lg, axis=1)
        margins = top[:, -1] - top[:, -2]
        for s, (want, lm) in enumerate(zip(r["generated_ids"], r["margins"])):
            n += 1
            if int(np.argmax(lg[s])) == want:
                same += 1
            else:
                where.append([pi, s])
            diffs.append(abs(float(margins[s]) - lm))
    return {"same_argmax": f"{same}/{n}", "disagree_at": where,
            "max_margin_diff": round(max(diffs), 6), "median_margin_diff": round(float(np.median(diffs)), 6)}


def dump(o, ind=0):
    """JSON with objects one key a line and lists of numbers on one line"""
    pad = " " * (ind + 1)
    if isinstance(o, dict):
        items = [f"{pad}{json.dumps(k)}: {dump(v, ind + 1)}" for k, v in o.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * ind + "}"
    if isinstance(o, list) and any(isinstance(x, (dict, list)) for x in o):
        return "[\n" + ",\n".join(pad + dump(x, ind + 1) for x in o) + "\n" + " " * ind + "]"
    return json.dumps(o, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", default=os.path.join(ROOT, "..", "peer-build", "build-cpu", "bin", "peer-golden"))
    ap.add_argument("--models", default=os.path.join(ROOT, "models"))
    ap.add_argument("--work", default=os.path.join(ROOT, "..", "peer-build", "synth"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "arch-goldens.json"))
    ap.add_argument("--no-ref", action="store_true", help="skip the float64 reference (numpy, gguf)")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    version = open(os.path.join(os.path.dirname(a.peer), "version")).read().splitlines()[0] \
        if os.path.exists(os.path.join(os.path.dirname(a.peer), "version")) else "llama.cpp"
    sources = {s: sha256(os.path.join(a.models, s)) for s in (SMOL, GEMMA)}
    cases = []
    for name, src, args in CASES:
        dst = os.path.join(a.work, name + ".gguf")
        subprocess.run([sys.executable, os.path.join(HERE, "gguf_synth.py"), os.path.join(a.models, src), dst]
                       + args, check=True, stdout=subprocess.DEVNULL)
        cmd = [a.peer, "-m", dst, "-n", str(N_PREDICT), "--kv", "f32", "-t", "2", "--model-name", name + ".gguf"]
        if name in PEER_CTX:
            cmd += ["-c", str(PEER_CTX[name])]
        for p in PROMPTS[src]:
            cmd += ["-p", p]
        res = json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE).stdout)
        results = [{k: r[k] for k in ("prompt", "prompt_ids", "generated_ids", "margins", "safe_horizon")}
                   for r in res]
        cases.append({
            "name": name,
            "arch": args[args.index("--arch") + 1],
            "recipe": args[args.index("--recipe") + 1],
            "source_model": src,
            "source_sha256": sources[src],
            "gguf_synth": ["tools/gguf_synth.py", src, name + ".gguf"] + args,
            "sha256": sha256(dst),
            "bytes": os.path.getsize(dst),
            "n_predict": N_PREDICT,
            "kv": "f32",
            "results": results,
        })
        if name in PEER_CTX:
            cases[-1]["n_ctx"] = PEER_CTX[name]
        if not a.no_ref and name not in NO_REF:
            cases[-1]["ref_f64"] = against_ref(dst, results)
        print(f"{name}: {cases[-1]['sha256']}, safe horizons {[r['safe_horizon'] for r in results]}, "
              f"{cases[-1].get('ref_f64')}", file=sys.stderr)
    doc = {
        "about": "llama.cpp's greedy ids for tools/gguf_synth.py's synthetic models of each architecture "
                 "(random weights; only the tokenizer comes from the source model, which may be a "
                 "gguf_synth.py --head copy). Regenerate a case's model with its gguf_synth arguments "
                 "(SRC DST = the source model, any output path) and check its sha256; then the engine's "
                 "prompt ids must equal prompt_ids and its greedy ids must equal generated_ids up to "
                 "safe_horizon (the first step whose llama.cpp top-2 logit margin is below 0.01). "
                 "ref_f64: llama.cpp against tools/ref_f64.py's float64 logits on the same tokens "
                 "(disagree_at: [prompt, step]; the margin differences are llama.cpp's own rounding: f16 "
                 "activations in F16 matmuls, its fp16-table GELU). "
                 "Made by: tools/arch_goldens.py (tools/peer-cpu-build first).",
        "source": f"{version}: peer-golden (tools/peer_golden.c), CPU, greedy, {N_PREDICT} tokens, "
                  "f32 KV cache, no flash attention, 2 threads, add_special and parse_special, "
                  "end-of-generation tokens not special",
        "cases": cases,
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(dump(doc) + "\n")
    print(a.out, file=sys.stderr)


if __name__ == "__main__":
    main()
