#!/usr/bin/env python3
"""A wiola export loaded by Hugging Face `transformers` computes what wiola
computes.

  1. takes the small model of the fixture (trained_checkpoint.py: 30 steps
     on a slice of the Brown corpus; held-out text: a later slice);
  2. `wiola eval --text` writes the C++ forward's logits of the held-out
     text's first window (fp32, ATM off) and its token ids;
  3. `wiola export --format hf` (fp32); `AutoTokenizer` of the folder gives
     the same ids, `AutoModelForCausalLM(trust_remote_code=True)` the same
     logits: max |Δ| / max |logit| < 1e-4;
  4. greedy `generate()` in transformers (KV cache on, and off) gives the
     tokens `wiola generate --greedy` gives;
  5. a bf16 export and a sharded export load too (bf16: within bf16
     rounding of the weights, max |Δ| / max |logit| < 5e-2);
  6. multiple-choice tasks (tasks_common.py): each choice's log-likelihood
     from `wiola eval --tasks` equals the one transformers computes on the
     export with lm-evaluation-harness's recipe (float64; 1e-4 relative to
     max(1, |ll|)), and acc and acc_norm equal an independent scorer's.

Skips (exit 77) with the reason when transformers cannot be imported.

usage: hf_logits.py --wiola BIN --text BROWN.txt --tokenizer tokenizer.json --config brown-small.toml --work DIR --trained DIR"""
import os
import sys

try:
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
except Exception as e:  # noqa: BLE001 - any import failure means: cannot run here
    print(f"SKIPPED: transformers cannot be imported here ({type(e).__name__}: {e}); "
          "scripts/setup.sh installs transformers 4.46.3")
    sys.exit(77)


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import parse_args, fail, run, trained  # noqa: E402
import tasks_common  # noqa: E402


def heldout(a, work):
    """Whole lines far beyond the training slice."""
    with open(a.text, "rb") as f:
        data = f.read()
    held = os.path.join(work, "heldout.txt")
    with open(held, "wb") as g:
        start = data.index(b"\n", 3000000) + 1
        g.write(data[start:start + 2500])
    return held


def hf_logits(folder, ids):
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    model.eval()
    with torch.no_grad():
        return model, model(torch.tensor(ids[None, :].astype(np.int64))).logits[0].float().numpy()


def rel_err(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def main():
    a = parse_args()
    torch.set_num_threads(2)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    _, _, ck = trained(a)
    held = heldout(a, a.work)

    lg, ids_path = os.path.join(a.work, "logits.npy"), os.path.join(a.work, "ids.npy")
    run([a.wiola, "eval", "--checkpoint", ck, "--text", held, "--save-logits", lg, "--save-ids", ids_path])
    ref, ids = np.load(lg), np.load(ids_path)
    out = os.path.join(a.work, "hf")
    run([a.wiola, "export", "--checkpoint", ck, "--format", "hf", out])

    tok = AutoTokenizer.from_pretrained(out)
    hf_ids = tok(open(held, encoding="utf-8").read(), add_special_tokens=False)["input_ids"][:len(ids)]
    if list(hf_ids) != ids.tolist():
        fail(f"AutoTokenizer ids differ from wiola's: {hf_ids[:10]} vs {ids[:10].tolist()}")
    model, logits = hf_logits(out, ids)
    err = rel_err(logits, ref)
    print(f"fp32 export: {len(ids)} positions x {ref.shape[1]} logits, max|Δ|/max|logit| = {err:.3e}")
    if not err < 1e-4:
        fail(f"transformers logits differ from wiola's: {err:.3e} >= 1e-4")

    prompt = "The jury said"
    w = run([a.wiola, "generate", "--checkpoint", ck, "--prompt", prompt, "--greedy", "--no-eos",
             "--max-new-tokens", "12"]).stdout[len(prompt):-1]
    pids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    for cache in (True, False):
        g = model.generate(pids, max_new_tokens=12, do_sample=False, use_cache=cache, eos_token_id=None,
                           pad_token_id=0)
        text = tok.decode(g[0, pids.shape[1]:])
        if text != w:
            fail(f"transformers generate (use_cache={cache}) {text!r} != wiola generate {w!r}")
    print(f"greedy generate, transformers (cache on and off) = wiola: {w!r}")

    tasks = tasks_common.task_files(a.trained)
    scores, per_item = tasks_common.wiola_eval(a, ck, tasks, os.path.join(a.work, "ll.jsonl"), 8)
    tasks_common.hf_check(out, tasks, scores, per_item)

    for extra, tol, what in ((["--dtype", "bf16"], 5e-2, "bf16"), (["--max-shard-size", "2MB"], 1e-4, "sharded")):
        o = os.path.join(a.work, "hf-" + what)
        run([a.wiola, "export", "--checkpoint", ck, "--format", "hf", o] + extra)
        files = sorted(os.listdir(o))
        _, lo = hf_logits(o, ids)
        e = rel_err(lo, ref)
        print(f"{what} export ({', '.join(f for f in files if 'safetensors' in f)[:120]}): "
              f"max|Δ|/max|logit| = {e:.3e}")
        if not e < tol:
            fail(f"{what} export: {e:.3e} >= {tol}")
    print("hf_logits: all checks passed")


if __name__ == "__main__":
    main()
