#!/usr/bin/env python3
"""Issue 8's yardsticks for a dense Llama/Qwen-style model.
Decode, batch 1: the weight bytes one step reads (every projection, the norms, the lm_head and
one embedding row; not the embedding table) and, with the copy bandwidth measured in the same
run, the tokens/s at that bandwidth. Prefill of one T-token prompt: 2 * linear params * T plus
causal attention (QK^T and PV over T^2/2 pairs), against the GEMM rate of the same run.
   decode_ceiling.py CONFIG_DIR [--copy-gbps 4228 --tok-s 198.97]
                                [--prefill-tokens 4096 --prefill-s 0.1368 --gemm-tflops 770]"""
import argparse, json, os

ap = argparse.ArgumentParser()
ap.add_argument("config")
ap.add_argument("--copy-gbps", type=float)
ap.add_argument("--tok-s", type=float, help="a measured decode rate to put against the ceiling")
ap.add_argument("--dtype-bytes", type=int, default=2)
ap.add_argument("--prefill-tokens", type=int)
ap.add_argument("--prefill-s", type=float)
ap.add_argument("--gemm-tflops", type=float)
a = ap.parse_args()
c = json.load(open(os.path.join(a.config, "config.json")))
H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
nh = c["num_attention_heads"]
nkv = c.get("num_key_value_heads", nh)
D = c.get("head_dim") or H // nh
I = c["intermediate_size"]
proj = H * nh * D + 2 * H * nkv * D + nh * D * H + 3 * H * I  # q, k, v, o, gate, up, down
per_layer = proj + 2 * H  # and the two norms
if c.get("model_type") == "qwen3":
    per_layer += 2 * D  # q_norm, k_norm
if c.get("attention_bias") or c.get("model_type") == "qwen2":
    per_layer += nh * D + 2 * nkv * D
params = L * per_layer + H + V * H + H  # final norm, lm_head (or the tied table), one embedding row
gb = params * a.dtype_bytes / 1e9
print(f"decode_bytes_per_token_GB {gb:.2f}")
if a.copy_gbps:
    ceiling = a.copy_gbps / gb
    print(f"decode_ceiling_tok_s {ceiling:.1f} (copy {a.copy_gbps:.0f} GB/s)")
    if a.tok_s:
        print(f"decode_share_of_ceiling {100 * a.tok_s / ceiling:.1f}% ({a.tok_s:.1f} tok/s)")
if a.prefill_tokens and a.prefill_s:
    T = a.prefill_tokens
    flops = 2 * L * proj * T + 2 * V * H + 4 * L * nh * D * (T * (T + 1) / 2)
    rate = flops / a.prefill_s / 1e12
    line = f"prefill_{T}: {flops / 1e12:.2f} TFLOP in {a.prefill_s:.4f} s = {rate:.0f} TFLOP/s"
    if a.gemm_tflops:
        line += f" = {100 * rate / a.gemm_tflops:.1f}% of {a.gemm_tflops:.0f}"
    print(line)
