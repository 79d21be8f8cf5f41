#!/usr/bin/env python3
"""`wiola generate` and `wiola eval` on a real trained checkpoint.

  1. takes the small model of the fixture (trained_checkpoint.py: 30 steps
     on a slice of the Brown corpus, a checkpoint and a validation figure at
     steps 15 and 30);
  2. the checkpoint carries the training data's tokenizer (file + SHA-256);
  3. eval --as-training gives the run's own val_loss bit for bit; eval of
     the whole split (--documents off) scores every token of it but the
     first, once, and with documents (the run's own way, the default) every
     EOS input's target is left out;
  4. generate: the prompt and its continuation stream to stdout; --prompts
     decodes in batches, one JSON line per prompt, each equal to the same
     prompt decoded alone; --check-greedy passes; sampling repeats with a
     seed;
  5. on cpu-bf16, eval stays within 1e-3 of cpu and greedy decoding passes
     --check-greedy;
  6. multiple-choice tasks (tasks_common.py): scripts/convert_tasks.py made
     lm-evaluation-harness's prompts of each published layout (the fixture
     converted them) and refuses a bad line naming it; `wiola eval --tasks`
     on the step-30 checkpoint gives the scores the training wrote at step
     30 (metrics.jsonl, report.json, TensorBoard): acc and acc_norm equal,
     the gold log-likelihood within 1e-6; a bad task file is one error line;
  7. bad input is one error line and exit 1: an empty prompt (argument and
     file line), a prompt longer than the context, a tokenizer that is not
     the training data's or whose vocabulary is not the model's, a
     checkpoint without a tokenizer, one that does not exist.

usage: infer_cli.py --wiola BIN --text BROWN.txt --tokenizer tokenizer.json --work DIR --trained DIR"""
import hashlib
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import parse_args, expect_error, fail, run, trained  # noqa: E402
import tasks_common  # noqa: E402


def check_tokenizer_stored(a, ck):
    step = os.path.join(ck, "step-00000030")
    man = json.load(open(os.path.join(step, "manifest.json")))
    want = hashlib.sha256(open(a.tokenizer, "rb").read()).hexdigest()
    if man.get("tokenizer") != {"file": "tokenizer.json", "sha256": want}:
        fail(f"manifest tokenizer entry {man.get('tokenizer')}, expected sha256 {want}")
    if hashlib.sha256(open(os.path.join(step, "tokenizer.json"), "rb").read()).hexdigest() != want:
        fail("the stored tokenizer.json is not the training data's")
    print("tokenizer stored with the checkpoint: OK")


