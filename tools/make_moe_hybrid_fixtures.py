#!/usr/bin/env python3
"""Tiny random-weight checkpoints of the mixture-of-experts and hybrid (Gated DeltaNet)
families, with transformers' reference outputs (run on the GPU machine, where torch and
transformers exist; the forward runs on the CPU in fp32):

    python3 tools/make_moe_hybrid_fixtures.py --out tests/fixtures/models [--only PREFIX]

Same format as tools/make_model_fixtures.py (config.json, generation_config.json, bf16
safetensors, reference.json with last_logits, 20 greedy tokens and their top1-top2 margins
per prompt), with longer prompts: up to 200 tokens for MoE, 300 for the hybrids (several
64-token chunks of the gated delta rule). Extra fixtures:
  - qwen3_moe_fused_experts: qwen3_moe_e8_k2_norm's weights with the experts saved as fused
    3-D tensors (mlp.experts.gate_up_proj [E, 2I, H], gate rows first; mlp.experts.down_proj
    [E, H, I]) as transformers 5 holds them; same reference.
  - *_fp8: fine-grained FP8 (e4m3, 128x128 blocks, weight_scale_inv) checkpoints; the reference
    is the fp32 forward on the weights dequantised from the quantised model in memory (every fp8
    parameter times its _scale_inv sibling, per 128x128 block), loaded strictly into an fp32 model
    (transformers' FP8 forward needs the `kernels` package, absent there).
A fixture whose config transformers rejects is reported and skipped; the others go on.
"""
import argparse
import json
import os
import shutil
import sys
import traceback

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

VOCAB = 256
NEW_TOKENS = 20
MOE_PROMPTS = [1, 7, 33, 200]
HYBRID_PROMPTS = [1, 7, 33, 300]

ATTN = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
GDN = dict(linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
           linear_num_value_heads=4)

# (name, model_type, overrides, prompt lengths, kind)
FIXTURES = [
    ("qwen3_moe_e8_k2_norm", "qwen3_moe",
     dict(ATTN, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2, num_experts=8,
          num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
          tie_word_embeddings=False), MOE_PROMPTS, "plain"),
    ("qwen3_moe_e64_k8_tied", "qwen3_moe",
     dict(ATTN, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=2, num_experts=64,
          num_experts_per_tok=8, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
          tie_word_embeddings=True), MOE_PROMPTS, "plain"),
    ("qwen3_moe_sparse2_mlponly", "qwen3_moe",
     dict(ATTN, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=4, num_experts=16,
          num_experts_per_tok=4, norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[3],
          tie_word_embeddings=False), MOE_PROMPTS, "plain"),
    ("qwen2_moe_shared", "qwen2_moe",
     dict(ATTN, intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
          num_hidden_layers=2, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1,
          mlp_only_layers=[], tie_word_embeddings=False, use_sliding_window=False), MOE_PROMPTS, "plain"),
    ("qwen3_next_tiny", "qwen3_next",
     dict(ATTN, **GDN, head_dim=32, intermediate_size=96, moe_intermediate_size=32,
          shared_expert_intermediate_size=48, num_hidden_layers=4, num_experts=8, num_experts_per_tok=2,
          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
          layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
          partial_rotary_factor=0.25, tie_word_embeddings=False), HYBRID_PROMPTS, "plain"),
    ("qwen3_5_moe_text_tiny", "qwen3_5_moe_text",
     dict(ATTN, **GDN, head_dim=32, moe_intermediate_size=32, shared_expert_intermediate_size=48,
          num_hidden_layers=4, num_experts=8, num_experts_per_tok=2,
          layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
          partial_rotary_factor=0.25, tie_word_embeddings=False), HYBRID_PROMPTS, "plain"),
    ("qwen3_5_moe_vl_tiny", "qwen3_5_moe",
     dict(text_config=dict(ATTN, **GDN, head_dim=32, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                           num_hidden_layers=4, num_experts=8, num_experts_per_tok=2, vocab_size=VOCAB,
                           layer_types=["linear_attention", "linear_attention", "linear_attention",
                                        "full_attention"],
                           partial_rotary_factor=0.25, rms_norm_eps=1e-6, max_position_embeddings=512,
                           bos_token_id=1, eos_token_id=2, pad_token_id=0),
          vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                             patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64),
          tie_word_embeddings=False), HYBRID_PROMPTS, "vl"),
    ("qwen3_5_dense_tiny", "qwen3_5_text",
     dict(ATTN, **GDN, head_dim=32, intermediate_size=96, num_hidden_layers=4,
          layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
          partial_rotary_factor=0.25, tie_word_embeddings=True), HYBRID_PROMPTS, "plain"),
    ("qwen3_dense_fp8", "qwen3",
     dict(hidden_size=256, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, head_dim=64, tie_word_embeddings=False), [1, 7, 33], "fp8"),
    ("qwen3_5_moe_text_fp8", "qwen3_5_moe_text",
     dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=128, linear_conv_kernel_dim=4,
          linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=1, linear_num_value_heads=2,
          moe_intermediate_size=128, shared_expert_intermediate_size=256, num_hidden_layers=4, num_experts=8,
          num_experts_per_tok=2,
          layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
          partial_rotary_factor=0.25, tie_word_embeddings=False), [1, 7, 33, 300], "fp8"),
    # head_dim 64: the gated-attention q_proj interleaves 64 query rows and 64 gate rows per head, so each
    # head's pieces start and end inside 128-row scale blocks (appended: a fixture's seed is its index).
    ("qwen3_5_moe_text_fp8_hd64", "qwen3_5_moe_text",
     dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=1, head_dim=64, linear_conv_kernel_dim=4,
          linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=1, linear_num_value_heads=2,
          moe_intermediate_size=128, shared_expert_intermediate_size=256, num_hidden_layers=4, num_experts=8,
          num_experts_per_tok=2,
          layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
          partial_rotary_factor=0.25, tie_word_embeddings=False), [1, 7, 33, 300], "fp8"),
]


