#!/bin/sh
# bench_bandwidth.sh - llm-bench --bandwidth: a positive read bandwidth, the
# bytes of weights a decode token reads equal to the projections' and the
# output matrix's sizes in the GGUF header (read by ../shared/tools'
# gguf_dump.py, not by our loader), and the bound they give.  Skips (77)
# without python3 or ../shared.
srcdir=${LLMD_SRCDIR:-$(dirname "$0")/..}
models=${LLMD_MODELS_DIR:-$srcdir/../shared/models}
dump=$srcdir/../shared/tools/gguf_dump.py
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
for f in stories260K.gguf derived/TinyStories-656K-q4_0.gguf; do
	m=$models/$f
	[ -f "$m" ] && [ -f "$dump" ] || { echo "SKIP: $m or $dump is absent"; exit 77; }
	./llm-bench --bandwidth --threads 2 --model "$m" --json > "$tmp/bw.json" ||
		{ echo "bench_bandwidth: llm-bench --bandwidth failed on $m" >&2; exit 1; }
	python3 "$dump" --json "$m" > "$tmp/dump.json" || { echo "bench_bandwidth: gguf_dump failed on $m" >&2; exit 1; }
	python3 - "$tmp/bw.json" "$tmp/dump.json" <<'PY' || exit 1
import json, re, sys
bw = json.load(open(sys.argv[1]))
tensors = {t["name"]: t["nbytes"] for t in json.load(open(sys.argv[2]))["tensors"]}
proj = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight$")
want = sum(n for name, n in tensors.items() if proj.match(name))
want += tensors.get("output.weight", tensors["token_embd.weight"])  # tied: the embedding
got = bw["weight_bytes_per_token"]
ok = got == want and bw["read_gb_s"] > 0 and bw["threads"] == 2
ok = ok and abs(bw["decode_bound_tok_s"] - bw["read_gb_s"] * 1e9 / got) <= 1e-6 * bw["decode_bound_tok_s"]
print(f"{bw['model']}: {got} bytes per decode token (header: {want}), {bw['read_gb_s']:.1f} GB/s, "
      f"bound {bw['decode_bound_tok_s']:.0f} tok/s")
sys.exit(0 if ok else 1)
PY
done
# without a model: the bandwidth alone
./llm-bench --bandwidth --threads 1 --json | python3 -c 'import json, sys; d = json.load(sys.stdin); sys.exit(not (d["read_gb_s"] > 0 and "weight_bytes_per_token" not in d))' ||
	{ echo "bench_bandwidth: --bandwidth without a model" >&2; exit 1; }
