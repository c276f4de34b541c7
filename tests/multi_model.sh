#!/bin/sh
# multi_model.sh - several models in one llmd ([models]; tests/multi_model.py
# says what it checks).  Skips (77) without python3 or the small models of
# ../shared/models.
src=${LLMD_SRCDIR:-$(dirname "$0")/..}
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
exec python3 "$src/tests/multi_model.py"
