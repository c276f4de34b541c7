#!/usr/bin/env python3
"""jschema_check.py - our JSON Schema -> GBNF converter (daemon/engine/jschema.c)
checked end to end without a grammar engine: random texts drawn from each
grammar must be JSON that the schema accepts.

    tests/jschema_check.py [-v] [-n SAMPLES] [SCHEMA.json ...]   exit 0, 1 or 77

For every schema of tests/schemas/ (or those named), the driver
tests/jschema_gbnf writes the grammar, once as is and once with --strict.
Each grammar is parsed here (llama.cpp's GBNF syntax: rules, |, groups,
literals, [classes], [^negated], * + ? {m} {m,} {m,n}) and checked for
shape: every rule named is defined, "root" is there, no rule can reach
itself without consuming a character (left recursion, which grammar
engines refuse).  Then SAMPLES random texts (200 by default) are expanded
from "root", alternatives and repeat counts drawn at random, the shortest
way out taken past a depth bound.  Each text must (a) parse with json.loads
(strict: no raw control characters, no NaN) and (b) validate against the
schema with Python's jsonschema, formats included (date-time and time by
RFC 3339 here, as jsonschema checks them only with an optional package).

Then the hand-written valid instances of tests/schemas/instances/valid.json
(their properties in the order the grammar writes them: required first)
must be accepted by the grammar, each written three ways (compact, with
json.dumps's spaces, indented), through a small matcher of ours.  Integer
and number bounds are checked exactly: for many bounds the root rule
(regular there) becomes a Python regular expression that must accept each
number text near the bounds if and only if it is within them (a negative
zero aside, which the grammar need not write).  Last, 200 random schemas
(random keywords, often contradictory or unsupported): the converter may
refuse one with ENOTSUP or EINVAL, never fail otherwise, and the grammar of
one it accepts must give valid texts.

The seed is fixed (JSCHEMA_SEED changes it) so that a failure repeats.
Skips (77) without python3's jsonschema (apt-get install python3-jsonschema)
or the driver.
"""

import datetime
import glob
import json
import os
import random
import re
import subprocess
import sys

try:
    import jsonschema
    import jsonschema.validators
except ImportError as e:
    print(f"SKIP: {e} (apt-get install python3-jsonschema)")
    sys.exit(77)

