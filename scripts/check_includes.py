#!/usr/bin/env python3
"""Holds every #include of the production folders against docs/architecture.md.

The rules are the fenced ```include-rules block under "Folders and the include
rule" in docs/architecture.md (its syntax is explained there); this script has
no rules of its own. Exit 0: every include is allowed (known exceptions are
listed); 1: a violation (file:line and the rule broken) or a stale exception;
2: the rules cannot be read.

  scripts/check_includes.py [--root DIR] [--rules FILE] [--quiet]

--root defaults to the repository holding this script, --rules to
ROOT/docs/architecture.md. Python 3 standard library only.
"""
import argparse
import os
import re
import sys

SOURCE_SUFFIXES = ('.h', '.hpp', '.c', '.cc', '.cpp', '.cu', '.cuh', '.inc', '.h.in', '.cpp.in')
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
FENCE_OPEN = '```include-rules'


class RulesError(Exception):
    pass


class Rules:
    def __init__(self):
        self.units = []          # folder units, "x/" or "x/y/"
        self.allow = {}          # unit or file -> set of entries
        self.restricted = set()  # "<h.h>": system headers only where a rule names them
        self.exceptions = []     # (file, include, reason, rules line)
        self.top = set()         # top-level project folders ("x")

    def unit_of(self, path):
        """The longest unit that holds path (a repository-relative file)."""
        best = None
        for u in self.units:
            if path.startswith(u) and (best is None or len(u) > len(best)):
                best = u
        if best is None:
            best = path.split('/', 1)[0] + '/'
        return best


def parse_rules(text):
    lines = text.splitlines()
    try:
        start = next(i for i, l in enumerate(lines) if l.strip() == FENCE_OPEN)
    except StopIteration:
        raise RulesError('no ```include-rules block')
    rules = Rules()
    for n in range(start + 1, len(lines)):
        raw = lines[n]
        if raw.strip().startswith('```'):
            break
        line = raw.split('#', 1)[0].strip() if not raw.lstrip().startswith('exception:') else raw.strip()
        if not line:
            continue
        where = 'rules line %d' % (n + 1)
        if line.startswith('exception:'):
            body = line[len('exception:'):]
            m = re.match(r'\s*(\S+)\s*->\s*(\S+)\s*#\s*(.+)$', body)
            if not m:
                raise RulesError('%s: want "exception: FILE -> INCLUDE  # reason": %s' % (where, raw))
            rules.exceptions.append((m.group(1), m.group(2), m.group(3).strip(), n + 1))
            continue
        if ':' not in line:
            raise RulesError('%s: want "KEY: ENTRIES": %s' % (where, raw))
        key, rest = line.split(':', 1)
        key = key.strip()
        entries = rest.split()
        if key == 'restricted':
            for e in entries:
                if not (e.startswith('<') and e.endswith('>')):
                    raise RulesError('%s: restricted takes <headers>: %s' % (where, e))
            rules.restricted.update(entries)
            continue
        for e in entries:
            if not (e == '*' or e.endswith('/') or e.endswith('/**') or (e.startswith('<') and e.endswith('>'))
                    or '.' in os.path.basename(e)):
                raise RulesError('%s: entry %r is not a folder/, folder/**, file, * or <header>' % (where, e))
        if key.endswith('/'):
            if key in rules.units:
                raise RulesError('%s: %s has two rules' % (where, key))
            rules.units.append(key)
            rules.top.add(key.split('/', 1)[0])
        rules.allow.setdefault(key, set()).update(entries)
    else:
        raise RulesError('the ```include-rules block is not closed')
    if not rules.units:
        raise RulesError('the ```include-rules block names no folder')
    for key in rules.allow:
        if not key.endswith('/') and rules.unit_of(key) not in rules.units:
            raise RulesError('file rule %s is in no folder with a rule' % key)
    return rules


def table_folders(text):
    """Top-level folders of the prose table (first column, `x/`)."""
    out = set()
    for l in text.splitlines():
        m = re.match(r'^\|\s*`([a-z_]+)/`\s*\|', l)
        if m:
            out.add(m.group(1))
    return out


