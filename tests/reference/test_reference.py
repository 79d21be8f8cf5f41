#!/usr/bin/env python3
"""Self-tests of the PyTorch reference (wiola_ref.py) and the dump tools.

Runs under pytest (``/usr/bin/python3 -m pytest tests/reference``) when it is
installed, and as a plain script otherwise:

    /usr/bin/python3 tests/reference/test_reference.py [-k NAME]

Exit status 0 iff every test passes.
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import wiola_ref as W  # noqa: E402

torch.set_num_threads(1)

TINY = dict(d=16, L=3, H=4, H_kv=2, d_A=16, d_B=32, V=37, T=10)


def _params(cfg, seed=0, dtype=torch.float64, perturb=True):
    """Random init plus perturbed gamma/delta/phi (so that they matter)."""
    p = W.init_params(cfg, seed=seed, dtype=dtype, requires_grad=False)
    g = torch.Generator().manual_seed(seed + 99)
    if perturb:
        for k, v in p.items():
            if v.ndim == 1:
                v.add_(0.3 * torch.randn(v.shape, generator=g, dtype=torch.float64).to(dtype))
            else:  # larger weights: attention patterns are not uniform
                v.mul_(4.0)
    return {k: v.requires_grad_(True) for k, v in p.items()}


def _tokens(cfg, B, seed=0, repeat=0.4):
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, cfg.V, (B, cfg.T + 1), generator=g)
    rep = torch.rand(B, cfg.T + 1, generator=g) < repeat
    for t in range(1, cfg.T + 1):
        tok[:, t] = torch.where(rep[:, t], tok[:, t - 1], tok[:, t])
    return tok


# --------------------------------------------------------------------------
# Naive per-position / per-head implementation (loops everywhere), fp64
# --------------------------------------------------------------------------
def _alg1(xrows, tau):
    """Paper Algorithm 1 on a list of float64 numpy rows -> open flags."""
    T = len(xrows)
    rho = []
    for t in range(T - 1):
        a, b = xrows[t], xrows[t + 1]
        na, nb = math.sqrt(float(a @ a)), math.sqrt(float(b @ b))
        rho.append(float(a @ b) / (na * nb) if na > 0 and nb > 0 else -math.inf)
    return _alg1_rho(rho, tau)


def _alg1_rho(rho, tau):
    T = len(rho) + 1
    out, i = [False] * T, 0
    while i < T:
        if i < T - 1 and rho[i] > tau:
            out[i] = True
            i += 2
        else:
            i += 1
    return out


def naive_forward(p, cfg, tokens, training=True, merge_open=None):
    B, T = tokens.shape
    d, H, G, dh = cfg.d, cfg.H, cfg.H_kv, cfg.d_h
    half = dh // 2

    def norm(x, gname):
        z = x + p[gname + ".offset"]
        return p[gname + ".weight"] * z / torch.sqrt((z * z).mean() + cfg.eps)

    def rot(v, pos):
        out = v.clone()
        for j in range(half):
            om = cfg.theta0 ** (-2.0 * j / dh)
            th = pos * om * (1 + 1 / cfg.k_s)
            r = 1 + cfg.a_s * math.sin(pos * cfg.f_s * om)
            c, s = r * math.cos(th), r * math.sin(th)
            out[j] = v[j] * c - v[j + half] * s
            out[j + half] = v[j] * s + v[j + half] * c
        return out

    E = p["model.embed_tokens.weight"]
    logits = torch.zeros(B, T, cfg.V, dtype=E.dtype)
    maps = {}
    for b in range(B):
        X = [E[int(tokens[b, t])] for t in range(T)]
        summ = [[sum(X[: t + 1]) / (t + 1) for t in range(T)]]
        for l in range(cfg.L):
            pre = f"model.layers.{l}."
            a = pre + "self_attn."
            xt = [norm(X[t], pre + "input_layernorm") for t in range(T)]
            atm = training and cfg.atm and l in cfg.atm_layers
            if atm:
                if merge_open is not None and l in merge_open:
                    op = [bool(v) for v in merge_open[l][b]]
                else:
                    op = _alg1([x.detach().numpy() for x in xt], cfg.tau)
                maps.setdefault(l, []).append(op)
                groups = W.merge_groups(op)
            n = min(cfg.Lambda, l + 1)
            ctx_layers = summ[l + 1 - n: l + 1]
            beta = torch.sigmoid(p[a + "ctx_gate_logit"])[0]
            A = []
            for t in range(T):
                q = p[a + "q_proj.weight"] @ xt[t]
                gate = torch.sigmoid(p[a + "gate_proj.weight"] @ xt[t])
                heads = []
                for h in range(H):
                    g = h % G
                    qh = rot(q[h * dh:(h + 1) * dh], t)
                    sl = slice(g * dh, (g + 1) * dh)

                    def kk(u):
                        return rot((p[a + "k_proj.weight"] @ xt[u])[sl], u)

                    def vv(u):
                        return (p[a + "v_proj.weight"] @ xt[u])[sl]
                    keys, vals = [], []
                    if atm:
                        for grp in groups:
                            if max(grp) <= t:
                                keys.append(sum(kk(u) for u in grp) / len(grp))
                                vals.append(sum(vv(u) for u in grp) / len(grp))
                            elif grp[0] == t:  # t opens a pair: own raw key/value
                                keys.append(kk(t))
                                vals.append(vv(t))
                    else:
                        keys = [kk(u) for u in range(t + 1)]
                        vals = [vv(u) for u in range(t + 1)]
                    sc = torch.stack([qh @ k for k in keys]) / math.sqrt(dh)
                    pr = torch.softmax(sc, 0)
                    o_self = sum(pr[i] * vals[i] for i in range(len(vals)))
                    kc = [(p[a + "ctx_k_proj.weight"] @ S[t])[sl] for S in ctx_layers]
                    vc = [(p[a + "ctx_v_proj.weight"] @ S[t])[sl] for S in ctx_layers]
                    pc = torch.softmax(torch.stack([qh @ k for k in kc]) / math.sqrt(dh), 0)
                    o_ctx = sum(pc[i] * vc[i] for i in range(len(vc)))
                    heads.append((1 - beta) * o_self + beta * o_ctx)
                O = torch.cat(heads)
                A.append(p[a + "o_proj.weight"] @ (gate * O))
            X = [X[t] + A[t] for t in range(T)]
            m = pre + "mlp."
            for t in range(T):
                xn = norm(X[t], pre + "post_attention_layernorm")
                av = p[m + "stream_a_down.weight"] @ (
                    torch.nn.functional.silu(p[m + "stream_a_gate.weight"] @ xn) * (p[m + "stream_a_up.weight"] @ xn))
                bu = p[m + "stream_b_up.weight"] @ xn
                bv = p[m + "stream_b_down.weight"] @ (0.5 * bu * (1 + torch.erf(bu / math.sqrt(2))))
                al = torch.sigmoid(p[m + "fusion.weight"] @ torch.cat([av, bv]))
                X[t] = X[t] + al * av + (1 - al) * bv
            summ.append([sum(X[: t + 1]) / (t + 1) for t in range(T)])
        for t in range(T):
            logits[b, t] = E @ norm(X[t], "model.norm")
    return logits, maps


# --------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------
def test_param_counts():
    """(e) exact parameter counts of the four named sizes (docs/model.md §1)."""
    for name, n in W.EXACT_PARAM_COUNTS.items():
        got = W.param_count(W.WiolaConfig.preset(name))
        assert got == n, (name, got, n)
    # formula of docs/model.md §1 against the shapes for an odd small config
    c = W.WiolaConfig(d=48, L=5, H=6, H_kv=3, d_A=40, d_B=100, V=97, T=8)
    per = (2 * c.d * c.H * c.d_h + c.H * c.d_h * c.d + 4 * c.d * c.H_kv * c.d_h
           + 3 * c.d * c.d_A + 2 * c.d * c.d_B + 2 * c.d * c.d + 4 * c.d + 1)
    assert W.param_count(c) == c.L * per + c.V * c.d + 2 * c.d


def test_merge_map_hand_cases():
    """(d) greedy, non-overlapping, strict >, zero norm never merges."""
    mo = lambda rho, tau=0.92: [int(v) for v in W.merge_open_from_rho(
        torch.tensor([rho], dtype=torch.float64), tau)[0]]
    assert mo([0.95, 0.95, 0.95, 0.10, 0.93]) == [1, 0, 1, 0, 1, 0]
    assert mo([0.10, 0.95, 0.95, 0.10, 0.10]) == [0, 1, 0, 0, 0, 0]
    assert mo([0.92, 0.9200001, 0.5]) == [0, 1, 0, 0]          # strict >
    assert mo([0.99] * 6) == [1, 0, 1, 0, 1, 0, 0]               # odd length: last alone
    assert mo([0.99] * 5) == [1, 0, 1, 0, 1, 0]
    assert mo([]) == [0]
    assert mo([0.1, 0.99, 0.1, 0.99, 0.99, 0.99, 0.1]) == [0, 1, 0, 1, 0, 1, 0, 0]
    # from activations: identical neighbours merge, orthogonal do not, zero never
    x = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [2.0, 1.0]]])
    assert [int(v) for v in W.compute_merge_open(x, 0.92)[0]] == [1, 0, 0, 0, 0, 0, 0]
    assert [int(v) for v in W.compute_merge_open(x, -5.0)[0]] == [1, 0, 1, 0, 0, 0, 0]
    # rho exactly at tau does not merge
    x = torch.tensor([[[3.0, 4.0], [4.0, 3.0]]], dtype=torch.float64)
    rho = float(W.neighbour_cosine(x)[0][0, 0])
    assert abs(rho - 24 / 25) < 1e-15
    assert int(W.compute_merge_open(x, rho)[0, 0]) == 0
    assert int(W.compute_merge_open(x, math.nextafter(rho, -1)) [0, 0]) == 1


def test_merge_map_random_vs_algorithm1():
    """(d) vectorised merge map == loop Algorithm 1 on random inputs."""
    g = torch.Generator().manual_seed(3)
    for T in (1, 2, 3, 7, 64):
        for tau in (-0.5, 0.0, 0.3, 0.92):
            x = torch.randn(5, T, 3, generator=g, dtype=torch.float64)
            x[:, ::3] *= torch.rand(5, 1, 1, generator=g, dtype=torch.float64) < 0.7  # zeros
            got = W.compute_merge_open(x, tau)
            for b in range(5):
                ref = _alg1([r.numpy() for r in x[b]], tau)
                assert [bool(v) for v in got[b]] == ref, (T, tau, b)
    # merge/unmerge helpers of the paper
    op = [1, 0, 0, 1, 0, 0]
    assert W.merge_groups(op) == [(0, 1), (2,), (3, 4), (5,)]
    xs = torch.arange(6, dtype=torch.float64)[:, None]
    xm = W.merge_tokens(xs, op)
    assert xm[:, 0].tolist() == [0.5, 2.0, 3.5, 5.0]
    assert W.unmerge_tokens(xm, op)[:, 0].tolist() == [0.5, 0.5, 2.0, 3.5, 3.5, 5.0]


def test_srpe_table_float64():
    cfg = W.WiolaConfig.preset("wiola-360m")
    c, s = W.srpe_table(cfg, 2048, torch.float32)
    p, j = 2047, 5
    om = cfg.theta0 ** (-2 * j / cfg.d_h)
    r = 1 + cfg.a_s * math.sin(p * cfg.f_s * om)
    th = p * om * (1 + 1 / cfg.k_s)
    assert float(c[p, j]) == float(np.float32(r * math.cos(th)))
    assert float(s[p, j + cfg.d_h // 2]) == float(np.float32(r * math.sin(th)))


def test_matches_naive_loops():
    """Vectorised forward == per-position/per-head loop implementation (fp64),
    with ATM maps computed by both (incl. merges), ATM off, and Lambda=3."""
    for over in (dict(), dict(atm=False), dict(Lambda=3, L=4, H=6, H_kv=3, d=24)):
        cfg = W.WiolaConfig(**{**TINY, "tau": 0.5, **over})
        p = _params(cfg, seed=1)
        tok = _tokens(cfg, 2, seed=2)[:, :-1]
        with torch.no_grad():
            lg, aux = W.forward(p, cfg, tok)
            ref, maps = naive_forward(p, cfg, tok)
        if cfg.atm:
            nm = sum(int(v.sum()) for v in aux["merge_open"].values())
            assert nm > 0, "test needs merges"
            for l, mo in aux["merge_open"].items():
                assert [[bool(v) for v in r] for r in mo] == maps[l]
        err = float((lg - ref).abs().max())
        assert err < 1e-11, (over, err)


def test_atm_no_merges_equals_causal():
    """(c) an all-zero merge map is exactly plain causal attention."""
    cfg = W.WiolaConfig(**TINY)
    p = _params(cfg, seed=4)
    tok = _tokens(cfg, 3, seed=5)[:, :-1]
    zero = {l: torch.zeros(3, cfg.T, dtype=torch.uint8) for l in cfg.atm_layers}
    with torch.no_grad():
        a, _ = W.forward(p, cfg, tok, training=True, merge_open=zero)
        b, _ = W.forward(p, cfg, tok, training=False)
    assert float((a - b).abs().max()) < 1e-13
    p32 = {k: v.detach().float() for k, v in p.items()}
    with torch.no_grad():
        a, _ = W.forward(p32, cfg, tok, training=True, merge_open=zero)
        b, _ = W.forward(p32, cfg, tok, training=False)
    assert float((a - b).abs().max()) < 1e-5


def test_atm_causality():
    """(c) forced merges (all pairs) and self-computed maps keep causality:
    changing tokens t+1.. leaves logits <= t unchanged."""
    cfg = W.WiolaConfig(**{**TINY, "tau": 0.3})
    B, T = 2, cfg.T
    p = _params(cfg, seed=6)
    tok = _tokens(cfg, B, seed=7)[:, :-1]
    alt = torch.zeros(B, T, dtype=torch.uint8)
    alt[:, 0:T - 1:2] = 1                                    # (0,1), (2,3), ...
    forced = {l: alt for l in cfg.atm_layers}
    g = torch.Generator().manual_seed(8)
    with torch.no_grad():
        base_f, _ = W.forward(p, cfg, tok, merge_open=forced)
        base_o, aux = W.forward(p, cfg, tok)
        plain, _ = W.forward(p, cfg, tok, training=False)
        assert float((base_f - plain).abs().max()) > 1e-6    # merging changes something
        assert sum(int(v.sum()) for v in aux["merge_open"].values()) > 0
        for t in range(T - 1):
            tok2 = tok.clone()
            tok2[:, t + 1:] = torch.randint(0, cfg.V, (B, T - t - 1), generator=g)
            lf, _ = W.forward(p, cfg, tok2, merge_open=forced)
            lo, _ = W.forward(p, cfg, tok2)
            assert float((lf[:, :t + 1] - base_f[:, :t + 1]).abs().max()) < 1e-12, t
            assert float((lo[:, :t + 1] - base_o[:, :t + 1]).abs().max()) < 1e-12, t
            assert float((lf[:, t + 1:] - base_f[:, t + 1:]).abs().max()) > 1e-9, t


def test_gradients_finite_differences():
    """(b) fp64 autograd gradient vs central finite differences (ATM on, maps fixed)."""
    cfg = W.WiolaConfig(**{**TINY, "T": 8})
    p = _params(cfg, seed=10)
    tok = _tokens(cfg, 2, seed=11)
    inputs, targets = tok[:, :-1], tok[:, 1:]
    with torch.no_grad():
        _, aux = W.forward(p, cfg, inputs)
    maps = {l: torch.zeros(2, cfg.T, dtype=torch.bool) for l in cfg.atm_layers}
    for l in maps:
        maps[l][0, 1] = maps[l][0, 4] = maps[l][1, 0] = maps[l][1, 6] = True

    def loss_fn():
        lg, _ = W.forward(p, cfg, inputs, merge_open=maps)
        return W.cross_entropy_loss(lg, targets)
    names = list(p)
    grads = dict(zip(names, torch.autograd.grad(loss_fn(), [p[n] for n in names])))
    g = torch.Generator().manual_seed(12)
    h = 1e-6
    checked = 0
    for n in names:
        if not any(s in n for s in ("layers.1.", "embed", "model.norm", "layers.2.mlp.fusion", "layers.0.self_attn.ctx")):
            continue
        v = p[n]
        idx = int(torch.randint(0, v.numel(), (1,), generator=g))
        if "embed" in n:  # pick a row that is used
            idx = int(inputs[0, 3]) * cfg.d + 5
        with torch.no_grad():
            old = float(v.view(-1)[idx])
            v.view(-1)[idx] = old + h
            lp = float(loss_fn())
            v.view(-1)[idx] = old - h
            lm = float(loss_fn())
            v.view(-1)[idx] = old
        fd = (lp - lm) / (2 * h)
        an = float(grads[n].view(-1)[idx])
        assert abs(fd - an) <= 1e-6 * max(abs(an), 1e-3), (n, idx, fd, an)
        checked += 1
    assert checked >= 15, checked


def test_adamw_clip_lr_match_pytorch():
    """docs/model.md §4: AdamW, clip_grad_norm_ and the schedule vs PyTorch."""
    assert W.warmup_steps(100) == 5 and W.warmup_steps(50) == 3 and W.warmup_steps(29) == 1
    assert W.lr_at(1, 100) == 3e-4 / 5 and W.lr_at(5, 100) == 3e-4
    assert abs(W.lr_at(100, 100, 3e-4, 1e-5)) - 1e-5 < 1e-18
    mid = W.lr_at(5 + 95 // 2, 100)
    assert abs(mid - 0.5 * 3e-4 * (1 + math.cos(math.pi * 47 / 95))) < 1e-18
    cfg = W.WiolaConfig(**TINY)
    p = W.init_params(cfg, seed=13, dtype=torch.float64)
    tp = {k: v.detach().clone().requires_grad_(True) for k, v in p.items()}
    dec = [v for k, v in tp.items() if W.is_decayed(k, v.shape)]
    nodec = [v for k, v in tp.items() if not W.is_decayed(k, v.shape)]
    assert len(nodec) == 5 * cfg.L + 2 and len(dec) == 13 * cfg.L + 1
    opt = torch.optim.AdamW([{"params": dec, "weight_decay": 0.1}, {"params": nodec, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    st = W.new_adam_state(p)
    g = torch.Generator().manual_seed(14)
    for step in range(1, 4):
        grads = {k: torch.randn(v.shape, generator=g, dtype=torch.float64) * (0.3 if step == 2 else 0.01)
                 for k, v in p.items()}
        for k in tp:
            tp[k].grad = grads[k].clone()
        tn = float(torch.nn.utils.clip_grad_norm_(list(tp.values()), 1.0))
        lr = 1e-3 * step
        for grp in opt.param_groups:
            grp["lr"] = lr
        opt.step()
        n, _ = W.clip_grads_(grads, 1.0)
        assert abs(n - tn) < 1e-12 * tn
        W.adamw_update_(p, grads, st, lr, step, 0.9, 0.95, 1e-8, 0.1)
        for k in p:
            assert float((p[k] - tp[k]).abs().max()) < 1e-15, (step, k)


def test_float32_float64():
    cfg = W.WiolaConfig(**TINY)
    p = _params(cfg, seed=15)
    tok = _tokens(cfg, 2, seed=16)
    zero = {l: torch.zeros(2, cfg.T, dtype=torch.bool) for l in cfg.atm_layers}
    zero[cfg.atm_layers[0]][0, 3] = True
    with torch.no_grad():
        a, _ = W.forward(p, cfg, tok[:, :-1], merge_open=zero)
        b, _ = W.forward({k: v.float() for k, v in p.items()}, cfg, tok[:, :-1], merge_open=zero)
    assert b.dtype == torch.float32
    assert float((a - b.double()).norm() / a.norm()) < 1e-5


def test_z_loss_gradient():
    # z-loss (docs/model.md §4): d(z mean lse^2)/dlogit = 2 z lse softmax / n
    # on the counted rows, zero on the masked ones, by autograd in float64.
    g = torch.Generator().manual_seed(21)
    logits = (torch.randn(2, 5, 11, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    keep = torch.ones(2, 5, dtype=torch.bool)
    keep[0, 2] = keep[1, 4] = False
    z = 0.3
    (dz,) = torch.autograd.grad(z * W.z_loss_term(logits, keep), [logits])
    lse = torch.logsumexp(logits.detach(), dim=-1, keepdim=True)
    want = 2 * z * lse * torch.softmax(logits.detach(), dim=-1) * keep.unsqueeze(-1) / int(keep.sum())
    assert float((dz - want).abs().max()) < 1e-15
    assert abs(float(W.z_loss_term(logits.detach(), keep)) - float((lse.squeeze(-1)[keep] ** 2).mean())) < 1e-12


def _run(args):
    r = subprocess.run([sys.executable] + args, capture_output=True, text=True, cwd=HERE)
    return r.returncode, r.stdout + r.stderr


def test_documents_alone():
    """docs/model.md §2 "Documents": a window without an EOS is forward()
    itself; with EOS ids each document's logits are those of the document
    alone (here: its prefix in a window of its own, filler after it, which a
    causal model never sees), an earlier document does not reach a later
    one (it does without documents), and the loss counts every target but
    the EOS positions'."""
    torch.manual_seed(5)
    cfg = W.WiolaConfig.preset("tiny", T=24, tau=0.05)
    p = W.init_params(cfg, seed=3, dtype=torch.float64)
    eos = 7
    tok = torch.randint(8, cfg.V, (2, cfg.T + 1))
    a, _ = W.forward(p, cfg, tok[:, :-1])
    b, _ = W.forward_documents(p, cfg, tok[:, :-1], eos)
    assert torch.equal(a, b)
    tok[0, [4, 5, 16]] = eos   # documents 0..4 (ends with its EOS), 5 (EOS only), 6..16, 17..
    tok[1, 20] = eos
    inp, tgt = tok[:, :-1], tok[:, 1:]
    assert W.document_spans(inp[0], eos) == [(0, 5), (5, 6), (6, 17), (17, 24)]
    logits, aux = W.forward_documents(p, cfg, inp, eos)
    for b_, (s, e) in [(0, (6, 17)), (0, (17, 24)), (1, (0, 21)), (1, (21, 24))]:
        alone = torch.randint(8, cfg.V, (1, cfg.T))
        alone[0, :e - s] = inp[b_, s:e]
        ref, _ = W.forward(p, cfg, alone)
        assert float((ref[0, :e - s] - logits[b_, s:e]).abs().max()) < 1e-12, (b_, s, e)
    for l, m in aux["merge_open"].items():  # no pair crosses a document's start
        assert not bool(m[0, 4]) and not bool(m[0, 5]) and not bool(m[0, 16]) and not bool(m[1, 20]), l
    changed = inp.clone()
    changed[0, 1] = 9
    c, _ = W.forward_documents(p, cfg, changed, eos)
    assert torch.equal(c[0, 5:], logits[0, 5:]) and not torch.equal(c[0, :5], logits[0, :5])
    c, _ = W.forward(p, cfg, changed)
    assert not torch.equal(c[0, 5:], W.forward(p, cfg, inp)[0][0, 5:])
    loss, n = W.documents_loss(logits, inp, tgt, eos)
    assert n == 2 * cfg.T - 4
    keep = inp != eos
    ce = torch.nn.functional.cross_entropy(logits[keep], tgt[keep])
    assert abs(float(loss) - float(ce)) < 1e-12