SRC = os.environ.get("LLMD_SRCDIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BUILD = os.environ.get("LLMD_BUILDDIR", os.getcwd())
SCHEMAS = os.path.join(SRC, "tests", "schemas")
DRIVER = os.path.join(BUILD, "tests", "jschema_gbnf")
SEED = int(os.environ.get("JSCHEMA_SEED", "20240724"))
MAX_NESTING = 64  # parentheses a grammar parser takes (grammar.h's, llama.cpp's is the stack)


# ---- GBNF: parsing ----

class Lit:
    def __init__(self, s):
        self.s = s


class Cls:
    def __init__(self, neg, ranges):
        self.neg = neg
        self.ranges = ranges  # [(lo, hi)] code points, inclusive


class Ref:
    def __init__(self, name):
        self.name = name


class Alt:
    def __init__(self, seqs):
        self.seqs = seqs  # [[item]]


class Rep:
    def __init__(self, item, lo, hi):
        self.item = item
        self.lo = lo
        self.hi = hi  # None: unbounded


class GrammarError(Exception):
    pass


ESC = {"t": "\t", "n": "\n", "r": "\r", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}


class Parser:
    def __init__(self, text):
        self.t = text
        self.i = 0
        self.nesting = 0      # parentheses open now
        self.max_nesting = 0  # at most, over the whole grammar

    def err(self, msg):
        line = self.t.count("\n", 0, self.i) + 1
        raise GrammarError(f"line {line}: {msg}: ...{self.t[self.i:self.i + 30]!r}")

    def ws(self, newlines):
        while self.i < len(self.t):
            c = self.t[self.i]
            if c == "#":
                while self.i < len(self.t) and self.t[self.i] != "\n":
                    self.i += 1
            elif c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            else:
                break

    def name(self):
        m = re.compile(r"[a-zA-Z0-9-]+").match(self.t, self.i)
        if not m:
            self.err("a rule name")
        self.i = m.end()
        return m.group(0)

    def char(self):
        c = self.t[self.i]
        if c != "\\":
            self.i += 1
            return ord(c)
        e = self.t[self.i + 1]
        n = {"x": 2, "u": 4, "U": 8}.get(e)
        if n:
            h = self.t[self.i + 2:self.i + 2 + n]
            if not re.fullmatch(r"[0-9a-fA-F]{%d}" % n, h):
                self.err("a bad hex escape")
            self.i += 2 + n
            return int(h, 16)
        if e not in ESC:
            self.err("an unknown escape")
        self.i += 2
        return ord(ESC[e])

    def primary(self):
        c = self.t[self.i]
        if c == '"':
            self.i += 1
            s = []
            while self.t[self.i] != '"':
                if self.t[self.i] == "\n":
                    self.err("a newline in a literal")
                s.append(chr(self.char()))
            self.i += 1
            return Lit("".join(s))
        if c == "[":
            self.i += 1
            neg = self.t[self.i] == "^"
            if neg:
                self.i += 1
            ranges = []
            while self.t[self.i] != "]":
                lo = self.char()
                hi = lo
                if self.t[self.i] == "-" and self.t[self.i + 1] != "]":
                    self.i += 1
                    hi = self.char()
                if hi < lo:
                    self.err("a bad range")
                ranges.append((lo, hi))
            self.i += 1
            return Cls(neg, ranges)
        if c == "(":
            self.i += 1
            self.nesting += 1
            self.max_nesting = max(self.max_nesting, self.nesting)
            a = self.alts(True)
            self.nesting -= 1
            self.ws(True)
            if self.t[self.i] != ")":
                self.err("missing )")
            self.i += 1
            return a
        if c == ".":
            self.i += 1
            return Cls(True, [])
        return Ref(self.name())

    def postfix(self, item):
        while self.i < len(self.t):
            c = self.t[self.i]
            if c == "*":
                item = Rep(item, 0, None)
            elif c == "+":
                item = Rep(item, 1, None)
            elif c == "?":
                item = Rep(item, 0, 1)
            elif c == "{":
                m = re.compile(r"\{(\d+)(,(\d*))?\}").match(self.t, self.i)
                if not m:
                    self.err("a bad repetition")
                lo = int(m.group(1))
                hi = lo if not m.group(2) else (int(m.group(3)) if m.group(3) else None)
                if hi is not None and hi < lo:
                    self.err("a repetition {m,n} with n < m")
                self.i = m.end() - 1
                item = Rep(item, lo, hi)
            else:
                return item
            self.i += 1
        return item

    def seq(self, nested):
        items = []
        while True:
            self.ws(nested)
            if self.i >= len(self.t) or self.t[self.i] in "|)\n\r":
                return items
            items.append(self.postfix(self.primary()))

    def alts(self, nested):
        seqs = [self.seq(nested)]
        while self.i < len(self.t) and self.t[self.i] == "|":
            self.i += 1
            self.ws(True)  # a newline after | continues the rule
            seqs.append(self.seq(nested))
        return Alt(seqs)

    def grammar(self):
        rules = {}
        while True:
            self.ws(True)
            if self.i >= len(self.t):
                return rules
            n = self.name()
            self.ws(False)
            if not self.t.startswith("::=", self.i):
                self.err("::=")
            self.i += 3
            if n in rules:
                self.err(f"rule {n} defined twice")
            rules[n] = self.alts(False)


# ---- GBNF: shape ----

def refs_of(node, out):
    if isinstance(node, Ref):
        out.add(node.name)
    elif isinstance(node, Alt):
        for s in node.seqs:
            for it in s:
                refs_of(it, out)
    elif isinstance(node, Rep):
        refs_of(node.item, out)


def nullable_rules(rules):
    null = set()

    def nul(node):
        if isinstance(node, Lit):
            return node.s == ""
        if isinstance(node, Cls):
            return False
        if isinstance(node, Ref):
            return node.name in null
        if isinstance(node, Rep):
            return node.lo == 0 or nul(node.item)
        return any(all(nul(it) for it in s) for s in node.seqs)

    changed = True
    while changed:
        changed = False
        for n, body in rules.items():
            if n not in null and nul(body):
                null.add(n)
                changed = True
    return nul


def check_shape(rules):
    """Problems of the grammar as a list of strings (none: fine)."""
    problems = []
    if "root" not in rules:
        problems.append("no root rule")
    for n, body in rules.items():
        used = set()
        refs_of(body, used)
        for u in sorted(used - rules.keys()):
            problems.append(f"{n} names undefined rule {u}")
    if problems:
        return problems
    nul = nullable_rules(rules)

    def left(node, out):
        """Rules that can stand first in NODE; whether NODE is nullable."""
        if isinstance(node, Ref):
            out.add(node.name)
        elif isinstance(node, Rep):
            left(node.item, out)
        elif isinstance(node, Alt):
            for s in node.seqs:
                for it in s:
                    left(it, out)
                    if not nul(it):
                        break

    first = {}
    for n, body in rules.items():
        first[n] = set()
        left(body, first[n])
    for n in rules:
        seen, todo = set(), list(first[n])
        while todo:
            r = todo.pop()
            if r == n:
                problems.append(f"rule {n} is left-recursive")
                break
            if r not in seen:
                seen.add(r)
                todo.extend(first[r])
    return problems


# ---- GBNF: random texts ----

INF = float("inf")

# Characters to draw from classes: ASCII, the JSON troublemakers, and some of
# every width of UTF-8 (no surrogates: no text has them).
POOL = [chr(c) for c in range(0x20, 0x7F)] + list("\t\n\r\x00\x01\x1f\x7f") + \
    list("\u00e9\u00df\u00a0\u0660\u03bb\u2028\u4e2d\u6587\U0001F600\U00010348")


def min_depths(rules):
    """Each rule's fewest nested expansions to a finished text, and a
    function that gives a node's (memoized once the rules' are known)."""
    depth = {n: INF for n in rules}

    def d(node):
        if isinstance(node, (Lit, Cls)):
            return 0
        if isinstance(node, Ref):
            return depth[node.name]
        if isinstance(node, Rep):
            return 0 if node.lo == 0 else d(node.item)
        return min(max([d(it) for it in s], default=0) for s in node.seqs)

    changed = True
    while changed:
        changed = False
        for n, body in rules.items():
            v = 1 + d(body)
            if v < depth[n]:
                depth[n] = v
                changed = True
    memo = {}

    def cost(node):
        k = id(node)
        if k not in memo:
            memo[k] = d(node)
        return memo[k]

    return depth, cost


class Sampler:
    def __init__(self, rules, rng, soft_depth=24, hard_depth=200):
        self.rules = rules
        self.rng = rng
        self.depth, self.cost = min_depths(rules)
        self.seq_costs = {}  # id(Alt) -> each alternative's cost
        self.cands = {}      # id(Cls) -> the characters of POOL in it
        self.soft = soft_depth
        self.hard = hard_depth

    def cls_char(self, c):
        def inside(cp):
            hit = any(lo <= cp <= hi for lo, hi in c.ranges)
            return hit != c.neg

        r = self.rng
        if not c.neg and r.random() < 0.5:
            lo, hi = r.choice(c.ranges)
            for _ in range(20):
                cp = r.randint(lo, hi)
                if not 0xD800 <= cp <= 0xDFFF:
                    return chr(cp)
        cands = self.cands.get(id(c))
        if cands is None:
            cands = self.cands[id(c)] = [ch for ch in POOL if inside(ord(ch))]
        if cands:
            return r.choice(cands)
        for lo, hi in c.ranges:
            for cp in (lo, hi):
                if not 0xD800 <= cp <= 0xDFFF:
                    return chr(cp)
        raise GrammarError("a class with no character to draw")

    def count(self, rep, deep):
        lo, hi = rep.lo, rep.hi
        if deep:
            return lo
        r = self.rng
        top = lo + 4 if hi is None else min(hi, lo + 4)
        if hi is not None and hi - lo <= 60 and r.random() < 0.15:
            return hi  # the upper bound itself now and then
        return r.randint(lo, top)

    def gen(self, node, level, out):
        if level > self.hard:
            raise GrammarError("expansion too deep: the grammar may not terminate")
        deep = level > self.soft
        if isinstance(node, Lit):
            out.append(node.s)
        elif isinstance(node, Cls):
            out.append(self.cls_char(node))
        elif isinstance(node, Ref):
            self.gen(self.rules[node.name], level + 1, out)
        elif isinstance(node, Rep):
            n = self.count(node, deep or self.cost(node.item) == INF)
            for _ in range(n):
                self.gen(node.item, level, out)
        else:
            costs = self.seq_costs.get(id(node))
            if costs is None:
                costs = [max([self.cost(it) for it in s], default=0) for s in node.seqs]
                self.seq_costs[id(node)] = costs
            best = min(costs)
            if best == INF:
                raise GrammarError("an alternative that never finishes")
            pick = [s for s, c in zip(node.seqs, costs) if c == best or (not deep and c < INF)]
            for it in self.rng.choice(pick):
                self.gen(it, level, out)

    def sample(self):
        out = []
        self.gen(self.rules["root"], 0, out)
        return "".join(out)


# ---- JSON Schema validation, formats included ----

RFC3339_TIME = re.compile(
    r"([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?(Z|z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$")


def is_time(s):
    if not isinstance(s, str):
        return True
    return bool(RFC3339_TIME.match(s))


def is_date_time(s):
    if not isinstance(s, str):
        return True
    m = re.match(r"(\d{4}-\d{2}-\d{2})[Tt](.*)$", s)
    if not m or not is_time(m.group(2)):
        return False
    try:
        datetime.date.fromisoformat(m.group(1))
    except ValueError:
        return False
    return True


def format_checker():
    fc = jsonschema.FormatChecker()
    fc.checks("time")(is_time)
    fc.checks("date-time")(is_date_time)
    for f in ("date", "uuid", "ipv4", "email"):
        if f not in fc.checkers:
            raise SystemExit(f"jsonschema lacks a checker for format {f}")
    return fc


def no_constant(name):
    raise ValueError(f"{name} is not JSON")


# ---- GBNF: matching (for texts that must be accepted) ----

class Matcher:
    """Whether a grammar (without left recursion) accepts a text: each node
    gives the set of positions where a match from a position can end."""

    def __init__(self, rules):
        self.rules = rules

    def ends(self, node, i):
        key = (id(node), i)
        got = self.memo.get(key)
        if got is not None:
            return got
        t = self.text
        if isinstance(node, Lit):
            got = {i + len(node.s)} if t.startswith(node.s, i) else set()
        elif isinstance(node, Cls):
            got = set()
            if i < len(t):
                cp = ord(t[i])
                if any(lo <= cp <= hi for lo, hi in node.ranges) != node.neg:
                    got = {i + 1}
        elif isinstance(node, Ref):
            got = self.ends(self.rules[node.name], i)
        elif isinstance(node, Rep):
            got, cur, k = set(), {i}, 0
            seen = set()
            while cur:
                if k >= node.lo:
                    cur = cur - seen
                    got |= cur
                    seen |= cur
                if k == node.hi or not cur:
                    break
                cur = set().union(*(self.ends(node.item, p) for p in cur))
                k += 1
        else:
            got = set()
            for seq in node.seqs:
                cur = {i}
                for it in seq:
                    cur = set().union(*(self.ends(it, p) for p in cur)) if cur else cur
                got |= cur
        self.memo[key] = got
        return got

    def accepts(self, text):
        self.text, self.memo = text, {}
        return len(text) in self.ends(self.rules["root"], 0)


def check_instances(path, schema, flags, instances):
    """Failures: hand-written valid instances of SCHEMA (in the order the
    grammar writes properties: required first) that its grammar refuses,
    each written compact, with json.dumps's spaces, and indented."""
    label = f"{os.path.basename(path)}{' ' + ' '.join(flags) if flags else ''}"
    text, err = grammar_for(path, flags)
    if text is None:
        return [f"{label}: the converter refused it: {err}"]
    m = Matcher(Parser(text).grammar())
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=format_checker())
    fails = []
    for inst in instances:
        errors = list(validator.iter_errors(inst))
        if errors:
            fails.append(f"{label}: instance {json.dumps(inst)[:100]} is not valid: {errors[0].message}")
            continue
        for form in (json.dumps(inst, ensure_ascii=False),
                     json.dumps(inst, separators=(",", ":"), ensure_ascii=False),
                     json.dumps(inst, indent=2, ensure_ascii=False)):
            if not m.accepts(form):
                fails.append(f"{label}: refuses valid {form[:300]!r}")
                break
    return fails


