#!/usr/bin/env python3
"""http_api.py - llmd's OpenAI-compatible HTTP front, through the official
`openai` Python client and through raw HTTP, against a live llmd on a
temporary Unix socket (SmolLM2-135M-Instruct, greedy where results are
compared).  Run by tests/http_api.sh; exits 77 when SmolLM2, `openai` or
`httpx` is missing.

Checks: chat and completions, streaming and not; stop strings; seeded
sampling repeats; logprobs; usage counts against /tokenize; the error
classes (400 naming the field, 404 model and route, 413, 429 with
Retry-After, 503 draining); greedy text through HTTP equal to llm-client's
through the native protocol, one at a time and 16 at once; hostile input
(broken JSON, wrong types, a 10 MB body, a header flood, a slow body, 500
parallel streams, clients vanishing mid-stream); and that afterwards no
request, KV block or connection is left behind.
"""

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

BUILD = os.environ.get("LLMD_BUILDDIR", os.getcwd())
MODELS = os.environ.get("LLMD_MODELS_DIR", os.path.join(os.environ.get("LLMD_SRCDIR", BUILD), "../shared/models"))
SMOL = os.environ.get("LLMD_SMOLLM2", os.path.join(BUILD, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))

# setup.sh check installs the client into the build tree's .pydeps
sys.path.insert(0, os.path.join(BUILD, ".pydeps"))
try:
    import openai
    try:
        import httpx
    except ImportError:  # newer openai releases ship it as httpx2
        import httpx2 as httpx
except ImportError as e:
    print(f"SKIP: {e} (pip install openai)")
    sys.exit(77)
if not os.path.exists(SMOL):
    print(f"SKIP: {SMOL} is absent (make fetch-model)")
    sys.exit(77)

failures = 0


def json_or_none(text):
    """TEXT parsed as JSON, or None where it is not JSON (a check fails then,
    instead of the whole script)."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def check(ok, what):
    global failures
    if ok:
        print(f"ok: {what}")
    else:
        failures += 1
        print(f"FAIL: {what}", file=sys.stderr)
    return ok


class Llmd:
    """llmd on a temporary socket, with its HTTP front beside it."""

    def __init__(self, tmp, name, *sets, tcp_port=None, key=None, model=SMOL):
        self.sock = os.path.join(tmp, name + ".sock")
        self.http = os.path.join(tmp, name + "-http.sock")
        self.log = open(os.path.join(tmp, name + ".log"), "w+")
        args = [os.path.join(BUILD, "llmd"), "--socket", self.sock, "--model", model, "--threads", "2"]
        for s in sets:
            args += ["--set", s]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(200):
            if os.path.exists(self.http) and os.path.exists(self.sock):
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if not os.path.exists(self.http):
            self.log.seek(0)
            raise SystemExit(f"FAIL: llmd made no HTTP socket:\n{self.log.read()}")
        self.client = openai.OpenAI(
            base_url="http://llmd/v1", api_key="unused", max_retries=0, timeout=120,
            http_client=httpx.Client(transport=httpx.HTTPTransport(uds=self.http), timeout=120))
        if tcp_port:
            self.tcp = openai.OpenAI(base_url=f"http://127.0.0.1:{tcp_port}/v1", api_key=key, max_retries=0,
                                     timeout=120)

    def raw(self, method, path, body=None, headers=None, timeout=60):
        """One request on a fresh connection: (status, headers, body bytes)."""
        t = httpx.HTTPTransport(uds=self.http)
        with httpx.Client(transport=t, timeout=timeout) as c:
            r = c.request(method, "http://llmd" + path, content=body, headers=headers or {})
            return r.status_code, r.headers, r.content

    def llmctl(self, *args):
        return subprocess.run([os.path.join(BUILD, "llmctl"), "--socket", self.sock, *args],
                              capture_output=True, text=True, timeout=30).stdout

    def idle(self, timeout=10):
        """Whether llmd has no request live and no KV block held after a while."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            st = json.loads(self.llmctl("status", "--json"))
            ps = self.llmctl("ps")
            if st["queue"]["running"] == 0 and st["queue"]["waiting"] == 0 and \
                    st["kv"]["used_blocks"] == 0 and "no requests" in ps:
                return True
            time.sleep(0.2)
        print(self.llmctl("status"), self.llmctl("ps"), file=sys.stderr)
        return False

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -1


def native_greedy(d, prompt, n):
    r = subprocess.run([os.path.join(BUILD, "llm-client"), "--socket", d.sock, "--temp", "0", "-n", str(n),
                        "-N", prompt], capture_output=True, text=True, timeout=120)
    return r.stdout


