#!/usr/bin/env python3
"""Holds docs/testing.md's table of environment variables to the code.

The table is the one under "Test hooks and every environment variable": one row
per variable (several, comma-separated, in one cell), the kind in the second
column. Checks, and exits 1 with one line per failure:
- the environment is read in one place: no production C++ file but
  util/env.cpp calls getenv (the others call util/env.h's env_value,
  env_text, env_flag, env_first_int);
- every variable a production C++ file reads is a row: a literal passed to
  one of those readers (each name of env_first_int's list), and every
  "WIOLA_..." string literal (tables of names: the test hooks, the refused
  former switches);
- every row names a variable that some C++ file, script or test reads (no
  stale rows; KIT_* stands for the GPU kit's own);
- the rows of kind "test hook" are exactly the hooks of util/test_hooks.cpp.

  scripts/check_env_docs.py [--root DIR]
  scripts/check_env_docs.py --selftest   (a small tree of each kind of mistake must fail)

Python 3 standard library only.
"""
import argparse
import os
import re
import sys

PRODUCTION = ("util", "kernels", "model", "data", "dist", "config", "ckpt", "train", "bench", "perf", "infer",
              "launch", "tools")
SOURCES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc", ".in")
NAME = r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+"


def files(root, dirs, suffixes):
    for d in dirs:
        for base, subdirs, names in os.walk(os.path.join(root, d)):
            subdirs[:] = [s for s in subdirs if not s.startswith(("build", "."))]
            for n in names:
                if n.endswith(suffixes):
                    yield os.path.join(base, n)


def read_by_code(root):
    """{variable: [files]} of what the production C++ reads."""
    found = {}
    for path in files(root, PRODUCTION, SOURCES):
        text = open(path, encoding="utf-8", errors="replace").read()
        names = set(re.findall(r'\b(?:getenv|env_value|env_text|env_flag)\(\s*"(' + NAME + ')"', text))
        names |= set(re.findall(r'"(WIOLA_[A-Z0-9_]+)"', text))
        for listed in re.findall(r"\benv_first_int\(\s*\{([^}]*)\}", text):
            names |= set(re.findall(r'"(' + NAME + ')"', listed))
        for n in names:
            found.setdefault(n, []).append(os.path.relpath(path, root))
    return found


def mentioned_anywhere(root, name):
    """Whether a C++ file, script or test of the repository reads `name`."""
    pat = re.compile(r"\b" + re.escape(name).replace(r"\*", r"[A-Z0-9_]+") + r"\b")
    for path in files(root, PRODUCTION + ("scripts", "tests"), SOURCES + (".sh", ".py", ".txt")):
        if path.endswith("check_env_docs.py"):
            continue
        if pat.search(open(path, encoding="utf-8", errors="replace").read()):
            return True
    return False


def getenv_outside_reader(root):
    """Production files other than util/env.cpp that call getenv."""
    out = []
    for path in files(root, PRODUCTION, SOURCES):
        rel = os.path.relpath(path, root)
        if rel != os.path.join("util", "env.cpp") and re.search(r"\bgetenv\s*\(",
                                                                 open(path, encoding="utf-8", errors="replace").read()):
            out.append(rel)
    return out


def table(root):
    """[(variables, kind)] of the documented table."""
    text = open(os.path.join(root, "docs", "testing.md"), encoding="utf-8").read()
    head = text.find("## Test hooks and every environment variable")
    if head < 0:
        sys.exit("check_env_docs.py: docs/testing.md has no section 'Test hooks and every environment variable'")
    rows = []
    for line in text[head:].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `") else []
        if len(cells) >= 2:
            rows.append((re.findall(r"`([A-Z][A-Z0-9_]*\*?)`", cells[0]), cells[1]))
    return rows


def hooks(root):
    text = open(os.path.join(root, "util", "test_hooks.cpp"), encoding="utf-8").read()
    return set(re.findall(r'\{Hook::\w+,\s*"(WIOLA_[A-Z0-9_]+)"', text))


def selftest():
    """Trees with one mistake each: every one must fail with its message."""
    import subprocess
    import tempfile
    doc = ("# T\n\n## Test hooks and every environment variable\n\n| variable | kind |\n|---|---|\n"
           "| `WIOLA_A` | setting |\n| `WIOLA_H` | test hook |\n{extra}\n## Next\n")
    hooks_cpp = '{Hook::H, "WIOLA_H", "N", "x", "y"},\n{extra}'
    code = 'env_text("WIOLA_A"); env_flag("WIOLA_H");\n{extra}'
    cases = [("", "", "", None),
             ("", "", 'env_value("WIOLA_NEW");', "reads WIOLA_NEW"),
             ("", "", 'std::getenv(name);', "calls getenv: read the environment through util/env.h"),
             ("| `WIOLA_GONE` | setting |\n", "", "", "WIOLA_GONE is in the table but nothing reads it"),
             ("", '{Hook::J, "WIOLA_J", "N", "x", "y"},', 'env_text("WIOLA_J");', "hook WIOLA_J is not a 'test hook'"),
             ('| `LAUNCH_X` | launcher |\n', "", 'env_first_int({"LAUNCH_X"});', None),
             ("", "", 'env_first_int({"LAUNCH_X", "LAUNCH_Y"});', "reads LAUNCH_Y")]
    failed = 0
    for extra_doc, extra_hook, extra_code, expect in cases:
        with tempfile.TemporaryDirectory() as t:
            for rel, body in (("docs/testing.md", doc.replace("{extra}", extra_doc)),
                              ("util/test_hooks.cpp", hooks_cpp.replace("{extra}", extra_hook)),
                              ("kernels/a.cpp", code.replace("{extra}", extra_code))):
                os.makedirs(os.path.dirname(os.path.join(t, rel)), exist_ok=True)
                open(os.path.join(t, rel), "w").write(body)
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--root", t], capture_output=True, text=True)
            ok = r.returncode == 0 if expect is None else (r.returncode == 1 and expect in r.stdout)
            print(("ok    " if ok else "WRONG ") + (expect or "a tree in step passes") + ": exit " + str(r.returncode)
                  + ("" if ok else "\n" + r.stdout))
            failed += not ok
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args()
    if args.selftest:
        return selftest()
    root = args.root
    code, rows = read_by_code(root), table(root)
    documented = {v for names, _ in rows for v in names}
    wildcards = [v[:-1] for v in documented if v.endswith("*")]
    errors = [f"{rel}: calls getenv: read the environment through util/env.h (env_value, env_text, env_flag, "
              "env_first_int), the one reader" for rel in getenv_outside_reader(root)]
    for var, where in sorted(code.items()):
        if var not in documented and not any(var.startswith(w) for w in wildcards):
            errors.append(f"{where[0]}: reads {var}, which docs/testing.md's table of environment variables lacks")
    for var in sorted(documented):
        if var not in code and not mentioned_anywhere(root, var):
            errors.append(f"docs/testing.md: {var} is in the table but nothing reads it")
    documented_hooks = {v for names, kind in rows if kind == "test hook" for v in names}
    declared = hooks(root)
    for var in sorted(declared - documented_hooks):
        errors.append(f"util/test_hooks.cpp: hook {var} is not a 'test hook' row of docs/testing.md")
    for var in sorted(documented_hooks - declared):
        errors.append(f"docs/testing.md: {var} is a 'test hook' row but not a hook of util/test_hooks.cpp")
    for e in errors:
        print(e)
    if not errors:
        print(f"check_env_docs.py: {len(code)} variables read by the C++ code, {len(documented)} documented, "
              f"{len(declared)} test hooks: all in step")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
