#!/bin/sh
# tests/test_arch.sh - makes the synthetic models tests/data/arch-goldens.json
# names (tools/gguf_synth.py, from SmolLM2's and Gemma 3's tokenizers; kept
# in models/synth/ of the build tree and checked by sha256, so a second run
# makes nothing), then runs tests/test_arch on them and on Gemma 3 itself.
# A source model that is absent leaves its cases out (test_arch says so);
# with neither, the test skips.
set -eu
b=${LLMD_BUILDDIR:-.}
s=${LLMD_SRCDIR:-.}
dir=$b/models/synth
mkdir -p "$dir"
command -v python3 >/dev/null || { echo "SKIP: no python3 to make the synthetic models"; exit 77; }
python3 - "$s/tests/data/arch-goldens.json" "$dir" "$s" "${LLMD_SMOLLM2:-}" "${LLMD_GEMMA3:-}" <<'PY'
import hashlib, json, os, subprocess, sys

golden, out, src, smol, gemma = sys.argv[1:6]
sources = {"SmolLM2-135M-Instruct.Q4_1.gguf": smol, "gemma-3-270m-q4_k_m.gguf": gemma}
for case in json.load(open(golden))["cases"]:
    args = case["gguf_synth"]
    model = sources.get(case["source_model"], "")
    dst = os.path.join(out, args[2])
    if not model or not os.path.exists(model):
        print("%s: no %s, left out" % (case["name"], case["source_model"]))
        continue
    def sha(p):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for blk in iter(lambda: f.read(1 << 20), b""):
                h.update(blk)
        return h.hexdigest()
    if os.path.exists(dst) and sha(dst) == case["sha256"]:
        continue
    subprocess.check_call([sys.executable, os.path.join(src, args[0]), model, dst + ".part"] + args[3:],
                          stdout=subprocess.DEVNULL)
    got = sha(dst + ".part")
    if got != case["sha256"]:
        sys.exit("%s: gguf_synth.py made sha256 %s, the golden says %s" % (case["name"], got, case["sha256"]))
    os.rename(dst + ".part", dst)
    print("%s: made %s" % (case["name"], dst))
PY
LLMD_SYNTH_DIR=$dir exec "$b/tests/test_arch"
