#!/usr/bin/env python3
"""Creates tiny random-weight Hugging Face checkpoints with the real architectures and
stores transformers' reference outputs next to them (run on the GPU machine, where
torch and transformers exist):

    python3 tools/make_model_fixtures.py --out tests/fixtures/models [--only PREFIX]

Each fixture directory holds config.json, generation_config.json, bf16 safetensors
(some sharded) and reference.json with, for prompts of length 1, 7 and 33:
  - last_logits: fp32 logits of the last prompt position (fp32 compute on the bf16 weights)
  - greedy: 20 greedy tokens, and margins: top1 - top2 logit at each greedy step.
"""
import argparse
import json
import os

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

VOCAB = 256
PROMPT_LENGTHS = [1, 7, 33]
NEW_TOKENS = 20

# (name, model_type, overrides, save kwargs)
FIXTURES = [
    ("llama_gqa2", "llama", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False), {}),
    ("llama_mqa_llama3rope", "llama", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True,
                                           max_position_embeddings=256,
                                           rope={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
     {}),
    ("llama_linear_rope_hd24", "llama", dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=4, head_dim=24,
                                             tie_word_embeddings=False, max_position_embeddings=256,
                                             rope={"rope_type": "linear", "factor": 2.0}), {}),
    ("qwen2_mha_bias", "qwen2", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True), {}),
    ("qwen2_gqa2_untied", "qwen2", dict(hidden_size=64, intermediate_size=112, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False), {}),
    ("qwen3_gqa4_hd32", "qwen3", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                                      tie_word_embeddings=True), {}),
    ("qwen3_mqa_untied_sharded", "qwen3", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                               num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                               tie_word_embeddings=False), {"max_shard_size": "40KB"}),
    ("qwen3_yarn", "qwen3", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                 tie_word_embeddings=True, max_position_embeddings=128,
                                 rope={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
     {}),
    # Sliding-window attention (appended: a fixture's seed is its index). Qwen2-style: layer 0 full
    # attention, layers 1-2 see the last 8 positions; Mistral-style: every layer windowed. Prompts of 33
    # tokens and 20 greedy steps run far past the window.
    ("qwen2_sliding_window", "qwen2", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                           num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                           use_sliding_window=True, sliding_window=8, max_window_layers=1,
                                           layer_types=["full_attention", "sliding_attention",
                                                        "sliding_attention"]), {}),
    ("mistral_sliding_window", "mistral", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                               tie_word_embeddings=False, sliding_window=8), {}),
]


def make_config(model_type, overrides):
    o = dict(overrides)
    rope = o.pop("rope", None)
    base = dict(vocab_size=VOCAB, rms_norm_eps=1e-6, max_position_embeddings=o.pop("max_position_embeddings", 512),
                bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg = AutoConfig.for_model(model_type, **base, **o)
    theta = 10000.0
    if hasattr(cfg, "rope_parameters"):  # transformers >= 5
        params = {"rope_type": "default", "rope_theta": theta}
        if rope:
            params.update(rope)
        cfg.rope_parameters = params
    else:
        cfg.rope_theta = theta
        if rope:
            cfg.rope_scaling = rope
    return cfg


def init_weights(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


def reference(model, prompts):
    out = []
    for ids in prompts:
        x = torch.tensor([ids])
        with torch.no_grad():
            logits = model(x).logits[0, -1].float()
        seq = list(ids)
        greedy, margins = [], []
        for _ in range(NEW_TOKENS):
            with torch.no_grad():
                lg = model(torch.tensor([seq])).logits[0, -1].float()
            top = torch.topk(lg, 2)
            tok = int(top.indices[0])
            greedy.append(tok)
            margins.append(float(top.values[0] - top.values[1]))
            seq.append(tok)
        out.append({"prompt_ids": ids, "last_logits": [float(v) for v in logits], "greedy": greedy,
                    "margins": margins})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="make only the fixtures whose names start with this")
    args = ap.parse_args()
    torch.manual_seed(0)
    for i, (name, mtype, overrides, save_kw) in enumerate(FIXTURES):
        if args.only and not name.startswith(args.only):
            continue
        cfg = make_config(mtype, overrides)
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32, attn_implementation="eager")
        init_weights(model, 1234 + i)
        if cfg.tie_word_embeddings:
            model.tie_weights()
        model = model.to(torch.bfloat16)
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True, **save_kw)
        model.generation_config.save_pretrained(d)
        # Reference: fp32 compute on the bf16 weights, as tessera's CPU backend does. Reload
        # from disk rather than upcasting in memory: model.to(bfloat16) also rounds the rotary
        # inv_freq buffer, which a real from_pretrained keeps in float32.
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        g = torch.Generator().manual_seed(99 + i)
        prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
        ref = {"model": name, "transformers": transformers.__version__, "torch": torch.__version__,
               "cases": reference(model, prompts)}
        with open(os.path.join(d, "reference.json"), "w") as f:
            json.dump(ref, f)
        print(name, "min margin", min(min(c["margins"]) for c in ref["cases"]))


if __name__ == "__main__":
    main()
