#!/bin/sh
# run-fuzz.sh - builds the GGUF loader's libFuzzer target with ASan and UBSan
# and runs it for SECONDS over a scratch copy of tests/corpus/gguf (the seeds
# in the tree are never modified; copy a minimized crash there by hand).
#
#   tests/fuzz/run-fuzz.sh [SECONDS] [libFuzzer options...]
#
# Environment: CC (default clang), FUZZ_DIR (scratch dir, default a new
# mktemp -d; kept afterwards so the grown corpus and crashes can be read).
set -eu

secs=${1:-60}
[ $# -gt 0 ] && shift
src=$(cd "$(dirname "$0")/../.." && pwd)
cc=${CC:-clang}
dir=${FUZZ_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/llmd-fuzz-gguf.XXXXXX")}
mkdir -p "$dir/corpus" "$dir/crashes"

"$cc" -std=gnu11 -D_GNU_SOURCE -g -O1 \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	-I"$src/daemon" "$src/daemon/gguf.c" "$src/tests/fuzz_gguf.c" -o "$dir/fuzz_gguf"

cp "$src"/tests/corpus/gguf/* "$dir/corpus/"

# Tokens libFuzzer may splice in: the magic, versions, type ids, common keys.
cat > "$dir/gguf.dict" <<'EOF'
"GGUF"
"\x02\x00\x00\x00"
"\x03\x00\x00\x00"
"\x08\x00\x00\x00"
"\x09\x00\x00\x00"
"\x20\x00\x00\x00\x00\x00\x00\x00"
"\x00\x01\x00\x00\x00\x00\x00\x00"
"\xff\xff\xff\xff\xff\xff\xff\xff"
"general.alignment"
"general.architecture"
"tokenizer.ggml.tokens"
".weight"
EOF

echo "run-fuzz: $secs s in $dir" >&2
cd "$dir"
{
	rc=0
	./fuzz_gguf -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
		-print_final_stats=1 -dict=gguf.dict -artifact_prefix=crashes/ \
		"$@" corpus 2>&1 || rc=$?
	echo $rc > fuzz.rc
} | tee fuzz.log
rc=$(cat fuzz.rc)
n=$(ls crashes | wc -l)
echo "run-fuzz: exit $rc, corpus $(ls corpus | wc -l) files, $n crash file(s), log $dir/fuzz.log" >&2
[ "$rc" -eq 0 ] && [ "$n" -eq 0 ]