def test_basics(d):
    c = d.client
    models = c.models.list()
    mid = models.data[0].id
    check(len(models.data) == 1 and mid == "SmolLM2-135M-Instruct.Q4_1", f"/v1/models lists {mid}")

    r = c.chat.completions.create(model=mid, messages=[{"role": "system", "content": "You are brief."},
                                                       {"role": "user", "content": "What is 2+2?"}],
                                  max_tokens=16, temperature=0)
    ch = r.choices[0]
    check(r.object == "chat.completion" and ch.message.role == "assistant" and ch.message.content and
          ch.finish_reason in ("stop", "length"), f"chat: {ch.message.content!r} ({ch.finish_reason})")
    check(r.usage.completion_tokens <= 16 and r.usage.prompt_tokens > 10 and
          r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens and
          r.usage.prompt_tokens_details.cached_tokens >= 0, f"chat usage {r.usage}")

    # the same again: the prompt comes from the prefix cache
    r2 = c.chat.completions.create(model=mid, messages=[{"role": "system", "content": "You are brief."},
                                                        {"role": "user", "content": "What is 2+2?"}],
                                   max_tokens=16, temperature=0)
    check(r2.choices[0].message.content == ch.message.content and
          r2.usage.prompt_tokens_details.cached_tokens > 0,
          f"a repeated chat is the same and its prompt cached ({r2.usage.prompt_tokens_details.cached_tokens})")

    # streaming chat: role first, deltas, a finish, usage, [DONE]
    chunks = list(c.chat.completions.create(model=mid, messages=[{"role": "user", "content": "What is 2+2?"}],
                                            max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(k.choices[0].delta.content or "" for k in chunks if k.choices)
    fins = [k.choices[0].finish_reason for k in chunks if k.choices and k.choices[0].finish_reason]
    usage = [k.usage for k in chunks if k.usage]
    plain = c.chat.completions.create(model=mid, messages=[{"role": "user", "content": "What is 2+2?"}],
                                      max_tokens=16, temperature=0)
    check(chunks[0].choices[0].delta.role == "assistant" and text == plain.choices[0].message.content and
          fins == [plain.choices[0].finish_reason] and len(usage) == 1 and
          usage[0].completion_tokens == plain.usage.completion_tokens,
          f"streamed chat equals the plain one ({len(chunks)} chunks)")

    # text parts
    r = c.chat.completions.create(model=mid, messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]}], max_tokens=16, temperature=0)
    check(r.choices[0].message.content == plain.choices[0].message.content, "content as text parts")

    # completions, plain and streamed, against the native protocol
    prompt = "Once upon a time"
    r = c.completions.create(model=mid, prompt=prompt, max_tokens=24, temperature=0)
    native = native_greedy(d, prompt, 24)
    check(r.object == "text_completion" and r.choices[0].text == native,
          f"completion equals llm-client's: {r.choices[0].text!r}")
    st = "".join(k.choices[0].text for k in c.completions.create(model=mid, prompt=prompt, max_tokens=24,
                                                                    temperature=0, stream=True) if k.choices)
    check(st == native, "streamed completion equals llm-client's")
    ntok = len(json.loads(d.raw("POST", "/tokenize", json.dumps({"content": prompt}))[2])["tokens"])
    check(r.usage.prompt_tokens == ntok and r.usage.completion_tokens == 24,
          f"completion usage: {r.usage.prompt_tokens} prompt tokens (/tokenize: {ntok}), 24 generated")

    # stop strings: the text ends before the first stop, finish "stop"
    full = c.completions.create(model=mid, prompt=prompt, max_tokens=40, temperature=0).choices[0].text
    words = full.split()
    stop = " " + words[3] if len(words) > 4 else None
    if check(stop is not None, "a stop word to use"):
        r = c.completions.create(model=mid, prompt=prompt, max_tokens=40, temperature=0, stop=[stop, "zzzq"])
        check(r.choices[0].text == full[:full.index(stop)] and r.choices[0].finish_reason == "stop",
              f"stop {stop!r}: {r.choices[0].text!r}")

    # seeded sampling repeats; another seed (almost surely) differs
    def sample(seed):
        return c.completions.create(model=mid, prompt=prompt, max_tokens=24, temperature=1.0,
                                    seed=seed).choices[0].text
    a, b, e = sample(1234), sample(1234), sample(99)
    check(a == b, "the same seed, the same text")
    check(a != e, "another seed, another text")

    # logprobs: one a generated token, finite, <= 0; the tokens make the text
    r = c.chat.completions.create(model=mid, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                  temperature=0, logprobs=True)
    lp = r.choices[0].logprobs.content
    check(len(lp) == r.usage.completion_tokens and all(x.logprob <= 0 for x in lp) and
          "".join(x.token for x in lp) == r.choices[0].message.content,
          f"chat logprobs: {[(x.token, round(x.logprob, 3)) for x in lp]}")
    # top_logprobs: the alternatives, best first; greedy picks the first
    r = c.chat.completions.create(model=mid, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                  temperature=0, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    ok = len(lp) == r.usage.completion_tokens
    for x in lp:
        alts = x.top_logprobs
        ok = ok and len(alts) == 3 and all(alts[i].logprob >= alts[i + 1].logprob for i in range(2))
        ok = ok and abs(alts[0].logprob - x.logprob) < 1e-4 and alts[0].token == x.token
        ok = ok and all(bytes(a.bytes).decode("utf-8", "replace") == a.token for a in alts)
    check(ok, f"chat top_logprobs=3: {[[(a.token, round(a.logprob, 2)) for a in x.top_logprobs] for x in lp[:2]]}")
    r = c.completions.create(model=mid, prompt=prompt, max_tokens=6, temperature=0, logprobs=2)
    lpc = r.choices[0].logprobs
    check(len(lpc.top_logprobs) == 6 and all(1 <= len(t) <= 2 for t in lpc.top_logprobs) and
          all(abs(max(t.values()) - v) < 1e-4 for t, v in zip(lpc.top_logprobs, lpc.token_logprobs)),
          f"completion logprobs=2: {lpc.top_logprobs[:2]}")
    try:
        c.chat.completions.create(model=mid, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                  top_logprobs=21, logprobs=True)
        check(False, "top_logprobs 21 refused")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "top_logprobs", "top_logprobs 21: 400")
    r = c.completions.create(model=mid, prompt=prompt, max_tokens=8, temperature=0, logprobs=0)
    lpc = r.choices[0].logprobs
    check(len(lpc.tokens) == 8 and len(lpc.token_logprobs) == 8 and "".join(lpc.tokens) == r.choices[0].text
          and lpc.text_offset[0] == 0, "completion logprobs")

    # /tokenize and /detokenize round trip, /health, /metrics
    st, _, body = d.raw("POST", "/tokenize", json.dumps({"content": "Hello, world! é"}))
    toks = json.loads(body)["tokens"]
    st2, _, body2 = d.raw("POST", "/detokenize", json.dumps({"tokens": toks}))
    check(st == 200 and st2 == 200 and json.loads(body2)["content"] == "Hello, world! é",
          f"/tokenize -> {toks} -> /detokenize")
    st, _, body = d.raw("GET", "/health")
    check(st == 200 and json.loads(body)["status"] == "ok", "/health 200 while serving")
    st, hd, body = d.raw("GET", "/metrics")
    text = body.decode()
    count = [ln for ln in text.splitlines() if ln.startswith("llmd_time_to_first_token_seconds_count ")]
    check(st == 200 and "llmd_requests_total" in text and "# TYPE llmd_generated_tokens_total counter" in text
          and "llmd_http_requests_total" in text and "# TYPE llmd_time_per_output_token_seconds histogram" in text
          and 'llmd_queue_wait_seconds_bucket{le="+Inf"}' in text and count and int(count[0].split()[1]) >= 10,
          f"/metrics in Prometheus text, with the latency histograms ({count})")


