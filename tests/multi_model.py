#!/usr/bin/env python3
"""multi_model.py - several models in one llmd: [models] NAME = PATH beside
model.path, one engine thread stepping each model in turn.

Checks, with the small real models of ../shared/models (skips, 77, without
them):
  - three models at once (TinyStories-656K F32 as the default, stories260K
    and TinyStories-656K Q8_0 by name): requests to all three at the same
    time, over HTTP ("model") and the native protocol (llm-client --model),
    give each model's own llama.cpp greedy ids (golden/greedy-llamacpp.json,
    up to each case's safe horizon);
  - /v1/models lists the three, the default first; llmctl models shows them
    ready with their requests counted; llmctl stats and /metrics count each
    model's tokens; llmctl ps names each request's model;
  - a model that is not served: HTTP 404 naming those that are, the native
    protocol's "nomodel" error, llm-client's message;
  - loading on demand: a model is loaded by its first request, and a
    request to another model streams on meanwhile; keep-alive unloads an
    idle one; llmctl load / unload (a pinned or default model stays; a busy
    one is unloaded when its requests end, which all finish); the memory
    budget unloads the least recently used idle model to make room, never
    a pinned one, and refuses a load that cannot fit with the numbers; a
    request's own keep-alive (llm-client --keep-alive -1, 0, 1s);
  - priority across models: two busy SmolLM2 models (when present), the
    one with the priority-5 request gets twice the other's steps;
  - the three on the CUDA backend (the emulator, in CI): golden ids;
  - per-model settings: models.NAME.n_ctx, .pool_tokens, .chat_template
    (a chat on a model whose file has no template; a bad one stops llmd);
  - models.NAME.draft_model: a model beside the default speculates with a
    draft of its own (its golden ids, draft steps counted), the default
    without one does not; a draft of another vocabulary stops llmd;
  - a load that fails after start (an engine that cannot be made) fails
    its requests with the loader's message, shows as failed with the
    reason, and is tried again by the next request; the default model
    serves on;
  - bad settings stop llmd before it serves: a name taken twice, a bad
    name, a file that does not load (its name and reason in the log).

    tests/multi_model.py            exit 0, 1 or 77
"""

import concurrent.futures
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