def make_config(model_type, overrides):
    o = dict(overrides)
    base = dict(vocab_size=VOCAB, rms_norm_eps=1e-6, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                pad_token_id=0)
    if model_type == "qwen3_5_moe":  # multimodal wrapper: the text fields live in text_config
        base = {}
    prf = o.pop("partial_rotary_factor", None)
    cfg = AutoConfig.for_model(model_type, **base, **o)
    tcfg = getattr(cfg, "text_config", None) or cfg
    if prf is None and hasattr(tcfg, "partial_rotary_factor"):
        prf = tcfg.partial_rotary_factor
    if hasattr(tcfg, "rope_parameters"):
        params = dict(tcfg.rope_parameters or {})
        params.setdefault("rope_type", "default")
        params["rope_theta"] = 10000.0
        if prf is not None:
            params["partial_rotary_factor"] = prf
        tcfg.rope_parameters = params
    if prf is not None and hasattr(tcfg, "partial_rotary_factor"):
        tcfg.partial_rotary_factor = prf
    return cfg


def init_weights(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                # zero-centred norms ((1 + w), Qwen3-Next/3.5) get small w, the others 1 + small
                centred = torch.allclose(p, torch.zeros_like(p))
                p.copy_((0.0 if centred else 1.0) + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias") or name.endswith("dt_bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.empty(p.shape).uniform_(1, 16, generator=g)))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


def model_class(kind):
    if kind == "vl":
        return transformers.AutoModelForImageTextToText
    return AutoModelForCausalLM


def reference(model, prompts):
    out = []
    for ids in prompts:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        seq = list(ids)
        greedy, margins = [], []
        for _ in range(NEW_TOKENS):
            with torch.no_grad():
                lg = model(torch.tensor([seq])).logits[0, -1].float()
            top = torch.topk(lg, 2)
            greedy.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            seq.append(int(top.indices[0]))
        out.append({"prompt_ids": ids, "last_logits": [float(v) for v in logits], "greedy": greedy,
                    "margins": margins})
    return out


def write_reference(d, name, model, lengths, seed, extra=None):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]
    ref = {"model": name, "transformers": transformers.__version__, "torch": torch.__version__,
           "cases": reference(model, prompts)}
    if extra:
        ref.update(extra)
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f)
    return ref


def fuse_experts(src, dst):
    """Copies fixture src to dst with per-expert tensors stacked as transformers 5's fused ones."""
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, dst, dirs_exist_ok=True)
    t = load_file(os.path.join(src, "model.safetensors"))
    out, groups = {}, {}
    for k, v in t.items():
        if ".mlp.experts." in k:
            pre, rest = k.split(".mlp.experts.")
            e, proj = rest.split(".")[0], rest.split(".")[1]
            groups.setdefault(pre, {}).setdefault(proj, {})[int(e)] = v
        else:
            out[k] = v
    for pre, projs in groups.items():
        n = len(projs["gate_proj"])
        gate = torch.stack([projs["gate_proj"][e] for e in range(n)])
        up = torch.stack([projs["up_proj"][e] for e in range(n)])
        out[pre + ".mlp.experts.gate_up_proj"] = torch.cat([gate, up], dim=1).contiguous()
        out[pre + ".mlp.experts.down_proj"] = torch.stack([projs["down_proj"][e] for e in range(n)]).contiguous()
    os.remove(os.path.join(dst, "model.safetensors"))
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(dst, "reference.json")) as f:
        ref = json.load(f)
    ref["model"] = os.path.basename(dst)
    ref["note"] = "weights of " + os.path.basename(src) + " with fused 3-D expert tensors"
    with open(os.path.join(dst, "reference.json"), "w") as f:
        json.dump(ref, f)