def test_errors(d):
    c = d.client
    try:
        c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
        check(False, "unknown model refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404 and "model" in str(e), f"unknown model: 404 ({e.body.get('message')})")
    for bad, field in (({"temperature": "hot"}, "temperature"), ({"max_tokens": 0}, "max_tokens"),
                       ({"top_p": 2}, "top_p"), ({"n": 2}, "n"), ({"stop": [1]}, "stop"),
                       ({"max_tokens": 10 ** 9}, "max_tokens")):
        try:
            c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1",
                                      messages=[{"role": "user", "content": "x"}], **bad)
            check(False, f"{bad} refused")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and e.body.get("param") == field,
                  f"{bad}: 400 naming {field} ({e.body.get('message')})")
    try:
        c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=[{"role": "robot", "content": "x"}])
        check(False, "role robot refused")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "messages", "an unknown role: 400 naming messages")
    try:
        c.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="x" * 300000, max_tokens=1)
        check(False, "an oversize prompt refused")
    except openai.APIStatusError as e:
        check(e.status_code == 413 and "limits.prompt_bytes" in e.body.get("message", ""),
              f"a 300 KB prompt: 413 ({e.body.get('message')})")
    st, _, body = d.raw("GET", "/v1/nothing")
    check(st == 404 and json.loads(body)["error"]["type"] == "not_found_error", "unknown route: 404")
    st, hd, _ = d.raw("GET", "/v1/completions")
    check(st == 405 and hd.get("allow") == "POST", "GET on a POST route: 405 with Allow")
    for body, what in ((b"{not json", "broken JSON"), (b"[1,2]", "a JSON list"), (b"", "an empty body"),
                       (b'{"prompt": "x"} trailing', "JSON with trailing bytes"),
                       (b'{"prompt": ' + b"[" * 100 + b"]" * 100 + b"}", "JSON nested 100 deep")):
        st, _, rb = d.raw("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        check(st == 400 and "error" in json.loads(rb), f"{what}: 400")
    # 10 MB body: refused whole (413), llmd still answers
    st, _, _ = d.raw("POST", "/v1/completions", b'{"prompt": "' + b"a" * (10 << 20) + b'"}')
    check(st == 413, f"a 10 MB body: {st}")
    # a header flood: refused, llmd still answers
    st, _, _ = d.raw("GET", "/health", headers={f"X-Flood-{i}": "y" * 100 for i in range(400)})
    check(st in (400, 413, 431), f"40 KB of headers: {st}")
    check(d.raw("GET", "/health")[0] == 200, "still healthy after the floods")


def test_structured(d):
    """response_format (json_object, json_schema strict and not) and
    llama-server's grammar: outputs that parse and fit; bad ones: 400 naming
    the place; llm-client --json-schema / --grammar / --format json too."""
    c = d.client
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                               "population": {"type": "integer", "minimum": 0},
                                               "coastal": {"type": "boolean"}},
              "required": ["city", "population", "coastal"], "additionalProperties": False}
    msgs = [{"role": "user", "content": "Describe Lisbon."}]
    for seed in range(4):
        r = c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=msgs, max_tokens=120,
                                      temperature=1.0, seed=seed,
                                      response_format={"type": "json_schema",
                                                       "json_schema": {"name": "city", "strict": True,
                                                                       "schema": schema}})
        text = r.choices[0].message.content
        try:
            v = json.loads(text)
            ok = (r.choices[0].finish_reason == "stop" and set(v) == {"city", "population", "coastal"} and
                  isinstance(v["population"], int) and v["population"] >= 0 and isinstance(v["coastal"], bool))
        except ValueError:
            ok = False
        check(ok, f"json_schema strict, seed {seed}: {text!r}")
    r = c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=msgs, max_tokens=150,
                                  temperature=0, response_format={"type": "json_object"})
    text = r.choices[0].message.content
    try:
        ok = r.choices[0].finish_reason != "stop" or isinstance(json.loads(text), dict)
    except ValueError:
        ok = False
    check(ok, f"json_object: an object ({r.choices[0].finish_reason}) {text[:80]!r}")
    r = c.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="Is water wet? Answer:", max_tokens=5,
                             temperature=1.0, extra_body={"grammar": 'root ::= " yes" | " no"'})
    check(r.choices[0].text in (" yes", " no") and r.choices[0].finish_reason == "stop",
          f"grammar: {r.choices[0].text!r}")
    # streaming under a schema: the chunks make the same JSON
    st = c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=msgs, max_tokens=120, seed=3,
                                   stream=True, response_format={"type": "json_schema",
                                                                 "json_schema": {"name": "city", "schema": schema}})
    text = "".join(ch.choices[0].delta.content or "" for ch in st if ch.choices)
    try:
        json.loads(text)
        ok = True
    except ValueError:
        ok = False
    check(ok, f"a streamed json_schema answer parses: {text!r}")
    # refusals: 400 with what and where
    for rf, says in (({"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}, "not at #"),
                     ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "stringy"}}},
                      "unknown type"),
                     ({"type": "xml"}, "response_format.type"),
                     ({"type": "json_schema"}, "json_schema must be an object")):
        try:
            c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=msgs, max_tokens=5,
                                      response_format=rf)
            check(False, f"{rf} refused")
        except openai.BadRequestError as e:
            check(says in e.body.get("message", ""), f"{rf}: 400 ({e.body.get('message')})")
    try:
        c.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="x", max_tokens=5,
                             extra_body={"grammar": 'root ::= "a" | b'})
        check(False, "an undefined rule refused")
    except openai.BadRequestError as e:
        check("line 1, column 16" in e.body.get("message", ""), f"a bad grammar: 400 ({e.body.get('message')})")
    # a grammar that cannot end within max_tokens: length, and the usage
    r = c.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="Count:", max_tokens=6,
                             extra_body={"grammar": 'root ::= ("ab" [0-9]){50}'})
    check(r.choices[0].finish_reason == "length", f"an unreachable end: length ({r.choices[0].text!r})")
    # the native client
    sf = os.path.join(os.path.dirname(d.sock), "city.json")
    with open(sf, "w") as f:
        json.dump(schema, f)
    rc, out, err = client("--socket", d.sock, "--chat", "--json-schema", sf, "--strict", "--seed", "5", "-N", "Describe Porto.")
    try:
        v = json.loads(out)
        ok = rc == 0 and set(v) == {"city", "population", "coastal"}
    except ValueError:
        ok = False
    check(ok, f"llm-client --json-schema --strict: {out!r} {err.strip()}")
    gf = os.path.join(os.path.dirname(d.sock), "yn.gbnf")
    with open(gf, "w") as f:
        f.write('root ::= "yes" | "no"\n')
    rc, out, err = client("--socket", d.sock, "--chat", "--grammar", gf, "-N", "Is the sea salty?")
    check(rc == 0 and out in ("yes", "no"), f"llm-client --grammar: {out!r}")
    rc, out, err = client("--socket", d.sock, "--chat", "--format", "json", "-n", "200", "Give me a JSON object about cats.")
    check(rc == 0 and out.lstrip().startswith("{"), f"llm-client --format json: {out[:60]!r}")
    with open(gf, "w") as f:
        f.write('root ::= [a-\n')
    rc, out, err = client("--socket", d.sock, "--grammar", gf, "x")
    check(rc == 1 and "grammar: line 1" in err, f"llm-client, a bad grammar: {err.strip()}")


