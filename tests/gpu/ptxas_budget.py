#!/usr/bin/env python3
"""Register, spill and shared-memory budgets of every CUDA kernel, checked
without a GPU (ctest `ptxas_budget`, issue: the GPU step at cuBLAS peak).

Reads ptxas's resource report of each kernels/cuda/*.cu for one architecture
and compares every kernel's figures with tests/gpu/ptxas_budget.json:
  registers     at most the budget (more registers, fewer blocks per SM)
  spill_bytes   spill stores + loads, at most the budget (0 for most)
  smem          static shared memory in bytes, at most the budget
A kernel without a budget, or a budget whose kernel is gone, fails too: a
new kernel gets its budget in the same change (--write rewrites the file from
what ptxas reports now; review the diff). Kernels are named by file and
demangled name without the anonymous namespace's per-build hash.

    ptxas_budget.py --nvcc NVCC --budget tests/gpu/ptxas_budget.json kernels/cuda/*.cu [--write]
    ptxas_budget.py --reports DIR --budget ... kernels/cuda/*.cu [--write]

The report comes from the build when it compiled sm_90a (--reports: the
objects' folder, where kernels/cuda/nvcc_resource_report.sh left each
object's report as NAME.cu.o.ptxas; what ctest runs), else from compiling
each file again here (nvcc --resource-usage -cubin).
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def short_name(demangled):
    """`void wiola::cuda::(anonymous namespace)::k<64>(args)` -> `k<64>`."""
    name = re.sub(r"^void ", "", demangled)
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameter list: the first "(" outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and not name.startswith("(anonymous", i):
            cut = i
            break
    name = name[:cut]
    # CUB's versioned namespace names the architectures compiled (cub::CUB_300001_SM_800_900::):
    # the same kernel whatever the build's list.
    name = re.sub(r"\bCUB_\d+_SM_\d+(_\d+)*::", "", name)
    return re.sub(r"(wiola::cuda(_emu)?::|\(anonymous namespace\)::)", "", name)


def parse_report(text, arch, cu):
    """ptxas's report (its "ptxas info" lines) -> {"FILE KERNEL": figures} of `arch`'s kernels."""
    kernels, current = {}, None
    for line in text.splitlines():
        if m := ENTRY.search(line):
            current = m.group(1) if m.group(2) == arch else None
            if current:
                kernels[current] = {"registers": 0, "spill_bytes": 0, "smem": 0}
        elif current and (m := SPILL.search(line)):
            kernels[current]["spill_bytes"] = int(m.group(1)) + int(m.group(2))
        elif current and (m := USED.search(line)):
            kernels[current]["registers"] = int(m.group(1))
            kernels[current]["smem"] = int(m.group(2) or 0)
    mangled = list(kernels)
    return {f"{os.path.basename(cu)} {short_name(d)}": kernels[m] for m, d in zip(mangled, demangle(mangled))}


def compile_report(nvcc, arch, include, cu):
    cmd = [nvcc, "-std=c++20", f"-I{include}", f"-arch={arch}", "--expt-relaxed-constexpr", "--resource-usage",
           "-cubin", "-o", os.devnull, cu]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"ptxas_budget: {' '.join(cmd)} failed:\n{r.stderr}")
    return parse_report(r.stderr, arch, cu)


def build_report(reports, arch, cu):
    path = os.path.join(reports, os.path.basename(cu) + ".o.ptxas")
    try:
        with open(path) as f:
            return parse_report(f.read(), arch, cu)
    except OSError as e:
        sys.exit(f"ptxas_budget: no report of the build for {cu} ({e}); build wiola_cuda first")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvcc", default="nvcc")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--include", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    ap.add_argument("--budget", required=True)
    ap.add_argument("--reports", help="the folder of wiola_cuda's objects and their .ptxas reports")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("cu", nargs="+")
    a = ap.parse_args()
    now = {}
    if a.reports:
        for cu in a.cu:
            now.update(build_report(a.reports, a.arch, cu))
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            for part in pool.map(lambda cu: compile_report(a.nvcc, a.arch, a.include, cu), a.cu):
                now.update(part)
    if a.write:
        with open(a.budget + ".tmp", "w") as f:
            json.dump({"arch": a.arch, "kernels": dict(sorted(now.items()))}, f, indent=1)
            f.write("\n")
        os.replace(a.budget + ".tmp", a.budget)
        print(f"ptxas_budget: wrote {len(now)} kernels' budgets to {a.budget}")
        return
    with open(a.budget) as f:
        budget = json.load(f)
    if budget.get("arch") != a.arch:
        sys.exit(f"ptxas_budget: {a.budget} is for {budget.get('arch')}, not {a.arch}")
    want = budget["kernels"]
    problems = []
    for k, fig in sorted(now.items()):
        b = want.get(k)
        if b is None:
            problems.append(f"{k}: no budget (new kernel? add it: --write, then review)  {fig}")
            continue
        for key, what in (("registers", "registers"), ("spill_bytes", "spill bytes"), ("smem", "static smem bytes")):
            if fig[key] > b[key]:
                problems.append(f"{k}: {fig[key]} {what} > budget {b[key]}")
    problems += [f"{k}: in the budget but not compiled any more (remove it)" for k in sorted(set(want) - set(now))]
    worst = max(now.items(), key=lambda kv: kv[1]["registers"], default=(None, {}))
    spilling = sorted(k for k, f in now.items() if f["spill_bytes"])
    print(f"ptxas_budget: {len(now)} kernels on {a.arch}; most registers: {worst[0]} ({worst[1].get('registers')}); "
          f"spilling: {', '.join(spilling) or 'none'}")
    if problems:
        print("\n".join(problems))
        sys.exit(f"ptxas_budget: {len(problems)} kernel(s) over budget")
    print("ptxas_budget: every kernel within its budget")


if __name__ == "__main__":
    main()