def dequantize_blocks(w, s, block):
    """w (fp8, [..., R, C]) times its scale_inv s: one scale per block[0] x block[1] block of the last two
    dimensions ([..., ceil(R/b0), ceil(C/b1)]), or fewer elements broadcast (per tensor [1], per expert
    [E, 1, 1] or [E])."""
    w, s = w.float(), s.float()
    rows, cols = w.shape[-2], w.shape[-1]
    blocks = (*w.shape[:-2], -(-rows // block[0]), -(-cols // block[1]))
    if s.shape != blocks and s.numel() == torch.Size(blocks).numel() and s.shape[:len(lead := w.shape[:-2])] == lead:
        # the same blocks in another shape: size-1 dims dropped or the last two flattened (transformers
        # loads per-expert scales [1, 2] + [1, 2] of a gate/up pair as [4] per expert), row-major as the blocks
        s = s.reshape(blocks)
    if s.dim() >= 2 and s.shape[-2] == -(-rows // block[0]) and s.shape[-1] == -(-cols // block[1]) \
            and s.shape[:-2] == w.shape[:-2]:
        s = torch.repeat_interleave(s, block[0], dim=-2)[..., :rows, :]
        s = torch.repeat_interleave(s, block[1], dim=-1)[..., :cols]
        return w * s
    if s.numel() == 1:
        return w * s.reshape(())
    lead = w.shape[:-2]
    if s.numel() == torch.Size(lead).numel():  # one scale per expert
        return w * s.reshape(*lead, 1, 1)
    raise ValueError(f"scale {tuple(s.shape)} does not fit weight {tuple(w.shape)} with blocks {block}")


def dequantized_state(q, block):
    """fp32 state dict of the in-memory FP8 model `q`, keyed as the unquantised model's parameters:
    every fp8 parameter P (FP8Linear .weight, FP8Expert .gate_up_proj / .down_proj / per-projection ones)
    is multiplied by its sibling P_scale_inv ("weight_scale_inv" for "weight") per 128x128 block.

    Reading the model rather than the saved files keeps the parameter names the reference model expects
    (save_pretrained may write another layout, e.g. per-expert tensors for fused experts, which made the
    file-based dequantisation fail for qwen3_5_moe_text_fp8), and every scale is found or named."""
    params = dict(q.named_parameters())
    params.update(dict(q.named_buffers()))
    out, missing = {}, []
    for k, v in params.items():
        if k.endswith("_scale_inv") or k.endswith("activation_scale") or k.endswith("input_scale"):
            continue
        if v.dtype != torch.float8_e4m3fn:
            out[k] = v.detach().float().cpu()
            continue
        sk = k + "_scale_inv"
        if sk not in params:
            missing.append(sk)
            continue
        out[k] = dequantize_blocks(v.detach().cpu(), params[sk].detach().cpu(), block)
    if missing:
        raise KeyError("FP8 parameters without scales: " + ", ".join(missing[:8]))
    return out


def release_fp8_exclusions(mtype, cfg):
    """What the released Qwen3.5 FP8 checkpoints keep in bf16 (their quantization_config's
    modules_to_not_convert, e.g. Qwen3.5-122B-A10B-FP8): lm_head, the embedding and, per layer,
    the Gated DeltaNet's conv1d / in_proj_a / in_proj_b, the router and the shared expert's gate.
    Without the list transformers would quantise in_proj_a / in_proj_b (a few rows each, not whole
    128-row blocks), which tessera refuses as the release never has them in FP8. None: transformers'
    default (lm_head)."""
    if not mtype.startswith("qwen3_5"):
        return None
    names = ["lm_head", "model.embed_tokens"]
    for layer, kind in enumerate(cfg.layer_types):
        p = f"model.layers.{layer}."
        if kind == "linear_attention":
            names += [p + "linear_attn." + m for m in ("conv1d", "in_proj_a", "in_proj_b")]
        names += [p + "mlp.gate", p + "mlp.shared_expert_gate"]
    return names


def make_fp8(name, mtype, cfg, lengths, d, seed, i):
    from transformers import FineGrainedFP8Config
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32, attn_implementation="eager")
    init_weights(model, seed)
    model = model.to(torch.bfloat16)
    tmp = d + "_bf16_tmp"
    os.makedirs(tmp, exist_ok=True)
    model.save_pretrained(tmp, safe_serialization=True)
    qcfg = FineGrainedFP8Config(weight_block_size=(128, 128),
                                modules_to_not_convert=release_fp8_exclusions(mtype, cfg))
    q = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.bfloat16, quantization_config=qcfg)
    q.save_pretrained(d, safe_serialization=True)
    q.generation_config.save_pretrained(d)
    shutil.rmtree(tmp)
    ref_model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32, attn_implementation="eager").eval()
    qc = q.config.quantization_config
    block = qc.get("weight_block_size") if isinstance(qc, dict) else getattr(qc, "weight_block_size", None)
    state = dequantized_state(q, tuple(block or (128, 128)))
    missing, unexpected = ref_model.load_state_dict(state, strict=False)
    missing = [m for m in missing if "rotary" not in m and "inv_freq" not in m]
    unexpected = [u for u in unexpected if "rotary" not in u and "inv_freq" not in u]  # buffers, not weights
    if missing or unexpected:  # a reference on partly random weights would be wrong: stop here
        raise RuntimeError(f"{name}: dequantised state does not match the model: missing {missing[:8]}, "
                           f"unexpected {unexpected[:8]}")
    check_saved_scales(d)
    return write_reference(d, name, ref_model, lengths, 99 + i,
                           {"reference_forward": "fp32 on weights dequantised from the FP8 checkpoint"})