def test_line_separators(d):
    """U+2028, U+2029 and U+0085 in the output come as \\u escapes: JSON
    allows them raw, but httpx's iter_lines and str.splitlines end a line
    there, cutting an event or an NDJSON line in two (it happened to a story
    sampled in the 500-stream test)."""
    want = "a\u2028b\u2029c\x85d"
    g = 'root ::= "a\\u2028b\\u2029c\\u0085d"'
    body = {"prompt": "Say:", "max_tokens": 12, "temperature": 0, "grammar": g}
    st, _, raw = d.raw("POST", "/v1/completions", json.dumps(body))
    text = raw.decode() if st == 200 else ""
    check(st == 200 and len(text.splitlines()) == 1 and "\\u2028" in text and
          json.loads(text)["choices"][0]["text"] == want, f"a JSON body keeps to one line: {text!r}")
    got = ""
    with httpx.Client(transport=httpx.HTTPTransport(uds=d.http), timeout=120) as c:
        with c.stream("POST", "http://llmd/v1/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    got += json_or_none(line[6:])["choices"][0]["text"] if json_or_none(line[6:]) else "<cut>"
    check(got == want, f"streamed through httpx's iter_lines: {got!r}")
    gf = os.path.join(os.path.dirname(d.sock), "seps.gbnf")
    with open(gf, "w") as f:
        f.write(g + "\n")
    rc, out, err = client("--socket", d.sock, "--json", "--grammar", gf, "Say:")
    ev = [json_or_none(x) for x in out.splitlines()]
    check(rc == 0 and all(ev) and "".join(e.get("text", "") for e in ev) == want,
          f"llm-client --json keeps each event to one line: {out!r} {err.strip()}")


def test_tools(d):
    """tools through the openai client on SmolLM2 (its template knows no
    tools: the generic JSON syntax): a named tool_choice gives a valid call
    every time, streamed too; the weather round trip; refusals."""
    c = d.client
    model = "SmolLM2-135M-Instruct.Q4_1"
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                        "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]}}},
             {"type": "function", "function": {"name": "get_time", "description": "The time in a timezone",
                                               "parameters": {"type": "object",
                                                              "properties": {"tz": {"type": "string"}},
                                                              "required": ["tz"]}}}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    good = 0
    for seed in range(6):
        r = c.chat.completions.create(model=model, messages=msgs, tools=tools, tool_choice=named, max_tokens=80,
                                      temperature=1.0, seed=seed)
        ch = r.choices[0]
        calls = ch.message.tool_calls or []
        try:
            args = json.loads(calls[0].function.arguments)
            ok = (ch.finish_reason == "tool_calls" and len(calls) == 1 and calls[0].function.name == "get_weather"
                  and calls[0].id.startswith("call_") and calls[0].type == "function"
                  and isinstance(args.get("city"), str) and set(args) <= {"city", "unit"})
        except (ValueError, IndexError):
            ok = False
        good += ok
        if not ok:
            print(f"  seed {seed}: {ch.finish_reason} {ch.message}")
    check(good == 6, f"tool_choice named: a valid get_weather call {good}/6 times")
    r = c.chat.completions.create(model=model, messages=msgs, tools=tools, tool_choice="required",
                                  parallel_tool_calls=False, max_tokens=80, temperature=0)
    calls = r.choices[0].message.tool_calls or []
    check(r.choices[0].finish_reason == "tool_calls" and len(calls) == 1 and
          calls[0].function.name in ("get_weather", "get_time"),
          f"tool_choice required, no parallel calls: one call ({calls[0].function if calls else None})")
    # the round trip: the call, its result, the answer
    call = c.chat.completions.create(model=model, messages=msgs, tools=tools, tool_choice=named, max_tokens=80,
                                     temperature=0).choices[0].message.tool_calls[0]
    msgs2 = msgs + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                    {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 18, "sky": "cloudy"})}]
    r = c.chat.completions.create(model=model, messages=msgs2, tools=tools, tool_choice="none", max_tokens=80,
                                  temperature=0)
    ch = r.choices[0]
    check(ch.finish_reason in ("stop", "length") and not ch.message.tool_calls and ch.message.content,
          f"round trip: the tool's result answered in text: {ch.message.content!r}")
    # streamed: the call comes as tool_calls deltas, no text
    st = c.chat.completions.create(model=model, messages=msgs, tools=tools, tool_choice=named, max_tokens=80,
                                   temperature=0, stream=True)
    text, deltas, finish = "", [], None
    for chunk in st:
        if not chunk.choices:
            continue
        dl = chunk.choices[0].delta
        text += dl.content or ""
        deltas += dl.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    check(finish == "tool_calls" and text == "" and len(deltas) == 1 and deltas[0].index == 0 and
          deltas[0].function.name == "get_weather" and
          json_or_none(deltas[0].function.arguments) == json_or_none(call.function.arguments) is not None,
          f"streamed named call: {deltas[0].function if deltas else None}, text {text!r}")
    # auto: free text or a call, whichever the model writes; never an error
    r = c.chat.completions.create(model=model, messages=msgs, tools=tools, max_tokens=40, temperature=0)
    check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"tool_choice auto: {r.choices[0].finish_reason}")
    for kw, param, what in (({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                             "tool_choice", "an unknown function"),
                            ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools",
                             "a bad function name"),
                            ({"tool_choice": "required"}, "tool_choice", "tool_choice without tools"),
                            ({"tools": tools, "tool_choice": "required", "response_format": {"type": "json_object"}},
                             "tool_choice", "a forced call with response_format"),
                            ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
                                "type": "object", "properties": {"a": {"not": {}}}}}}], "tool_choice": "required"},
                             "tools", "a schema that cannot be enforced")):
        try:
            c.chat.completions.create(model=model, messages=msgs, max_tokens=5, **kw)
            check(False, f"{what} refused")
        except openai.BadRequestError as e:
            check(e.body.get("param") == param, f"{what}: 400 naming {param} ({e.body.get('message')})")


