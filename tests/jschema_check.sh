#!/bin/sh
# jschema_check.sh - random texts of the grammar of every JSON Schema in
# tests/schemas/ must be JSON the schema accepts (tests/jschema_check.py says
# how).  Skips (77) without python3 or its jsonschema
# (apt-get install python3-jsonschema).
src=${LLMD_SRCDIR:-$(dirname "$0")/..}
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
exec python3 "$src/tests/jschema_check.py"
