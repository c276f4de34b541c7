#!/usr/bin/env python3
"""jinja_compare.py - our Jinja interpreter (daemon/engine/jinja.c) against
Python's jinja2, byte for byte, on every chat template in tests/templates/.

    tests/jinja_compare.py [-v] [TEMPLATE.jinja ...]   exit 0, 1 (a mismatch) or 77

jinja2 is set up as Hugging Face's apply_chat_template sets it up:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
loopcontrols extension and a {% generation %} tag, raise_exception() and
strftime_now() as globals, and tojson as json.dumps(ensure_ascii=False);
the context holds messages, tools and documents (None unless a conversation
brings them), add_generation_prompt, bos_token and eos_token.  Ours runs
through tests/jinja_render (a check program) on the same context, written as
JSON.  Both see the same clock: TZ=UTC, at NOW.

For each template and conversation the two must agree: the same bytes, or
both refuse (where jinja2's refusal is a raise_exception(), ours must give
the same message).  Every template in the folder is claimed, except those
in UNCLAIMED, each with the reason.  Skips (77) without python3's jinja2 or
the driver.
"""

import datetime
import json
import os
import subprocess
import sys
import tempfile

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:
    print(f"SKIP: {e} (apt-get install python3-jinja2)")
    sys.exit(77)

SRC = os.environ.get("LLMD_SRCDIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BUILD = os.environ.get("LLMD_BUILDDIR", os.getcwd())
TEMPLATES = os.path.join(SRC, "tests", "templates")
DRIVER = os.path.join(BUILD, "tests", "jinja_render")
NOW = 1721822400  # 2024-07-24 12:00:00 UTC

# Templates of the folder that we do not claim to render, and why (the
# construct ours lacks).  Empty: every template there agrees with jinja2.
UNCLAIMED = {
}

os.environ["TZ"] = "UTC"
try:
    import time
    time.tzset()
except AttributeError:
    pass


# ---- jinja2 as Hugging Face configures it ----

class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def strftime_now(fmt):
    return datetime.datetime.fromtimestamp(NOW).strftime(fmt)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class AssistantTracker(jinja2.ext.Extension):
    """HF's {% generation %} ... {% endgeneration %}: renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def hf_environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# ---- conversations ----

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "description": "How many days"},
            },
            "required": ["city"],
        },
    },
}]

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello"}
A1 = {"role": "assistant", "content": "Hi there! How can I help?"}
U2 = {"role": "user", "content": "Who are you?"}
A2 = {"role": "assistant", "content": "I am an assistant."}
ODD = ("Use {{ x }} and {% if %} here, 'single' \"double\" \\ backslash,\n"
       "new line\ttab, # not a comment {# nor this #}")
UNI = "Grüße, 世界! Ça va? 🙂 — ünïcödé «» \u00a0 end"

CONVERSATIONS = [
    ("user", {"messages": [U1], "add_generation_prompt": True}),
    ("system+user", {"messages": [SYS, U1], "add_generation_prompt": True}),
    ("multi-turn", {"messages": [SYS, U1, A1, U2], "add_generation_prompt": True}),
    ("multi-turn no prompt", {"messages": [SYS, U1, A1, U2], "add_generation_prompt": False}),
    ("no system multi-turn", {"messages": [U1, A1, U2], "add_generation_prompt": True}),
    ("assistant last", {"messages": [U1, A1, U2, A2], "add_generation_prompt": False}),
    ("assistant last + prompt", {"messages": [SYS, U1, A1], "add_generation_prompt": True}),
    ("unicode", {"messages": [{"role": "system", "content": UNI}, {"role": "user", "content": UNI}],
                 "add_generation_prompt": True}),
    ("braces quotes newlines", {"messages": [{"role": "user", "content": ODD},
                                             {"role": "assistant", "content": ODD},
                                             {"role": "user", "content": "  padded\n\n"}],
                                "add_generation_prompt": True}),
    ("empty content", {"messages": [{"role": "user", "content": ""}], "add_generation_prompt": True}),
    ("thinking", {"messages": [U1, {"role": "assistant",
                                    "content": "<think>\nLet me think.\n</think>\n\nHello!"}, U2],
                  "add_generation_prompt": True}),
    ("roles not alternating", {"messages": [U1, U2], "add_generation_prompt": True}),
    ("no messages", {"messages": [], "add_generation_prompt": True}),
    ("tools", {"messages": [SYS, {"role": "user", "content": "Weather in Paris?"}],
               "tools": TOOLS, "add_generation_prompt": True}),
    ("tool call and result", {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
             "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
        ],
        "tools": TOOLS, "add_generation_prompt": True}),
]


def context(conv):
    ctx = {"messages": conv["messages"], "tools": None, "documents": None,
           "add_generation_prompt": conv["add_generation_prompt"],
           "bos_token": "<s>", "eos_token": "</s>"}
    if "tools" in conv:
        ctx["tools"] = conv["tools"]
    return ctx


def render_jinja2(env, src, ctx):
    """("ok", text), ("raise", message) or ("error", what)."""
    try:
        return ("ok", env.from_string(src).render(**ctx))
    except TemplateError as e:
        return ("raise", str(e))
    except Exception as e:  # undefined, type errors, unknown filters...
        return ("error", f"{type(e).__name__}: {e}")


def render_ours(tmpl_path, ctx_path):
    p = subprocess.run([DRIVER, "--now", str(NOW), tmpl_path, ctx_path], capture_output=True,
                       timeout=60)
    if p.returncode == 0:
        return ("ok", p.stdout.decode("utf-8"))
    return ("error", p.stderr.decode("utf-8", "replace").strip())


def main():
    args = [a for a in sys.argv[1:] if a != "-v"]
    verbose = "-v" in sys.argv[1:]
    if not os.access(DRIVER, os.X_OK):
        print(f"SKIP: no driver {DRIVER} (make tests/jinja_render)")
        return 77
    names = args or sorted(f for f in os.listdir(TEMPLATES) if f.endswith(".jinja"))
    env = hf_environment()
    failures, agreed, refused_both = 0, 0, 0
    with tempfile.TemporaryDirectory(prefix="llmd-jinja.") as tmp:
        ctx_paths = []
        for i, (what, conv) in enumerate(CONVERSATIONS):
            path = os.path.join(tmp, f"ctx{i}.json")
            with open(path, "w", encoding="utf-8") as fh:
                json.dump(context(conv), fh, ensure_ascii=False)
            ctx_paths.append(path)
        for name in names:
            path = name if os.sep in name else os.path.join(TEMPLATES, name)
            base = os.path.basename(path)
            if base in UNCLAIMED and not args:
                print(f"unclaimed: {base}: {UNCLAIMED[base]}")
                continue
            with open(path, encoding="utf-8") as fh:
                src = fh.read()
            bad = 0
            for (what, conv), ctx_path in zip(CONVERSATIONS, ctx_paths):
                want = render_jinja2(env, src, context(conv))
                got = render_ours(path, ctx_path)
                if want[0] == "ok":
                    ok = got == want
                elif want[0] == "raise":
                    ok = got[0] == "error" and got[1].endswith("raise_exception: " + want[1])
                else:
                    ok = got[0] == "error"
                if ok:
                    agreed += 1
                    refused_both += want[0] != "ok"
                    if verbose:
                        print(f"ok: {base} / {what}: {want[0]}")
                    continue
                bad += 1
                print(f"FAIL: {base} / {what}:\n  jinja2: {want!r}\n  ours:   {got!r}",
                      file=sys.stderr)
            failures += bad
            print(f"{'FAIL' if bad else 'ok'}: {base}: {len(CONVERSATIONS) - bad}/{len(CONVERSATIONS)}")
    print(f"{agreed} template x conversation pairs agree ({refused_both} of them refused by both), "
          f"{failures} differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