# ---- numeric ranges: exact, through a regular expression ----

def to_regex(rules, node, stack=()):
    """A Python regular expression for NODE of a grammar without recursion."""
    if isinstance(node, Lit):
        return re.escape(node.s)
    if isinstance(node, Cls):
        def one(cp):
            return "\\U%08x" % cp
        body = "".join(one(lo) if lo == hi else f"{one(lo)}-{one(hi)}" for lo, hi in node.ranges)
        if node.neg:
            return f"[^{body}]" if body else "(?s:.)"
        return f"[{body}]"
    if isinstance(node, Ref):
        if node.name in stack:
            raise GrammarError(f"rule {node.name} is recursive")
        return "(?:" + to_regex(rules, rules[node.name], stack + (node.name,)) + ")"
    if isinstance(node, Rep):
        hi = "" if node.hi is None else str(node.hi)
        return "(?:" + to_regex(rules, node.item, stack) + "){%d,%s}" % (node.lo, hi)
    return "(?:" + "|".join("".join(to_regex(rules, it, stack) for it in s) for s in node.seqs) + ")"


INT_CASES = [(0, 150), (-5, 29), (7, None), (None, -10), (11, 19), (123, 456), (-1234, -17),
             (-99, 12345), (0, 0), (-1, 1), (987, None), (None, 999), (1, 1), (99, 101),
             (-100, -100), (None, 0), (0, None), (5, 5000), (-1000000, 1000000), (10, 99),
             (100, 999), (1, 9), (19, 21), (-21, -19), (200, 300)]