def allowed(rules, src, target, system):
    """Whether src may include target: None if yes, else the rule broken (a string)."""
    src_unit = rules.unit_of(src)
    entries = set(rules.allow.get(src_unit, set())) | rules.allow.get(src, set())
    if system:
        if target in entries:
            return None
        holders = sorted(k for k, v in rules.allow.items() if target in v)
        return '%s is restricted to %s' % (target, ', '.join(holders) if holders else 'no file')
    tunit = rules.unit_of(target)
    if tunit == src_unit or target in entries:
        return None
    if '*' in entries and tunit.split('/', 1)[0] in rules.top:
        return None
    for e in entries:
        if e.endswith('/') and e == tunit:
            return None
        if e.endswith('/**') and tunit.startswith(e[:-2]):
            return None
    shown = ' '.join(sorted(e for e in entries if not e.startswith('<'))) or 'nothing else'
    return '%s may include %s (and itself), not %s' % (
        src_unit + (' (with the rule of ' + src + ')' if src in rules.allow else ''), shown, tunit)


def source_files(root, rules):
    for top in sorted(rules.top):
        base = os.path.join(root, top)
        for d, dirs, files in os.walk(base):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(SOURCE_SUFFIXES):
                    yield os.path.relpath(os.path.join(d, f), root).replace(os.sep, '/')


def resolve(root, rules, src, inc):
    """Repository-relative path of a quoted include, or None for a library's."""
    local = os.path.normpath(os.path.join(os.path.dirname(src), inc)).replace(os.sep, '/')
    if not local.startswith('../') and os.path.isfile(os.path.join(root, local)):
        return local
    first = inc.split('/', 1)[0]
    if '/' in inc and first in rules.top:
        return os.path.normpath(inc).replace(os.sep, '/')
    return None


def check(root, rules, quiet=False):
    violations = []
    used = set()
    exc = {(f, i): (r, ln) for f, i, r, ln in rules.exceptions}
    for src in source_files(root, rules):
        with open(os.path.join(root, src), encoding='utf-8', errors='replace') as fh:
            for n, line in enumerate(fh, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                kind, inc = m.groups()
                if kind == '<':
                    target = '<%s>' % inc
                    if target not in rules.restricted:
                        continue
                    system = True
                else:
                    target = resolve(root, rules, src, inc)
                    if target is None:
                        continue
                    system = False
                why = allowed(rules, src, target, system)
                if why is None:
                    continue
                key = (src, target)
                if key in exc:
                    used.add(key)
                    continue
                violations.append('%s:%d: #include %s%s%s: %s' % (
                    src, n, m.group(1), inc, '"' if kind == '"' else '>', why))
    stale = ['docs rules line %d: exception %s -> %s no longer needed (the include is gone or allowed): '
             'delete it' % (ln, f, i) for (f, i), (r, ln) in sorted(exc.items()) if (f, i) not in used]
    if not quiet:
        for (f, i), (r, ln) in sorted(exc.items()):
            if (f, i) in used:
                print('known exception: %s -> %s  (%s)' % (f, i, r))
    return violations, stale


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--root', default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument('--rules', help='default: ROOT/docs/architecture.md')
    ap.add_argument('--quiet', action='store_true', help='do not list the known exceptions')
    a = ap.parse_args(argv)
    rules_path = a.rules or os.path.join(a.root, 'docs', 'architecture.md')
    try:
        with open(rules_path, encoding='utf-8') as fh:
            text = fh.read()
        rules = parse_rules(text)
    except (OSError, RulesError) as e:
        print('check_includes: %s: %s' % (rules_path, e), file=sys.stderr)
        return 2
    missing = sorted(table_folders(text) - rules.top)
    if missing:
        print('check_includes: %s: the table names %s, the include-rules block does not' % (
            rules_path, ', '.join(m + '/' for m in missing)), file=sys.stderr)
        return 2
    violations, stale = check(a.root, rules, a.quiet)
    for v in violations + stale:
        print(v, file=sys.stderr)
    if violations or stale:
        print('check_includes: %d include(s) break docs/architecture.md\'s table, %d stale exception(s); '
              'fix the include, or add an exception line with its reason (docs/architecture.md)'
              % (len(violations), len(stale)), file=sys.stderr)
        return 1
    print('check_includes: every include follows docs/architecture.md (%d known exception(s))'
          % len(rules.exceptions))
    return 0


if __name__ == '__main__':
    sys.exit(main())
