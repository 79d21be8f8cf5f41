"""PyTorch reference implementation of the Wiola language model (docs/model.md).

Functional style: parameters are a plain ``dict`` keyed by the exact
docs/model.md §3 names, matrices in PyTorch ``[out, in]`` layout.  Works in
float32 and float64.

    cfg = WiolaConfig.preset("tiny")
    params = init_params(cfg, seed=0)
    logits, aux = forward(params, cfg, tokens)           # training mode, ATM as cfg.atm
    loss = cross_entropy_loss(logits, targets)

Everything inside a layer is batched (no Python loops over positions or heads);
the only Python loop is over layers.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections import OrderedDict
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def set_threads(n: int) -> None:
    """Set the number of intra-op CPU threads torch uses."""
    if n and n > 0:
        torch.set_num_threads(int(n))


# --------------------------------------------------------------------------
# Configuration (docs/model.md §1, §2)
# --------------------------------------------------------------------------
@dataclasses.dataclass
class WiolaConfig:
    d: int
    L: int
    H: int
    H_kv: int
    d_A: int
    d_B: int
    V: int
    T: int
    theta0: float = 10000.0
    k_s: float = 8.0
    a_s: float = 0.1
    f_s: float = 0.01
    tau: float = 0.92
    Lambda: int = 2
    eps: float = 1e-6
    atm: bool = True

    def __post_init__(self) -> None:
        if self.d % self.H:
            raise ValueError("d must be divisible by H")
        if self.H % self.H_kv:
            raise ValueError("H must be divisible by H_kv")
        if self.d_h % 2:
            raise ValueError("d_h must be even (rotate-half pairing)")
        if self.Lambda < 1:
            raise ValueError("Lambda must be >= 1")

    @property
    def d_h(self) -> int:
        return self.d // self.H

    @property
    def atm_layers(self) -> range:
        """Layers where ATM acts (training only): floor(L/3) <= l < floor(2L/3)."""
        return range(self.L // 3, (2 * self.L) // 3)

    @staticmethod
    def preset(name: str, **overrides) -> "WiolaConfig":
        base = dict(PRESETS[name])
        base.update(overrides)
        return WiolaConfig(**base)


PRESETS = {
    "wiola-120m": dict(d=768, L=12, H=12, H_kv=4, d_A=768, d_B=3072, V=32000, T=2048),
    "wiola-360m": dict(d=1024, L=16, H=16, H_kv=4, d_A=1024, d_B=4096, V=32000, T=2048),
    "wiola-700m": dict(d=1536, L=24, H=16, H_kv=8, d_A=1536, d_B=6144, V=32000, T=2048),
    "wiola-1.5b": dict(d=2048, L=28, H=16, H_kv=8, d_A=2048, d_B=8192, V=32000, T=2048),
    # small configurations for tests and CPU benchmarks
    "tiny": dict(d=64, L=6, H=4, H_kv=2, d_A=64, d_B=256, V=512, T=32),
    "bench": dict(d=256, L=8, H=8, H_kv=4, d_A=256, d_B=1024, V=8192, T=256),
}
EXACT_PARAM_COUNTS = {
    "wiola-120m": 147_297_804,
    "wiola-360m": 318_048_272,
    "wiola-700m": 1_068_518_424,
    "wiola-1.5b": 2_179_698_716,
}

CONFIG_INT_FIELDS = ("d", "L", "H", "H_kv", "d_A", "d_B", "V", "T", "Lambda")
CONFIG_FLOAT_FIELDS = ("theta0", "k_s", "a_s", "f_s", "tau", "eps")


# --------------------------------------------------------------------------
# Parameters (docs/model.md §3)
# --------------------------------------------------------------------------
def param_shapes(cfg: WiolaConfig) -> "OrderedDict[str, Tuple[int, ...]]":
    d, dq, dkv = cfg.d, cfg.H * cfg.d_h, cfg.H_kv * cfg.d_h
    s: "OrderedDict[str, Tuple[int, ...]]" = OrderedDict()
    s["model.embed_tokens.weight"] = (cfg.V, d)
    for l in range(cfg.L):
        p = f"model.layers.{l}."
        s[p + "input_layernorm.weight"] = (d,)
        s[p + "input_layernorm.offset"] = (d,)
        s[p + "self_attn.q_proj.weight"] = (dq, d)
        s[p + "self_attn.k_proj.weight"] = (dkv, d)
        s[p + "self_attn.v_proj.weight"] = (dkv, d)
        s[p + "self_attn.ctx_k_proj.weight"] = (dkv, d)
        s[p + "self_attn.ctx_v_proj.weight"] = (dkv, d)
        s[p + "self_attn.gate_proj.weight"] = (dq, d)
        s[p + "self_attn.o_proj.weight"] = (d, dq)
        s[p + "self_attn.ctx_gate_logit"] = (1,)
        s[p + "post_attention_layernorm.weight"] = (d,)
        s[p + "post_attention_layernorm.offset"] = (d,)
        s[p + "mlp.stream_a_gate.weight"] = (cfg.d_A, d)
        s[p + "mlp.stream_a_up.weight"] = (cfg.d_A, d)
        s[p + "mlp.stream_a_down.weight"] = (d, cfg.d_A)
        s[p + "mlp.stream_b_up.weight"] = (cfg.d_B, d)
        s[p + "mlp.stream_b_down.weight"] = (d, cfg.d_B)
        s[p + "mlp.fusion.weight"] = (d, 2 * d)
    s["model.norm.weight"] = (d,)
    s["model.norm.offset"] = (d,)
    return s


def param_count(cfg: WiolaConfig) -> int:
    return sum(math.prod(sh) for sh in param_shapes(cfg).values())


def is_decayed(name: str, shape) -> bool:
    """Weight decay on matrices and the embedding only (not gamma, delta, phi)."""
    return len(shape) >= 2


def init_params(cfg: WiolaConfig, seed: int = 0, dtype=torch.float32,
                std: float = 0.02, requires_grad: bool = True) -> Dict[str, Tensor]:
    """Matrices/embedding N(0, std^2); gamma = 1, delta = 0, phi = -3."""
    g = torch.Generator().manual_seed(seed)
    out: Dict[str, Tensor] = OrderedDict()
    for name, shape in param_shapes(cfg).items():
        if name.endswith("ctx_gate_logit"):
            t = torch.full(shape, -3.0, dtype=torch.float64)
        elif name.endswith(".offset"):
            t = torch.zeros(shape, dtype=torch.float64)
        elif len(shape) == 1:  # norm gammas
            t = torch.ones(shape, dtype=torch.float64)
        else:
            t = torch.randn(shape, generator=g, dtype=torch.float32).double() * std
        out[name] = t.to(dtype).requires_grad_(requires_grad)
    return out


# --------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------
def wiola_rmsnorm(x: Tensor, gamma: Tensor, delta: Tensor, eps: float) -> Tensor:
    """WiolaRMSNorm: z = x + delta; y = gamma * z / sqrt(mean(z^2) + eps)."""
    z = x + delta
    return gamma * (z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps))


@functools.lru_cache(maxsize=64)
def _srpe_table_cached(T: int, d_h: int, theta0: float, k_s: float, a_s: float,
                       f_s: float, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    half = d_h // 2
    j = torch.arange(half, dtype=torch.float64)
    omega = theta0 ** (-2.0 * j / d_h)                      # [half]
    p = torch.arange(T, dtype=torch.float64)[:, None]        # [T, 1]
    theta = p * omega * (1.0 + 1.0 / k_s)                    # [T, half]
    r = 1.0 + a_s * torch.sin(p * f_s * omega)
    c = (r * torch.cos(theta)).to(dtype)                     # rounded once
    s = (r * torch.sin(theta)).to(dtype)
    return torch.cat([c, c], -1).contiguous(), torch.cat([s, s], -1).contiguous()


def srpe_table(cfg: WiolaConfig, T: int, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """(cos, sin) tables [T, d_h] (each half duplicated), computed in float64."""
    return _srpe_table_cached(T, cfg.d_h, float(cfg.theta0), float(cfg.k_s),
                              float(cfg.a_s), float(cfg.f_s), dtype)


def apply_srpe(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [..., T, n_heads, d_h]; rotate-half: lo' = lo c - hi s, hi' = lo s + hi c."""
    half = x.shape[-1] // 2
    lo, hi = x[..., :half], x[..., half:]
    rot = torch.cat([-hi, lo], -1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def prefix_mean(x: Tensor) -> Tensor:
    """P(X)_t = (1/(t+1)) sum_{u<=t} X_u along dim 1 (x is [B, T, d])."""
    T = x.shape[1]
    cnt = torch.arange(1, T + 1, dtype=x.dtype, device=x.device)[:, None]
    return torch.cumsum(x, dim=1) / cnt


# --------------------------------------------------------------------------
# ATM merge map (paper Algorithm 1, vectorised)
# --------------------------------------------------------------------------
def neighbour_cosine(x: Tensor) -> Tuple[Tensor, Tensor]:
    """rho_t for t = 0..T-2 computed in float64 from x [B, T, d]; also a
    validity mask (False where a norm is zero: never merges)."""
    xd = x.detach().to(torch.float64)
    n = xd.norm(dim=-1)                                      # [B, T]
    den = n[:, :-1] * n[:, 1:]
    dot = (xd[:, :-1] * xd[:, 1:]).sum(-1)
    valid = den > 0
    rho = torch.where(valid, dot / torch.where(valid, den, torch.ones_like(den)),
                      torch.full_like(den, -math.inf))
    return rho, valid


def greedy_merge_open(cand: Tensor) -> Tensor:
    """Greedy left-to-right non-overlapping merge from candidate flags.

    cand [B, T] bool (cand[t] = rho_t > tau, last column False).  Returns
    open [B, T] bool: open[t] = cand[t] and not open[t-1].  Inside a maximal run
    of candidates starting at s this opens s, s+2, s+4, ... (vectorised).
    """
    B, T = cand.shape
    idx = torch.arange(T, device=cand.device).expand(B, T)
    prev = torch.zeros_like(cand)
    prev[:, 1:] = cand[:, :-1]
    start = cand & ~prev
    run_start = torch.cummax(torch.where(start, idx, torch.full_like(idx, -1)), dim=1).values
    return cand & ((idx - run_start) % 2 == 0)


def merge_open_from_rho(rho: Tensor, tau: float) -> Tensor:
    """rho [B, T-1] (-inf or NaN never merges) -> open [B, T] bool."""
    B, T = rho.shape[0], rho.shape[1] + 1
    cand = torch.zeros(B, T, dtype=torch.bool, device=rho.device)
    cand[:, :-1] = rho > tau                                 # strictly greater
    return greedy_merge_open(cand)


def compute_merge_open(x: Tensor, tau: float) -> Tensor:
    """Merge map of Algorithm 1 for x [B, T, d]: bool [B, T], True where t
    opens the merged pair (t, t+1).  rho_t > tau strictly; zero norm never merges."""
    B, T = x.shape[0], x.shape[1]
    if T < 2:
        return torch.zeros(B, T, dtype=torch.bool, device=x.device)
    rho, _ = neighbour_cosine(x)
    return merge_open_from_rho(rho, tau)


def validate_merge_open(m: Tensor) -> None:
    m = m.bool()
    if m.shape[-1] and bool(m[..., -1].any()):
        raise ValueError("merge map: the last position cannot open a pair")
    if bool((m[..., :-1] & m[..., 1:]).any()):
        raise ValueError("merge map: overlapping pairs (t and t+1 both open)")


def merge_groups(open_row) -> list:
    """Paper's merge map M = [G_k]: list of tuples of source positions."""
    o = [bool(v) for v in open_row]
    groups, i = [], 0
    while i < len(o):
        if o[i]:
            groups.append((i, i + 1))
            i += 2
        else:
            groups.append((i,))
            i += 1
    return groups


def merge_tokens(x: Tensor, open_row) -> Tensor:
    """Paper's merge: x [T, ...] -> x' [T', ...] (pair means)."""
    return torch.stack([x[list(g)].mean(0) for g in merge_groups(open_row)])


def unmerge_tokens(xm: Tensor, open_row) -> Tensor:
    """Paper's unmerge (eq. unmerge): x_t = x'_k for t in G_k."""
    idx = [k for k, g in enumerate(merge_groups(open_row)) for _ in g]
    return xm[idx]


# --------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------
@functools.lru_cache(maxsize=32)
def _causal_bias(T: int, R: int, dtype: torch.dtype) -> Tensor:
    m = torch.ones(T, T, dtype=torch.bool).triu(1)
    b = torch.zeros(T, T, dtype=dtype).masked_fill(m, -math.inf)
    return b.repeat(R, 1).contiguous()                       # [R*T, T]


def self_attention(q: Tensor, k: Tensor, v: Tensor, R: int,
                   merge_open: Optional[Tensor]) -> Tensor:
    """Causal GQA attention, optionally with ATM key/value merging.

    q [B, H_kv, R*T, d_h] (already scaled by 1/sqrt(d_h); row r*T + t is query
    head h = r*H_kv + g at position t), k, v [B, H_kv, T, d_h] (k SRPE-rotated).
    Returns [B, H_kv, R*T, d_h].

    ATM (merge_open [B, T] bool, True where u opens the pair (u, u+1)): query t
    attends to [merged groups ; raw keys] with the visibility mask
      group G (key = mean of its members' rotated keys, value = mean of values)
          visible iff last(G) <= t;
      raw key/value of u visible iff u == t and t opens a pair.
    Vectorised: slot u holds the group whose last member is u, or -- when u
    opens a pair, so that no group ends at u -- the raw key/value of u.  Slot
    u's key is then (k_{u-1}+k_u)/2 if u closes a pair and k_u otherwise, and
    the mask becomes  visible[t, u] = (u < t and not open[u]) or u == t.
    With no merges this is exactly causal attention.
    """
    B, G, RT, dh = q.shape
    T = k.shape[2]
    if merge_open is None:
        s = torch.baddbmm(_causal_bias(T, R, q.dtype).to(q.device),
                          q.reshape(B * G, RT, dh), k.reshape(B * G, T, dh).transpose(1, 2))
        p = torch.softmax(s, dim=-1)
        return torch.bmm(p, v.reshape(B * G, T, dh)).view(B, G, RT, dh)

    mo = merge_open.to(device=q.device, dtype=torch.bool)
    closes = torch.zeros_like(mo)
    closes[:, 1:] = mo[:, :-1]                               # u is the 2nd member of a pair
    cl = closes[:, None, :, None]                            # [B, 1, T, 1]
    k_prev = torch.cat([k[:, :, :1], k[:, :, :-1]], 2)
    v_prev = torch.cat([v[:, :, :1], v[:, :, :-1]], 2)
    ks = torch.where(cl, (k_prev + k) * 0.5, k)              # slot keys
    vs = torch.where(cl, (v_prev + v) * 0.5, v)
    strict = torch.ones(T, T, dtype=torch.bool, device=q.device).tril(-1)
    hidden = ~((strict[None] & ~mo[:, None, :]) |
               torch.eye(T, dtype=torch.bool, device=q.device)[None])   # [B, T(query), T(slot)]
    s = torch.matmul(q, ks.transpose(-1, -2))                # [B, G, R*T, T]
    s = s.view(B, G, R, T, T).masked_fill(hidden[:, None, None], -math.inf).view(B, G, RT, T)
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, vs)


