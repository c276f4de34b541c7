#!/bin/sh
# jinja_compare.sh - every chat template in tests/templates/ rendered by our
# Jinja interpreter and by Python's jinja2, byte for byte
# (tests/jinja_compare.py says how).  Skips (77) without python3 or jinja2
# (apt-get install python3-jinja2).
src=${LLMD_SRCDIR:-$(dirname "$0")/..}
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
exec python3 "$src/tests/jinja_compare.py"