def int_values(lo, hi, rng):
    vals = set(range(-130, 131))
    for b in (lo, hi):
        if b is not None:
            vals.update(range(b - 130, b + 131))
    for k in range(1, 9):
        vals.update((10 ** k - 1, 10 ** k, -(10 ** k - 1), -(10 ** k)))
    vals.update(rng.randint(-10 ** 9, 10 ** 9) for _ in range(300))
    return sorted(vals)


def number_values(lo, hi):
    """Texts of decimals near the bounds, with their values (as Fractions)."""
    from fractions import Fraction
    out = []
    pts = {0}
    for b in (lo, hi):
        if b is not None:
            pts.add(b)
    for p in pts:
        for k in range(-12, 13):
            v = Fraction(p) + Fraction(k, 4)
            out.append(v)
    out += [Fraction(1, 10 ** 9), -Fraction(1, 10 ** 9), Fraction(123456, 1), -Fraction(123456, 1)]
    texts = []
    for v in set(out):
        sign = "-" if v < 0 else ""
        a = abs(v)
        whole = a.numerator // a.denominator
        frac = a - whole
        if frac == 0:
            forms = [f"{whole}", f"{whole}.0", f"{whole}.000"]
        else:
            digits = ""
            while frac and len(digits) < 12:
                frac *= 10
                d = frac.numerator // frac.denominator
                digits += str(d)
                frac -= d
            forms = [f"{whole}.{digits}", f"{whole}.{digits}0"]
        for f in forms:
            texts.append((sign + f, v))
            if v == 0:
                texts.append(("-" + f, v))
    return texts


