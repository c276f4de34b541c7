#!/bin/sh
# spec_draft.sh - speculative decoding with a draft model, end to end:
#  - llm-bench: TinyStories-656K f32 with its q8_0 quantization as the draft
#    gives the ids it gives without (greedy and seeded), most proposals
#    standing (one sequence: a batch of this tiny model is compute-bound,
#    and a draft as costly as the model is not run for it); with a draft of random weights (tools/gguf_synth.py, the
#    same tokenizer: proposals that are garbage) the same ids again; a
#    draft of another vocabulary (stories260K) is refused, naming it;
#  - llmd with spec.mode = draft: llm-client's text is the one without
#    speculation, llmctl stats counts the draft's proposals, and a request
#    for a draft on a daemon without one is refused; spec.mode = draft
#    without spec.draft_model, or a draft of another vocabulary, stops llmd
#    at start with the reason.
# Skips (77) without python3 or ../shared/models.
srcdir=${LLMD_SRCDIR:-$(dirname "$0")/..}
models=${LLMD_MODELS_DIR:-$srcdir/../shared/models}
target=$models/derived/TinyStories-656K-f32.gguf
draft=$models/derived/TinyStories-656K-q8_0.gguf
other=$models/stories260K.gguf
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
for f in "$target" "$draft" "$other" "$models/derived/TinyStories-656K-q4_0.gguf"; do
	[ -f "$f" ] || { echo "SKIP: $f is absent"; exit 77; }
done
tmp=$(mktemp -d) || exit 99
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "spec_draft: $*" >&2; exit 1; }

bench() { # OUT ARGS...: llm-bench's JSON in $tmp/OUT
	out=$1
	shift
	./llm-bench -m "$target" -p "Once upon a time" -n 96 --ignore-eos --json "$@" \
		> "$tmp/$out" 2> "$tmp/$out.err" || { cat "$tmp/$out.err" >&2; fail "llm-bench $* failed"; }
}
field() { # FILE EXPR: a Python expression over the JSON d
	python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$tmp/$1" "$2"
}
ids() { field "$1" 'd["generated_ids"]'; }

for temp in 0 0.8; do
	bench off.json --temp $temp --seed 5
	bench draft.json --temp $temp --seed 5 --speculative draft --draft-model "$draft"
	[ "$(ids off.json)" = "$(ids draft.json)" ] || fail "temperature $temp: the ids differ with the draft"
	echo "temperature $temp: the same ids with the q8_0 draft ($(field draft.json 'd["speculative"]["accepted"]') of $(field draft.json 'd["speculative"]["proposed"]') proposals accepted)"
	[ $temp != 0 ] || [ "$(field draft.json 'd["speculative"]["accepted"] > 0')" = True ] ||
		fail "no greedy proposal of the q8_0 draft stood"
done

# a draft of random weights: garbage proposals, the same output
python3 "$srcdir/tools/gguf_synth.py" --head "$models/derived/TinyStories-656K-q4_0.gguf" "$tmp/head.gguf" || exit 1
python3 "$srcdir/tools/gguf_synth.py" "$tmp/head.gguf" "$tmp/random.gguf" --recipe q4_1 || exit 1
bench off.json --temp 0
bench junk.json --temp 0 --speculative draft --draft-model "$tmp/random.gguf"
[ "$(ids off.json)" = "$(ids junk.json)" ] || fail "the ids differ with a random draft"
[ "$(field junk.json 'd["speculative"]["proposed"] > 0')" = True ] || fail "the random draft proposed nothing"
echo "a random draft: the same ids ($(field junk.json 'd["speculative"]["accepted"]') of $(field junk.json 'd["speculative"]["proposed"]') proposals accepted)"

if ./llm-bench -m "$target" -p "Once" -n 4 --speculative draft --draft-model "$other" > /dev/null 2> "$tmp/err"; then
	fail "a draft of another vocabulary was taken"
fi
grep -q "vocabulary has 512 tokens, the model's 2048" "$tmp/err" || { cat "$tmp/err" >&2; fail "no reason given"; }
echo "a draft of another vocabulary: $(cat "$tmp/err")"

# llmd
start() { # NAME ARGS...: llmd on $tmp/NAME.sock
	name=$1
	shift
	./llmd --socket "$tmp/$name.sock" --model "$target" --threads 2 --set http.socket= "$@" \
		> "$tmp/$name.log" 2>&1 &
	pid=$!
	for _ in $(seq 100); do
		[ -S "$tmp/$name.sock" ] && return 0
		kill -0 $pid 2>/dev/null || { cat "$tmp/$name.log" >&2; fail "llmd $* did not start"; }
		sleep 0.1
	done
	fail "llmd $* made no socket"
}
stop() {
	kill $pid
	wait $pid || fail "llmd did not stop cleanly"
	pid=
}
client() { ./llm-client --socket "$tmp/d.sock" --temp 0 -n 64 --ignore-eos -N "$@" "Once upon a time"; }

start d --set spec.mode=draft --set spec.draft_model="$draft"
# the draft first: its first steps, before the cost model has learned this
# tiny (compute-bound) model's price of a row, propose
b=$(client) && a=$(client --speculative off) && c=$(client --speculative ngram) || fail "llm-client failed"
[ "$a" = "$b" ] && [ "$a" = "$c" ] || fail "llm-client's text differs with the draft: '$a' / '$b' / '$c'"
n=$(./llmctl --socket "$tmp/d.sock" stats --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["llmd_spec_proposed_tokens_total"])')
[ "$n" -gt 0 ] || fail "stats count no proposal"
echo "llmd with a draft: the same text with and without, $n tokens proposed"
stop

start d
if client --speculative draft > /dev/null 2> "$tmp/err"; then
	fail "a draft request was served without a draft model"
fi
grep -q "spec.draft_model" "$tmp/err" || { cat "$tmp/err" >&2; fail "no reason given"; }
echo "a draft request without a draft model: $(cat "$tmp/err")"
stop

for bad in "--set spec.mode=draft" "--set spec.draft_model=$other"; do
	if ./llmd --socket "$tmp/e.sock" --model "$target" --threads 2 --set http.socket= $bad > "$tmp/e.log" 2>&1; then
		fail "llmd $bad started"
	fi
	grep -q "spec.draft_model\|vocabulary" "$tmp/e.log" || { cat "$tmp/e.log" >&2; fail "llmd $bad: no reason"; }
	echo "llmd $bad: $(grep -m1 "vocabulary\|needs" "$tmp/e.log")"
done
echo "spec_draft: ok"
