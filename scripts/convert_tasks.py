#!/usr/bin/env python3
"""Convert downloaded HellaSwag, ARC and PIQA files into wiola's task format
(docs/inference.md "Downstream tasks"): one JSON object per line,
{"task": NAME, "context": str, "choices": [str, ...], "gold": int}, with the
prompts lm-evaluation-harness uses for these tasks (zero-shot):

  hellaswag  context: preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()),
             choices: preprocess(ending) for each of "endings", gold: int(label);
             preprocess strips, turns " [title]" into ". ", drops "[...]" and
             halves double spaces (lm-eval's hellaswag/utils.py).
             Layout: the published hellaswag_{train,val}.jsonl, or the
             Hugging Face dataset's rows (label as a string).
  arc        context: "Question: " + question + "\\nAnswer:", choices: the
             choices' texts, gold: the index of answerKey among their labels.
             Layouts: the published ARC-V1 JSONL ({"question": {"stem",
             "choices": [{"text", "label"}]}, "answerKey"}) or the Hugging
             Face ai2_arc rows ({"question", "choices": {"text", "label"}}).
  piqa       context: "Question: " + goal + "\\nAnswer:", choices: [sol1, sol2],
             gold: label (the line's "label", or the published
             *-labels.lst file, one 0/1 per line, given with --labels).

No network: it reads the files you downloaded.

usage: convert_tasks.py {hellaswag,arc,piqa} INPUT.jsonl OUTPUT.jsonl [--labels FILE] [--name NAME] [--limit N]
"""
import argparse
import json
import re
import sys


def hellaswag_clean(text):
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def hellaswag(doc, _label):
    ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
    return (hellaswag_clean(doc["activity_label"] + ": " + ctx), [hellaswag_clean(e) for e in doc["endings"]],
            int(doc["label"]))


def arc(doc, _label):
    q = doc["question"]
    if isinstance(q, dict):  # ARC-V1 JSONL
        stem = q["stem"]
        texts = [c["text"] for c in q["choices"]]
        labels = [c["label"] for c in q["choices"]]
    else:  # Hugging Face ai2_arc
        stem = q
        texts, labels = list(doc["choices"]["text"]), list(doc["choices"]["label"])
    key = doc["answerKey"]
    if key not in labels:
        raise ValueError(f"answerKey {key!r} is none of the labels {labels}")
    return f"Question: {stem}\nAnswer:", texts, labels.index(key)


def piqa(doc, label):
    gold = doc["label"] if "label" in doc else label
    if gold is None:
        raise ValueError("no \"label\" in the line: give the *-labels.lst file with --labels")
    return f"Question: {doc['goal']}\nAnswer:", [doc["sol1"], doc["sol2"]], int(gold)


LAYOUTS = {"hellaswag": hellaswag, "arc": arc, "piqa": piqa}


def convert(kind, src, dst, labels=None, name=None, limit=0):
    """Returns the number of items written."""
    lab = None
    if labels:
        with open(labels, encoding="utf-8") as f:
            lab = [int(x) for x in f.read().split()]
    n = 0
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as g:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            if limit and n >= limit:
                break
            try:
                doc = json.loads(line)
                if lab is not None and n >= len(lab):
                    raise ValueError(f"{labels} has only {len(lab)} labels")
                ctx, choices, gold = LAYOUTS[kind](doc, lab[n] if lab is not None else None)
                if not 0 <= gold < len(choices):
                    raise ValueError(f"gold {gold} is not an index of the {len(choices)} choices")
            except (KeyError, TypeError, ValueError) as e:
                raise SystemExit(f"convert_tasks.py: error: {src}:{no}: not a {kind} item: "
                                 f"{type(e).__name__}: {e}") from None
            g.write(json.dumps({"task": name or kind, "context": ctx, "choices": choices, "gold": gold},
                               ensure_ascii=False) + "\n")
            n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=sorted(LAYOUTS))
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--labels", help="piqa: the *-labels.lst file of the published release")
    ap.add_argument("--name", help="the task's name (default: the kind; ARC: say arc_easy or arc_challenge)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N items")
    a = ap.parse_args()
    n = convert(a.kind, a.input, a.output, a.labels, a.name, a.limit)
    print(f"convert_tasks.py: {n} items -> {a.output}")


if __name__ == "__main__":
    sys.exit(main())