def check_ranges(tmp, rng):
    """Failures of integer and number bounds: every text accepted must be in
    the bounds (sound), every plain text in them accepted (complete)."""
    fails = []

    def grammar_regex(schema):
        path = os.path.join(tmp, "range.json")
        with open(path, "w") as f:
            json.dump(schema, f)
        text, err = grammar_for(path, [])
        if text is None:
            return None, err
        rules = Parser(text).grammar()
        return re.compile(to_regex(rules, rules["root"])), None

    for lo, hi in INT_CASES:
        for excl in (False, True):
            schema = {"type": "integer"}
            if lo is not None:
                schema["exclusiveMinimum" if excl else "minimum"] = lo
            if hi is not None:
                schema["exclusiveMaximum" if excl else "maximum"] = hi
            lo2 = None if lo is None else lo + excl
            hi2 = None if hi is None else hi - excl
            rx, err = grammar_regex(schema)
            if rx is None:
                if lo2 is not None and hi2 is not None and lo2 > hi2 and "no integer" in err:
                    continue
                fails.append(f"ranges: {schema}: {err}")
                continue
            for v in int_values(lo, hi, rng):
                want = (lo2 is None or v >= lo2) and (hi2 is None or v <= hi2) and \
                    abs(v) < 10 ** 16
                if bool(rx.fullmatch(str(v))) != want:
                    fails.append(f"ranges: {schema}: {v} {'refused' if want else 'accepted'}")
                    break
    bounds = [None, -3, -1, 0, 2, 5]
    for lo in bounds:
        for hi in bounds:
            for lx in (False, True):
                for hx in (False, True):
                    if (lo is None and lx) or (hi is None and hx):
                        continue
                    schema = {"type": "number"}
                    if lo is not None:
                        schema["exclusiveMinimum" if lx else "minimum"] = lo
                    if hi is not None:
                        schema["exclusiveMaximum" if hx else "maximum"] = hi
                    if lo is None and hi is None:
                        continue
                    rx, err = grammar_regex(schema)

                    def inside(v):
                        return (lo is None or (v > lo if lx else v >= lo)) and \
                            (hi is None or (v < hi if hx else v <= hi))
                    texts = number_values(lo, hi)
                    if rx is None:
                        if any(inside(v) for _, v in texts) or "no number" not in err:
                            fails.append(f"ranges: {schema}: {err}")
                        continue
                    for t, v in texts:
                        ok = bool(rx.fullmatch(t))
                        if ok != inside(v) and (ok or v != 0 or not t.startswith("-")):
                            # (a negative zero need not be written)
                            fails.append(f"ranges: {schema}: {t} {'refused' if inside(v) else 'accepted'}")
                            break
    return fails