def gcla(p: Dict[str, Tensor], pre: str, cfg: WiolaConfig, xt: Tensor, ctx: Tensor,
         cos: Tensor, sin: Tensor, merge_open: Optional[Tensor]) -> Tensor:
    """Gated Cross-Layer Attention.  xt = X~ [B, T, d]; ctx [B, T, n, d] context
    rows C_t (prefix-mean summaries); returns A [B, T, d]."""
    B, T, _ = xt.shape
    H, G, dh = cfg.H, cfg.H_kv, cfg.d_h
    R = H // G
    a = pre + "self_attn."
    wq, wk, wv, wg = (p[a + "q_proj.weight"], p[a + "k_proj.weight"],
                      p[a + "v_proj.weight"], p[a + "gate_proj.weight"])
    proj = F.linear(xt, torch.cat([wq, wk, wv, wg], 0))
    q, k, v, gate = torch.split(proj, [H * dh, G * dh, G * dh, H * dh], -1)
    scale = 1.0 / math.sqrt(dh)
    # head h = r*G + g  (g(h) = h mod H_kv): view [B, T, R, G, dh]
    q = apply_srpe(q.reshape(B, T, H, dh), cos, sin).mul(scale).view(B, T, R, G, dh)
    k = apply_srpe(k.reshape(B, T, G, dh), cos, sin)                # [B, T, G, dh]
    v = v.reshape(B, T, G, dh)

    # self-attention (query rows folded: [B, G, R*T, dh])
    qs = q.permute(0, 3, 2, 1, 4).reshape(B, G, R * T, dh)
    o_self = self_attention(qs, k.transpose(1, 2), v.transpose(1, 2), R, merge_open)
    o_self = o_self.view(B, G, R, T, dh).permute(0, 3, 2, 1, 4)     # [B, T, R, G, dh]

    # context attention over the rows C_t (no SRPE on context keys)
    n = ctx.shape[2]
    kv_c = F.linear(ctx, torch.cat([p[a + "ctx_k_proj.weight"], p[a + "ctx_v_proj.weight"]], 0))
    kc, vc = kv_c.view(B, T, n, 2, G, dh).unbind(3)                 # [B, T, n, G, dh]
    qc = q.permute(0, 1, 3, 2, 4)                                   # [B, T, G, R, dh]
    sc = torch.matmul(qc, kc.permute(0, 1, 3, 4, 2))                # [B, T, G, R, n]
    pc = torch.softmax(sc, dim=-1)
    o_ctx = torch.matmul(pc, vc.permute(0, 1, 3, 2, 4))             # [B, T, G, R, dh]
    o_ctx = o_ctx.transpose(2, 3)                                   # [B, T, R, G, dh]

    beta = torch.sigmoid(p[a + "ctx_gate_logit"])
    # (under bf16 autocast the three come in different dtypes; lerp wants one)
    dt = torch.promote_types(torch.promote_types(o_self.dtype, o_ctx.dtype), beta.dtype)
    o = torch.lerp(o_self.to(dt), o_ctx.to(dt), beta.to(dt))       # (1-beta) O_self + beta O_ctx
    o = o.reshape(B, T, H * dh)                                     # h-major
    return F.linear(torch.sigmoid(gate) * o, p[a + "o_proj.weight"])


