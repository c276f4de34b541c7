#!/usr/bin/env python3
"""check_deps.py - the layering rules of llmd's source, checked on its #includes.

    tools/check_deps.py [SRCDIR]     exit 0 when every rule holds, 1 when not

Each quoted #include is resolved to the file of ours it names (the including
file's own folder first, as the compiler does, then the whole tree) and the
edge is checked against what the including folder may use:

    libipc/          libipc only: the wire, the ring, the helpers below everything
    kernels/         kernels and libipc, never daemon/ or client/
    daemon/engine/   the engine, kernels and libipc: no server header
    daemon/          the server: anything but client/
    client/          libipc and client/ only (libllm, llm-client, llmctl)
    tools/, tests/   anything

Then modules (a name's .c/.cc/.cu with its .h) must not include each other
in a circle: calls go one way.  Generated headers (config.h) and system
headers (<...>) are not ours and are skipped.
"""
import os
import re
import sys

SOURCE_EXT = ('.c', '.h', '.cc', '.cu', '.cuh')
FOLDERS = ['libipc', 'kernels', 'daemon/engine', 'daemon', 'client', 'tools', 'tests']
ALLOWED = {
    'libipc': {'libipc'},
    'kernels': {'kernels', 'libipc'},
    'daemon/engine': {'daemon/engine', 'kernels', 'libipc'},
    'daemon': {'daemon', 'daemon/engine', 'kernels', 'libipc'},
    'client': {'client', 'libipc'},
    'tools': None,
    'tests': None,
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer(path):
    """The rule folder a source path belongs to (its longest listed prefix)."""
    for f in FOLDERS:
        if path == f or path.startswith(f + '/'):
            return f
    return None


def sources(root):
    out = []
    for f in FOLDERS:
        top = os.path.join(root, f)
        for d, dirs, files in os.walk(top):
            dirs[:] = [x for x in dirs if not x.startswith('.')]
            for name in files:
                if name.endswith(SOURCE_EXT):
                    out.append(os.path.relpath(os.path.join(d, name), root))
    return sorted(set(out))


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..')
    files = sources(root)
    by_name = {}
    for p in files:
        by_name.setdefault(os.path.basename(p), []).append(p)

    problems = []
    edges = {}  # module -> set of modules it includes

    def module(p):
        return os.path.splitext(p)[0]

    for p in files:
        with open(os.path.join(root, p), encoding='utf-8', errors='replace') as fh:
            text = fh.read()
        here = os.path.dirname(p)
        for inc in INCLUDE.findall(text):
            local = os.path.normpath(os.path.join(here, inc))
            if local in files or os.path.exists(os.path.join(root, local)):
                target = local
            else:
                cands = [c for c in by_name.get(os.path.basename(inc), []) if c.endswith(inc)]
                if not cands:
                    continue  # generated or not ours
                if len(cands) > 1:
                    problems.append('%s: "%s" could be any of %s: give them different names'
                                    % (p, inc, ', '.join(cands)))
                    continue
                target = cands[0]
            src, dst = layer(p), layer(target)
            allowed = ALLOWED.get(src)
            if allowed is not None and dst not in allowed:
                problems.append('%s includes %s: %s/ may use only %s'
                                % (p, target, src, ', '.join(sorted(x + '/' for x in allowed))))
            if module(target) != module(p):
                edges.setdefault(module(p), set()).add(module(target))

    # Circles among modules: a depth-first walk that reports each back edge's loop once.
    seen_loops = set()
    state = {}

    def walk(m, stack):
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                loop = stack[stack.index(n):]
                key = frozenset(loop)
                if key not in seen_loops:
                    seen_loops.add(key)
                    problems.append('circle: ' + ' -> '.join(loop + [n]))
            elif n not in state:
                walk(n, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            walk(m, [])

    for line in problems:
        print('check_deps: ' + line, file=sys.stderr)
    if problems:
        print('check_deps: %d problem(s) in %d files' % (len(problems), len(files)), file=sys.stderr)
        return 1
    print('check_deps: %d files, the layering rules hold, no circles' % len(files))
    return 0


if __name__ == '__main__':
    sys.exit(main())
