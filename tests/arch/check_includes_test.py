#!/usr/bin/env python3
"""scripts/check_includes.py on made-up trees: a bad include fails with
file:line and the rule, exceptions are listed, stale ones fail, and the rules
block of the real docs/architecture.md parses (ctest arch.includes_selftest)."""
import contextlib
import io
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True  # nothing written into scripts/
sys.path.insert(0, os.path.join(REPO, 'scripts'))
import check_includes  # noqa: E402

RULES = '''# Architecture

| folder | job | may include |
|---|---|---|
| `util/` | x | y |
| `kernels/` | x | y |
| `model/` | x | y |
| `dist/` | x | y |

```include-rules
restricted: <mpi.h>
util/:
kernels/: util/
kernels/cpu/: kernels/ util/
model/: kernels/ util/
dist/: kernels/ util/
dist/mpi_comm.cpp: <mpi.h>
dist/tp.h: model/collectives.h
%s
```
'''

GOOD = {
    'util/error.h': '#pragma once\n#include <string>\n',
    'kernels/ops.h': '#include "util/error.h"\n',
    'kernels/cpu/simd.h': '#include "kernels/ops.h"\n#include "hwy/highway.h"\n',
    'kernels/cpu/simd-inl.h': '#include "simd.h"\n',
    'model/collectives.h': '#include "kernels/ops.h"\n',
    'model/model.h': '#include "model/collectives.h"\n#include <vector>\n',
    'dist/tp.h': '#include "model/collectives.h"\n',
    'dist/mpi_comm.cpp': '#include <mpi.h>\n#include "dist/tp.h"\n',
}


class CheckIncludes(unittest.TestCase):
    def run_on(self, files, exceptions=''):
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, 'docs'))
            with open(os.path.join(root, 'docs', 'architecture.md'), 'w') as f:
                f.write(RULES % exceptions)
            for path, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
                with open(os.path.join(root, path), 'w') as f:
                    f.write(text)
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = check_includes.main(['--root', root])
            return rc, out.getvalue(), err.getvalue()

    def test_good_tree_passes(self):
        rc, out, err = self.run_on(GOOD)
        self.assertEqual(rc, 0, err)

    def test_backend_header_from_model_fails(self):
        bad = dict(GOOD, **{'model/layer.cpp': '#include <cmath>\n\n#include "kernels/cpu/simd.h"\n'})
        rc, out, err = self.run_on(bad)
        self.assertEqual(rc, 1)
        self.assertIn('model/layer.cpp:3: #include "kernels/cpu/simd.h"', err)
        self.assertIn('not kernels/cpu/', err)

    def test_upward_include_fails(self):
        rc, out, err = self.run_on(dict(GOOD, **{'kernels/ops.cpp': '#include "model/model.h"\n'}))
        self.assertEqual(rc, 1)
        self.assertIn('kernels/ops.cpp:1:', err)

    def test_file_rule_is_only_for_its_file(self):
        rc, out, err = self.run_on(dict(GOOD, **{'dist/other.h': '#include "model/collectives.h"\n'}))
        self.assertEqual(rc, 1)
        self.assertIn('dist/other.h:1:', err)

    def test_restricted_system_header(self):
        rc, out, err = self.run_on(dict(GOOD, **{'dist/grid.cpp': '#  include <mpi.h>\n'}))
        self.assertEqual(rc, 1)
        self.assertIn('dist/grid.cpp:1: #include <mpi.h>: <mpi.h> is restricted to dist/mpi_comm.cpp', err)

    def test_exception_is_listed_and_stale_one_fails(self):
        bad = dict(GOOD, **{'model/layer.cpp': '#include "kernels/cpu/simd.h"\n'})
        line = 'exception: model/layer.cpp -> kernels/cpu/simd.h  # a reason'
        rc, out, err = self.run_on(bad, line)
        self.assertEqual(rc, 0, err)
        self.assertIn('known exception: model/layer.cpp -> kernels/cpu/simd.h  (a reason)', out)
        rc, out, err = self.run_on(GOOD, line)
        self.assertEqual(rc, 1)
        self.assertIn('no longer needed', err)

    def test_missing_block_or_table_folder_is_an_error(self):
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, 'docs'))
            p = os.path.join(root, 'docs', 'architecture.md')
            with open(p, 'w') as f:
                f.write('# no rules\n')
            with contextlib.redirect_stderr(io.StringIO()):
                self.assertEqual(check_includes.main(['--root', root]), 2)
            with open(p, 'w') as f:
                f.write((RULES % '') + '| `train/` | x | y |\n')
            with contextlib.redirect_stderr(io.StringIO()):
                self.assertEqual(check_includes.main(['--root', root]), 2)

    def test_real_rules_parse(self):
        with open(os.path.join(REPO, 'docs', 'architecture.md')) as f:
            rules = check_includes.parse_rules(f.read())
        for unit in ('kernels/cpu/', 'kernels/cuda/', 'dist/nccl/', 'model/', 'train/', 'tools/'):
            self.assertIn(unit, rules.units)
        self.assertIsNotNone(check_includes.allowed(rules, 'model/layer.cpp', 'kernels/cpu/simd.h', False))
        self.assertIsNone(check_includes.allowed(rules, 'model/layer.cpp', 'kernels/ops.h', False))
        self.assertIsNotNone(check_includes.allowed(rules, 'train/trainer.cpp', '<mpi.h>', True))


if __name__ == '__main__':
    unittest.main()
