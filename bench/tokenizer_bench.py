#!/usr/bin/env python3
"""Tokenizer encoding throughput, wiola vs Hugging Face `tokenizers`, one core each.

Both encode the same file line by line (newline stripped, no special tokens
added) in the same run, pinned to the same single CPU. HF runs encode_batch
with RAYON_NUM_THREADS=1 (its batch path, without Python per-line overhead
beyond building the list); wiola runs bench's wiola_tokenizer_speed (best of
3, cold word cache each time). Prints MB/s of both and the ratio.

usage: tokenizer_bench.py [--tokenizer FILE] [--text FILE] [--speed BIN]

Defaults are the files bundled with the repository: the Wiola-360M tokenizer
(data/wiola360m/tokenizer.json) and the Brown corpus (data/brown/brown.txt.xz).
A text file ending in .xz is decompressed (Python's lzma) into a temporary
file first, so both tokenizers read the same plain text.
"""
import argparse
import atexit
import lzma
import os
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
p = argparse.ArgumentParser()
p.add_argument("--tokenizer", default=os.path.join(root, "data", "wiola360m", "tokenizer.json"))
p.add_argument("--text", default=os.path.join(root, "data", "brown", "brown.txt.xz"),
               help="plain text, or .xz-compressed plain text")
p.add_argument("--speed", default=os.path.join(root, "build", "bench", "wiola_tokenizer_speed"),
               help="path of the wiola_tokenizer_speed program")
p.add_argument("--cpu", type=int, default=None, help="CPU to pin both to (default: the first allowed)")
p.add_argument("--repeat", type=int, default=3)
a = p.parse_args()

allowed = os.sched_getaffinity(0)
cpu = a.cpu if a.cpu is not None else sorted(allowed)[0]
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.sched_setaffinity(0, {cpu})
try:
    from tokenizers import Tokenizer
except ImportError:
    sys.exit("Hugging Face tokenizers is not installed: "
             "/usr/bin/python3 -m pip install --break-system-packages tokenizers")

text_path = a.text
if a.text.endswith(".xz"):
    with lzma.open(a.text, "rb") as f:
        raw = f.read()
    tmp = tempfile.NamedTemporaryFile(prefix="tokenizer_bench_", suffix=".txt", delete=False)
    with tmp:
        tmp.write(raw)
    atexit.register(os.unlink, tmp.name)
    text_path = tmp.name
else:
    raw = open(a.text, "rb").read()
lines = raw.decode("utf-8").split("\n")
if lines and lines[-1] == "":
    lines.pop()
mb = len(raw) / 1e6

best = 1e30
tokens = 0
for _ in range(a.repeat):
    tok = Tokenizer.from_file(a.tokenizer)  # fresh: cold cache, as ours
    t0 = time.perf_counter()
    enc = tok.encode_batch(lines, add_special_tokens=False)
    best = min(best, time.perf_counter() - t0)
    tokens = sum(len(e.ids) for e in enc)
hf = mb / best

env = dict(os.environ, OMP_NUM_THREADS="1")
out = subprocess.run(["taskset", "-c", str(cpu), a.speed, a.tokenizer, text_path, str(a.repeat)],
                     capture_output=True, text=True, env=env, check=True).stdout
vals = dict(line.split(" ", 1) for line in out.strip().split("\n") if " " in line)
ours = float(vals["one_thread_MBps"])
os.sched_setaffinity(0, allowed)
out_mt = subprocess.run([a.speed, a.tokenizer, text_path, "1"], capture_output=True, text=True, check=True).stdout
vals_mt = dict(line.split(" ", 1) for line in out_mt.strip().split("\n") if " " in line)

print(f"text: {a.text} ({mb:.2f} MB, {len(lines)} lines)")
print(f"tokens: HF {tokens}, wiola {vals['tokens']}" + ("" if int(vals["tokens"]) == tokens else "  MISMATCH"))
print(f"Hugging Face tokenizers {__import__('tokenizers').__version__}, 1 core: {hf:8.2f} MB/s")
print(f"wiola, 1 core:                          {ours:8.2f} MB/s")
print(f"ratio wiola / HF:                       {ours / hf:8.2f}x")
print(f"wiola, all {vals_mt['threads']} threads:                  {float(vals_mt['all_threads_MBps']):8.2f} MB/s")
