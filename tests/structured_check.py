#!/usr/bin/env python3
"""structured_check.py - structured output end to end: for every JSON Schema
of tests/schemas/ (or those named), `test_structured --gen` has
SmolLM2-135M-Instruct write N outputs (STRUCTURED_N, 200 by default) at
temperature 1 with different seeds, each token drawn from the schema's
grammar mask.  Every output that ended (finish "stop") must parse with
json.loads (strict) and validate against the schema with Python's
jsonschema, formats included (tests/jschema_check.py's checker).  Every
output must end within max_tokens (STRUCTURED_MAX_TOKENS, 256 by default):
a 135M model at temperature 1 loops now and then (a string repeated, a tree
nested again and again), and the scheduler's end-in-time rule (sched.c's
grammar_pick) must close such an output before its budget runs out; one cut
anyway (finish "length") fails, and must say why in its message.

    tests/structured_check.py [-v] [SCHEMA.json ...]        exit 0, 1 or 77
"""

import glob
import json
import os
import subprocess
import sys
import time

try:
    import jsonschema
except ImportError as e:
    print(f"SKIP: {e} (apt-get install python3-jsonschema)")
    sys.exit(77)

SRC = os.environ.get("LLMD_SRCDIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BUILD = os.environ.get("LLMD_BUILDDIR", os.getcwd())
sys.path.insert(0, os.path.join(SRC, "tests"))
import jschema_check  # noqa: E402  (its format checker)

DRIVER = os.path.join(BUILD, "tests", "test_structured")
N = int(os.environ.get("STRUCTURED_N", "200"))
MAX_TOKENS = int(os.environ.get("STRUCTURED_MAX_TOKENS", "256"))


def main(argv):
    verbose = "-v" in argv
    paths = [a for a in argv if a != "-v"] or sorted(glob.glob(os.path.join(SRC, "tests", "schemas", "*.json")))
    if not os.access(DRIVER, os.X_OK):
        print(f"SKIP: no {DRIVER}")
        return 77
    fc = jschema_check.format_checker()
    failures = 0
    total = {"stop": 0, "length": 0}
    for path in paths:
        schema = json.load(open(path))
        cls = jsonschema.validators.validator_for(schema)
        validator = cls(schema, format_checker=fc)
        t0 = time.time()
        p = subprocess.run([DRIVER, "--gen", path, str(N), str(MAX_TOKENS)], capture_output=True, text=True)
        if p.returncode == 77:
            print("SKIP: " + p.stdout.strip())
            return 77
        if p.returncode != 0:
            print(f"FAIL {os.path.basename(path)}: the driver exited {p.returncode}: {p.stderr.strip()[-500:]}")
            failures += 1
            continue
        rows = [json.loads(line) for line in p.stdout.splitlines()]
        bad = 0
        counts = {"stop": 0, "length": 0, "error": 0}
        for r in rows:
            counts[r["finish"]] += 1
            if r["finish"] == "stop":
                try:
                    v = json.loads(r["text"], parse_constant=jschema_check.no_constant)
                    errs = list(validator.iter_errors(v))
                    if errs:
                        raise ValueError(errs[0].message)
                except ValueError as e:
                    bad += 1
                    print(f"  {os.path.basename(path)} seed {r['seed']}: {e}: {r['text'][:300]!r}")
            elif r["finish"] == "length":
                print(f"  {os.path.basename(path)} seed {r['seed']}: cut at {r['tokens']} tokens "
                      f"({r['message'] or 'without a notice'}): {r['text'][-120:]!r}")
            else:
                bad += 1
                print(f"  {os.path.basename(path)} seed {r['seed']}: error {r['message']}")
        ok = len(rows) == N and bad == 0 and counts["stop"] == N
        failures += not ok
        total["stop"] += counts["stop"]
        total["length"] += counts["length"]
        print(f"{'ok  ' if ok else 'FAIL'} {os.path.basename(path)}: {counts['stop']}/{len(rows)} complete and "
              f"valid{'' if not bad else f', {bad} bad'}, {counts['length']} cut at {MAX_TOKENS} tokens "
              f"({time.time() - t0:.0f} s)")
        if verbose and rows:
            print("   e.g. " + rows[0]["text"][:200].replace("\n", " "))
    print(f"{total['stop']} outputs complete and valid, {total['length']} cut by max_tokens; "
          f"{len(paths) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
