#!/usr/bin/env python3
"""The include roots hold: a wrong include fails to compile (ctest arch.include_roots).

Each library target compiles against its own include root (scripts/include_roots.py,
made from docs/architecture.md's include-rules block). This compiles small probe
files with the exact compile command of a real source of a layer (from the build's
compile_commands.json, -fsyntax-only) and expects:
  - an include the layer may not make (model/ -> train/, model/ -> kernels/cpu/,
    kernels/ -> model/, train/ -> the backends and NCCL, data/ -> model/) to fail,
    with the compiler's "no such file" for that header;
  - an allowed include (model/ -> kernels/ops.h, train/ -> config/, ...) to compile,
    so that a broken command cannot pass the negative cases.

  include_roots_test.py --build BUILD [--root REPO]
"""
import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import time

# (folder of the layer's source, include, compiles?)
CASES = [
    ('model', 'kernels/ops.h', True),
    ('model', 'train/trainer.h', False),
    ('model', 'kernels/cpu/cpu_ops.h', False),
    ('model', 'dist/comm.h', False),
    ('kernels', 'util/error.h', True),
    ('kernels', 'model/model.h', False),
    ('kernels', 'kernels/cpu/cpu_ops.h', False),
    ('data', 'model/config.h', False),
    ('dist', 'model/collectives.h', True),  # dist/tp_collectives.h's file rule
    ('dist', 'dist/nccl/nccl_comm.h', False),
    ('train', 'config/run_config.h', True),
    ('train', 'dist/nccl/nccl_comm.h', False),
    ('train', 'kernels/cuda/cuda_ops.h', False),
    ('train', 'kernels/cpu/cpu_ops.h', False),
    ('train', 'launch/cli.h', False),
]


def pick_command(entries, root, folder):
    """A compile command of a source directly in folder/ (sorted: the same one each run)."""
    mine = []
    for e in entries:
        f = os.path.normpath(os.path.join(e['directory'], e['file']))
        if os.path.dirname(f) == os.path.join(root, folder) and f.endswith('.cpp'):
            mine.append((f, e))
    # kernels/backend.cpp has a rule of its own (it may include the backends)
    mine = [m for m in sorted(mine, key=lambda m: m[0]) if not m[0].endswith('/kernels/backend.cpp')]
    if not mine:
        return None, None
    return mine[0]


def probe_command(entry, src, probe):
    args = entry['arguments'] if 'arguments' in entry else shlex.split(entry['command'])
    if os.path.basename(args[0]) == 'ccache':
        args = args[1:]
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ('-o', '-MT', '-MF', '-MQ'):
            skip = True
            continue
        if a in ('-c', '-MD', '-MMD') or os.path.normpath(os.path.join(entry['directory'], a)) == src:
            continue
        out.append(a)
    return out + ['-fsyntax-only', probe]


def run_case(entries, root, probes, n, folder, inc, ok):
    if not os.path.isfile(os.path.join(root, inc)):
        return 'case %d: %s does not exist: the case would prove nothing' % (n, inc)
    src, entry = pick_command(entries, root, folder)
    if entry is None:
        return 'case %d: no compile command for a source in %s/' % (n, folder)
    cmd = probe_command(entry, src, '')
    if not any('include_roots' in a for a in cmd):
        return 'case %d: %s compiles without an include root (%s)' % (n, os.path.relpath(src, root), ' '.join(cmd))
    d = os.path.join(probes, folder)
    os.makedirs(d, exist_ok=True)
    probe = os.path.join(d, 'probe_%d.cpp' % n)
    with open(probe, 'w') as fh:
        fh.write('// %s/ including %s: %s\n#include "%s"\n' % (folder, inc, 'allowed' if ok else 'refused', inc))
    cmd = probe_command(entry, src, probe)
    p = subprocess.run(cmd, cwd=entry['directory'], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    what = '%s/ (as %s) including "%s"' % (folder, os.path.relpath(src, root), inc)
    if ok and p.returncode != 0:
        return '%s should compile and does not:\n%s' % (what, p.stdout[-2000:])
    if not ok:
        if p.returncode == 0:
            return '%s compiles: the include root exposes it' % what
        if inc not in p.stdout or not ('No such file' in p.stdout or 'not found' in p.stdout):
            return '%s fails, but not for the missing header:\n%s' % (what, p.stdout[-2000:])
    print('ok: %s %s' % (what, 'compiles' if ok else 'fails: no such file'))
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--build', required=True)
    ap.add_argument('--root', default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    a = ap.parse_args(argv)
    t0 = time.time()
    with open(os.path.join(a.build, 'compile_commands.json')) as fh:
        entries = json.load(fh)
    root = os.path.abspath(a.root)
    probes = os.path.join(os.path.abspath(a.build), 'tests', 'arch', 'include_probes')
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        errors = [e for e in pool.map(lambda c: run_case(entries, root, probes, *c),
                                      [(n,) + c for n, c in enumerate(CASES)]) if e]
    for e in errors:
        print('FAIL: ' + e, file=sys.stderr)
    print('include_roots_test: %d of %d cases hold (%.1f s)' % (len(CASES) - len(errors), len(CASES),
                                                               time.time() - t0))
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main())
