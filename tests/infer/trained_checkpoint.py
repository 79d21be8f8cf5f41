#!/usr/bin/env python3
"""The ctest fixture infer_checkpoint: tokenizes 400 kB of the Brown corpus and
trains wiola-small (configs/brown-small.toml) for 30 steps, with a checkpoint
and a validation figure at steps 15 and 30 and the scores of tasks_common.py's
multiple-choice files (converted by scripts/convert_tasks.py) at step 30, into
--work. The CLI tests of
tests/infer read it through their --trained argument and never change it; one
training instead of one per test.

usage: trained_checkpoint.py --wiola BIN --text BROWN.txt --tokenizer tokenizer.json --config brown-small.toml --work DIR"""
import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import train  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    for k in ("wiola", "text", "tokenizer", "config", "work"):
        ap.add_argument("--" + k, required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    text, shards, ck = train(a, a.work)
    print(f"trained: {ck} (text {text}, shards {shards})")


if __name__ == "__main__":
    main()