# ---- random schemas ----

TYPES = ["object", "array", "string", "integer", "number", "boolean", "null"]
PATTERNS = ["^[a-z]+$", "^a(b|c)*d?$", "x", "^\\d{2,3}-\\w$", "^[^\"\\\\]{0,3}$", "^(?:ab){1,2}$", ".",
            "^\\s?$", "^[\u00e9-\u00ff]$", "^\\.\\*$"]
KEYWORDS = ["properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
            "maxItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
            "exclusiveMinimum", "exclusiveMaximum", "maxProperties"]


def random_schema(rng, depth=0):
    """A schema of random keywords, often contradictory or unsupported."""
    if depth > 3 or rng.random() < 0.15:
        return rng.choice([True, {}, {"type": rng.choice(TYPES)}])

    def scalar():
        return rng.choice([0, 1, -1, 2.5, "a", "", "b\"c", True, False, None, [1], {"k": 1}])

    s, r = {}, rng.random()
    if r < 0.1:
        s["anyOf"] = [random_schema(rng, depth + 1) for _ in range(rng.randint(1, 3))]
    elif r < 0.15:
        s["oneOf"] = [{"type": t} for t in rng.sample(TYPES, rng.randint(1, 3))]
    elif r < 0.22:
        s["allOf"] = [random_schema(rng, depth + 1) for _ in range(rng.randint(1, 2))]
    elif r < 0.3:
        s["enum"] = [scalar() for _ in range(rng.randint(1, 4))]
    elif r < 0.33:
        s["const"] = scalar()
    t = rng.choice(TYPES + [None, None, TYPES[:rng.randint(1, 7)]])
    if t is not None:
        s["type"] = t
    for k in rng.sample(KEYWORDS, rng.randint(0, 5)):
        if k == "properties":
            s[k] = {rng.choice(["a", "b", "ab", "c d", "\u00e9"]): random_schema(rng, depth + 1)
                    for _ in range(rng.randint(0, 3))}
        elif k == "required":
            s[k] = rng.sample(["a", "b", "ab", "z"], rng.randint(0, 2))
        elif k == "additionalProperties":
            s[k] = rng.choice([True, False, random_schema(rng, depth + 1)])
        elif k == "items":
            s[k] = rng.choice([random_schema(rng, depth + 1), False, True])
        elif k == "prefixItems":
            s[k] = [random_schema(rng, depth + 1) for _ in range(rng.randint(0, 2))]
        elif k in ("minItems", "maxItems", "minLength", "maxLength", "maxProperties"):
            s[k] = rng.randint(0, 4)
        elif k == "pattern":
            s[k] = rng.choice(PATTERNS)
        elif k == "format":
            s[k] = rng.choice(["date", "time", "date-time", "uuid", "ipv4", "email", "uri"])
        else:
            s[k] = rng.choice([-3, 0, 1, 2, 5, 10, 0.5, -2.5, 100])
    if depth == 0 and isinstance(s, dict) and rng.random() < 0.2:
        s = {"$defs": {"n": s}, "type": "object",
             "properties": {"x": {"$ref": "#/$defs/n"},
                            "self": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}}}
    return s


