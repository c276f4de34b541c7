#!/bin/sh
# emu_layout.sh - the kernels/cuda layout rule that lets the emulator
# run the CUDA source (issue 5, item 7): every launch goes through LAUNCH and
# dynamic shared memory through DYN_SHARED, both defined in cuda_compat.h
# only.  Fails on any raw triple chevron or `extern __shared__` elsewhere.
srcdir=${LLMD_SRCDIR:-$(dirname "$0")/..}
dir=$srcdir/kernels/cuda
test -f "$dir/cuda_compat.h" || { echo "emu_layout: no $dir/cuda_compat.h" >&2; exit 99; }

# Prints the offending lines under $1, except in cuda_compat.h itself.
scan() {
	grep -rnE '<<<|extern[[:space:]]+__shared__' "$1" 2>/dev/null | grep -v '/cuda_compat\.h:'
}

# The scan must see a planted violation, or a clean result means nothing.
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
printf 'static __global__ void k(float *x) { extern  __shared__ float s[]; }\nvoid f(float *x) { k<<<1, 32>>>(x); }\n' > "$tmp/bad.cu"
if [ "$(scan "$tmp" | wc -l)" -ne 2 ]; then
	echo "emu_layout: the scan misses planted violations" >&2
	exit 99
fi

bad=$(scan "$dir")
if [ -n "$bad" ]; then
	echo "raw launches or dynamic shared memory outside kernels/cuda/cuda_compat.h" >&2
	echo "(use LAUNCH(kernel, grid, block, smem, stream, ...) and DYN_SHARED(type, name)):" >&2
	echo "$bad" >&2
	exit 1
fi
n=$(find "$dir" -name '*.cu' | wc -l)
echo "emu_layout: $n .cu file(s) under kernels/cuda, no raw <<< or extern __shared__"
exit 0