SRC = os.environ.get("LLMD_SRCDIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BUILD = os.environ.get("LLMD_BUILDDIR", os.getcwd())
MODELS = os.environ.get("LLMD_MODELS_DIR", os.path.join(SRC, "..", "shared", "models"))
GOLDEN = os.path.join(MODELS, "golden", "greedy-llamacpp.json")
FILES = {
    "tinystories": "derived/TinyStories-656K-f32.gguf",  # the default model
    "stories260k": "stories260K.gguf",
    "tiny-q8": "derived/TinyStories-656K-q8_0.gguf",
}

failures = 0


def check(ok, what):
    global failures
    if ok:
        print(f"ok: {what}")
    else:
        failures += 1
        print(f"FAIL: {what}", file=sys.stderr)
    return ok


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path, timeout=120):
        super().__init__("llmd", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class Llmd:
    def __init__(self, tmp, name, *args):
        self.sock = os.path.join(tmp, name + ".sock")
        self.http = os.path.join(tmp, name + "-http.sock")
        self.logpath = os.path.join(tmp, name + ".log")
        self.log = open(self.logpath, "w+")
        self.proc = subprocess.Popen([os.path.join(BUILD, "llmd"), "--socket", self.sock, "--threads", "2",
                                      "--set", "kv.pool_mb=16", *args],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(400):
            if (os.path.exists(self.http) and os.path.exists(self.sock)) or self.proc.poll() is not None:
                break
            time.sleep(0.05)

    def serving(self):
        return self.proc.poll() is None and os.path.exists(self.http)

    def text(self):
        self.log.flush()
        with open(self.logpath) as f:
            return f.read()

    def request(self, method, path, body=None):
        c = UnixHTTP(self.http)
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, json.loads(data) if data else None

    def run(self, prog, *args):
        return subprocess.run([os.path.join(BUILD, prog), "--socket", self.sock, *args], capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.returncode


def golden_cases():
    cases = json.load(open(GOLDEN))
    out = []
    for name, f in FILES.items():
        out += [(name, c) for c in cases if c["model"] == f and c["prompt"]]
    return out


def test_serving(tmp):
    paths = {k: os.path.join(MODELS, v) for k, v in FILES.items()}
    d = Llmd(tmp, "three", "--model", paths["tinystories"], "--set", "model.name=tinystories",
             "--set", "models.stories260k=" + paths["stories260k"], "--set", "models.tiny-q8=" + paths["tiny-q8"])
    try:
        if not check(d.serving(), "llmd serves three models"):
            print(d.text(), file=sys.stderr)
            return
        st, body = d.request("GET", "/v1/models")
        ids = [m["id"] for m in body["data"]] if st == 200 else []
        check(ids == ["tinystories", "stories260k", "tiny-q8"] and body["data"][0]["default"] and
              not body["data"][1]["default"], f"/v1/models lists {ids}, the default first")

        def http_ids(name, c, named=True):
            req = {"prompt": c["prompt"], "max_tokens": c["n_predict"], "temperature": 0, "ignore_eos": True,
                   "return_token_ids": True}
            if named:
                req["model"] = name
            st, body = d.request("POST", "/v1/completions", req)
            if st != 200:
                return f"HTTP {st}: {body}"
            check(body["model"] == name, f"the answer names its model: {body['model']}")
            return body["choices"][0]["token_ids"]

        def native_ids(name, c):
            r = d.run("llm-client", "--model", name, "--ids", "--temp", "0", "-n", str(c["n_predict"]),
                      "--ignore-eos", c["prompt"])
            if r.returncode != 0:
                return f"llm-client exit {r.returncode}: {r.stderr.strip()}"
            return [int(x) for x in r.stdout.split()]

        r = d.run("llmctl", "models", "--json")
        states = {m["name"]: m["state"] for m in json.loads(r.stdout)["models"]} if r.returncode == 0 else {}
        check(states == {"tinystories": "ready", "stories260k": "unloaded", "tiny-q8": "unloaded"},
              f"only the default model is loaded at start: {states}")
        cases = golden_cases()
        # every case of every model at once, both protocols: 2 x 12 requests in flight
        with concurrent.futures.ThreadPoolExecutor(max_workers=24) as ex:
            fh = [ex.submit(http_ids, n, c) for n, c in cases]
            fn = [ex.submit(native_ids, n, c) for n, c in cases]
            got = [(f.result(), g.result()) for f, g in zip(fh, fn)]
        for (name, c), (h, n) in zip(cases, got):
            hz = c["safe_horizon"]
            want = c["generated_ids"][:hz]
            check(isinstance(h, list) and h[:hz] == want, f"{name} {c['prompt']!r} over HTTP: golden ids "
                  f"up to {hz}" + ("" if isinstance(h, list) and h[:hz] == want else f": {str(h)[:200]}"))
            check(isinstance(n, list) and n[:hz] == want, f"{name} {c['prompt']!r} natively: golden ids "
                  f"up to {hz}" + ("" if isinstance(n, list) and n[:hz] == want else f": {str(n)[:200]}"))
        # no model named: the default one
        c = [c for n, c in cases if n == "tinystories"][0]
        h = http_ids("tinystories", c, named=False)
        check(isinstance(h, list) and h[:c["safe_horizon"]] == c["generated_ids"][:c["safe_horizon"]],
              "a request that names no model gets the default one")

        # what is served, as llmctl sees it
        r = d.run("llmctl", "models", "--json")
        try:
            ms = json.loads(r.stdout)
            byname = {m["name"]: m for m in ms["models"]}
            ok = (ms["default"] == "tinystories" and set(byname) == set(FILES) and
                  all(m["state"] == "ready" for m in ms["models"]) and
                  all(byname[n]["requests_total"] >= 4 for n in FILES) and
                  byname["stories260k"]["arch"] == "llama" and byname["tiny-q8"]["weights_mib"] > 0)
        except (ValueError, KeyError):
            ok = False
        check(ok, f"llmctl models --json: {r.stdout.strip()[:300]}")
        r = d.run("llmctl", "models")
        check(r.returncode == 0 and "tinystories" in r.stdout and "stories260k" in r.stdout and
              "ready" in r.stdout, f"llmctl models:\n{r.stdout}")

        # per-model counters: llmctl stats, /metrics
        r = d.run("llmctl", "stats", "--json")
        try:
            pm = json.loads(r.stdout)["per_model"]["llmd_model_generated_tokens_total"]
            ok = set(pm) == set(FILES) and all(v > 0 for v in pm.values())
        except (ValueError, KeyError):
            pm, ok = r.stdout[:200], False
        check(ok, f"llmctl stats: generated tokens per model {pm}")
        c = UnixHTTP(d.http)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        check('llmd_model_generated_tokens_total{model="stories260k"}' in text,
              "/metrics: a series per model")

        # a request in flight names its model in llmctl ps
        p = subprocess.Popen([os.path.join(BUILD, "llm-client"), "--socket", d.sock, "--model", "stories260k",
                              "--temp", "0", "-n", "400", "--ignore-eos", "Once"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        seen = ""
        for _ in range(100):
            r = d.run("llmctl", "ps", "--json")
            try:
                reqs = json.loads(r.stdout)["requests"]
            except (ValueError, KeyError):
                reqs = []
            if reqs:
                seen = reqs[0].get("model", "")
                break
            time.sleep(0.02)
        p.wait(timeout=60)
        check(seen == "stories260k", f"llmctl ps names the request's model ({seen!r})")

        # a model not served
        st, body = d.request("POST", "/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 2})
        msg = body.get("error", {}).get("message", "") if isinstance(body, dict) else ""
        check(st == 404 and "tinystories" in msg and "tiny-q8" in msg, f"unknown model over HTTP: {st} {msg}")
        r = d.run("llm-client", "--model", "nope", "-n", "2", "x")
        check(r.returncode != 0 and "nope" in r.stderr, f"unknown model natively: {r.stderr.strip()}")
        st, body = d.request("POST", "/tokenize", {"model": "stories260k", "content": "Hello", "add_special": True})
        check(st == 200 and body["tokens"] == [1, 346, 306, 414], f"/tokenize with stories260k's vocabulary: {body}")
    finally:
        check(d.stop() == 0, "llmd stops cleanly")


def models_of(d):
    r = d.run("llmctl", "models", "--json")
    try:
        return {m["name"]: m for m in json.loads(r.stdout)["models"]}
    except (ValueError, KeyError):
        return {}


def wait_state(d, name, state, timeout=10):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if models_of(d).get(name, {}).get("state") == state:
            return True
        time.sleep(0.05)
    return False


def greedy(d, name, n=8, prompt="Once upon a time", *extra):
    r = d.run("llm-client", "--model", name, *extra, "--ids", "--temp", "0", "-n", str(n), "--ignore-eos", prompt)
    return [int(x) for x in r.stdout.split()] if r.returncode == 0 else r.stderr.strip()


def test_lifecycle(tmp):
    p = {k: os.path.join(MODELS, v) for k, v in FILES.items()}
    want = {n: c["generated_ids"][:8] for n, c in golden_cases() if c["prompt"] == "Once upon a time"}
    d = Llmd(tmp, "life", "--model", p["tinystories"], "--set", "model.name=tinystories",
             "--set", "models.stories260k=" + p["stories260k"], "--set", "models.stories260k.keep_alive_s=1",
             "--set", "models.tiny-q8=" + p["tiny-q8"], "--set", "models.tiny-q8.pinned=true",
             "--set", "server.socket_mode=0666")
    try:
        if not check(d.serving(), "llmd serves with a pinned model and a keep-alive"):
            print(d.text(), file=sys.stderr)
            return
        ms = models_of(d)
        check(ms["tiny-q8"]["state"] == "ready" and ms["stories260k"]["state"] == "unloaded",
              "a pinned model is loaded at start, the others are not")
        # loaded by its first request, unloaded after its keep-alive
        check(greedy(d, "stories260k") == want["stories260k"], "the first request loads stories260k "
              "and gets its golden ids")
        check(models_of(d)["stories260k"]["state"] == "ready", "stories260k is ready after it")
        check(wait_state(d, "stories260k", "unloaded", 5), "idle past its keep-alive (1 s), it is unloaded")
        check(greedy(d, "stories260k") == want["stories260k"], "loaded again by the next request: the same ids")
        # a request's own keep-alive (Ollama's): -1 keeps it past its 1 s, 0 unloads it when idle
        check(greedy(d, "stories260k", 8, "Once upon a time", "--keep-alive", "-1") == want["stories260k"],
              "llm-client --keep-alive -1")
        time.sleep(2)
        check(models_of(d)["stories260k"]["state"] == "ready", "kept loaded past its configured keep-alive")
        check(greedy(d, "stories260k", 8, "Once upon a time", "--keep-alive", "0") == want["stories260k"],
              "llm-client --keep-alive 0")
        check(wait_state(d, "stories260k", "unloaded", 2), "unloaded as soon as its request ended")
        check(greedy(d, "stories260k", 8, "Once upon a time", "--keep-alive", "1s") == want["stories260k"] and
              wait_state(d, "stories260k", "unloaded", 5), "--keep-alive 1s: loaded, then unloaded after it")
        # llmctl load / unload
        r = d.run("llmctl", "unload", "tiny-q8")
        check(r.returncode != 0 and "pinned" in r.stderr, f"a pinned model is not unloaded: {r.stderr.strip()}")
        r = d.run("llmctl", "unload", "tinystories")
        check(r.returncode != 0 and "default" in r.stderr, f"nor the default one: {r.stderr.strip()}")
        r = d.run("llmctl", "unload", "nope")
        check(r.returncode != 0 and "nope" in r.stderr, f"an unknown one: {r.stderr.strip()}")
        if os.geteuid() == 0:
            # load and unload are admin commands; models is anyone's
            def nobody():
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            for cmd in (["load", "stories260k"], ["unload", "tiny-q8"], ["models"]):
                r = subprocess.run([os.path.join(BUILD, "llmctl"), "--socket", d.sock, *cmd], capture_output=True,
                                   text=True, timeout=30, preexec_fn=nobody)
                if cmd[0] == "models":
                    check(r.returncode == 0 and "stories260k" in r.stdout, "llmctl models for uid 65534")
                else:
                    check(r.returncode != 0 and "admin" in r.stderr, f"llmctl {cmd[0]} refused for uid 65534: "
                          f"{r.stderr.strip()}")
        r = d.run("llmctl", "load", "stories260k")
        check(r.returncode == 0 and wait_state(d, "stories260k", "ready"), f"llmctl load: {r.stdout.strip()}")
        # unload while a request runs: it finishes whole, then the model goes
        proc = subprocess.Popen([os.path.join(BUILD, "llm-client"), "--socket", d.sock, "--model", "stories260k",
                                 "--ids", "--temp", "0", "-n", "300", "--ignore-eos", "Once upon a time"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t0 = time.time()
        while models_of(d).get("stories260k", {}).get("live", 0) == 0 and time.time() - t0 < 5:
            time.sleep(0.01)
        r = d.run("llmctl", "unload", "stories260k")
        out, err = proc.communicate(timeout=60)
        ids = [int(x) for x in out.split()] if proc.returncode == 0 else []
        check(r.returncode == 0 and len(ids) == 300 and ids[:8] == want["stories260k"],
              f"unload while a request runs: {r.stdout.strip()}; it still gets its {len(ids)} tokens")
        check(wait_state(d, "stories260k", "unloaded", 5), "then the model is unloaded")
    finally:
        check(d.stop() == 0, "llmd stops cleanly")


def test_priority(tmp):
    """Two busy models (SmolLM2 twice, when present: steps long enough to
    count): the one whose request has the higher priority gets two steps
    to the other's one (never none), and both finish whole."""
    smol = os.environ.get("LLMD_SMOLLM2", os.path.join(BUILD, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    if not os.path.exists(smol):
        print(f"skipped: priority across models ({smol} is absent)")
        return
    p = {k: os.path.join(MODELS, v) for k, v in FILES.items()}
    d = Llmd(tmp, "prio", "--model", p["tinystories"], "--set", "model.name=tinystories",
             "--set", "models.smol-a=" + smol, "--set", "models.smol-a.pinned=true",
             "--set", "models.smol-b=" + smol, "--set", "models.smol-b.pinned=true")
    try:
        if not check(d.serving(), "llmd serves two SmolLM2 models"):
            print(d.text(), file=sys.stderr)
            return

        def per_model(metric):
            return json.loads(d.run("llmctl", "stats", "--json").stdout)["per_model"][metric]
        n = 160

        def client(model, prio):
            return subprocess.Popen([os.path.join(BUILD, "llm-client"), "--socket", d.sock, "--model", model,
                                     "--priority", str(prio), "--ids", "--temp", "0", "-n", str(n),
                                     "--ignore-eos", "Once upon a time"], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        low = client("smol-b", 0)  # the low one first: a head start, if anything
        high = client("smol-a", 5)
        t0 = time.time()
        while time.time() - t0 < 10:
            running = per_model("llmd_model_queue_running")
            if running["smol-a"] and running["smol-b"]:
                break
            time.sleep(0.01)
        s0 = per_model("llmd_model_steps_total")
        out_h, _ = high.communicate(timeout=120)
        s1 = per_model("llmd_model_steps_total")
        out_l, _ = low.communicate(timeout=120)
        dh, dl = s1["smol-a"] - s0["smol-a"], s1["smol-b"] - s0["smol-b"]
        check(len(out_h.split()) == n and len(out_l.split()) == n, f"both get their {n} tokens")
        check(dh > n / 2 and 0.3 * dh <= dl <= 0.75 * dh,
              f"while both ran: {dh} steps of the priority-5 model, {dl} of the priority-0 one")
    finally:
        check(d.stop() == 0, "llmd stops cleanly")


def test_load_while_streaming(tmp):
    """SmolLM2 (when present) loaded on demand while the default model
    streams: the stream's gaps between tokens stay bounded."""
    smol = os.environ.get("LLMD_SMOLLM2", os.path.join(BUILD, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    if not os.path.exists(smol):
        print(f"skipped: load while streaming ({smol} is absent)")
        return
    d = Llmd(tmp, "stream", "--model", os.path.join(MODELS, FILES["tinystories"]), "--set", "model.name=tiny",
             "--set", "models.smol=" + smol)
    try:
        if not check(d.serving(), "llmd serves with SmolLM2 to load"):
            return
        c = UnixHTTP(d.http)
        c.request("POST", "/v1/completions", body=json.dumps({
            "model": "tiny", "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "stream": True}), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        times, loaded = [], None
        first, done = None, False
        while True:
            line = r.readline()
            if not line:
                break
            done = done or line.startswith(b"data: [DONE]")
            if not line.startswith(b"data: {"):
                continue
            times.append(time.time())
            # early in the stream (tokens come several to a chunk, more of
            # them on a busy machine): a request for the unloaded SmolLM2
            if len(times) == 10:
                t0 = time.time()
                first = subprocess.Popen([os.path.join(BUILD, "llm-client"), "--socket", d.sock, "--model", "smol",
                                          "-n", "1", "--temp", "0", "Hi"], stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE)
        c.close()
        if first:
            first.wait(timeout=120)
            loaded = time.time() - t0
        gaps = [b - a for a, b in zip(times, times[1:])]
        worst = max(gaps[9:]) if len(gaps) > 9 else None
        check(done and first and first.returncode == 0 and worst is not None and worst < 1.0,
              f"SmolLM2 loaded on demand (its first token {loaded or -1:.2f} s after the request) while another "
              f"model streamed: {len(times)} chunks, worst gap {worst * 1e3 if worst else -1:.0f} ms")
    finally:
        check(d.stop() == 0, "llmd stops cleanly")


def test_budget(tmp):
    p = {k: os.path.join(MODELS, v) for k, v in FILES.items()}
    want = {n: c["generated_ids"][:8] for n, c in golden_cases() if c["prompt"] == "Once upon a time"}
    # the default model holds 2.5 MiB of weights and 16 of KV; each other about 17: two fit 40 MiB
    d = Llmd(tmp, "budget", "--model", p["tinystories"], "--set", "model.name=tinystories",
             "--set", "memory.budget_mb=40",
             "--set", "models.stories260k=" + p["stories260k"], "--set", "models.tiny-q8=" + p["tiny-q8"])
    try:
        if not check(d.serving(), "llmd serves with memory.budget_mb = 40"):
            print(d.text(), file=sys.stderr)
            return
        check(greedy(d, "stories260k") == want["stories260k"], "stories260k loads within the budget")
        check(greedy(d, "tiny-q8") == want["tiny-q8"], "tiny-q8 loads too, in place of the idle stories260k")
        ms = models_of(d)
        check(ms["stories260k"]["state"] in ("unloaded", "unloading") and ms["tiny-q8"]["state"] == "ready",
              f"the least recently used idle model made room: "
              f"{ {n: m['state'] for n, m in ms.items()} }")
        check(greedy(d, "stories260k") == want["stories260k"] and wait_state(d, "tiny-q8", "unloaded"),
              "and back: stories260k in, tiny-q8 out")
    finally:
        check(d.stop() == 0, "llmd stops cleanly")
    # a pinned model is never unloaded to make room: a load that cannot fit is refused
    d = Llmd(tmp, "budget2", "--model", p["tinystories"], "--set", "model.name=tinystories",
             "--set", "memory.budget_mb=40", "--set", "models.tiny-q8=" + p["tiny-q8"],
             "--set", "models.tiny-q8.pinned=1", "--set", "models.stories260k=" + p["stories260k"])
    try:
        if not check(d.serving(), "llmd serves with a pinned model filling the budget"):
            print(d.text(), file=sys.stderr)
            return
        r = d.run("llm-client", "--model", "stories260k", "-n", "4", "Once")
        check(r.returncode != 0 and "memory.budget_mb" in r.stderr and "MiB" in r.stderr,
              f"a load that cannot fit is refused with the numbers: {r.stderr.strip()}")
        st, body = d.request("POST", "/v1/completions", {"model": "stories260k", "prompt": "Once", "max_tokens": 4})
        check(st == 429 and "memory.budget_mb" in body["error"]["message"], f"over HTTP: {st}")
        check(models_of(d)["tiny-q8"]["state"] == "ready", "the pinned model stays")
        check(greedy(d, "tiny-q8") == want["tiny-q8"], "and serves")
    finally:
        check(d.stop() == 0, "llmd stops cleanly")


def test_model_settings(tmp):
    """models.NAME.n_ctx, .pool_tokens and .chat_template: a model's own
    context, KV pool and chat template, beside others that keep the
    daemon's."""
    p = {k: os.path.join(MODELS, v) for k, v in FILES.items()}
    tmpl = os.path.join(tmp, "chatml.jinja")
    with open(tmpl, "w") as f:
        f.write("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    d = Llmd(tmp, "settings", "--model", p["tinystories"], "--set", "model.name=tinystories",
             "--set", "models.stories260k=" + p["stories260k"], "--set", "models.stories260k.n_ctx=64",
             "--set", "models.stories260k.pool_tokens=256", "--set", "models.stories260k.chat_template=" + tmpl,
             "--set", "models.tiny-q8=" + p["tiny-q8"])
    try:
        if not check(d.serving(), "llmd serves with per-model settings"):
            print(d.text(), file=sys.stderr)
            return
        ms = models_of(d)
        check(ms["stories260k"]["n_ctx"] == 64 and ms["tiny-q8"]["n_ctx"] == ms["tinystories"]["n_ctx"],
              f"n_ctx: stories260k's own 64, tiny-q8 the daemon's {ms['tiny-q8']['n_ctx']}")
        r = d.run("llm-client", "--model", "stories260k", "--chat", "-n", "4", "--temp", "0", "Hi")
        check(r.returncode == 0, f"a chat with stories260k's template from the config: {r.stderr.strip()}")
        r = d.run("llm-client", "--model", "tiny-q8", "--chat", "-n", "4", "Hi")
        check(r.returncode != 0, f"tiny-q8 has none: {r.stderr.strip()}")
        ms = models_of(d)
        check(ms["stories260k"]["kv_capacity_tokens"] == 256 and ms["stories260k"]["n_ctx"] == 64,
              f"loaded: a pool of {ms['stories260k']['kv_capacity_tokens']} tokens (pool_tokens 256)")
        r = d.run("llm-client", "--model", "stories260k", "-n", "4", "Once upon a time " * 20)
        check(r.returncode != 0 and "over the limit of 63" in r.stderr,
              f"a prompt past its 64-token context: {r.stderr.strip()}")
        r = d.run("llm-client", "--model", "tiny-q8", "-n", "4", "Once upon a time " * 20)
        check(r.returncode == 0, "the same prompt on tiny-q8 (the daemon's context)")
    finally:
        check(d.stop() == 0, "llmd stops cleanly")
    # a template that does not compile stops llmd, naming the setting
    bad = os.path.join(tmp, "bad.jinja")
    with open(bad, "w") as f:
        f.write("{% for m in messages %}")
    d = Llmd(tmp, "settings2", "--model", p["tinystories"], "--set", "models.stories260k=" + p["stories260k"],
             "--set", "models.stories260k.chat_template=" + bad)
    try:
        check(d.proc.wait(timeout=30) != 0 and "models.stories260k.chat_template" in d.text(),
              "a chat_template that does not compile stops llmd: " +
              next((l for l in d.text().splitlines() if "chat_template" in l), "?"))
    finally:
        d.stop()


def test_draft(tmp):
    """models.NAME.draft_model: a model other than the default with a draft
    of its own (TinyStories F32, its Q8_0 proposing) speculates, per request
    and by spec.mode = draft, with its golden ids; it counts in the model's
    memory and comes back with it after an unload; the default model,
    without one, refuses a draft request and serves plainly; a draft of
    another vocabulary stops llmd, naming the setting."""
    p = {k: os.path.join(MODELS, v) for k, v in FILES.items()}
    want = [c["generated_ids"][:24] for n, c in golden_cases()
            if n == "tinystories" and c["prompt"] == "Once upon a time"][0]
    d = Llmd(tmp, "draft", "--model", p["stories260k"], "--set", "model.name=stories260k",
             "--set", "models.tiny=" + p["tinystories"], "--set", "models.tiny.draft_model=" + p["tiny-q8"],
             "--set", "spec.mode=draft")
    try:
        if not check(d.serving(), "llmd serves with spec.mode = draft and only models.tiny.draft_model"):
            print(d.text(), file=sys.stderr)
            return

        def draft_steps():
            r = d.run("llmctl", "stats", "--json")
            return json.loads(r.stdout).get("llmd_spec_draft_steps_total", 0) if r.returncode == 0 else -1
        # Whether a proposal pays follows measured step times: the draft
        # steps are counted where the draft is fresh (no step time yet, so it
        # proposes), after a load; later requests may well not draft at all
        # (this draft costs as much as its target), so only their ids count.
        s0 = draft_steps()
        got = greedy(d, "tiny", 24, "Once upon a time", "--speculative", "draft")
        s1 = draft_steps()
        check(got == want and s1 > s0, f"tiny --speculative draft, first request: its golden ids, "
              f"{s1 - s0} draft steps")
        got = greedy(d, "tiny", 24, "Once upon a time")
        check(got == want, f"tiny by spec.mode: its golden ids ({draft_steps() - s1} draft steps)")
        m = models_of(d)["tiny"]
        check(m.get("draft_model") == p["tiny-q8"] and
              m["weights_mib"] > os.path.getsize(p["tinystories"]) / 2**20,
              f"llmctl models: tiny's draft {m.get('draft_model')}, its weights counted "
              f"({m['weights_mib']:.2f} MiB)")
        r = d.run("llm-client", "--model", "stories260k", "--speculative", "draft", "-n", "4", "x")
        check(r.returncode == 1 and "none (spec.draft_model)" in r.stderr,
              f"a draft request to the default model, which has none: {r.stderr.strip()}")
        s0 = draft_steps()
        r = d.run("llm-client", "--model", "stories260k", "--temp", "0", "-n", "8", "Once upon a time")
        check(r.returncode == 0 and draft_steps() == s0, "the default model serves without speculating")
        d.run("llmctl", "unload", "tiny")
        check(wait_state(d, "tiny", "unloaded"), "tiny unloaded")
        s0 = draft_steps()
        got = greedy(d, "tiny", 24, "Once upon a time")
        s1 = draft_steps()
        check(got == want and s1 > s0, f"loaded again, with its draft, by spec.mode: the golden ids, "
              f"{s1 - s0} draft steps")
    finally:
        check(d.stop() == 0, "llmd stops cleanly")
    d = Llmd(tmp, "draft2", "--model", p["tinystories"], "--set", "models.tiny=" + p["tinystories"],
             "--set", "models.tiny.draft_model=" + p["stories260k"])
    try:
        check(d.proc.wait(timeout=30) != 0 and "models.tiny.draft_model" in d.text() and
              "vocabulary" in d.text(), "a draft of another vocabulary stops llmd: " +
              next((l for l in d.text().splitlines() if "draft_model" in l), "?"))
    finally:
        d.stop()


def test_device(tmp):
    """The three models on the CUDA backend (the emulator where the build
    has it, as in CI; a GPU build's device where it sees one): each model's
    weights and KV pool in device memory within the budget, graphs per
    engine, each model's golden ids."""
    try:
        emu = "#define HAVE_CUDA_EMU 1" in open(os.path.join(BUILD, "config.h")).read()
    except OSError:
        emu = False
    if not emu:
        print("skipped: several models on the CUDA backend (this build has no emulator)")
        return
    p = {k: os.path.join(MODELS, v) for k, v in FILES.items()}
    want = {n: c["generated_ids"][:8] for n, c in golden_cases() if c["prompt"] == "Once upon a time"}
    d = Llmd(tmp, "device", "--model", p["tinystories"], "--set", "model.name=tinystories",
             "--set", "device.backend=cuda", "--set", "models.stories260k=" + p["stories260k"],
             "--set", "models.tiny-q8=" + p["tiny-q8"])
    try:
        if not check(d.serving(), "llmd serves three models on the CUDA backend"):
            print(d.text(), file=sys.stderr)
            return
        got = {n: greedy(d, n) for n in want}
        check(got == want, f"each model's golden ids on the device: {got}")
        ms = models_of(d)
        check(all(m["state"] == "ready" and m["backend"].startswith("cuda") for m in ms.values()),
              f"all three ready on {ms['tinystories']['backend']}")
    finally:
        check(d.stop() == 0, "llmd stops cleanly")


def test_load_failure(tmp):
    """A model whose load fails after start (its file reads, its engine
    cannot be made: heads of 48 a q8_0 KV cache cannot hold, a model
    tools/gguf_synth.py makes): its requests fail with the loader's
    message, llmctl models says failed and why, the default model keeps
    serving, and the next request tries again."""
    tiny = os.path.join(MODELS, FILES["tinystories"])
    want = [c["generated_ids"][:8] for n, c in golden_cases()
            if n == "tinystories" and c["prompt"] == "Once upon a time"][0]
    head, odd = os.path.join(tmp, "odd-head.gguf"), os.path.join(tmp, "odd.gguf")
    synth = [sys.executable, os.path.join(SRC, "tools", "gguf_synth.py")]
    if subprocess.run(synth + ["--head", os.path.join(MODELS, "derived", "TinyStories-656K-q4_0.gguf"), head],
                      capture_output=True).returncode or \
            subprocess.run(synth + [head, odd, "--recipe", "f32", "--arch", "llama", "--layers", "1", "--embd", "96",
                                    "--heads", "2", "--kv-heads", "2", "--head-dim", "48", "--ff", "128"],
                           capture_output=True).returncode:
        check(False, "gguf_synth.py makes a model of 48-wide heads")
        return
    d = Llmd(tmp, "fail", "--model", tiny, "--set", "model.name=tinystories", "--set", "kv.type=q8_0",
             "--set", "models.odd=" + odd)
    try:
        if not check(d.serving(), "llmd starts with a model whose engine cannot be made (it reads)"):
            print(d.text(), file=sys.stderr)
            return
        for attempt in ("first", "second"):
            r = d.run("llm-client", "--model", "odd", "-n", "4", "Once")
            check(r.returncode != 0 and "model odd cannot be loaded" in r.stderr and "head_dim" in r.stderr,
                  f"the {attempt} request fails with the loader's message: {r.stderr.strip()}")
            m = models_of(d).get("odd", {})
            check(m.get("state") == "failed" and "head_dim" in json.dumps(m),
                  f"llmctl models: {m.get('state')}, with the reason")
            check(greedy(d, "tinystories") == want, "the default model serves its golden ids meanwhile")
    finally:
        check(d.stop() == 0, "llmd stops cleanly")


def test_bad_settings(tmp):
    tiny = os.path.join(MODELS, FILES["tinystories"])
    bad = os.path.join(tmp, "bad.gguf")
    with open(bad, "wb") as f:
        f.write(b"GGUF" + b"\0" * 60)
    for args, says in (
            (["--set", "models.TinyStories-656K-f32=" + tiny], "the default model's name"),
            (["--set", "models.a/b=" + tiny], "a model's name is"),
            (["--set", "models.broken=" + bad], "models.broken"),
    ):
        d = Llmd(tmp, "bad", "--model", tiny, *args)
        try:
            d.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        out = d.text()
        check(d.proc.poll() not in (None, 0) and says in out, f"{args[-1][:60]}: llmd stops, saying '{says}'")
        d.stop()


def main():
    for f in list(FILES.values()) + ["golden/greedy-llamacpp.json"]:
        if not os.path.exists(os.path.join(MODELS, f)):
            print(f"SKIP: {os.path.join(MODELS, f)} is absent")
            return 77
    with tempfile.TemporaryDirectory(prefix="llmd-multi.") as tmp:
        os.chmod(tmp, 0o755)  # uid 65534's llmctl reaches the socket
        test_serving(tmp)
        test_lifecycle(tmp)
        test_priority(tmp)
        test_load_while_streaming(tmp)
        test_budget(tmp)
        test_model_settings(tmp)
        test_draft(tmp)
        test_device(tmp)
        test_load_failure(tmp)
        test_bad_settings(tmp)
    print(f"multi_model: {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
