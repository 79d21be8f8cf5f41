"""infer/hf/modeling_wiola.py (the file `wiola export` puts beside the weights) against the
PyTorch reference tests/reference/wiola_ref.py: the same logits in evaluation (float64 and
float32) and in training with ATM merging, cached decoding equal to the full forward, greedy
`generate()` with and without the cache, save/load through the Auto classes with
trust_remote_code, and the refusals (padding masks, bad configs)."""
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile

try:
    import torch
    import transformers
except Exception as e:  # noqa: BLE001 - any import failure means: cannot run here
    print(f"SKIPPED: transformers cannot be imported here ({type(e).__name__}: {e}); "
          "scripts/setup.sh installs transformers 4.46.3")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "infer", "hf"))
import modeling_wiola as mw  # noqa: E402
import wiola_ref as R  # noqa: E402

torch.set_num_threads(2)


@contextlib.contextmanager
def raises(exc, match):
    try:
        yield
    except exc as e:
        assert re.search(match, str(e)), f"{exc.__name__} {e!s} does not say {match!r}"
        return
    raise AssertionError(f"no {exc.__name__} ({match})")


def hf_config(cfg):
    return mw.WiolaConfig(vocab_size=cfg.V, hidden_size=cfg.d, num_hidden_layers=cfg.L,
                          num_attention_heads=cfg.H, num_key_value_heads=cfg.H_kv, dsff_narrow_size=cfg.d_A,
                          dsff_wide_size=cfg.d_B, max_position_embeddings=cfg.T, srpe_theta=cfg.theta0,
                          srpe_spiral_divisor=cfg.k_s, srpe_radial_amplitude=cfg.a_s,
                          srpe_radial_frequency=cfg.f_s, atm_enabled=cfg.atm, atm_threshold=cfg.tau,
                          gcla_lookback=cfg.Lambda, rms_norm_eps=cfg.eps)


def make(dtype=torch.float64, seed=0, std=0.3, **over):
    cfg = R.WiolaConfig.preset("tiny", **over)
    params = R.init_params(cfg, seed=seed, dtype=torch.float64, requires_grad=False, std=std)
    g = torch.Generator().manual_seed(seed + 1)
    for name, p in params.items():  # gamma, delta, phi away from their init so that they matter
        if p.dim() == 1:
            p += 0.2 * torch.randn(p.shape, generator=g, dtype=torch.float64)
    model = mw.WiolaForCausalLM(hf_config(cfg)).to(dtype)
    missing, unexpected = model.load_state_dict({k: v.to(dtype) for k, v in params.items()}, strict=True)
    assert not missing and not unexpected
    return cfg, {k: v.to(dtype) for k, v in params.items()}, model.eval()


def tokens(cfg, B=2, T=None, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.V, (B, T or cfg.T), generator=g)


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def test_state_dict_names_are_the_model_contract():
    cfg, params, model = make()
    assert set(model.state_dict().keys()) == set(R.param_shapes(cfg).keys())
    for k, v in model.state_dict().items():
        assert tuple(v.shape) == R.param_shapes(cfg)[k], k


def test_eval_logits_equal_reference():
    for dtype, std, tol in ((torch.float64, 0.3, 1e-10), (torch.float32, 0.02, 1e-5)):
        cfg, params, model = make(dtype, std=std)
        x = tokens(cfg)
        with torch.no_grad():
            ref, _ = R.forward(params, cfg, x, training=False)
            out = model(x, use_cache=False).logits
        print(f"  {dtype}: max|d|/max|logit| = {rel(out, ref):.2e}")
        assert rel(out, ref) < tol


def test_training_with_atm_merges_equals_reference():
    cfg, params, model = make(torch.float64, tau=0.5)
    x = tokens(cfg)
    x[:, 5:12] = 7  # repeated tokens: neighbouring inputs nearly equal, so ATM merges them
    model.train()
    for p in params.values():
        p.requires_grad_(True)
    ref, aux = R.forward(params, cfg, x, training=True)
    assert any(bool(m.any()) for m in aux["merge_open"].values()), "the test needs ATM merges"
    out = model(x).logits
    assert rel(out, ref) < 1e-10
    tgt = tokens(cfg, seed=9)
    name = "model.layers.2.self_attn.k_proj.weight"
    g_ref = torch.autograd.grad(R.cross_entropy_loss(ref, tgt), params[name])[0]
    loss = torch.nn.functional.cross_entropy(out.reshape(-1, cfg.V), tgt.reshape(-1))
    g_hf = torch.autograd.grad(loss, dict(model.named_parameters())[name])[0]
    assert rel(g_hf, g_ref) < 1e-9


