#!/bin/sh
# structured_check.sh - SmolLM2's outputs under each JSON Schema of
# tests/schemas/ must be JSON the schema accepts (tests/structured_check.py
# says how).  Skips (77) without the model, python3 or its jsonschema.
src=${LLMD_SRCDIR:-$(dirname "$0")/..}
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
exec python3 "$src/tests/structured_check.py" "$@"