def test_limits(tmp):
    """429 with Retry-After when the queue is full; 503 while draining."""
    # (a short http.timeout_s here only: on a loaded machine a client may
    # well take seconds to read its stream, and would be cut off)
    d = Llmd(tmp, "tight", "sched.max_seqs=1", "sched.max_queue=1", "http.timeout_s=2")
    try:
        slow_body(d, 2)
        def long(i):
            try:
                d.client.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=f"Story {i}:",
                                            max_tokens=64, extra_body={"ignore_eos": True})
                return 200, None
            except openai.RateLimitError as e:
                return 429, e.response.headers.get("retry-after")
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            res = list(ex.map(long, range(6)))
        codes = [r[0] for r in res]
        check(codes.count(200) >= 2 and codes.count(429) >= 1 and all(r[1] for r in res if r[0] == 429),
              f"a full queue: {codes}, 429s with Retry-After")
        check(d.idle(), "the tight llmd is idle afterwards")
        d.llmctl("drain")
        try:
            d.client.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="x", max_tokens=1)
            check(False, "draining refuses")
        except openai.APIStatusError as e:
            check(e.status_code == 503, f"draining: {e.status_code}")
        st, hd, _ = d.raw("GET", "/health")
        check(st == 503 and hd.get("retry-after"), "/health 503 while draining")
    finally:
        d.stop()


