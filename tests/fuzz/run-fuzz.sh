#!/bin/sh
# run-fuzz.sh - builds one of llmd's libFuzzer targets with ASan and UBSan and
# runs it for SECONDS over a scratch copy of its seed corpus (the seeds in the
# tree are never modified; copy a minimized crash there by hand).
#
#   tests/fuzz/run-fuzz.sh [gguf|frame] [SECONDS] [libFuzzer options...]
#
# Targets: gguf (the default) is the GGUF loader, tests/fuzz_gguf.c over
# tests/corpus/gguf; frame is the wire protocol, tests/fuzz_frame.c over
# tests/corpus/frame.
# Environment: CC (default clang), FUZZ_DIR (scratch dir, default a new
# mktemp -d; kept afterwards so the grown corpus and crashes can be read).
set -eu

target=gguf
case ${1:-} in
gguf|frame) target=$1; shift ;;
esac
secs=${1:-60}
[ $# -gt 0 ] && shift
src=$(cd "$(dirname "$0")/../.." && pwd)
cc=${CC:-clang}
dir=${FUZZ_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/llmd-fuzz-$target.XXXXXX")}
mkdir -p "$dir/corpus" "$dir/crashes"

# The target's code under test, and where its header lives.
case $target in
gguf) inc=$src/daemon/engine; lib=$src/daemon/engine/gguf.c ;;
frame) inc=$src/libipc; lib=$src/libipc/proto.c ;;
esac
"$cc" -std=gnu11 -D_GNU_SOURCE -g -O1 \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	-I"$inc" -I"$src/libipc" "$lib" "$src/tests/fuzz_$target.c" -o "$dir/fuzz_$target"

cp "$src"/tests/corpus/"$target"/* "$dir/corpus/"

# Tokens libFuzzer may splice in.
if [ "$target" = gguf ]; then
	# The magic, versions, type ids, common keys.
	cat > "$dir/fuzz.dict" <<'EOF'
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
else
	# Frame types with their zero reserved half-word, PROTO_MAX_PAYLOAD,
	# floats at the edges of SUBMIT's ranges (1, NaN, inf, -1), all ones.
	cat > "$dir/fuzz.dict" <<'EOF'
"\x01\x00\x00\x00"
"\x02\x00\x00\x00"
"\x03\x00\x00\x00"
"\x04\x00\x00\x00"
"\x05\x00\x00\x00"
"\x81\x00\x00\x00"
"\x82\x00\x00\x00"
"\x83\x00\x00\x00"
"\x00\x00\x10\x00"
"\x10\x00\x00\x00"
"\x00\x01\x00\x00"
"\x00\x00\x00\x00\x00\x00\x00\x00"
"\x00\x00\x80\x3f"
"\x00\x00\xc0\x7f"
"\x00\x00\x80\x7f"
"\x00\x00\x80\xbf"
"\xff\xff\xff\xff"
"status"
"chatml"
EOF
fi

echo "run-fuzz: $target, $secs s in $dir" >&2
cd "$dir"
{
	rc=0
	"./fuzz_$target" -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
		-print_final_stats=1 -dict=fuzz.dict -artifact_prefix=crashes/ \
		"$@" corpus 2>&1 || rc=$?
	echo $rc > fuzz.rc
} | tee fuzz.log
rc=$(cat fuzz.rc)
n=$(ls crashes | wc -l)
echo "run-fuzz: $target: exit $rc, corpus $(ls corpus | wc -l) files, $n crash file(s), log $dir/fuzz.log" >&2
[ "$rc" -eq 0 ] && [ "$n" -eq 0 ]
