#!/usr/bin/env python3
"""Holds the production code to the size rules of docs/architecture.md.

No function of the production folders longer than 100 lines, unless the
comment right above it says why it is not split, with the marker

    // long-function: <why>

(kernels whose length is their work, say: one fused pass over a tile), and no
source file longer than 1,000 lines. Functions are found by lizard (PyPI,
installed by scripts/setup.sh), which reads C and C++; .cu, .cuh and .inc
files are read as C++. A function's length is lizard's: its first line (the
one with its name) to its closing brace. The marker belongs to the comment
block above the declaration (template and attribute lines between are fine)
and needs a reason after the colon.

Exit 0: within the rules; 1: a function or file over its limit (file:line,
the function and its length), or a marker without a reason; 77: lizard is not
installed (ctest reports the test skipped, and this says how to install it).

  scripts/check_function_length.py [--root DIR] [--max-function N] [--max-file N]
  scripts/check_function_length.py --selftest   (small made-up trees: what must fail fails)
"""
import argparse
import os
import re
import sys

PRODUCTION = ("bench", "ckpt", "config", "data", "dist", "infer", "kernels", "launch", "model", "perf", "train",
              "util", "tools")
CXX = (".h", ".hpp", ".c", ".cc", ".cpp", ".cu", ".cuh", ".inc")
READ_AS_CXX = (".cu", ".cuh", ".inc")  # lizard does not know these suffixes
OTHER_SOURCES = (".py", ".sh", ".in", ".sbatch")  # the file rule only
MAX_FUNCTION = 100
MAX_FILE = 1000
MARKER = "long-function:"
SKIP_RC = 77
INSTALL_HINT = ("lizard is not installed for " + sys.executable + "; the function-length check is skipped. "
                "Install it with scripts/setup.sh (as root), or: " + sys.executable
                + " -m pip install --break-system-packages lizard")


def source_files(root):
    for d in PRODUCTION:
        for base, subdirs, names in os.walk(os.path.join(root, d)):
            subdirs[:] = sorted(s for s in subdirs if not s.startswith(("build", ".")))
            for n in sorted(names):
                if n.endswith(CXX + OTHER_SOURCES):
                    yield os.path.join(base, n)


def declaration_top(lines, start):
    """Index of the first line of the declaration whose name is on lines[start]
    (0-based): template, attribute and return-type lines above it count."""
    i = start
    while i > 0:
        prev = lines[i - 1].strip()
        if not prev or prev.startswith(("//", "/*", "*", "#")) or prev.endswith((";", "{", "}", ":")):
            break
        i -= 1
    return i


def marker_reason(lines, start):
    """The reason of the marker in the comment block above the function at
    lines[start] (0-based); None: no marker; "": a marker without a reason."""
    i = declaration_top(lines, start) - 1
    while i >= 0 and lines[i].strip().startswith("//"):
        text = lines[i].strip()[2:].strip()
        if text.startswith(MARKER):
            return text[len(MARKER):].strip()
        i -= 1
    return None


def check(root, max_function=MAX_FUNCTION, max_file=MAX_FILE):
    """(problems, justified): lines 'file:line: ...' that break the rules, and
    the long functions a marker justifies."""
    import lizard
    analyzer = lizard.FileAnalyzer(lizard.get_extensions([]))
    problems, justified = [], []
    for path in source_files(root):
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        text = open(path, encoding="utf-8", errors="replace").read()
        lines = text.splitlines()
        if len(lines) > max_file:
            problems.append(f"{rel}:1: file is {len(lines)} lines (limit {max_file}): split it by component")
        if not path.endswith(CXX):
            continue
        name = path + ".cpp" if path.endswith(READ_AS_CXX) else path
        for fn in analyzer.analyze_source_code(name, text).function_list:
            if fn.length <= max_function:
                continue
            where = f"{rel}:{fn.start_line}: function {fn.name} is {fn.length} lines (limit {max_function})"
            reason = marker_reason(lines, fn.start_line - 1)
            if reason is None:
                problems.append(where + f": split it into named parts, or justify it with '// {MARKER} <why>'"
                                        " in the comment above it")
            elif not reason:
                problems.append(where + f": its '// {MARKER}' marker gives no reason")
            else:
                justified.append(where + ": " + reason)
    return problems, justified


def selftest():
    """Made-up trees, one case each: what breaks a rule must fail, naming it."""
    import tempfile

    def body(n, head="int f() {"):  # a function of n lines
        return head + "\n" + "  x();\n" * (n - 2) + "}\n"

    kernel = "template <int N>\n__global__ void __launch_bounds__(128)\n    k_long(float* p) {\n"
    cases = [
        ("a 100-line function passes", {"model/a.cpp": body(100)}, None),
        ("a 101-line function fails", {"model/a.cpp": "// f.\n" + body(101)},
         "model/a.cpp:2: function f is 101 lines (limit 100)"),
        ("a member function is named", {"train/b.cpp": "\n" + body(150, "void Trainer::run() {")},
         "train/b.cpp:2: function Trainer::run is 150 lines"),
        ("the marker justifies it", {"kernels/cpu/c.cpp": "// One pass.\n// long-function: one fused pass\n"
                                     + body(120)}, None),
        ("a marker needs a reason", {"kernels/cpu/c.cpp": "// long-function:\n" + body(120)}, "gives no reason"),
        ("a marker of another function does not count",
         {"data/d.cpp": "// long-function: g is long\nint g() { return 1; }\n" + body(101)},
         "data/d.cpp:3: function f is 101 lines"),
        (".cu kernels are read", {"kernels/cuda/e.cu": kernel + "  x();\n" * 110 + "}\n"},
         "kernels/cuda/e.cu:3: function k_long is 112 lines"),
        (".cu kernel justified above its template line",
         {"kernels/cuda/e.cu": "// long-function: the tile loop is one pass\n" + kernel + "  x();\n" * 110 + "}\n"},
         None),
        ("a file over 1,000 lines fails", {"util/f.h": "int a;\n" * 1001}, "util/f.h:1: file is 1001 lines"),
        ("a 1,000-line file passes", {"util/f.h": "int a;\n" * 1000}, None),
        ("folders outside production are not held", {"tests/g.cpp": body(300)}, None),
    ]
    failed = 0
    for what, tree, expect in cases:
        with tempfile.TemporaryDirectory() as t:
            for rel, text in tree.items():
                os.makedirs(os.path.dirname(os.path.join(t, rel)), exist_ok=True)
                with open(os.path.join(t, rel), "w") as f:
                    f.write(text)
            problems, _ = check(t)
            ok = not problems if expect is None else len(problems) == 1 and expect in problems[0]
            print(("ok    " if ok else "WRONG ") + what + ("" if ok else f": expected {expect!r}, got {problems}"))
            failed += not ok
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--max-function", type=int, default=MAX_FUNCTION)
    ap.add_argument("--max-file", type=int, default=MAX_FILE)
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args()
    try:
        import lizard  # noqa: F401
    except ImportError:
        print(INSTALL_HINT)
        return SKIP_RC
    if a.selftest:
        return selftest()
    problems, justified = check(a.root, a.max_function, a.max_file)
    for j in justified:
        print("justified: " + j)
    for p in problems:
        print(p)
    if problems:
        print(f"check_function_length: {len(problems)} over the limits (docs/architecture.md, 'Function and file size')")
        return 1
    print(f"check_function_length: every function within {a.max_function} lines (or justified), "
          f"every file within {a.max_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