def test_speculative(d):
    """Prompt lookup per request (the daemon's spec.mode is off): the same
    text as without it, greedy and seeded; proposals counted in stats; a bad
    mode refused; nothing left held."""
    code = "".join(f"def f{i}(records):\n    total = 0\n    for record in records:\n"
                   f"        total += record[{i}]\n    return total\n\n" for i in range(4))
    msgs = [{"role": "user", "content": code + "Rewrite this code with records renamed to rows."}]
    c, mid = d.client, "SmolLM2-135M-Instruct.Q4_1"

    def stats():
        return json.loads(d.llmctl("stats", "--json"))

    def chat(mode, extra=None, **kw):
        return c.chat.completions.create(model=mid, messages=msgs, max_tokens=120,
                                         extra_body={"speculative": mode, **(extra or {})},
                                         **kw).choices[0].message.content
    before = stats()["llmd_spec_proposed_tokens_total"]
    off, on = chat("off", temperature=0), chat("ngram", temperature=0)
    after = stats()
    check(on == off and len(on) > 40, f"greedy: the same text with speculative ngram ({len(on)} chars)")
    check(after["llmd_spec_proposed_tokens_total"] > before and after["llmd_spec_accepted_tokens_total"] > 0,
          f"stats count {after['llmd_spec_proposed_tokens_total'] - before} proposed tokens, "
          f"{after['llmd_spec_accepted_tokens_total']} accepted")
    a = chat("ngram", temperature=1.0, seed=4321)
    b = chat("off", temperature=1.0, seed=4321)
    check(a == b, "seeded sampling: the same text with and without speculation")
    # llama-server's speculative.n_max bounds the proposals of a verifying step
    for n_max in (1, 16):
        s0 = stats()
        t = chat("ngram", {"speculative.n_max": n_max}, temperature=0)
        s1 = stats()
        prop = s1["llmd_spec_proposed_tokens_total"] - s0["llmd_spec_proposed_tokens_total"]
        steps = s1["llmd_spec_verify_steps_total"] - s0["llmd_spec_verify_steps_total"]
        ok = t == off and steps > 0 and (prop <= steps if n_max == 1 else prop > steps)
        check(ok, f"speculative.n_max {n_max}: the same text, {prop} tokens proposed in {steps} verifying steps")
    for bad in (0, 17, "4"):
        try:
            chat("ngram", {"speculative.n_max": bad}, temperature=0)
            check(False, f"speculative.n_max {bad!r} refused")
        except openai.BadRequestError as e:
            check(e.body.get("param") == "speculative.n_max", f"speculative.n_max {bad!r}: 400 "
                  f"({e.body.get('message')})")
    try:
        chat("eagle", temperature=0)
        check(False, "speculative eagle refused")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "speculative", f"speculative eagle: 400 ({e.body.get('message')})")
    prompt = "one two three four five one two three four five one two three"
    rc, out, _ = client("--socket", d.sock, "--temp", "0", "-n", "40", "--speculative", "ngram", "-N", prompt)
    check(rc == 0 and out == native_greedy(d, prompt, 40), f"llm-client --speculative ngram: {out[:50]!r}")
    s0 = stats()
    rc, out, _ = client("--socket", d.sock, "--temp", "0", "-n", "40", "--speculative", "ngram", "--draft-max", "1",
                        "-N", prompt)
    s1 = stats()
    prop = s1["llmd_spec_proposed_tokens_total"] - s0["llmd_spec_proposed_tokens_total"]
    steps = s1["llmd_spec_verify_steps_total"] - s0["llmd_spec_verify_steps_total"]
    check(rc == 0 and out == native_greedy(d, prompt, 40) and 0 < prop <= steps,
          f"llm-client --draft-max 1: the same text, {prop} tokens proposed in {steps} verifying steps")
    rc, _, err = client("--socket", d.sock, "--speculative", "eagle", "x")
    check(rc == 2 and "ngram, draft or off" in err, f"llm-client --speculative eagle: exit 2 ({err.strip()})")
    try:
        chat("draft", temperature=0)
        check(False, "speculative draft without a draft model refused")
    except openai.BadRequestError as e:
        check("spec.draft_model" in e.body.get("message", ""), f"speculative draft without a draft model: 400 "
              f"({e.body.get('message')})")
    check(d.idle(), "nothing held after speculation")


