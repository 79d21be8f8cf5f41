# coding=utf-8
# Wiola for Hugging Face transformers, as exported by `wiola export --format hf`.
# Written for the wiola training system (MIT licence); the math is wiola's
# docs/model.md, which this file follows line by line.
"""Wiola causal language model for `transformers` (load with ``trust_remote_code=True``).

Components (docs/model.md §2):

* **WiolaRMSNorm**: ``z = x + offset; y = weight * z / sqrt(mean(z^2) + eps)``.
* **SRPE**: rotate-half rotary encoding whose angle is ``p * omega_j * (1 + 1/k_s)`` and whose
  radius is ``1 + a_s * sin(p * f_s * omega_j)``; the table is computed in float64 from integer
  positions and rounded once.
* **GCLA**: causal grouped-query self-attention (query head h reads KV group h mod H_kv) blended
  with an attention over *context rows*: the prefix means of the residual stream after the
  ``gcla_lookback`` previous layers, ``(1 - beta) O_self + beta O_ctx`` with
  ``beta = sigmoid(ctx_gate_logit)``, then a sigmoid gate and the output projection.
* **ATM** (training mode only, layers floor(L/3) <= l < floor(2L/3)): adjacent tokens whose
  normalised inputs have cosine > ``atm_threshold`` are merged greedily left to right as keys
  and values. Off in evaluation and generation, as in wiola.
* **DSFF**: ``alpha * D_A(SiLU(G_A x) * U_A x) + (1 - alpha) * D_B(GELU(U_B x))`` with
  ``alpha = sigmoid(W_f [a; b])``.
* The LM head is the token embedding (tied); no ``lm_head.weight`` is stored.

Decoding keeps, per layer, the rotated keys and the values, and per summary stream the running
sum of the residual stream, so prefix means continue exactly. Inputs must not be padded: the
prefix means would include the padding (an ``attention_mask`` with zeros is refused).
"""
import math
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

try:  # transformers >= 4.45 asks models to inherit GenerationMixin themselves
    from transformers.generation import GenerationMixin
except ImportError:  # pragma: no cover - older releases: PreTrainedModel provides generate()
    GenerationMixin = object


def _generate_works_without_fsdp() -> None:
    """transformers 4.46's generate() imports torch.distributed.fsdp to ask whether the model is
    FSDP-managed; under Debian 12's torch 1.13 with Python 3.11 that import fails (a dataclass
    error inside torch), so generate() fails for every model. Where FSDP cannot even be imported,
    no module is FSDP-managed: answer that without the import."""
    try:
        import torch.distributed.fsdp  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure: FSDP is unusable here
        try:
            import transformers.generation.utils as gen_utils
        except ImportError:  # pragma: no cover
            return
        if hasattr(gen_utils, "is_fsdp_managed_module"):
            gen_utils.is_fsdp_managed_module = lambda module: bool(getattr(module, "_is_fsdp_managed_module", False))


_generate_works_without_fsdp()