def dsff(p: Dict[str, Tensor], pre: str, cfg: WiolaConfig, x: Tensor) -> Tensor:
    m = pre + "mlp."
    ga, ua, ub = (p[m + "stream_a_gate.weight"], p[m + "stream_a_up.weight"],
                  p[m + "stream_b_up.weight"])
    h = F.linear(x, torch.cat([ga, ua, ub], 0))
    hg, hu, hb = torch.split(h, [cfg.d_A, cfg.d_A, cfg.d_B], -1)
    a = F.linear(F.silu(hg) * hu, p[m + "stream_a_down.weight"])
    b = F.linear(F.gelu(hb), p[m + "stream_b_down.weight"])          # exact erf GELU
    alpha = torch.sigmoid(F.linear(torch.cat([a, b], -1), p[m + "fusion.weight"]))
    return torch.lerp(b, a, alpha)                               # alpha a + (1 - alpha) b


# --------------------------------------------------------------------------
# Full forward pass
# --------------------------------------------------------------------------
def forward(params: Dict[str, Tensor], cfg: WiolaConfig, tokens: Tensor,
            training: bool = True,
            merge_open: Optional[Dict[int, Tensor]] = None) -> Tuple[Tensor, dict]:
    """tokens [B, T] (int) -> logits [B, T, V].

    training=True and cfg.atm: ATM acts in cfg.atm_layers.  merge_open, if given,
    maps layer index -> [B, T] (uint8/bool) merge map that is used instead of
    the one computed from the activations (decisions injected from outside).
    aux = {"merge_open": {l: map used}, "own_merge_open": {l: map computed here}}.
    """
    B, T = tokens.shape
    emb = params["model.embed_tokens.weight"]
    dtype = emb.dtype
    cos, sin = srpe_table(cfg, T, dtype)
    cos, sin = cos.to(emb.device), sin.to(emb.device)
    x = F.embedding(tokens.long(), emb)
    summaries = [prefix_mean(x)]                                     # S^(-1)
    aux = {"merge_open": {}, "own_merge_open": {}}
    atm_on = training and cfg.atm
    for l in range(cfg.L):
        pre = f"model.layers.{l}."
        xt = wiola_rmsnorm(x, params[pre + "input_layernorm.weight"],
                           params[pre + "input_layernorm.offset"], cfg.eps)
        mo = None
        if atm_on and l in cfg.atm_layers:
            own = compute_merge_open(xt, cfg.tau)
            aux["own_merge_open"][l] = own
            if merge_open is not None and l in merge_open:
                mo = merge_open[l].to(device=x.device).bool()
                if tuple(mo.shape) != (B, T):
                    raise ValueError(f"merge map for layer {l}: shape {tuple(mo.shape)} != {(B, T)}")
                validate_merge_open(mo)
            else:
                mo = own
            aux["merge_open"][l] = mo
        n = min(cfg.Lambda, l + 1)
        ctx = torch.stack(summaries[l + 1 - n: l + 1], 2)            # [B, T, n, d]
        x = x + gcla(params, pre, cfg, xt, ctx, cos, sin, mo)
        xn = wiola_rmsnorm(x, params[pre + "post_attention_layernorm.weight"],
                           params[pre + "post_attention_layernorm.offset"], cfg.eps)
        x = x + dsff(params, pre, cfg, xn)
        if l + 1 < cfg.L:
            summaries.append(prefix_mean(x))                         # S^(l)
    xf = wiola_rmsnorm(x, params["model.norm.weight"], params["model.norm.offset"], cfg.eps)
    return F.linear(xf, emb), aux