def test_native_equal(d):
    """Greedy text through HTTP equals llm-client's, alone and 16 at once."""
    prompts = ["Once upon a time", "The capital of France is", "def fib(n):", "Tell me a story about a cat.",
               "1, 2, 3, 4,", "In the beginning", "The quick brown fox", "Water boils at"] * 2
    prompts = [p + (" " * (i // 8)) for i, p in enumerate(prompts)]
    native = [native_greedy(d, p, 20) for p in prompts]

    def http(p):
        return d.client.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=p, max_tokens=20,
                                           temperature=0).choices[0].text
    alone = [http(p) for p in prompts]
    check(alone == native, "greedy HTTP equals native, one at a time (16 prompts)")
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        together = list(ex.map(http, prompts))
    bad = [i for i in range(16) if together[i] != native[i]]
    check(not bad, f"greedy HTTP equals native, 16 at once (different: {bad})")


def raw_socket(d):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(d.http)
    return s


def client(*args, stdin=None, env=None):
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([os.path.join(BUILD, "llm-client"), *args], input=stdin, capture_output=True, text=True,
                       timeout=120, env=e)
    return r.returncode, r.stdout, r.stderr


def test_client_url(d):
    """llm-client (libllm) over the HTTP API: what it prints is what it
    prints through the native socket."""
    url = "unix:" + d.http
    for args in (["--temp", "0", "-n", "24", "Once upon a time"], ["--ids", "--temp", "0", "-n", "16", "Hello"],
                 ["-s", "Be brief.", "--temp", "0", "-n", "16", "What is 2+2?"],
                 ["--stop", " of", "--temp", "0", "-n", "40", "Once upon a time"]):
        rn, native, _ = client("--socket", d.sock, *args)
        rh, http, err = client("--url", url, *args)
        check(rn == 0 and rh == 0 and http == native and native.strip(),
              f"llm-client --url {' '.join(args[:-1])}: the same as native {err.strip()}")
    qs = "What is 2+2?\nName a color.\n\nWhat is the capital of France?\n"
    rn, native, _ = client("--socket", d.sock, "--each-line", "--temp", "0", "-n", "12", stdin=qs)
    rh, http, _ = client("--each-line", "--temp", "0", "-n", "12", stdin=qs, env={"LLM_URL": url})
    check(rh == 0 and http == native and len(http.splitlines()) == 4, "--each-line through LLM_URL: the same lines")
    rh, out, err = client("--url", url, "--json", "--temp", "0", "-n", "4", "Hi")
    ev = [json.loads(x) for x in out.splitlines()]
    check(rh == 0 and ev[-1]["event"] == "done" and ev[-1]["usage"]["generated_tokens"] == 4 and
          ev[-1]["usage"]["prompt_tokens"] > 0, "--json over HTTP: the usage")
    rh, _, err = client("--url", url, "-n", "100000", "x")
    check(rh == 1 and "limits.max_tokens" in err, f"a refusal over HTTP: exit 1, {err.strip()}")
    rh, _, err = client("--url", "unix:" + d.http + ".none", "x")
    check(rh == 3 and "cannot use" in err, f"no server: exit 3, {err.strip()}")


def test_bench_url(d):
    """llm-bench --url: the load tool the speed comparisons use."""
    r = subprocess.run([os.path.join(BUILD, "llm-bench"), "--url", "http://llmd/v1", "--unix-socket", d.http,
                        "-p", "Tell me a story.", "-n", "16", "--ignore-eos", "--parallel", "4", "--json"],
                       capture_output=True, text=True, timeout=120)
    try:
        j = json.loads(r.stdout)
    except ValueError:
        j = {}
    check(r.returncode == 0 and j.get("aggregate_tok_s", 0) > 0 and len(j.get("results", [])) == 4 and
          j.get("url") == "http://llmd/v1", f"llm-bench --url, 4 streams: {j.get('aggregate_tok_s')} tok/s "
          f"{r.stderr.strip()}")
    r = subprocess.run([os.path.join(BUILD, "llm-bench"), "--url", "http://llmd/v1", "--unix-socket", d.http,
                        "-p", "x", "-n", "100000"], capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "400" in r.stderr, f"llm-bench --url reports the server's error: {r.stderr.strip()}")
    # the ids over HTTP are the native path's
    args = ["-p", "Tell me a story.", "-n", "12", "--parallel", "2", "--json"]
    rh = subprocess.run([os.path.join(BUILD, "llm-bench"), "--url", "http://llmd/v1", "--unix-socket", d.http, *args],
                        capture_output=True, text=True, timeout=120)
    rn = subprocess.run([os.path.join(BUILD, "llm-bench"), "--socket", d.sock, *args], capture_output=True,
                        text=True, timeout=120)
    ih = [x.get("generated_ids") for x in json.loads(rh.stdout)["results"]] if rh.returncode == 0 else None
    inn = [x.get("generated_ids") for x in json.loads(rn.stdout)["results"]] if rn.returncode == 0 else None
    check(ih is not None and ih == inn and all(ih), "llm-bench --url and --socket: the same ids")


def slow_body(d, timeout_s):
    """A slow body: the connection is closed after http.timeout_s."""
    s = raw_socket(d)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\"")
    t0 = time.time()
    s.settimeout(timeout_s + 10)
    try:
        data = s.recv(4096)
        while data:
            data = s.recv(4096)
    except OSError:
        pass
    took = time.time() - t0
    s.close()
    check(took < timeout_s + 5, f"a slow body is cut off after {took:.1f} s (http.timeout_s={timeout_s})")


def test_hostile(d):
    # slowloris: many connections trickling headers do not stop others
    socks = []
    for _ in range(50):
        s = raw_socket(d)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    t0 = time.time()
    st = d.raw("GET", "/health")[0]
    check(st == 200 and time.time() - t0 < 5, "50 half-sent requests do not delay a /health")
    for s in socks:
        s.close()

    # clients vanishing: mid-stream, mid-answer, before the answer
    def vanish(kind):
        s = raw_socket(d)
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True,
                           "stream": kind == "stream"}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        if kind == "stream":
            s.recv(100)
        else:
            time.sleep(0.5)
        s.close()
    for kind in ("stream", "plain", "stream", "plain"):
        vanish(kind)
    check(d.idle(), "vanished clients leave no request and no KV block")

    # 500 parallel streams (the main llmd lets one user have 1024 requests);
    # half of the clients vanish after their first event
    def stream(i):
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=d.http), timeout=300) as c:
                with c.stream("POST", "http://llmd/v1/completions",
                              json={"prompt": f"Story {i}:", "max_tokens": 12, "stream": True,
                                    "ignore_eos": True}) as r:
                    if r.status_code != 200:
                        return r.status_code
                    fin = None
                    for line in r.iter_lines():
                        if line.startswith("data: {"):
                            if i % 2:
                                return "gone"
                            fin = json.loads(line[6:])["choices"][0]["finish_reason"] or fin
                        if line == "data: [DONE]":
                            return 200 if fin == "length" else f"finish {fin}"
                    return "cut"
        except httpx.HTTPError as e:
            return type(e).__name__
    with concurrent.futures.ThreadPoolExecutor(500) as ex:
        res = list(ex.map(stream, range(500)))
    whole = res[0::2]
    check(all(r == 200 for r in whole) and all(r == "gone" for r in res[1::2]),
          f"500 parallel streams: {sorted(set(map(str, res)))}")
    check(d.idle(60), "after 500 streams: no request and no KV block left")
    conns = json.loads(d.llmctl("stats", "--json"))["llmd_connections"]
    check(conns <= 1, f"no connection left behind ({conns})")


