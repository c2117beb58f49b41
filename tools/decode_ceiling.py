#!/usr/bin/env python3
"""Issue 8's and issue 16's yardsticks for a Llama/Qwen-style model, dense or mixture of experts.
Decode, batch 1: the weight bytes one step reads (every projection, the norms, the lm_head and
one embedding row; not the embedding table; of a MoE layer only the router, the shared expert and
the k routed experts) and, with the copy bandwidth measured in the same run, the tokens/s at that
bandwidth. Decode at batch B (MoE): a step reads the experts any of the B tokens chose; with
uniform routing a layer touches E * (1 - (1 - k/E)^B) distinct experts on average, so the ceiling
is B tokens per (dense bytes + distinct experts' bytes) / bandwidth. Prefill of one T-token
prompt: 2 * active linear params * T plus causal attention (QK^T and PV over T^2/2 pairs),
against the GEMM rate of the same run. Hybrid models (Qwen3-Next, Qwen3.5: layer_types or
full_attention_interval): the Gated DeltaNet layers' weights replace attention's (gated attention
reads a doubled q_proj), and every decode token also reads and writes each linear layer's state,
the conv state [K-1, C] (--dtype-bytes) and the recurrent state [Hv, Dk, Dv] (--ssm-state-bytes,
4 for the default f32); at batch B each of the B sequences has its own state.
   decode_ceiling.py CONFIG_DIR [--copy-gbps 4228 --tok-s 198.97]
                                [--batch 8 32 --batch-tok-s 900 2500]
                                [--prefill-tokens 4096 --prefill-s 0.1368 --gemm-tflops 770]"""
import argparse, json, os

ap = argparse.ArgumentParser()
ap.add_argument("config")
ap.add_argument("--copy-gbps", type=float)
ap.add_argument("--tok-s", type=float, help="a measured decode rate (batch 1) to put against the ceiling")
ap.add_argument("--batch", type=int, nargs="*", default=[], help="decode batch sizes to give the ceiling of")
ap.add_argument("--batch-tok-s", type=float, nargs="*", default=[], help="measured tok/s at each --batch")
ap.add_argument("--dtype-bytes", type=int, default=2)
ap.add_argument("--fp8", action="store_true", help="FP8 linear weights (--quantization fp8); implied by an fp8 "
                "quantization_config: projections and experts 1 byte (+ f32 scales per 128x128 block), routers, gates, "
                "embeddings, lm_head, conv1d and norms at --dtype-bytes")
ap.add_argument("--ssm-state-bytes", type=int, default=4, help="bytes per recurrent-state element (f32: 4, bf16: 2)")
ap.add_argument("--prefill-tokens", type=int)
ap.add_argument("--prefill-s", type=float)
ap.add_argument("--gemm-tflops", type=float)
a = ap.parse_args()
c = json.load(open(os.path.join(a.config, "config.json")))
q = c.get("quantization_config") or c.get("text_config", {}).get("quantization_config") or {}
c = c.get("text_config", c)
fp8 = a.fp8 or q.get("quant_method") == "fp8"
LB = (1 + 4 / 128**2) if fp8 else a.dtype_bytes  # bytes per linear weight (FP8: plus the block scales)
H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
nh = c["num_attention_heads"]
nkv = c.get("num_key_value_heads", nh)
D = c.get("head_dim") or H // nh
I = c.get("intermediate_size", 0)
E = c.get("num_experts", 0) or 0
k = c.get("num_experts_per_tok", 0) or 0
Im = c.get("moe_intermediate_size", 0) or 0
Is = c.get("shared_expert_intermediate_size", 0) or 0
step = c.get("decoder_sparse_step", 1) or 1
mlp_only = set(c.get("mlp_only_layers") or [])
moe_layers = sum(1 for i in range(L) if E > 0 and i not in mlp_only and (i + 1) % step == 0)
dense_layers = L - moe_layers

types = c.get("layer_types") or []
if not types and c.get("full_attention_interval"):
    fi = c["full_attention_interval"]
    types = ["full_attention" if (i + 1) % fi == 0 else "linear_attention" for i in range(L)]
linear_layers = sum(1 for t in types if t == "linear_attention")
hybrid = linear_layers > 0
q_rows = 2 * nh * D if hybrid else nh * D  # gated attention: q_proj holds each head's query and gate
attn = H * q_rows + 2 * H * nkv * D + nh * D * H  # q, k, v, o
small = 2 * H  # the two norms
if c.get("model_type") in ("qwen3", "qwen3_moe") or hybrid:
    small += 2 * D  # q_norm, k_norm