def cross_entropy_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy over all B*T targets."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).long())


def z_loss_term(logits: Tensor, keep: Optional[Tensor] = None) -> Tensor:
    """z-loss's term (docs/model.md §4, train.z_loss): the mean of lse^2,
    lse = log sum_j exp(logit_j), over the counted targets (keep: a bool
    mask of the B*T positions; None: all count)."""
    lse = torch.logsumexp(logits.reshape(-1, logits.shape[-1]), dim=-1)
    if keep is not None:
        lse = lse[keep.reshape(-1)]
    return lse.pow(2).sum() / max(lse.numel(), 1)


# --------------------------------------------------------------------------
# Documents (docs/model.md §2 "Documents"): a packed window computed as its
# documents, each run alone through forward() from position 0.
# --------------------------------------------------------------------------
def document_spans(row, eos: int) -> list:
    """[(start, end)] of the documents of one window of inputs: a document
    ends with its EOS (position t starts one when input t-1 is the EOS id)."""
    ids = [int(v) for v in row]
    spans, s = [], 0
    for t in range(1, len(ids)):
        if ids[t - 1] == eos:
            spans.append((s, t))
            s = t
    spans.append((s, len(ids)))
    return spans


def forward_documents(params: Dict[str, Tensor], cfg: WiolaConfig, tokens: Tensor, eos: int,
                      training: bool = True,
                      merge_open: Optional[Dict[int, Tensor]] = None) -> Tuple[Tensor, dict]:
    """forward() of every document of every window of tokens [B, T] alone;
    logits [B, T, V] and aux as forward()'s, the pieces put back in place
    (injected merge maps are cut the same way: no pair may cross a start)."""
    B, T = tokens.shape
    rows, maps = [], {"merge_open": {}, "own_merge_open": {}}
    for b in range(B):
        pieces, piece_maps = [], {"merge_open": {}, "own_merge_open": {}}
        for s, e in document_spans(tokens[b], eos):
            mo = {l: m[b:b + 1, s:e] for l, m in merge_open.items()} if merge_open else None
            lg, aux = forward(params, cfg, tokens[b:b + 1, s:e], training=training, merge_open=mo)
            pieces.append(lg)
            for key in piece_maps:
                for l, m in aux[key].items():
                    piece_maps[key].setdefault(l, []).append(m)
        rows.append(torch.cat(pieces, 1))
        for key in maps:
            for l, ms in piece_maps[key].items():
                maps[key].setdefault(l, []).append(torch.cat(ms, 1))
    aux = {key: {l: torch.cat(ms, 0) for l, ms in maps[key].items()} for key in maps}
    return torch.cat(rows, 0), aux


