#!/usr/bin/env python3
"""How far transformers itself moves from a fixture's fp32 reference when it computes in bf16
(run on the GPU machine, where torch and transformers exist):

    python3 tools/fixture_bf16_spread.py --fixtures tests/fixtures/models [--only PREFIX] [--write]

For every fixture directory (config.json + model.safetensors + reference.json) it loads the
checkpoint in bfloat16 (on the GPU when there is one), runs each reference prompt and prints
the largest |bf16 logit - fp32 reference logit| at the prompt's last position. This is the
noise floor of a bf16 forward of that model: tiny random MoE models can flip a router choice
between two near-tied experts in bf16, which moves the logits far more than rounding alone.
With --write the figure is stored in reference.json as each case's `bf16_last_logits_err`,
which tests/model/model_fixture_test.cpp uses to widen the logit tolerance of bf16 backends
for that case (never below its fixed floor).
"""
import argparse
import json
import os

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


def load(d, device):
    cfg = AutoConfig.from_pretrained(d)
    cls = AutoModelForCausalLM
    if any(a.endswith("ForConditionalGeneration") for a in (cfg.architectures or [])):
        cls = transformers.AutoModelForImageTextToText
    qc = getattr(cfg, "quantization_config", None)
    qc = qc if isinstance(qc, dict) else (qc.to_dict() if qc is not None else None)
    if qc and qc.get("quant_method") == "fp8":
        return load_fp8_dequantised(d, cfg, qc, device)
    return cls.from_pretrained(d, dtype=torch.bfloat16, attn_implementation="eager").to(device).eval()


def load_fp8_dequantised(d, cfg, qc, device):
    """An FP8 fixture in bf16: the checkpoint's weights dequantised (each FP8 tensor times its
    _scale_inv per block, as the fixture maker's fp32 reference is built) into the unquantised model
    in bfloat16. transformers' own FP8 forward needs the `kernels` package, absent here; this is the
    bf16 noise of the model the reference computes in fp32."""
    import copy
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_moe_hybrid_fixtures import dequantized_state
    q = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    block = tuple(qc.get("weight_block_size") or (128, 128))
    state = dequantized_state(q, block)
    plain = copy.deepcopy(cfg)
    del plain.quantization_config
    m = AutoModelForCausalLM.from_config(plain, torch_dtype=torch.float32, attn_implementation="eager")
    missing, unexpected = m.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary" not in k and "inv_freq" not in k]
    if missing or [k for k in unexpected if "rotary" not in k and "inv_freq" not in k]:
        raise RuntimeError(f"dequantised state does not match the model: missing {missing[:4]}")
    return m.to(torch.bfloat16).to(device).eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in sorted(os.listdir(args.fixtures)):
        d = os.path.join(args.fixtures, name)
        ref_path = os.path.join(d, "reference.json")
        if (args.only and not name.startswith(args.only)) or not os.path.exists(ref_path):
            continue
        try:
            model = load(d, device)
        except Exception as e:  # a family this transformers lacks, or an FP8 checkpoint
            print(f"{name}: skipped ({type(e).__name__}: {str(e).splitlines()[0][:120]})", flush=True)
            continue
        with open(ref_path) as f:
            ref = json.load(f)
        errs = []
        try:
            for c in ref["cases"]:
                with torch.no_grad():
                    lg = model(torch.tensor([c["prompt_ids"]], device=device)).logits[0, -1].float().cpu()
                err = float((lg - torch.tensor(c["last_logits"])).abs().max())
                errs.append(err)
                c["bf16_last_logits_err"] = err
        except Exception as e:  # e.g. transformers' FP8 forward needs the absent `kernels` package
            print(f"{name}: skipped ({type(e).__name__}: {str(e).splitlines()[0][:120]})", flush=True)
            continue
        print(f"{name}: bf16 last-logit error per prompt " +
              ", ".join(f"{len(c['prompt_ids'])} tok {e:.3f}" for c, e in zip(ref["cases"], errs)), flush=True)
        if args.write:
            with open(ref_path, "w") as f:
                json.dump(ref, f)


if __name__ == "__main__":
    main()
