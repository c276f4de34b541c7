#!/bin/sh
# readme_examples.sh - the README's "Running the daemon" block, run as a new
# user would run it: taken from README.md (not copied here), in a scratch
# folder holding what the examples assume (./llmd, the model under models/,
# a git repository with a change, questions.txt), with the built llm-client
# and llmctl first on PATH.  Two things differ from a terminal, and only
# these: the sockets are the scratch folder's rather than /tmp/llmd.sock and
# /tmp/llmd-http.sock, and
# `llmctl top` (which redraws until interrupted) runs for three seconds.
# Each example must succeed and print what it promises.  Skips (77) without
# SmolLM2 (make fetch-model), git, curl or python3.
set -u
build=${LLMD_BUILDDIR:-$(pwd)}
src=${LLMD_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
smol=${LLMD_SMOLLM2:-$build/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$smol" ] || { echo "SKIP: $smol is absent (make fetch-model)"; exit 77; }
for p in git curl python3; do
	command -v $p >/dev/null || { echo "SKIP: no $p"; exit 77; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/llmd-readme.XXXXXX") || exit 99
pid=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

# The block: the lines between "## Running the daemon"'s first ```sh and
# its closing fence.
awk '/^## Running the daemon/ { s = 1; next }
	s == 1 && /^```sh/ { s = 2; next }
	s == 2 && /^```/ { exit }
	s == 2 { print }' "$src/README.md" > "$tmp/block.sh"
[ -s "$tmp/block.sh" ] || { echo "FAIL: no sh block under '## Running the daemon' in README.md" >&2; exit 1; }
grep -q '/tmp/llmd.sock' "$tmp/block.sh" || {
	echo "FAIL: the README's block no longer uses /tmp/llmd.sock; update this test" >&2
	exit 1
}

mkdir -p "$tmp/work/models" "$tmp/bin" "$tmp/out"
ln -s "$build/llmd" "$tmp/work/llmd"
ln -s "$smol" "$tmp/work/models/SmolLM2-135M-Instruct.Q4_1.gguf"
ln -s "$build/llm-client" "$tmp/bin/llm-client"
printf 'What is 2+2?\nName a color.\n\nWhat is the capital of France?\n' > "$tmp/work/questions.txt"
(
	cd "$tmp/work" && git init -q . && git config user.email t@example.org &&
		git config user.name t && printf 'hello\n' > notes.txt && git add notes.txt &&
		git commit -q -m init && printf 'hello, world\n' > notes.txt
) || { echo "FAIL: could not make the scratch git repository" >&2; exit 1; }
# llmctl top redraws until ^C: three seconds of it (exit 124 from timeout
# is its success here), every other llmctl command as it is
cat > "$tmp/bin/llmctl" <<EOF
#!/bin/sh
if [ "\$1" = top ]; then
	timeout 3 "$build/llmctl" "\$@"
	[ \$? -eq 124 ]
	exit
fi
exec "$build/llmctl" "\$@"
EOF
chmod +x "$tmp/bin/llmctl"

sock=$tmp/llmd.sock
fail=0
n=0
cd "$tmp/work" || exit 99
while IFS= read -r line; do
	line=$(printf '%s' "$line" | sed "s|/tmp/llmd.sock|$sock|g; s|/tmp/llmd-http.sock|$tmp/llmd-http.sock|g")
	case $line in
	"" | "#"*) continue ;;
	*"&") # the daemon, in the background: wait for its socket
		eval "exec ${line%&}" > "$tmp/out/llmd.log" 2>&1 &
		pid=$!
		i=0
		while [ ! -S "$sock" ] && [ $i -lt 100 ] && kill -0 "$pid" 2>/dev/null; do
			sleep 0.1
			i=$((i + 1))
		done
		[ -S "$sock" ] || { echo "FAIL: '$line' made no socket:" >&2; cat "$tmp/out/llmd.log" >&2; exit 1; }
		echo "ok: $line"
		continue
		;;
	export*)
		eval "$line"
		echo "ok: $line"
		continue
		;;
	esac
	n=$((n + 1))
	# as written, with the command's comment, in a shell of its own
	if PATH=$tmp/bin:$PATH LLMD_SOCKET=$sock timeout 120 sh -c "$line" \
		> "$tmp/out/$n.out" 2> "$tmp/out/$n.err" < /dev/null; then
		echo "ok: $line"
	else
		echo "FAIL: '$line' exited $?:" >&2
		tail -n 5 "$tmp/out/$n.err" >&2
		fail=1
	fi
	cp "$tmp/out/$n.out" "$tmp/out/last.out"
	# what each example promises
	case $line in
	*"llm-client \"Once upon a time\""*)
		[ -s "$tmp/out/$n.out" ] || { echo "FAIL: the completion printed nothing" >&2; fail=1; } ;;
	*"git diff | llm-client"*)
		[ -s "$tmp/out/$n.out" ] || { echo "FAIL: the commit message is empty" >&2; fail=1; } ;;
	*"--ids"*)
		# 16 ids, numbers only
		words=$(tr -s ' \n' '\n\n' < "$tmp/out/$n.out" | grep -c .)
		if grep -q '[^0-9 ]' "$tmp/out/$n.out" || [ "$words" -lt 1 ] || [ "$words" -gt 16 ]; then
			echo "FAIL: --ids -n 16 printed:" >&2
			cat "$tmp/out/$n.out" >&2
			fail=1
		fi ;;
	*"--each-line"*)
		# one answer line a question line, blank ones included
		want=$(wc -l < questions.txt)
		got=$(wc -l < "$tmp/out/$n.out")
		[ "$got" -eq "$want" ] || {
			echo "FAIL: --each-line gave $got lines for $want questions:" >&2
			cat "$tmp/out/$n.out" >&2
			fail=1
		} ;;
	*"/v1/chat/completions"*)
		python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
assert d["object"] == "chat.completion" and d["choices"][0]["message"]["content"], d' "$tmp/out/$n.out" ||
			{ echo "FAIL: the HTTP API example printed:" >&2; cat "$tmp/out/$n.out" >&2; fail=1; } ;;
	*"llmctl status"*)
		for want in "llmd_" "model"; do
			grep -q "$want" "$tmp/out/$n.out" || {
				echo "FAIL: '$line' printed no '$want':" >&2
				head -n 40 "$tmp/out/$n.out" >&2
				fail=1
			}
		done ;;
	esac
done < "$tmp/block.sh"
[ $n -ge 5 ] || { echo "FAIL: only $n examples ran from the README's block" >&2; fail=1; }
kill -0 "$pid" 2>/dev/null || { echo "FAIL: llmd died during the examples:" >&2; tail "$tmp/out/llmd.log" >&2; fail=1; }
exit $fail