def check_saved_scales(d):
    """Every F8_E4M3 tensor the checkpoint holds has its _scale_inv beside it (what tessera loads)."""
    from safetensors import safe_open
    names, fp8 = set(), []
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(d, fn), "pt") as f:
                for k in f.keys():
                    names.add(k)
                    if f.get_slice(k).get_dtype() == "F8_E4M3":
                        fp8.append(k)
    lost = [k for k in fp8 if k + "_scale_inv" not in names]
    if lost:
        raise RuntimeError(f"{d}: FP8 tensors saved without scales: {lost[:8]}")


def list_tensors(d):
    from safetensors import safe_open
    rows = []
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(d, fn), "pt") as f:
                for k in f.keys():
                    sl = f.get_slice(k)
                    rows.append(f"{k} {sl.get_dtype()} {sl.get_shape()}")
    with open(os.path.join(d, "tensors.txt"), "w") as f:
        f.write("\n".join(rows) + "\n")
    print("\n".join(rows[:60]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    torch.manual_seed(0)
    failed = []
    for i, (name, mtype, overrides, lengths, kind) in enumerate(FIXTURES):
        if args.only and not name.startswith(args.only):
            continue
        d = os.path.join(args.out, name)
        try:
            cfg = make_config(mtype, overrides)
            os.makedirs(d, exist_ok=True)
            if kind == "fp8":
                ref = make_fp8(name, mtype, cfg, lengths, d, 4321 + i, i)
            else:
                cls = model_class(kind)
                model = cls.from_config(cfg, torch_dtype=torch.float32, attn_implementation="eager")
                init_weights(model, 4321 + i)
                if getattr(cfg, "tie_word_embeddings", False):
                    model.tie_weights()
                model = model.to(torch.bfloat16)
                model.save_pretrained(d, safe_serialization=True)
                model.generation_config.save_pretrained(d)
                model = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
                nparams = sum(p.numel() for p in model.parameters())
                ref = write_reference(d, name, model, lengths, 99 + i, {"parameters": nparams})
            list_tensors(d)
            print(name, "ok; min margin", min(min(c["margins"]) for c in ref["cases"]),
                  "files", sorted(os.listdir(d)), flush=True)
            if name == "qwen3_moe_e8_k2_norm":
                fuse_experts(d, os.path.join(args.out, "qwen3_moe_fused_experts"))
                print("qwen3_moe_fused_experts ok", flush=True)
        except Exception:
            failed.append(name)
            print(name, "FAILED", file=sys.stderr)
            traceback.print_exc()
            shutil.rmtree(d, ignore_errors=True)
    print("failed:", failed)


if __name__ == "__main__":
    main()
