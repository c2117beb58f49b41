#!/usr/bin/env python3
"""Fine-tunes the demo model's MTP head for drafting two tokens (issue 22).

tools/train_demo_model.py trains the MTP head for one step: at position t it sees the main model's
final hidden state and token t+1 and predicts t+2. Speculative decoding with k = 2 runs it a second
time on its own output (vLLM's and tessera's MTP proposers both do: pass 2 gets pass 1's normed
output as its hidden state, token t+2 and position t+1), an input the one-step head never saw: on the
demo prompts its second drafts were accepted about a sixth of the time the first ones were.

This script keeps every main weight as it is (bit for bit: the file's other tensors are copied, not
re-saved) and trains only the mtp.* tensors on the training corpus with both passes' losses:
  h1 = mtp(embed(x[t+1]), hidden[t]) -> x[t+2];  h2 = mtp(embed(x[t+2]), h1[t]) -> x[t+3]
loss = CE(pass 1) + --pass2-weight * CE(pass 2) + the MTP router's load-balancing loss. Pass 2 attends
over pass-2 keys of the earlier positions (at inference those come from pass 1: a small mismatch).

--distill FILE trains on the main model's own greedy continuations instead of the corpus (self-
distillation, as draft heads are usually trained): FILE is `tessera generate --output` JSONL (prompt_ids,
token_ids) of the demo model on prompts from the training corpus (--write-prompts makes them: the first
line of each text, chat turns rendered up to the assistant's turn), and every target is the main
model's argmax (pass 1 at row t: the argmax at t+1; pass 2: at t+2), which is what greedy verification
accepts. --eval-distill FILE (the same from held-out prompts) adds acceptance on such text to eval.json
(mtp_acceptance_generated): that is what speculative decoding sees.

Then it measures teacher-forced acceptance on the held-out texts as train_demo_model.py does, for
pass 1 (eval.json's mtp_acceptance, same method) and pass 2 (mtp_acceptance_pass2: given true tokens
t+1 and t+2, against the true token t+3 and the main model's argmax at t+2), and writes them into
eval.json with this run's settings (mtp_finetune). Run on a GPU (about 5 minutes with the defaults):
  python3 tools/finetune_demo_mtp.py --model models/tessera-demo --out /tmp/demo-mtp2
"""
import argparse
import json
import math
import os
import random
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_demo_model as tdm  # noqa: E402


def two_passes(model, mtp, lkw, x):
    """Main hidden states (no gradient), then both MTP passes over a [B, T] batch: logits of the
    main model, of pass 1 (row t predicts x[t+2]) and of pass 2 (row t predicts x[t+3])."""
    import torch
    with torch.no_grad():
        h = model.model(input_ids=x, use_cache=False).last_hidden_state  # after the final norm
        emb = model.model.embed_tokens(x)
    emb1 = torch.cat([emb[:, 1:], emb[:, -1:]], dim=1)  # rows past the end: masked by the losses
    emb2 = torch.cat([emb[:, 2:], emb[:, -2:]], dim=1)
    h1 = mtp(emb1, h, lkw.kw)
    h2 = mtp(emb2, h1, lkw.kw)
    return h, h1, h2


def losses(model, mtp, lkw, x, distill=False):
    """Both passes' cross-entropies: against the next tokens of x, or (distill) against the main
    model's argmax there (row t of pass 1: the argmax at t+1, which predicts x[t+2]; pass 2: at t+2)."""
    import torch
    import torch.nn.functional as F
    h, h1, h2 = two_passes(model, mtp, lkw, x)
    l1 = model.lm_head(h1).float()
    l2 = model.lm_head(h2).float()
    V = l1.shape[-1]
    if distill:
        with torch.no_grad():
            main = model.lm_head(h).argmax(-1)
        y1, y2 = main[:, 1:-1], main[:, 2:-1]
    else:
        y1, y2 = x[:, 2:], x[:, 3:]
    ce1 = F.cross_entropy(l1[:, :-2].reshape(-1, V), y1.reshape(-1))
    ce2 = F.cross_entropy(l2[:, :-3].reshape(-1, V), y2.reshape(-1))
    return ce1, ce2


