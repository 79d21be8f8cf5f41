#!/usr/bin/env python3
"""Writes the fuzz targets' seed inputs into corpus/<target>/seed-*.

Seeds are small valid inputs of each format (plus a few near misses), so
libFuzzer starts from files that get past the first checks. Inputs that once
found a bug are added beside them as corpus/<target>/bug-* by hand and are
never regenerated. Run: python3 tests/fuzz/seeds.py (from anywhere).
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def byte_chars():
    """GPT-2's byte -> printable character table (byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tokenizers():
    ch = byte_chars()
    vocab = {"<pad>": 0, "<eos>": 1}
    for b in range(256):
        vocab[ch[b]] = len(vocab)
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), (ch[32], "w"), ("o", "r")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    added = [{"id": 0, "content": "<pad>", "special": True}, {"id": 1, "content": "<eos>", "special": True}]
    base = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [a + " " + b for a, b in merges]},
    }
    put("tokenizer_json", "strings.json", json.dumps(base))
    pairs = json.loads(json.dumps(base))
    pairs["model"]["merges"] = [[a, b] for a, b in merges]
    pairs["model"]["ignore_merges"] = True
    pairs["pre_tokenizer"]["use_regex"] = False
    pairs["added_tokens"].append({"id": len(vocab), "content": "<|user|>", "special": False})
    put("tokenizer_json", "pairs.json", json.dumps(pairs))
    put("tokenizer_json", "no-bytes.json", json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                                                      "pre_tokenizer": {"type": "ByteLevel"}}))


def texts():
    put("tokenizer_encode", "ascii", b"\x00Hello, world! It's 2026; 3.14 apples.\n\n  indented\ttab")
    put("tokenizer_encode", "special", b"\x01<bos>user says <|user|>hi<eos><eos><pad>")
    put("tokenizer_encode", "unicode", "\x00Zürich — 東京 🙂 ‍ \u3000 ٣٤٥ Ǆ".encode())
    put("tokenizer_encode", "invalid", b"\x00abc\xc3\x28 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf")


def safetensors():
    def st(tensors, meta):
        header, data = {"__metadata__": meta}, b""
        for name, dtype, shape, raw in tensors:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        return struct.pack("<Q", len(h)) + h + data

    f32 = struct.pack("<6f", 1, -2, 3.5, 0, 1e-3, -7)
    bf16 = struct.pack("<4H", 0x3F80, 0xC000, 0x7FC0, 0x0001)
    f16 = struct.pack("<3H", 0x3C00, 0x8001, 0x7C00)
    put("safetensors", "three", st([("a.weight", "F32", [2, 3], f32), ("b", "BF16", [4], bf16),
                                    ("c.bias", "F16", [3, 1], f16)], {"format": "pt"}))
    put("safetensors", "empty-tensor", st([("e", "F32", [0, 5], b""), ("s", "F32", [], f32[:4])], {}))
    # The index of the two shards fuzz/safetensors_index.cpp writes.
    shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    put("safetensors_index", "two-shards.json", json.dumps(
        {"metadata": {"total_size": 12}, "weight_map": {"a": shard1, "b": shard1, "c": shard2}}, indent=2))
    put("safetensors_index", "missing-c.json", json.dumps(
        {"metadata": {"total_size": 8}, "weight_map": {"a": shard1, "b": shard1}}))


def configs():
    root = os.path.dirname(os.path.dirname(HERE))
    for name in ("wiola-tiny.toml", "brown-small.toml"):
        with open(os.path.join(root, "configs", name)) as f:
            put("run_config", name, f.read())
    put("run_config", "overrides", "[model]\npreset = \"wiola-tiny\"\n\0train.steps=5\nparallel.tp=2\n"
        "model.n_layers = 4\ncheckpoint.dir=ck\ntrain.lr_max=1e-3")
    put("run_config", "blend", "[[data.blend]]\npath = \"runs/web\"\nweight = 0.7\n\n[[data.blend]]\n"
        "path = \"runs/books\"\nweight = 3\n\0data.blend=[{path=\"a\", weight=1e-3}, {path=\"b\", weight=2}]\n")


def manifests():
    m = {"format": "wiola-manifest-1",
         "tokenizer": {"file": "tokenizer.json", "sha256": "ab" * 32, "vocab_size": 32000, "eos_id": 2},
         "dtype": "uint16",
         "splits": {"train": {"num_tokens": 100, "num_documents": 3,
                              "shards": [{"file": "train-00000.h5", "num_tokens": 60, "num_documents": 2},
                                         {"file": "train-00001.h5", "num_tokens": 40, "num_documents": 1}]},
                    "val": {"num_tokens": 0, "num_documents": 0, "shards": []}},
         "prep": {"inputs": ["a.txt"], "seed": 1}}
    put("data_manifest", "two-shards.json", json.dumps(m, indent=1))


def checkpoints():
    def files(kinds, n):
        out = []
        for r in range(n):
            rows = 4 // n
            slices = {k: {"w": [[r * rows, 0, rows, 3]], "b": [[0, 0, 2, 1]] if r == 0 else []} for k in kinds}
            out.append({"bytes": 1000 + r, "grid_coord": [0, 0, r], "name": "rank-%05d.h5" % r, "rank": r,
                        "slices": slices, "xxh3": "0123456789abcdef"})
        return out

    base = {"format": "wiola-checkpoint-1", "run_id": "e15dd0296b07e7ab", "step": 4,
            "tensors": {"w": {"shape": [4, 3]}, "b": {"shape": [2, 1]}}}
    put("checkpoint_manifest", "dp2.json", json.dumps(dict(base, files=files(["param", "exp_avg", "exp_avg_sq"], 2))))
    put("checkpoint_manifest", "weights.json", json.dumps(dict(base, kinds=["param"], files=files(["param"], 1))))


def documents():
    docs = [{"text": "First document.\nWith two lines."}, {"text": "Zürich 🙂", "id": 7}, {"text": ""},
            {"other": "no text field"}]
    put("documents", "jsonl", "\n".join(json.dumps(d, ensure_ascii=False) for d in docs) + "\n\n")
    put("documents", "text", "Para one line one\nline two\n\n   \n\nPara two\r\n\r\nlast without newline")


if __name__ == "__main__":
    tokenizers()
    texts()
    safetensors()
    configs()
    manifests()
    checkpoints()
    documents()