def check_random(tmp, rng, count, samples):
    """Failures over COUNT random schemas: the converter may refuse one
    (ENOTSUP, EINVAL), never fail otherwise; what it accepts must give
    valid texts."""
    fails, path = [], os.path.join(tmp, "random.json")
    for _ in range(count):
        schema = random_schema(rng)
        with open(path, "w") as f:
            json.dump(schema, f)
        flags = rng.choice([[], ["--strict"]])
        p = subprocess.run([DRIVER] + flags + [path], capture_output=True, text=True)
        if p.returncode != 0:
            if p.returncode != 1 or not p.stderr.startswith(("ENOTSUP: ", "EINVAL: ")):
                fails.append(f"random: {json.dumps(schema)} {flags}: exit {p.returncode}: {p.stderr[-300:]}")
            continue
        parser = Parser(p.stdout)
        rules = parser.grammar()
        problems = check_shape(rules)
        if parser.max_nesting > MAX_NESTING:
            problems.append(f"parentheses nested {parser.max_nesting} deep")
        if problems:
            fails.append(f"random: {json.dumps(schema)} {flags}: {problems[0]}")
            continue
        cls = jsonschema.validators.validator_for(schema)
        validator = cls(schema, format_checker=format_checker())
        sampler = Sampler(rules, rng)
        for _ in range(samples):
            try:
                text = sampler.sample()
                value = json.loads(text, parse_constant=no_constant)
            except (GrammarError, ValueError) as e:
                fails.append(f"random: {json.dumps(schema)} {flags}: {e}")
                break
            errors = list(validator.iter_errors(value))
            if errors:
                fails.append(f"random: {json.dumps(schema)} {flags}: {errors[0].message[:200]}: {text[:300]!r}")
                break
    return fails


# ---- the run ----

