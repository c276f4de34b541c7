#!/bin/sh
# http_api.sh - the OpenAI HTTP front through the official openai client and
# raw HTTP (tests/http_api.py says what it checks).  Skips (77) without
# python3, the openai package (setup.sh check installs it into .pydeps) or
# SmolLM2.
src=${LLMD_SRCDIR:-$(dirname "$0")/..}
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
exec python3 "$src/tests/http_api.py"
