#!/usr/bin/env python3
"""`wiola export --format hf` and `wiola import` on a real trained checkpoint,
read by someone else's readers (safetensors, h5py, torch):

  1. takes the small model of the fixture (trained_checkpoint.py; checkpoints
     at steps 15 and 30);
  2. the fp32 export holds every tensor of `wiola ckpt consolidate` bit for
     bit, under the names of the model contract, no lm_head; its config.json
     has the published Wiola-360M keys plus auto_map; the tokenizer files and
     modeling_wiola.py are there;
  3. a bf16 export is torch's round-to-nearest-even of the same values; a
     sharded export (tiny --max-shard-size) has an index naming every tensor;
  4. import of the fp32 export: `wiola ckpt verify` passes, and consolidate
     equals the original's parameters bit for bit; its export has the same
     tensor bytes; a bf16 export imports as the widened bf16 values;
  5. the imported checkpoint starts a fine-tuning run (checkpoint.init_from)
     and is refused as a resume (weights only);
  6. bad input, one error each: another size in config.json, a missing
     tensor, a tied lm_head that is not the embedding, a tokenizer whose
     vocabulary is not the model's, another model_type, export into a
     non-empty folder, an unknown format or dtype, a missing checkpoint.

usage: export_cli.py --wiola BIN --text BROWN.txt --tokenizer tokenizer.json --config brown-small.toml --work DIR --trained DIR"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import parse_args, expect_error, fail, run, trained  # noqa: E402

try:
    import h5py
    import numpy as np
    import torch
    from safetensors.numpy import load_file, save_file
except Exception as e:  # noqa: BLE001
    print(f"SKIPPED: needs h5py, numpy, torch and safetensors ({type(e).__name__}: {e})")
    sys.exit(77)

PUBLISHED_KEYS = {"architectures", "atm_enabled", "atm_threshold", "bos_token_id", "dsff_narrow_size",
                  "dsff_wide_size", "dtype", "eos_token_id", "gcla_gate_init", "gcla_lookback", "hidden_size",
                  "initializer_range", "max_position_embeddings", "model_type", "num_attention_heads",
                  "num_hidden_layers", "num_key_value_heads", "pad_token_id", "rms_norm_eps",
                  "srpe_radial_amplitude", "srpe_radial_frequency", "srpe_spiral_divisor", "srpe_theta",
                  "transformers_version", "use_cache", "vocab_size"}


def consolidated(a, ck, work, name):
    out = os.path.join(work, name + ".h5")
    run([a.wiola, "ckpt", "consolidate", ck, out])
    with h5py.File(out, "r") as h:
        return {k: h["param"][k][...] for k in h["param"]}


def load_folder(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.exists(index):
        return load_file(os.path.join(folder, "model.safetensors"))
    out = {}
    for f in sorted(set(json.load(open(index))["weight_map"].values())):
        out.update(load_file(os.path.join(folder, f)))
    return out


def same_bits(x, y, what):
    if set(x) != set(y):
        fail(f"{what}: tensor names differ: {sorted(set(x) ^ set(y))[:5]}")
    for k in x:
        if x[k].shape != y[k].shape or x[k].tobytes() != y[k].tobytes():
            fail(f"{what}: {k} differs ({x[k].shape} vs {y[k].shape})")


def check_export(a, work, ck, ref):
    out = os.path.join(work, "hf")
    run([a.wiola, "export", "--checkpoint", ck, "--format", "hf", out])
    for f in ("config.json", "generation_config.json", "model.safetensors", "modeling_wiola.py", "tokenizer.json",
              "tokenizer_config.json", "special_tokens_map.json", "README.md"):
        if not os.path.exists(os.path.join(out, f)):
            fail(f"export lacks {f}")
    conf = json.load(open(os.path.join(out, "config.json")))
    if not PUBLISHED_KEYS <= set(conf) or conf["auto_map"]["AutoModelForCausalLM"] != "modeling_wiola.WiolaForCausalLM":
        fail(f"config.json lacks {sorted(PUBLISHED_KEYS - set(conf))} or the auto_map: {conf}")
    if (conf["hidden_size"], conf["num_hidden_layers"], conf["vocab_size"]) != (128, 6, 32000):
        fail(f"config.json sizes {conf}")
    same_bits(load_folder(out), ref, "fp32 export vs consolidate")
    print(f"fp32 export = ckpt consolidate bit for bit ({len(ref)} tensors), config.json has the published keys: OK")

    bf = os.path.join(work, "hf-bf16")
    run([a.wiola, "export", "--checkpoint", ck, "--format", "hf", bf, "--dtype", "bf16"])
    from safetensors.torch import load_file as load_torch
    got = load_torch(os.path.join(bf, "model.safetensors"))
    for k, v in ref.items():
        want = torch.from_numpy(v).to(torch.bfloat16)
        if got[k].dtype != torch.bfloat16 or not torch.equal(got[k].view(torch.int16), want.view(torch.int16)):
            fail(f"bf16 export: {k} is not torch's bf16 rounding")
    sh = os.path.join(work, "hf-sharded")
    run([a.wiola, "export", "--checkpoint", ck, "--format", "hf", sh, "--max-shard-size", "3MB"])
    index = json.load(open(os.path.join(sh, "model.safetensors.index.json")))
    if set(index["weight_map"]) != set(ref) or len(set(index["weight_map"].values())) < 3:
        fail(f"sharded export index: {index}")
    same_bits(load_folder(sh), ref, "sharded export")
    print(f"bf16 export = torch's rounding; sharded export: {len(set(index['weight_map'].values()))} shards: OK")
    return out, bf


def check_import(a, work, out, bf, ref, shards):
    imp = os.path.join(work, "imported")
    run([a.wiola, "import", out, "--output", imp])
    run([a.wiola, "ckpt", "verify", imp])
    same_bits(consolidated(a, imp, work, "imported"), ref, "import of the fp32 export")
    again = os.path.join(work, "hf-again")
    run([a.wiola, "export", "--checkpoint", imp, "--format", "hf", again])
    same_bits(load_folder(again), ref, "export of the imported checkpoint")
    print("export -> import -> consolidate and -> export: bit for bit: OK")
    imp16 = os.path.join(work, "imported-bf16")
    run([a.wiola, "import", bf, "--output", imp16])
    widened = {k: torch.from_numpy(v).to(torch.bfloat16).float().numpy() for k, v in ref.items()}
    same_bits(consolidated(a, imp16, work, "imported-bf16"), widened, "import of the bf16 export")
    print("bf16 export imports as the exactly widened values: OK")

    ft = [a.wiola, "train", "--config", a.config, "--set", f"data.path={shards}/manifest.json", "--set",
          "train.steps=1", "--set", "train.micro_batch=2", "--set", "train.eval_every=0", "--set",
          f"train.run_dir={work}/ft", "--set", "train.threads=2"]
    p = run(ft + ["--set", f"checkpoint.init_from={imp}", "--set", f"checkpoint.dir={work}/ft-ck"])
    if "weights from" not in p.stdout:
        fail(f"fine-tuning from the import did not say where its weights came from:\n{p.stdout}")
    expect_error(ft + ["--set", f"checkpoint.dir={imp}"], "holds weights only")
    print("the import starts a fine-tuning run and is refused as a resume: OK")


def rewrite(src, dst, conf=None, tensors=None, tokenizer=None):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    if conf is not None:
        json.dump(conf, open(os.path.join(dst, "config.json"), "w"))
    if tensors is not None:
        save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
        shutil.copy(tokenizer, os.path.join(dst, "tokenizer.json"))
    return dst


def check_bad_input(a, work, ck, out, ref, text):
    conf = json.load(open(os.path.join(out, "config.json")))
    imp = [a.wiola, "import", "--output", os.path.join(work, "bad-import")]
    expect_error(imp + [rewrite(out, os.path.join(work, "b1"), conf=dict(conf, hidden_size=256))],
                 "model.embed_tokens.weight: shape [32000, 128] in the file, [32000, 256] for this config")
    t = dict(ref)
    del t["model.layers.3.mlp.fusion.weight"]
    expect_error(imp + [rewrite(out, os.path.join(work, "b2"), tensors=t)], "model.layers.3.mlp.fusion.weight: missing")
    t = dict(ref, **{"lm_head.weight": ref["model.embed_tokens.weight"] * 2})
    expect_error(imp + [rewrite(out, os.path.join(work, "b3"), tensors=t)], "Wiola's head is tied")
    small = os.path.join(work, "small-tokenizer.json")
    run([a.wiola, "tokenizer", "train", "--vocab-size", "300", "--output", small, text])
    expect_error(imp + [rewrite(out, os.path.join(work, "b4"), tokenizer=small)], "do not belong together")
    expect_error(imp + [rewrite(out, os.path.join(work, "b5"), conf=dict(conf, model_type="llama"))],
                 "is not a Wiola model")
    c = dict(conf)
    del c["num_hidden_layers"]
    expect_error(imp + [rewrite(out, os.path.join(work, "b6"), conf=c)], "needs the integer num_hidden_layers")
    expect_error(imp + [os.path.join(work, "nowhere")], "config.json")
    expect_error([a.wiola, "export", "--checkpoint", ck, "--format", "hf", out], "not empty")
    expect_error([a.wiola, "export", "--checkpoint", ck, "--format", "onnx", out + "-x"], "only hf")
    expect_error([a.wiola, "export", "--checkpoint", ck, "--format", "hf", out + "-x", "--dtype", "fp16"], "fp32 or bf16")
    expect_error([a.wiola, "export", "--checkpoint", os.path.join(work, "nowhere"), "--format", "hf", out + "-x"],
                 "nowhere")
    if os.path.exists(out + "-x"):
        fail("a refused export left its output folder")
    print("bad input: OK")


def main():
    a = parse_args()
    text, shards, ck = trained(a)
    ref = consolidated(a, ck, a.work, "original")
    out, bf = check_export(a, a.work, ck, ref)
    check_import(a, a.work, out, bf, ref, shards)
    check_bad_input(a, a.work, ck, out, ref, text)
    print("export_cli: all checks passed")


if __name__ == "__main__":
    main()