def grammar_for(path, flags):
    p = subprocess.run([DRIVER] + flags + [path], capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr.strip()
    return p.stdout, None


def check(path, schema, flags, n, rng, verbose):
    """Failures (strings) of one schema under FLAGS."""
    label = f"{os.path.basename(path)}{' ' + ' '.join(flags) if flags else ''}"
    text, err = grammar_for(path, flags)
    if text is None:
        return [f"{label}: the converter refused it: {err}"]
    try:
        parser = Parser(text)
        rules = parser.grammar()
    except (GrammarError, IndexError) as e:
        return [f"{label}: the grammar does not parse: {e}"]
    problems = check_shape(rules)
    if parser.max_nesting > MAX_NESTING:
        problems.append(f"parentheses nested {parser.max_nesting} deep")
    if problems:
        return [f"{label}: {p}" for p in problems]
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=format_checker())
    sampler = Sampler(rules, rng)
    fails, distinct = [], set()
    for _ in range(n):
        try:
            s = sampler.sample()
        except GrammarError as e:
            return [f"{label}: {e}"]
        distinct.add(s)
        try:
            value = json.loads(s, parse_constant=no_constant)
        except ValueError as e:
            fails.append(f"{label}: not JSON ({e}): {s!r}")
            continue
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            fails.append(f"{label}: invalid at {'/'.join(map(str, e.absolute_path)) or '(root)'}: "
                         f"{e.message[:200]}: {s[:400]!r}")
        if len(fails) >= 5:
            break
    if verbose:
        print(f"  {label}: {len(rules)} rules, {len(distinct)} distinct of {n} texts, e.g. "
              f"{rng.choice(sorted(distinct))[:160]!r}")
    return fails


def main(argv):
    verbose = "-v" in argv
    argv = [a for a in argv if a != "-v"]
    n = 200
    if "-n" in argv:
        k = argv.index("-n")
        n = int(argv[k + 1])
        del argv[k:k + 2]
    if not os.access(DRIVER, os.X_OK):
        print(f"SKIP: no {DRIVER} (make check builds it)")
        return 77
    paths = argv or sorted(glob.glob(os.path.join(SCHEMAS, "*.json")))
    if not paths:
        print(f"FAIL: no schemas in {SCHEMAS}")
        return 1
    failures, runs, failed = [], 0, 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            schema = json.load(f)
        rng = random.Random(f"{SEED}:{os.path.basename(path)}")
        for flags in ([], ["--strict"]):
            runs += 1
            fails = check(path, schema, flags, n, rng, verbose)
            failures += fails
            failed += bool(fails)
            print(f"{'FAIL' if fails else 'ok'}: {os.path.basename(path)} {' '.join(flags)}".rstrip())
    # hand-written valid instances: accepted
    inst_path = os.path.join(SCHEMAS, "instances", "valid.json")
    if not argv and os.path.exists(inst_path):
        with open(inst_path, encoding="utf-8") as f:
            table = json.load(f)
        sys.setrecursionlimit(20000)
        for name, cases in sorted(table.items()):
            path = os.path.join(SCHEMAS, name)
            with open(path, encoding="utf-8") as f:
                schema = json.load(f)
            for flags in ([], ["--strict"]):
                insts = [c["value"] for c in cases if flags != ["--strict"] or c.get("strict", True)]
                runs += 1
                fails = check_instances(path, schema, flags, insts)
                failures += fails
                failed += bool(fails)
                print(f"{'FAIL' if fails else 'ok'}: {name} {' '.join(flags)} accepts its valid "
                      f"instances".replace("  ", " "))
    # integer and number bounds, exactly; random schemas
    if not argv:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            for what, fn in (("integer and number ranges", lambda: check_ranges(tmp, random.Random(SEED))),
                             ("random schemas", lambda: check_random(tmp, random.Random(SEED), 200, 20))):
                fails = fn()
                runs += 1
                failures += fails
                failed += bool(fails)
                print(f"{'FAIL' if fails else 'ok'}: {what}")
    # response_format json_object: any object
    runs += 1
    p = subprocess.run([DRIVER, "--any"], capture_output=True, text=True)
    rules = Parser(p.stdout).grammar()
    problems = check_shape(rules)
    sampler = Sampler(rules, random.Random(SEED))
    for _ in range(n):
        if problems:
            break
        s = sampler.sample()
        try:
            if not isinstance(json.loads(s, parse_constant=no_constant), dict):
                problems.append(f"--any: not an object: {s[:200]!r}")
        except ValueError as e:
            problems.append(f"--any: not JSON ({e}): {s[:200]!r}")
    failures += problems
    failed += bool(problems)
    print(f"{'FAIL' if problems else 'ok'}: --any")
    for f in failures:
        print("  " + f)
    print(f"{runs - failed} passed, {failed} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
