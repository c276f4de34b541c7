#!/bin/sh
# gguf_synth.sh - tools/gguf_synth.py writes models the engine loads and
# runs: from TinyStories-656K's header (--head), a Q4_K_M-shaped file of
# another shape (Q4_K and Q6_K weights, separate output) and a Q4_1 one of
# the source's shape, each generating 4 tokens through llm-bench on the CPU
# (the Q4_K_M one also on the emulated CUDA backend, where the build has it,
# with the CPU's tokens, profiled too, and in 17-row decode steps with each
# sequence's one-row logits); a shape whose rows are not whole blocks is refused.  Skips (77) without
# python3 or ../shared/models.
srcdir=${LLMD_SRCDIR:-$(dirname "$0")/..}
models=${LLMD_MODELS_DIR:-$srcdir/../shared/models}
src=$models/derived/TinyStories-656K-q4_0.gguf
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
[ -f "$src" ] || { echo "SKIP: $src is absent"; exit 77; }
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
synth() { python3 "$srcdir/tools/gguf_synth.py" "$@" || exit 1; }
run() { # MODEL [ARGS]: 4 tokens, their ids in $tmp/ids
	m=$1
	shift
	./llm-bench -m "$m" -p "Once upon a time" -n 4 --temp 0 --ignore-eos --json "$@" > "$tmp/out.json" ||
		{ echo "gguf_synth: llm-bench $* failed on $m" >&2; exit 1; }
	python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(d["generated_ids"]); sys.exit(len(d["generated_ids"]) != 4)' \
		"$tmp/out.json" > "$tmp/ids" || { echo "gguf_synth: $m did not give 4 tokens" >&2; exit 1; }
}
synth --head "$src" "$tmp/head.gguf"
[ "$(wc -c < "$tmp/head.gguf")" -lt "$(wc -c < "$src")" ] || { echo "gguf_synth: --head kept data" >&2; exit 1; }
synth "$tmp/head.gguf" "$tmp/kq.gguf" --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 --recipe q4_k_m
run "$tmp/kq.gguf"
# Its first layer mixes Q4_K q, k and a Q6_K v, which share one
# quantization of their input (one matmul call); the emulated CUDA backend,
# where the build has it, runs the three as one launch at one row
# (LLMD_CUDA_MM_MIXED, the default), and with LLMD_CUDA_MM_MIXED=0 q and k
# as one launch and v against the same quantized rows: the same tokens as
# the CPU either way.
if grep -q '^#define HAVE_CUDA_EMU 1' config.h 2>/dev/null; then
	mv "$tmp/ids" "$tmp/ids.cpu"
	run "$tmp/kq.gguf" --backend cuda
	cmp -s "$tmp/ids" "$tmp/ids.cpu" ||
		{ echo "gguf_synth: cuda $(cat "$tmp/ids"), cpu $(cat "$tmp/ids.cpu")" >&2; exit 1; }
	# LLMD_CUDA_PROFILE times each launch (graphs off): the same tokens,
	# and a table that names the mixed launch (then the Q4_K q+k launch
	# and the Q6_K v).
	profile() { # MIXED KEYS...: the profile with LLMD_CUDA_MM_MIXED=MIXED holds each key
		export LLMD_CUDA_PROFILE=1 LLMD_CUDA_MM_MIXED="$1"
		run "$tmp/kq.gguf" --backend cuda 2> "$tmp/prof"
		unset LLMD_CUDA_PROFILE LLMD_CUDA_MM_MIXED
		cmp -s "$tmp/ids" "$tmp/ids.cpu" ||
			{ echo "gguf_synth: profiled cuda $(cat "$tmp/ids"), cpu $(cat "$tmp/ids.cpu")" >&2; exit 1; }
		shift
		for k in "llmd cuda profile" "cuda_attention_q8 T=1" "$@"; do
			grep -q "$k" "$tmp/prof" ||
				{ cat "$tmp/prof" >&2; echo "gguf_synth: no '$k' in the profile" >&2; exit 1; }
		done
	}
	profile 1 "matmul Q4_K+Q6_K n_in=256 n_out=256+128+128 T=1"
	profile 0 "matmul Q4_K n_in=256 n_out=256+128 T=1" "matmul Q6_K n_in=256 n_out=128 T=1"
	# Those are one-row steps (1 tile of 8 rows a pass).  17-row decode
	# steps take the K-quants' tensor-core kernels with 4 tiles a pass, as
	# do the longer prompts: each sequence's logits must keep the bits of
	# its own one-row steps.
	# (The one-row steps' first layer runs the mixed kernel.)
	./tests/test_cuda_engine --wide "$tmp" kq.gguf 17 ||
		{ echo "gguf_synth: 17-row steps on cuda differ from one-row steps" >&2; exit 1; }
fi
synth "$tmp/head.gguf" "$tmp/q41.gguf" --recipe q4_1
run "$tmp/q41.gguf"
# a shape whose rows are not whole blocks is refused, naming the tensor
if python3 "$srcdir/tools/gguf_synth.py" "$tmp/head.gguf" "$tmp/bad.gguf" --embd 96 --heads 4 --kv-heads 2 \
	--recipe q4_k_m 2> "$tmp/err"; then
	echo "gguf_synth: a 96-wide Q4_K model was written" >&2
	exit 1
fi
grep -q "not whole Q4_K blocks" "$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
echo "gguf_synth: Q4_K_M- and Q4_1-shaped models from TinyStories-656K's header load and generate"
