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
        test_serving(tmp)
        test_bad_settings(tmp)
    print(f"multi_model: {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