def test_golden_ids(tmp):
    """Greedy ids through HTTP (return_token_ids) equal the native path's and
    llama.cpp's (up to each case's safe horizon) on the golden prompts of
    the F32 model, where arithmetic is exact: one at a time and 16 at once."""
    golden = os.path.join(MODELS, "golden/greedy-llamacpp.json")
    model = os.path.join(MODELS, "derived/TinyStories-656K-f32.gguf")
    if not (os.path.exists(golden) and os.path.exists(model)):
        print(f"skipped: {golden} or {model} is absent")
        return
    cases = [c for c in json.load(open(golden)) if c["model"] == "derived/TinyStories-656K-f32.gguf"]
    d = Llmd(tmp, "golden", model=model)
    try:
        def http_ids(c):
            r = d.raw("POST", "/v1/completions", json.dumps({
                "prompt": c["prompt"], "max_tokens": c["n_predict"], "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}))
            return json.loads(r[2])["choices"][0]["token_ids"] if r[0] == 200 else r
        ok = True
        for c in cases:
            n = subprocess.run([os.path.join(BUILD, "llm-client"), "--socket", d.sock, "--ids", "--temp", "0",
                                "-n", str(c["n_predict"]), "--ignore-eos", c["prompt"]], stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=60).stdout.split()
            native = [int(x) for x in n]
            h = http_ids(c)
            hz = c["safe_horizon"]
            same = h == native and h[:hz] == c["generated_ids"][:hz]
            ok = ok and same
            if not same:
                print(f"  {c['prompt']!r}: http {h[:12]}, native {native[:12]}, golden {c['generated_ids'][:12]}",
                      file=sys.stderr)
        check(ok, f"greedy ids through HTTP = native = llama.cpp's on {len(cases)} golden prompts (F32)")
        batch = (cases * 4)[:16]
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            together = list(ex.map(http_ids, batch))
        alone = {c["prompt"]: http_ids(c) for c in cases}
        check(all(together[i] == alone[batch[i]["prompt"]] for i in range(16)),
              "the same ids 16 at once (batch invariance through HTTP)")
        # streamed: the token_ids of the chunks make the same list
        r = d.raw("POST", "/v1/completions", json.dumps({"prompt": cases[0]["prompt"], "max_tokens":
                                                          cases[0]["n_predict"], "temperature": 0,
                                                          "ignore_eos": True, "stream": True,
                                                          "return_token_ids": True}))
        ids = []
        for line in r[2].decode().splitlines():
            if line.startswith("data: {"):
                ids += json.loads(line[6:])["choices"][0].get("token_ids", [])
        check(ids == alone[cases[0]["prompt"]], "streamed token_ids add up to the same ids")
    finally:
        d.stop()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_tcp(tmp):
    """Loopback TCP: every request needs a key of http.keys_file, and each
    key is its own user for the limits."""
    keys = os.path.join(tmp, "keys")
    with open(keys, "w") as f:
        f.write("# name key\nalice k-alice-0123456789abcdef\nbob k-bob-0123456789abcdef0000\n")
    os.chmod(keys, 0o644)
    port = free_port()
    r = subprocess.run([os.path.join(BUILD, "llmd"), "--socket", os.path.join(tmp, "bad.sock"), "--model", SMOL,
                        "--threads", "2", "--set", f"http.listen={port}", "--set", f"http.keys_file={keys}"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "chmod 600" in r.stderr, "a keys file others can read stops llmd, saying why")
    os.chmod(keys, 0o600)
    d = Llmd(tmp, "tcp", f"http.listen=127.0.0.1:{port}", f"http.keys_file={keys}", "limits.requests_per_uid=1",
             "limits.requests_per_connection=1", tcp_port=port, key="k-alice-0123456789abcdef")
    try:
        r = d.tcp.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="Once upon a time", max_tokens=8,
                                     temperature=0)
        check(r.choices[0].text == native_greedy(d, "Once upon a time", 8), "TCP with alice's key")
        r = httpx.get(f"http://127.0.0.1:{port}/v1/models")
        check(r.status_code == 401 and r.headers.get("www-authenticate") == "Bearer" and
              r.json()["error"]["type"] == "authentication_error", "no key: 401 with WWW-Authenticate")
        for key, what in (("k-alice-0123456789abcdeX", "a wrong key"), ("k-alice-0123456789abcde", "a key's prefix"),
                          ("k-alice-0123456789abcdef0", "a key and more")):
            c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
            try:
                c.models.list()
                check(False, f"{what} refused")
            except openai.AuthenticationError as e:
                check(e.status_code == 401, f"{what}: 401")
        # one live request per key (limits.requests_per_uid=1): alice's
        # second waits out a 429, bob's goes ahead
        bob = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k-bob-0123456789abcdef0000",
                            max_retries=0)
        out = {}

        def long_alice():
            out["a1"] = d.tcp.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="Story:",
                                                 max_tokens=200, extra_body={"ignore_eos": True})
        t = threading.Thread(target=long_alice)
        t.start()
        time.sleep(0.5)
        ps = d.llmctl("ps")
        try:
            d.tcp.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="x", max_tokens=2)
            out["a2"] = 200
        except openai.RateLimitError:
            out["a2"] = 429
        out["b"] = bob.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="x", max_tokens=2)
        t.join()
        check(out["a2"] == 429 and out["b"].usage.completion_tokens == 2 and
              out["a1"].usage.completion_tokens == 200, "limits per key: alice's second 429, bob served")
        check("key:alice" in ps, "llmctl ps names the key")
        url = f"http://127.0.0.1:{port}/v1"
        rc, out, _ = client("--url", url, "--temp", "0", "-n", "8", "Once upon a time",
                            env={"LLM_API_KEY": "k-bob-0123456789abcdef0000"})
        check(rc == 0 and out == native_greedy(d, "Once upon a time", 8) + "\n",
              "llm-client --url over TCP with LLM_API_KEY")
        rc, _, err = client("--url", url, "--api-key", "k-wrong-0123456789abcdef", "x")
        check(rc == 3 and "401" in err, f"llm-client with a wrong key: exit 3, {err.strip()}")
    finally:
        d.stop()


def main():
    with tempfile.TemporaryDirectory(prefix="llmd-http.") as tmp:
        d = Llmd(tmp, "main", "http.max_body_kib=1024", "limits.connections_per_uid=1024",
                 "limits.requests_per_uid=1024")
        try:
            for t in (test_basics, test_errors, test_structured, test_line_separators, test_tools, test_speculative, test_native_equal, test_bench_url, test_client_url):
                t(d)
            test_hostile(d)
            check(d.proc.poll() is None, "llmd is still running")
        finally:
            rc = d.stop()
            check(rc == 0, f"llmd stopped cleanly ({rc})")
        test_limits(tmp)
        test_tcp(tmp)
        test_golden_ids(tmp)
    print(f"http_api: {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