state_bytes = 0  # per sequence, every linear layer's conv + recurrent state
if hybrid:
    Kc, Dk, Dv = c["linear_conv_kernel_dim"], c["linear_key_head_dim"], c["linear_value_head_dim"]
    Hk, Hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    C = 2 * Hk * Dk + Hv * Dv
    # in_proj (q k v z b a), conv1d, A_log + dt_bias, gated norm, out_proj
    gdn = H * (C + Hv * Dv + 2 * Hv) + C * Kc + 2 * Hv + Dv + Hv * Dv * H
    gdn_lin = H * (C + Hv * Dv) + Hv * Dv * H  # in_proj_qkv, in_proj_z, out_proj (FP8 in the released checkpoints)
    state_bytes = linear_layers * ((Kc - 1) * C * a.dtype_bytes + Hv * Dk * Dv * a.ssm_state_bytes)
if c.get("attention_bias") or c.get("model_type") in ("qwen2", "qwen2_moe"):
    small += nh * D + 2 * nkv * D
expert = 3 * H * Im  # gate, up, down of one routed expert
moe_fixed = E * H + (3 * H * Is + H if Is else 0)  # router, shared expert and its gate
# Parameters every decode step reads whatever the routing: attention, dense MLPs, routers,
# shared experts, norms, final norm, lm_head (or the tied table), one embedding row.
attn_layers = L - linear_layers
fixed = attn_layers * (attn + small) + linear_layers * (gdn + 2 * H if hybrid else 0) + dense_layers * 3 * H * I + moe_layers * moe_fixed + H + V * H + H
# of which linear weights (FP8 when quantised): projections, dense MLPs, shared experts
fixed_lin = attn_layers * attn + linear_layers * (gdn_lin if hybrid else 0) + dense_layers * 3 * H * I + moe_layers * (3 * H * Is if Is else 0)
total = fixed + moe_layers * E * expert

def gb(params, experts=0.0):
    """GB of `params` fixed parameters (of which fixed_lin linear) plus `experts` routed experts' weights."""
    lin = fixed_lin if params == fixed else 0
    return ((params - lin) * a.dtype_bytes + lin * LB + experts * expert * LB) / 1e9

def distinct_experts(batch):
    return E * (1 - (1 - k / E) ** batch) if E else 0.0

step1_experts = moe_layers * k
state_gb = 2 * state_bytes / 1e9  # read and written once per decode token
step1 = gb(fixed, step1_experts)
print(f"decode_bytes_per_token_GB {step1 + state_gb:.2f}" + (" (FP8 linear weights)" if fp8 else ""))
if hybrid:
    print(f"hybrid: {linear_layers} of {L} layers linear attention; state {state_bytes / 2**20:.1f} MiB per sequence,"
          f" read + written {state_gb:.3f} GB per token; weights {step1:.2f} GB per token")
if E:
    print(f"moe: {moe_layers} of {L} layers sparse, {E} experts top-{k} of {Im}"
          + (f", shared expert {Is}" if Is else "") + f"; weights {gb(fixed, moe_layers * E):.2f} GB in all, {step1:.2f} GB active")
if a.copy_gbps:
    ceiling = a.copy_gbps / (step1 + state_gb)
    print(f"decode_ceiling_tok_s {ceiling:.1f} (copy {a.copy_gbps:.0f} GB/s)")
    if a.tok_s:
        print(f"decode_share_of_ceiling {100 * a.tok_s / ceiling:.1f}% ({a.tok_s:.1f} tok/s)")
for n, B in enumerate(a.batch):
    d = distinct_experts(B) if E else 0.0
    step_gb = gb(fixed, moe_layers * d) + B * state_gb
    line = f"decode_batch_{B}: {d:.1f} distinct experts per layer, {step_gb:.2f} GB per step"
    if a.copy_gbps:
        ceiling = B * a.copy_gbps / step_gb
        line += f", ceiling {ceiling:.0f} tok/s"
        if n < len(a.batch_tok_s):
            line += f", measured {a.batch_tok_s[n]:.0f} tok/s = {100 * a.batch_tok_s[n] / ceiling:.1f}%"
    print(line)
if a.prefill_tokens and a.prefill_s:
    T = a.prefill_tokens
    active = attn_layers * attn + linear_layers * (gdn if hybrid else 0) + dense_layers * 3 * H * I + moe_layers * (moe_fixed + k * expert)
    flops = 2 * active * T + 2 * V * H + 4 * attn_layers * nh * D * (T * (T + 1) / 2)
    rate = flops / a.prefill_s / 1e12
    line = f"prefill_{T}: {flops / 1e12:.2f} TFLOP in {a.prefill_s:.4f} s = {rate:.0f} TFLOP/s"
    if a.gemm_tflops:
        line += f" = {100 * rate / a.gemm_tflops:.1f}% of {a.gemm_tflops:.0f}"
    print(line)
