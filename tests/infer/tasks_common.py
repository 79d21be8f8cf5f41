"""Multiple-choice tasks in the tests of tests/infer (docs/inference.md
"Downstream tasks"): tiny files in the published HellaSwag, ARC and PIQA
layouts (and the Hugging Face rows), what scripts/convert_tasks.py must make
of them (lm-evaluation-harness's prompts, written out here), and an
independent scorer with transformers. The fixture (common.train) converts
them and trains with train.eval_tasks; infer_cli checks the converter, `wiola
eval --tasks` and the training's scores; hf_logits the log-likelihoods and
accuracies against transformers."""
import json
import os
import subprocess
import sys

from common import fail, run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = ("hellaswag", "arc_easy", "arc_challenge", "piqa")
CONVERT = os.path.join(ROOT, "scripts", "convert_tasks.py")

HELLASWAG = [
    {"ind": 24, "activity_label": "Roof shingle removal",
     "ctx_a": "A man is sitting on a roof.", "ctx_b": "he", "ctx": "A man is sitting on a roof. he",
     "split": "val", "split_type": "indomain", "label": 3,
     "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                 "is holding a rubik's cube.", "starts pulling up roofing on a roof."],
     "source_id": "activitynet~v_-JhWjGDPHMY"},
    {"ind": 92, "activity_label": "Personal Care and Style",
     "ctx_a": "[header] How to dye your hair [title] Wash your hair first.",
     "ctx_b": "THE day before", "ctx": "", "split": "val", "split_type": "zeroshot", "label": "0",
     "endings": ["you dye it, [step] use a mild shampoo.", "paint the  wall [substeps] twice.",
                 "go to the jury room.", "said the grand jury."],
     "source_id": "wikihow~1"},
]
HELLASWAG_WANT = [
    ("Roof shingle removal: A man is sitting on a roof. He",
     ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.", "is holding a rubik's cube.",
      "starts pulling up roofing on a roof."], 3),
    ("Personal Care and Style: How to dye your hair. Wash your hair first. The day before",
     ["you dye it, use a mild shampoo.", "paint the wall twice.", "go to the jury room.",
      "said the grand jury."], 0),
]
ARC_V1 = [
    {"id": "Mercury_1", "question": {"stem": "Which of these do the jury members investigate?",
                                     "choices": [{"text": "elections", "label": "A"},
                                                 {"text": "the weather", "label": "B"},
                                                 {"text": "fish", "label": "C"}]}, "answerKey": "A"},
    {"id": "Mercury_2", "question": {"stem": "What did the city executive committee do?",
                                     "choices": [{"text": "it praised the manner of the election", "label": "1"},
                                                 {"text": "it sang", "label": "2"},
                                                 {"text": "it swam", "label": "3"},
                                                 {"text": "it flew away", "label": "4"}]}, "answerKey": "1"},
]
ARC_HF = [
    {"id": "X_3", "question": "Who said the election was conducted well?",
     "choices": {"text": ["the grand jury", "a cat", "nobody", "the moon"], "label": ["A", "B", "C", "D"]},
     "answerKey": "A"},
    {"id": "X_4", "question": "What does a jury give?",
     "choices": {"text": ["a presentment", "a song"], "label": ["A", "B"]}, "answerKey": "B"},
]
PIQA = [
    {"goal": "How do I keep the election fair?", "sol1": "Count every vote twice.", "sol2": "Hide the ballots."},
    {"goal": "To praise the city,", "sol1": "burn it down.", "sol2": "thank its people for their work."},
    {"goal": "Open a jar", "sol1": "Twist the lid.", "sol2": "Sing at the lid."},
    # Longer than the model's context (T = 128): truncated on the left, as lm-eval does.
    {"goal": "The jury praised the city for the manner in which the election was conducted. " * 12,
     "sol1": "Thank the jury.", "sol2": "Ask the city."},
]
PIQA_LABELS = [0, 1, 0, 1]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(l) for l in f if l.strip()]


def make_task_files(work):
    """The published-layout files and their conversion into work/tasks/; returns the task files."""
    d = os.path.join(work, "tasks")
    os.makedirs(d, exist_ok=True)
    src = {n: os.path.join(d, n + "_src.jsonl") for n in ("hs", "arc_v1", "arc_hf", "piqa")}
    write_jsonl(src["hs"], HELLASWAG)
    write_jsonl(src["arc_v1"], ARC_V1)
    write_jsonl(src["arc_hf"], ARC_HF)
    write_jsonl(src["piqa"], PIQA)
    with open(os.path.join(d, "piqa-labels.lst"), "w") as f:
        f.write("\n".join(map(str, PIQA_LABELS)) + "\n")
    out = task_files(work)
    run([sys.executable, CONVERT, "hellaswag", src["hs"], out[0]])
    run([sys.executable, CONVERT, "arc", src["arc_v1"], out[1], "--name", "arc_easy"])
    run([sys.executable, CONVERT, "arc", src["arc_hf"], out[2], "--name", "arc_challenge"])
    run([sys.executable, CONVERT, "piqa", src["piqa"], out[3], "--labels", os.path.join(d, "piqa-labels.lst")])
    return out


