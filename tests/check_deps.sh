#!/bin/sh
# check_deps.sh - the layering rules (tools/check_deps.py) hold on the source,
# and the checker catches each kind of violation planted in a copy of it.
set -u
src=${LLMD_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
command -v python3 >/dev/null 2>&1 || { echo "no python3" >&2; exit 77; }
fail=0

if ! python3 "$src/tools/check_deps.py" "$src"; then
	echo "FAIL: the source breaks the layering rules (above)" >&2
	fail=1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/llmd-deps.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
# plant FILE LINE EXPECT: a copy of the source folders with LINE added to
# FILE must fail, with EXPECT in the checker's complaint.
plant() {
	rm -rf "$tmp/s"
	mkdir -p "$tmp/s"
	(cd "$src" && find libipc kernels daemon client tools tests -type f \( -name '*.[ch]' \
		-o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) -print | tar -cf - -T -) |
		tar -C "$tmp/s" -xf -
	printf '%s\n' "$2" >> "$tmp/s/$1"
	if python3 "$src/tools/check_deps.py" "$tmp/s" > "$tmp/out" 2>&1; then
		echo "FAIL: '$2' in $1 was not caught" >&2
		fail=1
	elif ! grep -q -- "$3" "$tmp/out"; then
		echo "FAIL: '$2' in $1: expected '$3' in:" >&2
		cat "$tmp/out" >&2
		fail=1
	else
		echo "caught: $1: $2"
	fi
}
plant daemon/engine/gguf.c '#include "server.h"' 'daemon/engine/gguf.c includes daemon/server.h'
plant libipc/ring.c '#include "quant.h"' 'libipc/ring.c includes kernels/quant.h'
plant kernels/cpu_pool.c '#include "worker.h"' 'kernels/cpu_pool.c includes daemon/worker.h'
plant client/llmctl.c '#include "engine.h"' 'client/llmctl.c includes daemon/engine/engine.h'
plant daemon/conn.c '#include "server.h"' 'circle: daemon/conn -> daemon/server -> daemon/conn'
exit $fail
