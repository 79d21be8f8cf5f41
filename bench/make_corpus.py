#!/usr/bin/env python3
"""A synthetic corpus of any size for prep benchmarks (docs/data.md).

Documents are "Document N." followed by 3 to 40 sentences drawn (seeded,
with replacement) from the Brown corpus, so they read like Brown to the
tokenizer and are all distinct (N differs). The same arguments give the
same bytes.

  bench/make_corpus.py --brown BUILD/brown.txt --mb 1024 --format jsonl -o corpus.jsonl
"""
import argparse
import json
import random
import re


def sentences(brown_path):
    text = open(brown_path, encoding="utf-8").read()
    return [s for s in (" ".join(p.split()) for p in re.split(r"(?<=[.!?])\s+", text)) if len(s) > 20]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brown", required=True, help="the Brown corpus as plain text (the build's brown.txt)")
    ap.add_argument("--mb", type=float, required=True, help="size to write, MB (1e6 bytes)")
    ap.add_argument("--format", choices=["text", "jsonl"], default="jsonl")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    pool = sentences(a.brown)
    rng = random.Random(a.seed)
    target, written, n = int(a.mb * 1e6), 0, 0
    with open(a.output, "w", encoding="utf-8", newline="\n") as out:
        while written < target:
            doc = f"Document {n}. " + " ".join(rng.choices(pool, k=rng.randint(3, 40)))
            n += 1
            line = json.dumps({"text": doc}, ensure_ascii=False) + "\n" if a.format == "jsonl" else doc + "\n\n"
            out.write(line)
            written += len(line.encode("utf-8"))
    print(f"{a.output}: {n} distinct documents, {written / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