def check_eval(a, shards, ck):
    metrics = [json.loads(l) for l in open(os.path.join(a.trained, "run", "metrics.jsonl"))]
    val = [m["val_loss"] for m in metrics if m["step"] == 30 and "val_loss" in m]
    if len(val) != 1:
        fail(f"metrics.jsonl has no val_loss at step 30: {metrics[-1]}")
    r = json.loads(run([a.wiola, "eval", "--checkpoint", ck, "--data", shards, "--as-training", "--json"]).stdout)
    if r["loss"] != val[0]:
        fail(f"eval --as-training loss {r['loss']!r} != the run's val_loss {val[0]!r}")
    print(f"eval --as-training = the run's val_loss {val[0]!r} bit for bit: OK")
    n_val = json.load(open(os.path.join(shards, "manifest.json")))["splits"]["val"]["num_tokens"]
    # --documents off: the split as one stream, every token but the first a target.
    r = json.loads(run([a.wiola, "eval", "--checkpoint", ck, "--data", shards, "--json", "--batch", "3",
                        "--documents", "off"]).stdout)
    T = 128
    if r["targets"] != n_val - 1 or r["windows"] != -(-(n_val - 1) // T):
        fail(f"whole split: {r['targets']} targets in {r['windows']} windows, expected {n_val - 1} "
             f"in {-(-(n_val - 1) // T)}")
    print(f"eval --documents off of the whole split: {r['targets']} targets = every token but the first, "
          f"loss {r['loss']:.4f}, perplexity {r['perplexity']:.1f}: OK")
    # --documents on (docs/model.md §2 "Documents"): the same windows as
    # documents, every EOS input's target left out. The fixture trained with
    # data.documents (the shipped config), so it is also the default.
    n_docs = json.load(open(os.path.join(shards, "manifest.json")))["splits"]["val"]["num_documents"]
    d = json.loads(run([a.wiola, "eval", "--checkpoint", ck, "--data", shards, "--json", "--batch", "3",
                        "--documents", "on"]).stdout)
    default = json.loads(run([a.wiola, "eval", "--checkpoint", ck, "--data", shards, "--json", "--batch", "3"]).stdout)
    same = all(default[k] == d[k] for k in ("loss", "targets", "windows"))
    if not same or not n_docs - 1 <= r["targets"] - d["targets"] <= n_docs:
        fail(f"--documents on: {d['targets']} targets, off {r['targets']}, default {default['targets']}, "
             f"{n_docs} documents in the split")
    print(f"eval --documents on (the default: the run trained with documents): {d['targets']} targets "
          f"(the {r['targets'] - d['targets']} EOS inputs' left out), loss {d['loss']:.4f}: OK")


def check_generate(a, work, ck):
    g = [a.wiola, "generate", "--checkpoint", ck, "--max-new-tokens", "16", "--threads", "2"]
    prompts = ["The jury said", "In the morning", "He had never seen such a"]
    alone = []
    for p in prompts:
        r = run(g + ["--prompt", p, "--greedy", "--check-greedy"])
        if not r.stdout.startswith(p) or "tokens/s" not in r.stderr or "0 differ" not in r.stderr:
            fail(f"generate --prompt {p!r}: stdout {r.stdout!r}, stderr {r.stderr!r}")
        alone.append(r.stdout[len(p):-1])  # the prompt, the continuation, a newline
    pf = os.path.join(work, "prompts.txt")
    with open(pf, "w") as f:
        f.write("\n".join(prompts) + "\n")
    r = run(g + ["--prompts", pf, "--greedy", "--check-greedy", "--batch", "2"])
    lines = [json.loads(l) for l in r.stdout.splitlines()]
    if sorted(l["index"] for l in lines) != [0, 1, 2]:
        fail(f"--prompts: expected one JSON line per prompt, got {r.stdout}")
    for l in lines:
        if l["prompt"] != prompts[l["index"]] or l["completion"] != alone[l["index"]]:
            fail(f"--prompts line {l} differs from the prompt decoded alone: {alone[l['index']]!r}")
    if r.stderr.count("0 differ") != 2:
        fail(f"--check-greedy over two batches: {r.stderr}")
    print("generate: streaming, batched = alone, greedy = full-forward argmax: OK")
    s = g + ["--prompt", prompts[0], "--temperature", "0.9", "--top-k", "40", "--top-p", "0.95"]
    a1, a2 = run(s + ["--seed", "7"]).stdout, run(s + ["--seed", "7"]).stdout
    if a1 != a2:
        fail(f"sampling with one seed differs between runs: {a1!r} vs {a2!r}")
    print(f"sampling repeats with its seed: OK ({a1.strip()!r})")


def check_bf16(a, shards, ck):
    """The same checkpoint on cpu-bf16 (the GPU's bf16 storage types on the
    CPU kernels): eval within bf16 noise of cpu's, greedy decoding with a bf16
    KV cache equal to the full bf16 forward's argmax."""
    e = [a.wiola, "eval", "--checkpoint", ck, "--data", shards, "--json"]
    f32 = json.loads(run(e).stdout)["loss"]
    b16 = json.loads(run(e + ["--backend", "cpu-bf16"]).stdout)["loss"]
    if not abs(b16 - f32) < 1e-3 * abs(f32):
        fail(f"eval on cpu-bf16: loss {b16!r} vs cpu {f32!r}")
    r = run([a.wiola, "generate", "--checkpoint", ck, "--max-new-tokens", "16", "--threads", "2", "--prompt",
             "The jury said", "--greedy", "--check-greedy", "--backend", "cpu-bf16"])
    if "0 differ" not in r.stderr:
        fail(f"generate on cpu-bf16, --check-greedy: {r.stderr}")
    print(f"cpu-bf16: eval loss {b16:.6f} vs cpu {f32:.6f}, greedy = full-forward argmax: OK")


def check_bad_input(a, work, text, ck):
    g = [a.wiola, "generate", "--checkpoint", ck, "--max-new-tokens", "4"]
    expect_error(g + ["--prompt", ""], "empty prompt")
    pf = os.path.join(work, "blank.txt")
    with open(pf, "w") as f:
        f.write("one\n\nthree\n")
    expect_error(g + ["--prompts", pf], "blank.txt:2: empty prompt")
    expect_error(g + ["--prompt", "word " * 300], "more than the model's context of 128")
    # The same vocabulary, other bytes: not the training data's tokenizer.
    other = os.path.join(work, "other-tokenizer.json")
    with open(a.tokenizer, "rb") as f, open(other, "wb") as o:
        o.write(f.read() + b"\n")
    expect_error(g + ["--prompt", "The", "--tokenizer", other], "not the tokenizer this model was trained with")
    run(g + ["--prompt", "The", "--tokenizer", other, "--any-tokenizer"])
    small = os.path.join(work, "small-tokenizer.json")
    run([a.wiola, "tokenizer", "train", "--vocab-size", "300", "--output", small, text])
    expect_error(g + ["--prompt", "The", "--tokenizer", small, "--any-tokenizer"], "do not belong together")
    bare = os.path.join(work, "bare-step")
    shutil.rmtree(bare, ignore_errors=True)
    shutil.copytree(os.path.join(ck, "step-00000030"), bare)
    man = json.load(open(os.path.join(bare, "manifest.json")))
    del man["tokenizer"]
    json.dump(man, open(os.path.join(bare, "manifest.json"), "w"))
    expect_error([a.wiola, "generate", "--checkpoint", bare, "--prompt", "The"], "carries no tokenizer")
    run([a.wiola, "generate", "--checkpoint", bare, "--prompt", "The", "--max-new-tokens", "2",
         "--tokenizer", a.tokenizer])
    expect_error(g[:2] + ["--checkpoint", os.path.join(work, "nowhere"), "--prompt", "x"], "nowhere")
    expect_error([a.wiola, "eval", "--checkpoint", ck, "--text", pf, "--as-training"], "--as-training needs --data")
    print("bad input: OK")


def check_tasks(a, ck):
    tasks_common.check_converted(a.trained, a.work)
    tasks = tasks_common.task_files(a.trained)
    scores, _ = tasks_common.wiola_eval(a, ck, tasks, os.path.join(a.work, "ll.jsonl"), 4)
    run_dir = os.path.join(a.trained, "run")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        recs = {r["step"]: r for r in map(json.loads, f)}
    if sorted(s for s, r in recs.items() if "tasks" in r) != [30]:
        fail(f"metrics.jsonl: task scores at steps {[s for s, r in recs.items() if 'tasks' in r]}, not the last (30)")
    report = json.load(open(os.path.join(run_dir, "report.json")))
    got = recs[30]["tasks"]
    for name, s in scores.items():
        if (got[name + "/acc"], got[name + "/acc_norm"]) != (s["acc"], s["acc_norm"]):
            fail(f"{name}: training's scores at step 30 {got} != wiola eval's {s}")
        g = got[name + "/gold_loglik"]
        if not abs(g - s["gold_loglik"]) <= 1e-6 * max(1.0, abs(g)):
            fail(f"{name}: gold log-likelihood {g} in training, {s['gold_loglik']} in eval")
        if (report["tasks"][name]["acc"], report["tasks"][name]["acc_norm"]) != (s["acc"], s["acc_norm"]):
            fail(f"report.json tasks: {report['tasks']}")
    tb = os.path.join(run_dir, "tensorboard")
    events = b"".join(open(os.path.join(tb, f), "rb").read() for f in os.listdir(tb))
    if b"metrics/tasks/piqa/acc_norm" not in events:
        fail("TensorBoard: no metrics/tasks/piqa/acc_norm")
    bad = os.path.join(a.work, "bad_task.jsonl")
    with open(bad, "w") as f:
        f.write('{"context": "x", "choices": ["a", "b"], "gold": 0}\n{"context": "x", "choices": ["a", "b"], "gold": 5}\n')
    expect_error([a.wiola, "eval", "--checkpoint", ck, "--tasks", bad], "bad_task.jsonl:2: \"gold\" is 5")
    shards = os.path.join(a.trained, "shards", "manifest.json")
    expect_error([a.wiola, "train", "--config", a.config, "--set", f"data.path={shards}", "--set", "train.steps=1",
                  "--set", f"train.run_dir={a.work}/bad_tasks_run", "--set", f'train.eval_tasks=["{bad}"]'],
                 "train.eval_tasks: " + bad + ":2:")
    print("wiola eval --tasks = the training's scores at step 30: " +
          ", ".join(f"{n} acc {s['acc']:.3f} acc_norm {s['acc_norm']:.3f}" for n, s in scores.items()))


def main():
    a = parse_args()
    text, shards, ck = trained(a)
    check_tokenizer_stored(a, ck)
    check_eval(a, shards, ck)
    check_generate(a, a.work, ck)
    check_bf16(a, shards, ck)
    check_tasks(a, ck)
    check_bad_input(a, a.work, text, ck)
    print("infer_cli: all checks passed")


if __name__ == "__main__":
    main()