def acceptance(model, mtp, lkw, tok, rows, max_tokens, device):
    """Teacher-forced acceptance of both passes on the held-out texts (each scored alone)."""
    texts = [tok.encode(tdm.doc_text(r), add_special_tokens=False).ids[:max_tokens] for r in rows]
    return acceptance_ids(model, mtp, lkw, texts, device)


def acceptance_ids(model, mtp, lkw, texts, device):
    """acceptance() over token id lists."""
    import torch
    n1 = n2 = p1_true = p1_main = p2_true = p2_main = main_true = scored = 0
    with torch.no_grad():
        for ids in texts:
            if len(ids) < 4:
                continue
            x = torch.tensor([ids], device=device)
            h, h1, h2 = two_passes(model, mtp, lkw, x)
            main = model.lm_head(h).float().argmax(-1)[0]
            m1 = model.lm_head(h1).float().argmax(-1)[0]
            m2 = model.lm_head(h2).float().argmax(-1)[0]
            n = len(ids)
            main_true += (main[:-1] == x[0, 1:]).sum().item()
            scored += n - 1
            p1_true += (m1[:-2] == x[0, 2:]).sum().item()
            p1_main += (m1[:-2] == main[1:-1]).sum().item()
            n1 += n - 2
            p2_true += (m2[:-3] == x[0, 3:]).sum().item()
            p2_main += (m2[:-3] == main[2:-1]).sum().item()
            n2 += n - 3
    return {
        "pass1": {"positions": n1, "vs_true_token": p1_true / max(n1, 1), "vs_main_argmax": p1_main / max(n1, 1),
                  "main_next_token_accuracy": main_true / max(scored, 1)},
        "pass2": {"positions": n2, "vs_true_token": p2_true / max(n2, 1), "vs_main_argmax": p2_main / max(n2, 1),
                  "method": "teacher forcing on the held-out texts: pass 1 at t gets the main hidden state at t "
                  "and the true token t+1; pass 2 gets pass 1's output at t and the true token t+2; compared "
                  "with the true token t+3 and with the main model's argmax at t+2"},
    }


def first_lines_prompts(rows):
    """Completion prompts from corpus rows: a text's first line (and its newline), a chat's first user
    turn rendered with the generation prompt."""
    out = []
    for r in rows:
        if r["kind"] == "chat":
            out.append(tdm.render_chat(r["messages"][:1], add_generation_prompt=True))
        else:
            line = r["text"].split("\n")[0]
            if line.strip():
                out.append(line + "\n")
    return out


def generated_docs(path, eot):
    """`tessera generate --output` JSONL: prompt and continuation of each line, as token ids."""
    docs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            j = json.loads(line)
            docs.append(list(j["prompt_ids"]) + list(j["token_ids"]) + [eot])
    return docs