def documents_loss(logits: Tensor, inputs: Tensor, targets: Tensor, eos: int) -> Tuple[Tensor, int]:
    """Mean cross-entropy over the counted targets (those whose input is not
    the EOS id) and their number."""
    keep = (inputs != eos).reshape(-1)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).long(), reduction="none")
    n = int(keep.sum())
    return ce[keep].sum() / max(n, 1), n


# --------------------------------------------------------------------------
# Optimiser (docs/model.md §4)
# --------------------------------------------------------------------------
@dataclasses.dataclass
class OptimConfig:
    lr_max: float = 3e-4
    lr_min: float = 0.0
    t_max: int = 1000
    warmup: Optional[int] = None       # None: floor((t_max + 10) / 20)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip: float = 1.0


def warmup_steps(t_max: int) -> int:
    return (int(t_max) + 10) // 20


def lr_at(step: int, t_max: int, lr_max: float = 3e-4, lr_min: float = 0.0,
          warmup: Optional[int] = None) -> float:
    """Linear warmup for t <= T_w, then cosine to lr_min at t = T_max (t 1-based)."""
    tw = warmup_steps(t_max) if warmup is None else int(warmup)
    if step <= tw:
        return lr_max * step / tw
    if t_max <= tw:
        return lr_min
    frac = min(1.0, (step - tw) / (t_max - tw))
    return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + math.cos(math.pi * frac))


