#!/bin/sh
# emu_nvcc.sh - every .cu file under kernels/cuda compiles with nvcc for
# sm_80 and sm_90 (no GPU needed), with ptxas's register, shared-memory and
# spill report in the log.  Skips (77) when configure found no CUDA toolkit.
srcdir=${LLMD_SRCDIR:-$(dirname "$0")/..}
if [ -z "$NVCC" ] || [ ! -x "$NVCC" ]; then
	echo "emu_nvcc: no nvcc (configure found no CUDA toolkit): skipped"
	exit 77
fi
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
status=0
for cu in "$srcdir"/kernels/cuda/*.cu; do
	for arch in sm_80 sm_90; do
		echo "== $NVCC -arch=$arch -Xptxas -v -c $(basename "$cu")"
		if ! "$NVCC" -arch=$arch -std=c++17 -Xptxas -v -I"$srcdir/kernels/cuda" -I"$srcdir/kernels" \
			-c "$cu" -o "$tmp/out.o" 2>&1; then
			echo "emu_nvcc: $cu does not compile for $arch" >&2
			status=1
		fi
	done
done
exit $status
