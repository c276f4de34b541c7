#!/bin/sh
# accuracy.sh - llmd's logits on the quantized real models against a float64
# reference, no worse than llama.cpp's (tests/accuracy.py says how).  Skips
# (77) without python3, numpy and gguf, or the models.
src=${LLMD_SRCDIR:-$(dirname "$0")/..}
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
exec python3 "$src/tests/accuracy.py"
