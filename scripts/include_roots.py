#!/usr/bin/env python3
"""Makes each library target's include root from docs/architecture.md's table.

CMake runs this at configure time (the top CMakeLists.txt, wiola_include_root):
every library target compiles against BUILD/include_roots/<target>/ instead of
the repository root. A root holds symbolic links to the folders (and single
files) the target's sources may include under the include-rules block (the one
that scripts/check_includes.py holds every include against), so a wrong
include fails to compile: "model/model.h" is not there for kernels/, nor
"train/..." or "kernels/cpu/..." for model/.

What a root exposes, for the units its sources belong to (a source's unit, and
the source's own file rule, as check_includes.py reads them):
  - those units themselves and their rules' entries (a unit `x/` is its own
    files, not its sub-units: kernels/ does not bring kernels/cpu/; `x/**` is
    all of x/; `*` every folder of the table; <headers> are left to the
    system include path),
  - the file rules of headers in an exposed unit (dist/tp_collectives.h's
    model/collectives.h) and the exceptions of its files,
  - and the closure: the entries of every unit exposed, because a header that
    a target may include compiles only with what that header includes (train/
    may include config/, whose headers include perf/ and dist/).
So the compiler holds each library to the closure of its rules, and
check_includes.py (ctest arch.includes) holds every file to its direct rule
(kernels/backend.cpp alone includes kernels/cpu/; <mpi.h> only in
dist/mpi_comm.cpp). docs/architecture.md says which check does what.

  include_roots.py --root SRC --binary BIN --spec FILE --out DIR

FILE: one line per target, "TARGET<tab>SOURCE_DIR<tab>SRC1;SRC2;..." (absolute
paths; a source under BIN, a generated one, counts as a file of SOURCE_DIR).
Prints the folders holding links to single files, which CMake watches
(CONFIGURE_DEPENDS) so that a new header there reconfigures. Exit 2 when the
rules cannot be read. Python 3 standard library only.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_includes  # noqa: E402  (the one parser of the include-rules block)

HEADER_SUFFIXES = ('.h', '.hpp', '.cuh', '.inc')


def rel_source(path, root, binary, source_dir):
    path = os.path.normpath(path)
    if binary and (path + os.sep).startswith(os.path.normpath(binary) + os.sep):
        path = os.path.join(source_dir, os.path.basename(path))
    return os.path.relpath(path, root).replace(os.sep, '/')


def exposure(rules, sources):
    """(units, files, trees, everything) a target with these sources may see."""
    units, files, trees = set(), set(), set()
    everything = False
    keys = []
    for src in sources:
        u = rules.unit_of(src)
        units.add(u)
        keys.append(u)
        if src in rules.allow:
            keys.append(src)
        for f, inc, _, _ in rules.exceptions:
            if f == src:
                files.add(inc)
                keys.append(rules.unit_of(inc) + '#entries')
    seen = set()
    while keys:
        k = keys.pop()
        if k in seen:
            continue
        seen.add(k)
        if k.endswith('#entries'):  # a single file's unit: its entries, not the unit
            entries = rules.allow.get(k[:-len('#entries')], set())
        else:
            entries = set(rules.allow.get(k, set()))
            if k.endswith('/'):  # the headers of the unit carry their file rules and exceptions
                for f in rules.allow:
                    if not f.endswith('/') and f.endswith(HEADER_SUFFIXES) and rules.unit_of(f) == k:
                        keys.append(f)
                for f, inc, _, _ in rules.exceptions:
                    if f.endswith(HEADER_SUFFIXES) and rules.unit_of(f) == k:
                        entries.add(inc)
        for e in entries:
            if e.startswith('<'):
                continue
            if e == '*':
                everything = True
            elif e.endswith('/**'):
                trees.add(e[:-2])
                for u in rules.units:
                    if u.startswith(e[:-2]):
                        keys.append(u)
            elif e.endswith('/'):
                units.add(e)
                keys.append(e)
            else:
                files.add(e)
                keys.append(rules.unit_of(e) + '#entries')
    return units, files, trees, everything


def links(root, rules, units, files, trees, everything):
    """{relative path in the include root: what it links to}, and the folders linked file by file."""
    if everything:
        return {t: t for t in sorted(rules.top) if os.path.isdir(os.path.join(root, t))}, []

    def seen(rel, is_dir):
        if any((rel + '/').startswith(t) for t in trees):
            return True
        if not is_dir:
            return rules.unit_of(rel) in units or rel in files
        return False

    out, by_file = {}, []

    def walk(d):  # d: a folder (relative, no slash) that is not wholly exposed
        full = os.path.join(root, d)
        whole = []
        for name in sorted(os.listdir(full)):
            rel = d + '/' + name
            if os.path.isdir(os.path.join(root, rel)):
                if all_exposed(rel):
                    out[rel] = rel
                elif any_exposed(rel):
                    walk(rel)
            elif seen(rel, False):
                whole.append(rel)
        for rel in whole:
            out[rel] = rel
        if whole:
            by_file.append(d)

    def all_exposed(d):
        if seen(d, True):
            return True
        # a unit under d that is not exposed (even an empty one) makes d partial
        if any(u.startswith(d + '/') and u not in units for u in rules.units):
            return False
        for base, dirs, fs in os.walk(os.path.join(root, d)):
            for f in fs:
                rel = os.path.relpath(os.path.join(base, f), root).replace(os.sep, '/')
                if not seen(rel, False):
                    return False
        return True

    def any_exposed(d):
        if seen(d, True):
            return True
        if any(u.startswith(d + '/') for u in units) or any(f.startswith(d + '/') for f in files):
            return True
        return False

    for top in sorted(rules.top):
        if not os.path.isdir(os.path.join(root, top)):
            continue
        if all_exposed(top):
            out[top] = top
        elif any_exposed(top):
            walk(top)
    return out, by_file


def sync(out_dir, root, wanted):
    """Makes out_dir hold exactly the links in wanted (rel -> source rel), touching only what changed."""
    want = {os.path.join(out_dir, rel): os.path.join(root, src) for rel, src in wanted.items()}
    if os.path.isdir(out_dir):
        for base, dirs, fs in os.walk(out_dir, topdown=False):
            for name in fs + dirs:
                p = os.path.join(base, name)
                if os.path.islink(p):
                    if want.get(p) != os.readlink(p):
                        os.unlink(p)
                elif os.path.isdir(p):
                    if not any(w.startswith(p + os.sep) for w in want):
                        os.rmdir(p)
                else:
                    os.unlink(p)
    for link, target in sorted(want.items()):
        if os.path.islink(link):
            continue
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(target, link)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--root', required=True, help='the repository')
    ap.add_argument('--binary', default='', help='the build folder (generated sources)')
    ap.add_argument('--spec', required=True)
    ap.add_argument('--out', required=True, help='BUILD/include_roots')
    a = ap.parse_args(argv)
    root = os.path.abspath(a.root)
    rules_path = os.path.join(root, 'docs', 'architecture.md')
    try:
        with open(rules_path, encoding='utf-8') as fh:
            rules = check_includes.parse_rules(fh.read())
    except (OSError, check_includes.RulesError) as e:
        print('include_roots: %s: %s' % (rules_path, e), file=sys.stderr)
        return 2
    watch = set()
    with open(a.spec, encoding='utf-8') as fh:
        for line in fh:
            if not line.strip():
                continue
            target, source_dir, srcs = line.rstrip('\n').split('\t')
            sources = sorted({rel_source(s, root, a.binary, source_dir) for s in srcs.split(';') if s})
            wanted, by_file = links(root, rules, *exposure(rules, sources))
            sync(os.path.join(a.out, target), root, wanted)
            watch.update(by_file)
    for d in sorted(watch):
        print(os.path.join(root, d))
    return 0


if __name__ == '__main__':
    sys.exit(main())