def test_dump_roundtrip_and_perturbation():
    """(a) make_dump -> compare_dump passes; a perturbed gradient / merge map /
    parameter fails; a broken file is an error (exit 2)."""
    d = tempfile.mkdtemp(prefix="wiola_ref_test_")
    try:
        rc, out = _run(["make_dump.py", "--out-dir", d, "--steps", "3"])
        assert rc == 0, out
        files = [os.path.join(d, f"step_{i}.h5") for i in (1, 2, 3)]
        rc, out = _run(["compare_dump.py"] + files + ["--threads", "1"])
        assert rc == 0 and "PASS" in out, out
        assert "128/128 (100.00%)" in out
        rc, out = _run(["compare_dump.py", files[1], files[2], "--threads", "1"])  # start at step 2
        assert rc == 0, out

        bad = os.path.join(d, "bad_step_2.h5")
        shutil.copy(files[1], bad)
        with h5py.File(bad, "r+") as f:
            ds = f["grads/model.layers.3.mlp.stream_b_up.weight"]
            a = ds[()]
            a[0, 0] += 1e-3 * np.linalg.norm(a)
            ds[...] = a
        rc, out = _run(["compare_dump.py", files[0], bad, files[2], "--threads", "1"])
        assert rc == 1 and "grads/model.layers.3.mlp.stream_b_up.weight" in out, out

        shutil.copy(files[1], bad)
        with h5py.File(bad, "r+") as f:  # params_after drifts -> step 3's carried params differ
            ds = f["params_after/model.layers.0.self_attn.q_proj.weight"]
            a = ds[()]
            a *= 1.0001
            ds[...] = a
        rc, out = _run(["compare_dump.py", files[0], bad, "--threads", "1"])
        assert rc == 1 and "params_after/model.layers.0.self_attn.q_proj.weight" in out, out

        shutil.copy(files[0], bad)
        with h5py.File(bad, "r+") as f:  # different merge decisions change the gradients
            mo = f["atm/layer_2"][()]
            mo[:] = 0
            f["atm/layer_2"][...] = mo
        rc, out = _run(["compare_dump.py", bad, "--threads", "1"])
        assert rc == 1 and "FAIL" in out, out

        # Documents: a packed batch (an EOS-only document too) passes; read
        # as one document per window it fails.
        dd = os.path.join(d, "docs")
        rc, out = _run(["make_dump.py", "--out-dir", dd, "--steps", "1", "--documents-eos", "5"])
        assert rc == 0, out
        docs = os.path.join(dd, "step_1.h5")
        rc, out = _run(["compare_dump.py", docs, "--threads", "1"])
        assert rc == 0 and "PASS" in out and "targets counted" in out, out
        shutil.copy(docs, bad)
        with h5py.File(bad, "r+") as f:
            del f["config"].attrs["documents"]
        rc, out = _run(["compare_dump.py", bad, "--threads", "1"])
        assert rc == 1 and "FAIL" in out, out

        shutil.copy(files[0], bad)
        with h5py.File(bad, "r+") as f:
            del f["grads/model.norm.offset"]
        rc, out = _run(["compare_dump.py", bad, "--threads", "1"])
        assert rc == 2 and "missing" in out, out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sel = argv[argv.index("-k") + 1] if "-k" in argv else None
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    failed = 0
    for n, f in tests:
        if sel and sel not in n:
            continue
        t0 = time.time()
        try:
            f()
            print(f"PASS {n} ({time.time() - t0:.1f}s)", flush=True)
        except Exception as e:  # noqa: BLE001
            failed += 1
            import traceback
            traceback.print_exc()
            print(f"FAIL {n}: {e!r}", flush=True)
    print("ALL PASSED" if not failed else f"{failed} FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
