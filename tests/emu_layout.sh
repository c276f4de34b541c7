#!/bin/sh
# emu_layout.sh - the kernels/cuda layout rules that let the emulator
# run the CUDA source (issue 5, item 7): every launch goes through LAUNCH
# (or LAUNCH_PDL) and dynamic shared memory through DYN_SHARED, all defined
# in cuda_compat.h only; and every kernel's body begins with grid_dep_wait() (or
# grid_dep_wait_prefetch(), which prefetches, then waits), so that a launch
# may overlap the kernel before it (LAUNCH_PDL).  Fails on any raw
# triple chevron or `extern __shared__` elsewhere, or a kernel without it.
srcdir=${LLMD_SRCDIR:-$(dirname "$0")/..}
dir=$srcdir/kernels/cuda
test -f "$dir/cuda_compat.h" || { echo "emu_layout: no $dir/cuda_compat.h" >&2; exit 99; }

# Prints the offending lines under $1, except in cuda_compat.h itself.
scan() {
	grep -rnE '<<<|extern[[:space:]]+__shared__' "$1" 2>/dev/null | grep -v '/cuda_compat\.h:'
}

# The kernels (a __global__ definition, its brace on a line of its own, as
# STYLE.md has it) under $1 whose first statement is not grid_dep_wait().
scan_wait() {
	for f in "$1"/*.cu; do
		awk -v f="$f" '
			/^[[:space:]]*(\/\*|\*)/ { next }
			state == 0 && /__global__/ && !/;[[:space:]]*$/ { state = 1; line = FNR; next }
			state == 1 && /^\{$/ { state = 2; next }
			state == 1 && /;[[:space:]]*$/ { state = 0; next }
			state == 2 && NF {
				if ($0 !~ /^\tgrid_dep_wait(_prefetch)?\(/)
					print f ":" line ": a kernel that does not begin with grid_dep_wait()"
				state = 0
			}' "$f"
	done
}

# The scans must see planted violations, or a clean result means nothing.
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
printf 'static __global__ void k(float *x) { extern  __shared__ float s[]; }\nvoid f(float *x) { k<<<1, 32>>>(x); }\n' > "$tmp/bad.cu"
if [ "$(scan "$tmp" | wc -l)" -ne 2 ]; then
	echo "emu_layout: the scan misses planted violations" >&2
	exit 99
fi
printf 'static __global__ void k(float *x,\n\tint n)\n{\n\tx[0] = 1;\n}\n\nstatic __global__ void ok(float *x)\n{\n\tgrid_dep_wait();\n}\n' > "$tmp/bad.cu"
if [ "$(scan_wait "$tmp" | wc -l)" -ne 1 ]; then
	echo "emu_layout: the grid_dep_wait scan misses a planted kernel without it" >&2
	exit 99
fi

bad=$(scan "$dir")
if [ -n "$bad" ]; then
	echo "raw launches or dynamic shared memory outside kernels/cuda/cuda_compat.h" >&2
	echo "(use LAUNCH(kernel, grid, block, smem, stream, ...) and DYN_SHARED(type, name)):" >&2
	echo "$bad" >&2
	exit 1
fi
bad=$(scan_wait "$dir")
if [ -n "$bad" ]; then
	echo "$bad" >&2
	exit 1
fi
n=$(find "$dir" -name '*.cu' | wc -l)
k=$(grep -h '__global__' "$dir"/*.cu | grep -vcE '^[[:space:]]*(/\*|\*)')
echo "emu_layout: $n .cu file(s) under kernels/cuda, no raw <<< or extern __shared__;" \
	"$k kernels, each beginning with grid_dep_wait()"
exit 0