def save_mtp(mtp, cfg, path):
    """Replaces the mtp.* tensors of the safetensors file, keeping every other tensor's bytes."""
    import torch
    from safetensors.torch import load_file, save_file
    saved = load_file(path)
    mtp.to(torch.bfloat16)
    mtp_t = {"mtp." + k: v.detach().cpu().contiguous() for k, v in mtp.state_dict().items()}
    if "mtp.layers.0.mlp.experts.0.gate_proj.weight" in saved:
        tdm.to_per_expert(mtp_t, "mtp.layers.0.mlp.experts.", cfg.num_experts, cfg.moe_intermediate_size)
    missing = sorted(set(k for k in saved if k.startswith("mtp.")) ^ set(mtp_t))
    if missing:
        sys.exit("finetune_demo_mtp.py: the MTP tensors do not match the file's: {}".format(missing[:5]))
    for k, v in mtp_t.items():
        if saved[k].shape != v.shape or saved[k].dtype != v.dtype:
            sys.exit("finetune_demo_mtp.py: {} is {} {} in the file, {} {} trained".format(
                k, saved[k].dtype, tuple(saved[k].shape), v.dtype, tuple(v.shape)))
    saved.update(mtp_t)
    save_file(saved, path, metadata={"format": "pt"})
    mtp.to(torch.float32)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description="Fine-tune the demo model's MTP head for two-token drafts.")
    ap.add_argument("--model", help="the demo model directory (read)")
    ap.add_argument("--out", help="where the fine-tuned copy goes")
    ap.add_argument("--data", default=os.path.join(here, "demo_data"))
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--steps", type=int, default=0, help="fixed step count instead of the time budget")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--pass2-weight", type=float, default=1.0)
    ap.add_argument("--aux-coef", type=float, default=0.01)
    ap.add_argument("--eval-max-tokens", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=22)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--smoke", action="store_true", help="10 steps and 20 held-out texts: checks the pipeline")
    ap.add_argument("--write-prompts", metavar="FILE",
                    help="write the training corpus's prompts as `tessera generate --input` JSONL and exit "
                         "(with --heldout: the held-out texts' instead)")
    ap.add_argument("--heldout", action="store_true", help="with --write-prompts: the held-out texts")
    ap.add_argument("--max-prompts", type=int, default=0, help="with --write-prompts: at most this many (a seeded "
                    "random choice)")
    ap.add_argument("--distill", metavar="FILE", help="train on these generations with the main model's argmax as "
                    "targets (self-distillation; see above) instead of the corpus")
    ap.add_argument("--eval-distill", metavar="FILE", help="also measure acceptance on these generations")
    args = ap.parse_args()
    if args.write_prompts:
        rows = tdm.load_rows(os.path.join(args.data, "heldout.jsonl" if args.heldout else "train.jsonl"))
        prompts = first_lines_prompts(rows)
        if args.max_prompts and len(prompts) > args.max_prompts:
            prompts = random.Random(args.seed).sample(prompts, args.max_prompts)
        with open(args.write_prompts, "w", encoding="utf-8") as f:
            for p in prompts:
                f.write(json.dumps({"prompt": p}, ensure_ascii=False) + "\n")
        return
    if not args.model or not args.out:
        ap.error("--model and --out are required (except with --write-prompts)")
    if args.smoke:
        args.steps, args.batch, args.seq_len, args.warmup, args.log_every = 10, 4, 128, 2, 5

    t_start = time.time()
    tdm.check_transformers()
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM
    device = "cuda" if torch.cuda.is_available() else "cpu"
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    if os.path.abspath(args.out) != os.path.abspath(args.model):
        shutil.rmtree(args.out, ignore_errors=True)
        shutil.copytree(args.model, args.out)
    path = os.path.join(args.out, "model.safetensors")
    tok = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))
    limit = 2000 if args.smoke else 0
    train_rows = [] if args.distill else tdm.load_rows(os.path.join(args.data, "train.jsonl"), limit)
    held_rows = tdm.load_rows(os.path.join(args.data, "heldout.jsonl"), 20 if args.smoke else 0)
    eot = tok.token_to_id("<|endoftext|>")
    docs = generated_docs(args.distill, eot) if args.distill else tdm.encode_docs(tok, train_rows, eot)
    eval_gen = [d[:args.eval_max_tokens] for d in generated_docs(args.eval_distill, eot)] if args.eval_distill else []

    model = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32, attn_implementation="sdpa")
    model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    mtp, full_idx = tdm.load_mtp(model, path)
    mtp.to(device=device, dtype=torch.float32)
    for p in mtp.parameters():  # its decoder layer is a deep copy of a (frozen) main layer
        p.requires_grad_(True)
    lkw = tdm.LayerKwargs(model.model.layers[full_idx])
    cfg = model.config
    before = acceptance(model, mtp.eval(), lkw, tok, held_rows, args.eval_max_tokens, device)
    before_gen = acceptance_ids(model, mtp, lkw, eval_gen, device) if eval_gen else None
    if before_gen:
        tdm.log("before, generated text: pass 1 {:.4f} / pass 2 {:.4f} vs the main argmax".format(
            before_gen["pass1"]["vs_main_argmax"], before_gen["pass2"]["vs_main_argmax"]))
    tdm.log("before: pass 1 {:.4f} / pass 2 {:.4f} vs the main argmax".format(before["pass1"]["vs_main_argmax"],
                                                                           before["pass2"]["vs_main_argmax"]))

    mtp.train()
    routers = tdm.RouterLogits([mtp.layers[0].mlp.gate])
    params = list(mtp.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=(device == "cuda"))
    rng = random.Random(args.seed)
    budget, history = args.minutes * 60, []
    step, t0, done = 0, time.time(), False
    while not done:
        for batch in tdm.epoch_batches(docs, args.seq_len, args.batch, rng):
            frac = step / args.steps if args.steps else (time.time() - t0) / budget
            if frac >= 1.0:
                done = True
                break
            lr = tdm.lr_schedule(step, frac, args.lr, args.warmup)
            for g in opt.param_groups:
                g["lr"] = lr
            x = torch.from_numpy(batch).to(device)
            with torch.autocast(device_type="cuda" if device == "cuda" else "cpu", dtype=torch.bfloat16):
                ce1, ce2 = losses(model, mtp, lkw, x, distill=bool(args.distill))
                aux = routers.balance_loss(cfg.num_experts, cfg.num_experts_per_tok)
            loss = ce1 + args.pass2_weight * ce2 + (args.aux_coef * aux if aux is not None else 0.0)
            gn = tdm.optimizer_step(opt, params, loss)
            step += 1
            if step % args.log_every == 0 or step == 1:
                rec = {"step": step, "seconds": round(time.time() - t0, 1), "ce_pass1": round(ce1.item(), 4),
                       "ce_pass2": round(ce2.item(), 4), "grad_norm": round(float(gn), 3), "lr": lr}
                history.append(rec)
                tdm.log("step {step} pass1 {ce_pass1} pass2 {ce_pass2} gnorm {grad_norm} lr {lr:.2e} "
                        "{seconds}s".format(**rec))
                if not math.isfinite(rec["ce_pass1"]) or not math.isfinite(rec["ce_pass2"]):
                    sys.exit("finetune_demo_mtp.py: loss is not finite at step {}".format(step))
    train_seconds = time.time() - t0

    mtp.eval()
    save_mtp(mtp, cfg, path)
    mtp, _ = tdm.load_mtp(model, path)  # measured as saved (bf16 weights, fp32 compute)
    mtp.to(device=device, dtype=torch.float32).eval()
    lkw = tdm.LayerKwargs(model.model.layers[full_idx])
    after = acceptance(model, mtp, lkw, tok, held_rows, args.eval_max_tokens, device)
    after_gen = acceptance_ids(model, mtp, lkw, eval_gen, device) if eval_gen else None
    if after_gen:
        tdm.log("after, generated text: pass 1 {:.4f} / pass 2 {:.4f} vs the main argmax".format(
            after_gen["pass1"]["vs_main_argmax"], after_gen["pass2"]["vs_main_argmax"]))
    tdm.log("after: pass 1 {:.4f} / pass 2 {:.4f} vs the main argmax".format(after["pass1"]["vs_main_argmax"],
                                                                          after["pass2"]["vs_main_argmax"]))

    ev_path = os.path.join(args.out, "eval.json")
    with open(ev_path, encoding="utf-8") as f:
        ev = json.load(f)
    ev["mtp_acceptance"].update({k: after["pass1"][k] for k in after["pass1"]})
    ev["mtp_acceptance_pass2"] = after["pass2"]
    if after_gen:
        ev["mtp_acceptance_generated"] = {
            "pass1": after_gen["pass1"]["vs_main_argmax"], "pass2": after_gen["pass2"]["vs_main_argmax"],
            "positions": after_gen["pass1"]["positions"], "before": {
                "pass1": before_gen["pass1"]["vs_main_argmax"], "pass2": before_gen["pass2"]["vs_main_argmax"]},
            "method": "teacher forcing on the main model's own greedy continuations of the held-out texts' first "
            "lines (--eval-distill): pass 1 at t gets the main hidden state at t and token t+1, pass 2 pass 1's "
            "output and token t+2; compared with the main model's argmax at t+1 and t+2"}
    ev["mtp_finetune"] = {
        "command": "python3 tools/finetune_demo_mtp.py " + " ".join(sys.argv[1:]), "smoke": args.smoke,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
        "steps": step, "train_seconds": train_seconds, "total_seconds": time.time() - t_start,
        "distill": bool(args.distill), "pass2_weight": args.pass2_weight, "lr": args.lr, "batch": args.batch, "seq_len": args.seq_len,
        "before": before, "after": after, "log": history}
    with open(ev_path, "w", encoding="utf-8") as f:
        json.dump(ev, f, ensure_ascii=False, indent=1)
    tdm.log("done in {:.1f} s: {}".format(time.time() - t_start, args.out))


if __name__ == "__main__":
    main()
