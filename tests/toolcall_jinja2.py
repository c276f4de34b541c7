#!/usr/bin/env python3
"""toolcall_jinja2.py - renders a chat template with Python's jinja2, set up
as Hugging Face's apply_chat_template sets it up (tests/jinja_compare.py's
environment), for tests/test_toolcall.c to compare with chat_render_json.

    tests/toolcall_jinja2.py TEMPLATE.jinja CONTEXT.json

Prints the text and exits 0; 1 when the template fails (the error on
stderr); 77 without jinja2.  strftime_now() sees the current time in UTC.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jinja_compare  # noqa: E402  (exits 77 without jinja2)


def main():
    if len(sys.argv) != 3:
        print("usage: toolcall_jinja2.py TEMPLATE CONTEXT.json", file=sys.stderr)
        return 2
    jinja_compare.NOW = int(time.time())
    with open(sys.argv[1], encoding="utf-8") as fh:
        src = fh.read()
    with open(sys.argv[2], encoding="utf-8") as fh:
        ctx = json.load(fh)
    kind, text = jinja_compare.render_jinja2(jinja_compare.hf_environment(), src, ctx)
    if kind != "ok":
        print(f"{kind}: {text}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