def task_files(work):
    return [os.path.join(work, "tasks", n + ".jsonl") for n in NAMES]


def check_converted(work, scratch):
    """The converter's files (the fixture's) hold lm-eval's prompts; a bad line is refused."""
    want = {
        "hellaswag": HELLASWAG_WANT,
        "arc_easy": [("Question: " + d["question"]["stem"] + "\nAnswer:", [c["text"] for c in d["question"]["choices"]],
                      [c["label"] for c in d["question"]["choices"]].index(d["answerKey"])) for d in ARC_V1],
        "arc_challenge": [("Question: " + d["question"] + "\nAnswer:", d["choices"]["text"],
                           d["choices"]["label"].index(d["answerKey"])) for d in ARC_HF],
        "piqa": [("Question: " + d["goal"] + "\nAnswer:", [d["sol1"], d["sol2"]], g)
                 for d, g in zip(PIQA, PIQA_LABELS)],
    }
    for name, path in zip(NAMES, task_files(work)):
        rows = read_jsonl(path)
        got = [(r["context"], r["choices"], r["gold"]) for r in rows]
        if got != want[name] or any(r["task"] != name for r in rows):
            fail(f"convert_tasks.py {name}: {rows} != {want[name]}")
    bad = os.path.join(scratch, "bad_piqa.jsonl")
    write_jsonl(bad, [dict(PIQA[0], label=0), {"goal": "x", "sol1": "y", "label": 1}])  # no sol2
    p = subprocess.run([sys.executable, CONVERT, "piqa", bad, os.path.join(scratch, "b.jsonl")],
                       capture_output=True, text=True)
    if p.returncode == 0 or f"{bad}:2: not a piqa item" not in p.stderr:
        fail(f"a bad piqa line: exit {p.returncode}, {p.stderr!r}")
    print(f"convert_tasks.py: {', '.join(NAMES)} as lm-eval's prompts; a bad line refused")


def wiola_eval(a, ck, tasks, out, batch):
    """`wiola eval --tasks` -> ({task: scores}, [per-item records])."""
    p = run([a.wiola, "eval", "--checkpoint", ck, "--tasks", ",".join(tasks), "--batch", str(batch), "--json",
             "--threads", "1", "--tasks-out", out])
    return {t["task"]: t for t in json.loads(p.stdout)["tasks"]}, read_jsonl(out)


def hf_check(out, tasks, scores, per_item):
    """The fp32 export `out` loaded in float64 by transformers: each choice's log-likelihood by
    lm-evaluation-harness's recipe (context and continuation encoded together, the
    continuation's tokens scored, left truncation to T + 1 tokens) within 1e-4 of wiola's
    (`per_item`: --tasks-out records), relative to max(1, |ll|); acc and acc_norm scored here
    equal wiola's `scores`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, torch_dtype=torch.float64).eval()
    T = model.config.max_position_embeddings

    def enc(s):
        return tok(s, add_special_tokens=False)["input_ids"]

    def loglik(context, continuation):  # lm-evaluation-harness's _encode_pair and _loglikelihood_tokens
        n = len(context) - len(context.rstrip())
        if n:
            continuation, context = context[-n:] + continuation, context[:-n]
        whole, ctx = enc(context + continuation), enc(context)
        cont = whole[len(ctx):]
        inp = (ctx + cont)[-(T + 1):][:-1]
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([inp])).logits[0], dim=-1)
        lp = lp[len(inp) - len(cont):]
        return float(sum(lp[i, t] for i, t in enumerate(cont)))

    worst, k = 0.0, 0
    for path in tasks:
        items = read_jsonl(path)
        name = items[0]["task"]
        acc = acc_norm = 0
        for i, it in enumerate(items):
            lls = [loglik(it["context"], " " + c) for c in it["choices"]]
            w = per_item[k]
            k += 1
            if (w["task"], w["item"]) != (name, i):
                fail(f"--tasks-out record {w} is not {name} item {i}")
            for x, y in zip(lls, w["loglik"]):
                worst = max(worst, abs(x - y) / max(1.0, abs(x)))
            norm = [ll / len(c) for ll, c in zip(lls, it["choices"])]
            acc += lls.index(max(lls)) == it["gold"]
            acc_norm += norm.index(max(norm)) == it["gold"]
        acc, acc_norm = acc / len(items), acc_norm / len(items)
        if (acc, acc_norm) != (scores[name]["acc"], scores[name]["acc_norm"]):
            fail(f"{name}: independent scorer acc {acc}, acc_norm {acc_norm}; wiola {scores[name]}")
        print(f"  {name}: {len(items)} items, acc {acc:.3f}, acc_norm {acc_norm:.3f} (both scorers)")
    print(f"transformers (float64) on the export: {k} items, worst |Δ loglik| / max(1, |ll|) = {worst:.2e}")
    if not worst <= 1e-4:
        fail(f"log-likelihoods differ from transformers': {worst:.2e} > 1e-4")