def global_grad_norm(grads: Dict[str, Tensor]) -> float:
    """L2 norm over all gradients (accumulated in float64)."""
    tot = 0.0
    for g in grads.values():
        tot += float(g.detach().to(torch.float64).pow(2).sum())
    return math.sqrt(tot)


def clip_grads_(grads: Dict[str, Tensor], max_norm: float) -> Tuple[float, float]:
    """In-place clip as torch.nn.utils.clip_grad_norm_; returns (norm, coef)."""
    norm = global_grad_norm(grads)
    coef = 1.0
    if max_norm > 0 and math.isfinite(norm):
        coef = min(1.0, max_norm / (norm + 1e-6))
        if coef < 1.0:
            for g in grads.values():
                g.mul_(coef)
    return norm, coef


def new_adam_state(params: Dict[str, Tensor]) -> dict:
    return {"m": {k: torch.zeros_like(v.detach()) for k, v in params.items()},
            "v": {k: torch.zeros_like(v.detach()) for k, v in params.items()}}


@torch.no_grad()
def adamw_update_(params: Dict[str, Tensor], grads: Dict[str, Tensor], state: dict,
                  lr: float, step: int, beta1: float, beta2: float, eps: float,
                  weight_decay: float) -> None:
    """AdamW exactly as torch.optim.AdamW (single-tensor path):
    p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps)."""
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    step_size = lr / bc1
    bc2_sqrt = math.sqrt(bc2)
    for name, p in params.items():
        g = grads[name]
        if is_decayed(name, p.shape) and weight_decay != 0.0:
            p.mul_(1.0 - lr * weight_decay)
        m, v = state["m"][name], state["v"][name]
        m.mul_(beta1).add_(g, alpha=1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        denom = (v.sqrt() / bc2_sqrt).add_(eps)
        p.addcdiv_(m, denom, value=-step_size)


def train_step(params: Dict[str, Tensor], state: dict, cfg: WiolaConfig, tokens: Tensor,
               lr: float, step: int, oc: OptimConfig,
               merge_open: Optional[Dict[int, Tensor]] = None, keep_logits: bool = False,
               documents_eos: Optional[int] = None) -> dict:
    """One full training step on tokens [B, T+1]: forward (training, ATM as
    configured), backward, clip, AdamW.  A non-finite gradient norm skips the
    update.  Returns loss, grad_norm, grads (unclipped copies), logits, aux.
    documents_eos: document masking with this EOS id (forward_documents,
    documents_loss)."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    for p in params.values():
        p.grad = None
    if documents_eos is None:
        logits, aux = forward(params, cfg, inputs, training=True, merge_open=merge_open)
        loss = cross_entropy_loss(logits, targets)
    else:
        logits, aux = forward_documents(params, cfg, inputs, documents_eos, training=True, merge_open=merge_open)
        loss, _ = documents_loss(logits, inputs, targets, documents_eos)
    names = list(params)
    gl = torch.autograd.grad(loss, [params[n] for n in names])
    grads = {n: g for n, g in zip(names, gl)}
    raw = {n: g.detach().clone() for n, g in grads.items()}
    norm, coef = clip_grads_(grads, oc.clip)
    skipped = not math.isfinite(norm)
    if not skipped:
        adamw_update_(params, grads, state, lr, step, oc.beta1, oc.beta2, oc.eps, oc.weight_decay)
    return {"loss": float(loss.detach()), "grad_norm": norm, "clip_coef": coef,
            "grads": raw, "skipped": skipped,
            "logits": logits.detach() if keep_logits else None, "aux": aux}