def test_cached_decoding_equals_full_forward():
    # float64 at a large init: the same numbers; float32 at the training init: the 1e-4 bar of docs/model.md
    # §2 (Inference) and §8 (Numerical tolerances)
    # (a large init makes this model chaotic enough to amplify float32 rounding ~1000x).
    for (dtype, std, tol) in ((torch.float64, 0.3, 1e-10), (torch.float32, 0.02, 1e-4)):
        _check_cached(dtype, std, tol)


def _check_cached(dtype, std, tol):
    cfg, params, model = make(dtype, std=std)
    for chunks in ([5, 1, 1, 1, 1], [3, 3, 3, 3], [1] * 12, [32]):
        x = tokens(cfg, T=sum(chunks))
        with torch.no_grad():
            full = model(x, use_cache=False).logits
            cache, parts, at = None, [], 0
            for n in chunks:
                o = model(x[:, at:at + n], past_key_values=cache, use_cache=True)
                cache, at = o.past_key_values, at + n
                parts.append(o.logits)
        err = float((torch.cat(parts, 1) - full).abs().max())
        print(f"  {dtype}, init std {std}, chunks {chunks}: max|d| = {err:.2e}")
        assert err < tol


def test_generate_greedy_with_and_without_cache_is_the_full_forward_argmax():
    cfg, params, model = make(torch.float64)
    prompt = tokens(cfg, B=2, T=4)
    a = model.generate(prompt, max_new_tokens=10, do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0)
    b = model.generate(prompt, max_new_tokens=10, do_sample=False, use_cache=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(a, b)
    with torch.no_grad():
        logits = model(a, use_cache=False).logits
    assert torch.equal(logits[:, 3:-1].argmax(-1), a[:, 4:])
    with raises(ValueError, match="context"):
        model.generate(prompt, max_new_tokens=cfg.T, do_sample=False, eos_token_id=None, pad_token_id=0)


def test_auto_classes_load_a_saved_folder_without_lm_head():
    cfg, params, model = make(torch.float32)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        shutil.copy(os.path.join(ROOT, "infer", "hf", "modeling_wiola.py"), d)
        conf = json.load(open(os.path.join(d, "config.json")))
        conf["auto_map"] = {"AutoConfig": "modeling_wiola.WiolaConfig",
                            "AutoModelForCausalLM": "modeling_wiola.WiolaForCausalLM"}
        json.dump(conf, open(os.path.join(d, "config.json"), "w"))
        from safetensors.numpy import load_file
        names = set(load_file(os.path.join(d, "model.safetensors")))
        assert names == set(R.param_shapes(cfg)), names ^ set(R.param_shapes(cfg))
        loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
            d, trust_remote_code=True, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        x = tokens(cfg)
        with torch.no_grad():
            assert torch.equal(loaded.eval()(x).logits, model(x).logits)


def test_packed_position_ids_equal_each_document_alone():
    """Packed inputs the transformers way (position_ids restarting at 0 at each
    document, as DataCollatorWithFlattening makes them; docs/model.md §2
    "Documents"): each document's logits are those it gets alone, in
    evaluation and in training with ATM merging; other positions are refused."""
    cfg, params, model = make(torch.float32, std=0.02, tau=0.5)
    x = tokens(cfg)
    x[:, 8:14] = 7  # repeats: ATM merges in training
    spans = [[(0, 5), (5, 6), (6, cfg.T)], [(0, 10), (10, cfg.T)]]
    pos = torch.stack([torch.cat([torch.arange(e - s) for s, e in row]) for row in spans])
    for train in (False, True):
        model.train(train)
        with torch.no_grad():
            out = model(x, position_ids=pos, use_cache=False).logits
            for b, row in enumerate(spans):
                for s, e in row:
                    alone = model(x[b:b + 1, s:e], use_cache=False).logits[0]
                    assert rel(out[b, s:e], alone) < 1e-5, (train, b, s, e)
            plain = model(x, use_cache=False).logits
        assert rel(out[0, 6:], plain[0, 6:]) > 1e-4  # the documents are not one window
    model.eval()
    with raises(ValueError, match="restarting"):
        model(x, position_ids=torch.tensor([[0, 1, 3] + list(range(3, cfg.T))] * 2))


def test_refusals():
    cfg, params, model = make(torch.float32)
    x = tokens(cfg, T=6)
    mask = torch.ones_like(x)
    mask[0, 0] = 0
    with raises(ValueError, match="padding"):
        model(x, attention_mask=mask)
    with raises(ValueError, match="multiple of num_attention_heads"):
        mw.WiolaConfig(hidden_size=100, num_attention_heads=16)
    with raises(ValueError, match="multiple of num_key_value_heads"):
        mw.WiolaConfig(num_attention_heads=16, num_key_value_heads=5)


if __name__ == "__main__":
    torch.manual_seed(0)
    names = [n for n in sorted(globals()) if n.startswith("test_")]
    for n in names:
        print(n)
        globals()[n]()
    print(f"test_hf_modeling: {len(names)} tests passed (transformers {transformers.__version__}, "
          f"torch {torch.__version__})")