class WiolaConfig(PretrainedConfig):
    """Wiola hyper-parameters; the key names of the published Wiola-360M config.json."""

    model_type = "wiola"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(self, vocab_size=32000, hidden_size=1024, num_hidden_layers=16, num_attention_heads=16,
                 num_key_value_heads=4, dsff_narrow_size=1024, dsff_wide_size=4096,
                 max_position_embeddings=2048, srpe_theta=10000.0, srpe_spiral_divisor=8.0,
                 srpe_radial_amplitude=0.1, srpe_radial_frequency=0.01, atm_enabled=True, atm_threshold=0.92,
                 gcla_lookback=2, gcla_gate_init=-3.0, rms_norm_eps=1e-6, initializer_range=0.02,
                 use_cache=True, bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True,
                 **kwargs):
        if hidden_size % num_attention_heads:
            raise ValueError(f"hidden_size {hidden_size} is not a multiple of num_attention_heads "
                             f"{num_attention_heads}")
        if num_attention_heads % num_key_value_heads:
            raise ValueError(f"num_attention_heads {num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {num_key_value_heads}")
        if (hidden_size // num_attention_heads) % 2:
            raise ValueError("the head size hidden_size / num_attention_heads must be even (SRPE pairs)")
        if gcla_lookback < 1:
            raise ValueError(f"gcla_lookback {gcla_lookback} must be >= 1")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.dsff_narrow_size = dsff_narrow_size
        self.dsff_wide_size = dsff_wide_size
        self.max_position_embeddings = max_position_embeddings
        self.srpe_theta = srpe_theta
        self.srpe_spiral_divisor = srpe_spiral_divisor
        self.srpe_radial_amplitude = srpe_radial_amplitude
        self.srpe_radial_frequency = srpe_radial_frequency
        self.atm_enabled = atm_enabled
        self.atm_threshold = atm_threshold
        self.gcla_lookback = gcla_lookback
        self.gcla_gate_init = gcla_gate_init
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        super().__init__(bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class WiolaCache:
    """Decoding state: per layer the SRPE-rotated keys and the values [B, H_kv, len, d_h], per
    summary stream the running sum of the residual stream [B, d], and the length."""

    def __init__(self, n_layers: int):
        self.keys: List[Optional[torch.Tensor]] = [None] * n_layers
        self.values: List[Optional[torch.Tensor]] = [None] * n_layers
        self.sums: List[Optional[torch.Tensor]] = [None] * n_layers
        self.length = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def append_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------
class WiolaRMSNorm(nn.Module):
    """z = x + offset; y = weight * z / sqrt(mean(z^2) + eps)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.offset = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x + self.offset
        return self.weight * (z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + self.eps))


def srpe_table(config: WiolaConfig, pos0: int, n: int, dtype, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [n, d_h] for positions pos0..pos0+n-1, each half duplicated; float64, rounded once."""
    dh = config.head_dim
    j = torch.arange(dh // 2, dtype=torch.float64)
    omega = float(config.srpe_theta) ** (-2.0 * j / dh)
    p = torch.arange(pos0, pos0 + n, dtype=torch.float64)[:, None]
    theta = p * omega * (1.0 + 1.0 / float(config.srpe_spiral_divisor))
    r = 1.0 + float(config.srpe_radial_amplitude) * torch.sin(p * float(config.srpe_radial_frequency) * omega)
    c, s = (r * torch.cos(theta)).to(dtype), (r * torch.sin(theta)).to(dtype)
    return torch.cat([c, c], -1).to(device), torch.cat([s, s], -1).to(device)


def apply_srpe(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, n, heads, d_h]: lo' = lo c - hi s, hi' = lo s + hi c (rotate-half pairing)."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def prefix_mean(x: torch.Tensor, carry: Optional[torch.Tensor], pos0: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """P(X)_t = (1/(t+1)) sum_{u<=t} X_u along dim 1, continuing from the running sum `carry`
    of positions 0..pos0-1; returns the means and the new running sum."""
    s = torch.cumsum(x, dim=1)
    if carry is not None:
        s = s + carry[:, None, :]
    cnt = torch.arange(pos0 + 1, pos0 + x.shape[1] + 1, dtype=x.dtype, device=x.device)[:, None]
    return s / cnt, s[:, -1]


def atm_merge_open(xt: torch.Tensor, tau: float) -> torch.Tensor:
    """ATM decisions [B, T] bool: t opens the merged pair (t, t+1) when the cosine of the
    normalised inputs rho_t > tau (float64; a zero norm never merges), greedily left to right
    without overlap (inside a run of candidates starting at s: s, s+2, s+4, ...)."""
    B, T = xt.shape[:2]
    cand = torch.zeros(B, T, dtype=torch.bool, device=xt.device)
    if T >= 2:
        xd = xt.detach().to(torch.float64)
        n = xd.norm(dim=-1)
        den = n[:, :-1] * n[:, 1:]
        dot = (xd[:, :-1] * xd[:, 1:]).sum(-1)
        valid = den > 0
        rho = torch.where(valid, dot / torch.where(valid, den, torch.ones_like(den)), torch.full_like(den, -1e300))
        cand[:, :-1] = rho > tau
    idx = torch.arange(T, device=xt.device).expand(B, T)
    prev = torch.zeros_like(cand)
    prev[:, 1:] = cand[:, :-1]
    run_start = torch.cummax(torch.where(cand & ~prev, idx, torch.full_like(idx, -1)), dim=1).values
    return cand & ((idx - run_start) % 2 == 0)


# ---------------------------------------------------------------------------------------------
# GCLA
# ---------------------------------------------------------------------------------------------
class WiolaGCLA(nn.Module):
    """Gated Cross-Layer Attention with ATM inside (docs/model.md §2)."""

    def __init__(self, config: WiolaConfig, layer_idx: int):
        super().__init__()
        d, H, G, dh = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.H, self.G, self.dh, self.layer_idx = H, G, dh, layer_idx
        self.q_proj = nn.Linear(d, H * dh, bias=False)
        self.k_proj = nn.Linear(d, G * dh, bias=False)
        self.v_proj = nn.Linear(d, G * dh, bias=False)
        self.ctx_k_proj = nn.Linear(d, G * dh, bias=False)
        self.ctx_v_proj = nn.Linear(d, G * dh, bias=False)
        self.gate_proj = nn.Linear(d, H * dh, bias=False)
        self.o_proj = nn.Linear(H * dh, d, bias=False)
        self.ctx_gate_logit = nn.Parameter(torch.full((1,), float(config.gcla_gate_init)))

    def self_attention(self, q, k, v, pos0: int, merge_open: Optional[torch.Tensor]) -> torch.Tensor:
        """q [B, G, R, n, d_h] (scaled), k, v [B, G, Tk, d_h] (every key so far); query i sits at
        position pos0 + i. Returns [B, G, R, n, d_h]."""
        n, Tk = q.shape[3], k.shape[2]
        qpos = torch.arange(pos0, pos0 + n, device=q.device)[:, None]
        kpos = torch.arange(Tk, device=q.device)[None, :]
        if merge_open is None:
            hidden = (kpos > qpos)[None, None, None]                     # causal
        else:
            # ATM as keys: slot u holds the pair ending at u (mean of its keys and values), or the
            # raw key of u when u opens a pair; visible: u < t and u not opening, or u == t.
            closes = torch.zeros_like(merge_open)
            closes[:, 1:] = merge_open[:, :-1]
            cl = closes[:, None, :, None]
            k = torch.where(cl, (torch.cat([k[:, :, :1], k[:, :, :-1]], 2) + k) * 0.5, k)
            v = torch.where(cl, (torch.cat([v[:, :, :1], v[:, :, :-1]], 2) + v) * 0.5, v)
            visible = ((kpos < qpos)[None] & ~merge_open[:, None, :]) | (kpos == qpos)[None]
            hidden = ~visible[:, None, None]                             # [B, 1, 1, n, Tk]
        s = torch.matmul(q, k[:, :, None].transpose(-1, -2)).masked_fill(hidden, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1), v[:, :, None])

    def forward(self, xt, ctx, cos, sin, cache: Optional[WiolaCache], pos0: int,
                merge_open: Optional[torch.Tensor]) -> torch.Tensor:
        """xt [B, n, d] normalised input, ctx [B, n, n_ctx, d] context rows; returns A [B, n, d]."""
        B, n, _ = xt.shape
        H, G, dh = self.H, self.G, self.dh
        R = H // G
        # head h = r*G + g reads group g = h mod H_kv: view heads as [R, G]
        q = apply_srpe(self.q_proj(xt).view(B, n, H, dh), cos, sin) * (1.0 / math.sqrt(dh))
        q = q.view(B, n, R, G, dh)
        k = apply_srpe(self.k_proj(xt).view(B, n, G, dh), cos, sin).transpose(1, 2)   # [B, G, n, dh]
        v = self.v_proj(xt).view(B, n, G, dh).transpose(1, 2)
        if cache is not None:
            k, v = cache.append_kv(self.layer_idx, k, v)
        o_self = self.self_attention(q.permute(0, 3, 2, 1, 4), k, v, pos0, merge_open)  # [B, G, R, n, dh]
        o_self = o_self.permute(0, 3, 2, 1, 4)                                           # [B, n, R, G, dh]

        # context attention over the rows C_t (no SRPE on context keys)
        nc = ctx.shape[2]
        kc = self.ctx_k_proj(ctx).view(B, n, nc, G, dh).permute(0, 1, 3, 4, 2)   # [B, n, G, dh, nc]
        vc = self.ctx_v_proj(ctx).view(B, n, nc, G, dh).permute(0, 1, 3, 2, 4)   # [B, n, G, nc, dh]
        pc = torch.softmax(torch.matmul(q.permute(0, 1, 3, 2, 4), kc), dim=-1)   # [B, n, G, R, nc]
        o_ctx = torch.matmul(pc, vc).transpose(2, 3)                              # [B, n, R, G, dh]

        beta = torch.sigmoid(self.ctx_gate_logit)
        o = torch.lerp(o_self, o_ctx, beta).reshape(B, n, H * dh)
        return self.o_proj(torch.sigmoid(self.gate_proj(xt)) * o)


class WiolaDSFF(nn.Module):
    """Dual-stream feed-forward: alpha * D_A(SiLU(G_A x) U_A x) + (1 - alpha) * D_B(GELU(U_B x))."""

    def __init__(self, config: WiolaConfig):
        super().__init__()
        d, dA, dB = config.hidden_size, config.dsff_narrow_size, config.dsff_wide_size
        self.stream_a_gate = nn.Linear(d, dA, bias=False)
        self.stream_a_up = nn.Linear(d, dA, bias=False)
        self.stream_a_down = nn.Linear(dA, d, bias=False)
        self.stream_b_up = nn.Linear(d, dB, bias=False)
        self.stream_b_down = nn.Linear(dB, d, bias=False)
        self.fusion = nn.Linear(2 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.stream_a_down(F.silu(self.stream_a_gate(x)) * self.stream_a_up(x))
        b = self.stream_b_down(F.gelu(self.stream_b_up(x)))           # exact erf GELU
        alpha = torch.sigmoid(self.fusion(torch.cat([a, b], -1)))
        return torch.lerp(b, a, alpha)


class WiolaDecoderLayer(nn.Module):
    def __init__(self, config: WiolaConfig, layer_idx: int):
        super().__init__()
        L = config.num_hidden_layers
        self.atm_layer = bool(config.atm_enabled) and L // 3 <= layer_idx < (2 * L) // 3
        self.tau = float(config.atm_threshold)
        self.input_layernorm = WiolaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = WiolaGCLA(config, layer_idx)
        self.post_attention_layernorm = WiolaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = WiolaDSFF(config)

    def forward(self, x, ctx, cos, sin, cache, pos0):
        xt = self.input_layernorm(x)
        merge_open = atm_merge_open(xt, self.tau) if (self.training and self.atm_layer and cache is None) else None
        x = x + self.self_attn(xt, ctx, cos, sin, cache, pos0, merge_open)
        return x + self.mlp(self.post_attention_layernorm(x))


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------
class WiolaPreTrainedModel(PreTrainedModel):
    config_class = WiolaConfig
    base_model_prefix = "model"
    _no_split_modules = ["WiolaDecoderLayer"]
    supports_gradient_checkpointing = False
    _supports_cache_class = False

    def _init_weights(self, module):
        """docs/model.md §3: matrices and the embedding N(0, std^2), weight 1, offset 0, phi init."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=std)
        elif isinstance(module, WiolaRMSNorm):
            module.weight.data.fill_(1.0)
            module.offset.data.zero_()
        elif isinstance(module, WiolaGCLA):
            module.ctx_gate_logit.data.fill_(float(self.config.gcla_gate_init))


class WiolaModel(WiolaPreTrainedModel):
    """Embedding, the layers with their prefix-mean summaries, the final norm."""

    def __init__(self, config: WiolaConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(WiolaDecoderLayer(config, l) for l in range(config.num_hidden_layers))
        self.norm = WiolaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids: torch.LongTensor, cache: Optional[WiolaCache] = None) -> torch.Tensor:
        cfg = self.config
        B, n = input_ids.shape
        pos0 = cache.length if cache is not None else 0
        if pos0 + n > cfg.max_position_embeddings:
            raise ValueError(f"{pos0 + n} positions exceed the model's context of {cfg.max_position_embeddings} "
                             "(max_position_embeddings)")
        x = self.embed_tokens(input_ids)
        cos, sin = srpe_table(cfg, pos0, n, x.dtype, x.device)

        def summarize(s: int, h: torch.Tensor) -> torch.Tensor:  # S^(s-1): prefix mean of h
            carry = cache.sums[s] if cache is not None else None
            mean, total = prefix_mean(h, carry, pos0)
            if cache is not None:
                cache.sums[s] = total
            return mean

        summaries = [summarize(0, x)]
        L, lam = cfg.num_hidden_layers, cfg.gcla_lookback
        for l, layer in enumerate(self.layers):
            nc = min(lam, l + 1)
            ctx = torch.stack(summaries[l + 1 - nc: l + 1], 2)   # [B, n, nc, d]
            x = layer(x, ctx, cos, sin, cache, pos0)
            if l + 1 < L:
                summaries.append(summarize(l + 1, x))
        if cache is not None:
            cache.length = pos0 + n
        return self.norm(x)


def packed_documents(position_ids: torch.Tensor) -> Optional[list]:
    """Packed inputs the transformers way (DataCollatorWithFlattening): per row,
    [(start, end)] of the documents when the positions run 0, 1, ... and
    restart at 0 where each document begins; None when they do not."""
    rows = []
    for row in position_ids.tolist():
        if not row or row[0] != 0:
            return None
        spans, s = [], 0
        for t in range(1, len(row)):
            if row[t] == 0:
                spans.append((s, t))
                s = t
            elif row[t] != row[t - 1] + 1:
                return None
        rows.append(spans + [(s, len(row))])
    return rows


class WiolaForCausalLM(WiolaPreTrainedModel, GenerationMixin):
    """Logits = final hidden state times the (tied) token embedding."""

    def __init__(self, config: WiolaConfig):
        super().__init__(config)
        self.model = WiolaModel(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return None  # the head is the embedding itself: nothing to tie or store

    def forward(self, input_ids: torch.LongTensor = None, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.LongTensor] = None, past_key_values: Optional[WiolaCache] = None,
                use_cache: Optional[bool] = None, labels: Optional[torch.LongTensor] = None,
                return_dict: Optional[bool] = None, **kwargs):
        if input_ids is None:
            raise ValueError("WiolaForCausalLM needs input_ids (inputs_embeds are not supported)")
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError("Wiola has no padding: its prefix-mean summaries would include the pads. "
                             "Batch only prompts of equal length (attention_mask must be all ones)")
        if past_key_values is not None and not isinstance(past_key_values, WiolaCache):
            raise ValueError(f"past_key_values must be a WiolaCache, not {type(past_key_values).__name__}")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        cache = past_key_values
        if use_cache and cache is None and not self.training:
            cache = WiolaCache(self.config.num_hidden_layers)
        if not use_cache:
            cache = None
        docs = None
        if position_ids is not None:
            start = cache.length if cache is not None else 0
            want = torch.arange(start, start + input_ids.shape[1], device=position_ids.device)
            if not bool((position_ids == want).all()):
                # Packed documents (docs/model.md §2 "Documents"): positions that
                # restart at 0 start a document, and each is computed alone.
                docs = packed_documents(position_ids.expand(input_ids.shape[0], -1)) if start == 0 else None
                if docs is None:
                    raise ValueError("Wiola positions are 0, 1, ... of each sequence (plus the cache length), "
                                     "or, for packed documents without a cache, 0, 1, ... restarting at each "
                                     "document's first token")
        if docs is not None:  # a packed batch is not continued by decoding: no cache
            cache = None
            h = torch.cat([torch.cat([self.model(input_ids[b:b + 1, s:e], None) for s, e in spans], 1)
                           for b, spans in enumerate(docs)], 0)
        else:
            h = self.model(input_ids, cache)
        logits = F.linear(h, self.model.embed_tokens.weight)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                   labels[:, 1:].reshape(-1), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache)

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None,
                                      use_cache=True, **kwargs):
        if past_key_values is not None:
            input_ids = input_ids[:, past_key_values.length:]   # only what the cache has not seen
        return {"input_ids": input_ids, "past_key_values": past_key_values, "attention_mask": attention_mask,
                "use_cache": use_cache}

    def _reorder_cache(self, past_key_values, beam_idx):
        for l in range(len(past_key_values.keys)):
            past_key_values.keys[l] = past_key_values.keys[l].index_select(0, beam_idx)
            past_key_values.values[l] = past_key_values.values[l].index_select(0, beam_idx)
            past_key_values.sums[l] = past_key_values.sums[l].index_select(0, beam_idx)
        return past_key_values
