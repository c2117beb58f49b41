#!/usr/bin/env python3
"""Trains the demo model of issue 21 on the GPU machine: a byte-level BPE tokenizer, a small
Qwen3.5-MoE-architecture model (Gated DeltaNet + gated attention, MoE with a shared expert, tied
embeddings) and its MTP head, trained jointly on tools/demo_data/train.jsonl; then evaluates it.

Needs torch, transformers (with qwen3_5_moe_text), tokenizers, safetensors; no network.

    python3 tools/train_demo_model.py --out /tmp/demo --minutes 6      # the real run
    python3 tools/train_demo_model.py --out /tmp/demo --smoke          # tiny model, 20 steps, < 1 min

On the device (the corpus is committed, so nothing needs carrying; tools/README.md has the details):

    set -o pipefail; python3 tools/train_demo_model.py --out /tmp/tessera-demo --minutes 6 2>&1 | \
      tee $OUT/train.log; rc=$?; cp /tmp/tessera-demo/eval.json /tmp/tessera-demo/README.md $OUT/; \
      tar czf - -C /tmp tessera-demo | split -b 15M - $OUT/tessera-demo.tgz.part-; exit $rc

Written to --out (a normal HF model directory): config.json (with mtp_num_hidden_layers: 1),
model.safetensors (bf16, main weights as transformers saves them plus the MTP head under mtp.*),
tokenizer.json, tokenizer_config.json (ChatML template with enable_thinking), generation_config.json,
README.md (model card), eval.json, train_log.json, heldout_texts.jsonl (the exact texts scored).

MTP head (Qwen3.5's structure, as vLLM's qwen3_5_mtp.py loads it): at position t,
  h = mtp.fc(concat(mtp.pre_fc_norm_embedding(embed(x[t+1])), mtp.pre_fc_norm_hidden(hidden[t])))
  h = mtp.layers.0(h)  (a full-attention decoder layer with the same MoE as the main layers)
  logits = lm_head(mtp.norm(h))  predicts x[t+2]; hidden[t] is the main model's output after its
final norm; embedding and lm_head are the main model's. Loss = CE(main) + lambda * CE(MTP) +
coef * load-balancing loss of every router.
"""
import argparse
import copy
import json
import math
import os
import random
import re
import sys
import time
import unicodedata

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK = ["<think>", "</think>"]
EMPTY_THINK = "<think>\n\n</think>\n\n"
# ChatML. Every assistant turn carries a think block; when the content has none, an empty one (as
# Qwen3 renders enable_thinking=false). The generation prompt adds the empty block only when
# enable_thinking is false; otherwise the model writes it itself (it always saw it in training).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- set content = message['content'] %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}")
# Qwen2's pre-tokenizer split (single digits, letters runs, punctuation runs, whitespace).
SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
CJK = re.compile(r"[\u4e00-\u9fff\u3400-\u4dbf]")
POEM_PROMPT = "写一首关于月的五言绝句"
QUOTE_PROMPT = "Tell me a quote about love."


def render_chat(messages, add_generation_prompt=False, enable_thinking=True):
    """Python mirror of CHAT_TEMPLATE for messages without reasoning (checked against the Jinja one)."""
    out = []
    for m in messages:
        if m["role"] == "assistant":
            out.append("<|im_start|>assistant\n" + EMPTY_THINK + m["content"] + "<|im_end|>\n")
        else:
            out.append("<|im_start|>" + m["role"] + "\n" + m["content"] + "<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n" + ("" if enable_thinking else EMPTY_THINK))
    return "".join(out)


def doc_text(row):
    return render_chat(row["messages"]) if row["kind"] == "chat" else row["text"]


def load_rows(path, limit=0):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            rows.append(json.loads(line))
            if limit and len(rows) >= limit:
                break
    return rows


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


# ---------------------------------------------------------------- tokenizer
def train_tokenizer(rows, vocab_size, out):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()

    def texts():  # contents only: the ChatML markup is special tokens and "\n"
        for r in rows:
            if r["kind"] == "chat":
                for m in r["messages"]:
                    yield m["content"]
            else:
                yield r["text"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(THINK), min_frequency=2, show_progress=False,
                                  special_tokens=[AddedToken(s, special=True, normalized=False) for s in SPECIAL],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(), trainer)
    # <think> and </think> are added tokens that decoding keeps (special: false), as in Qwen3.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK])
    tok.save(os.path.join(out, "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL + THINK}
    decoder = {str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                             "single_word": False, "special": t in SPECIAL} for t in SPECIAL + THINK}
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "add_prefix_space": False,
           "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
           "clean_up_tokenization_spaces": False, "errors": "replace", "model_max_length": 4096,
           "split_special_tokens": False, "added_tokens_decoder": decoder, "chat_template": CHAT_TEMPLATE}
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
    return tok, ids


# ---------------------------------------------------------------- model
def check_transformers():
    try:
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import transformers
    except ImportError as e:
        sys.exit("train_demo_model.py: {} — run it where torch, transformers (with Qwen3.5), tokenizers, "
                 "safetensors and numpy are installed (the GPU machine)".format(e))
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    cls = getattr(transformers, "Qwen3_5MoeForCausalLM", None)
    if "qwen3_5_moe_text" not in CONFIG_MAPPING or cls is None:
        qwen_types = sorted(k for k in CONFIG_MAPPING.keys() if "qwen" in k)
        qwen_classes = sorted(n for n in dir(transformers) if n.startswith("Qwen3") and "CausalLM" in n)
        sys.exit("train_demo_model.py: transformers {} lacks model_type qwen3_5_moe_text or class "
                 "Qwen3_5MoeForCausalLM. Qwen model types it has: {}. Qwen3 causal-LM classes: {}. "
                 "Install a transformers with Qwen3.5 (>= 5.x).".format(
                     transformers.__version__, qwen_types, qwen_classes))
    return cls


def make_config(args, vocab_size, ids):
    from transformers import AutoConfig
    n = args.layers
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]
    o = dict(vocab_size=vocab_size, hidden_size=args.hidden, num_hidden_layers=n, layer_types=layer_types,
             num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
             linear_conv_kernel_dim=4, linear_key_head_dim=args.head_dim, linear_value_head_dim=args.head_dim,
             linear_num_key_heads=args.linear_k_heads, linear_num_value_heads=args.linear_v_heads,
             num_experts=args.experts, num_experts_per_tok=args.top_k, moe_intermediate_size=args.moe_inter,
             shared_expert_intermediate_size=args.shared_inter, tie_word_embeddings=True,
             max_position_embeddings=4096, rms_norm_eps=1e-6, bos_token_id=ids["<|endoftext|>"],
             eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], router_aux_loss_coef=args.aux_coef)
    cfg = AutoConfig.for_model("qwen3_5_moe_text", **o)
    if hasattr(cfg, "rope_parameters"):  # as tools/make_moe_hybrid_fixtures.py: plain RoPE on 1/4 of head_dim
        params = dict(cfg.rope_parameters or {})
        params.setdefault("rope_type", "default")
        params["rope_theta"] = 10000.0
        params["partial_rotary_factor"] = 0.25
        cfg.rope_parameters = params
    if hasattr(cfg, "partial_rotary_factor"):
        cfg.partial_rotary_factor = 0.25
    for k, v in o.items():
        if getattr(cfg, k, None) != v:
            sys.exit("train_demo_model.py: config field {} is {} after construction, wanted {}".format(
                k, getattr(cfg, k, None), v))
    return cfg


def make_mtp(model):
    """The MTP head: norms of the main model's RMSNorm class, fc, one full-attention decoder layer of
    the main model's class (fresh random weights), final norm. Names match Qwen3.5's mtp.* tensors."""
    import torch
    from torch import nn
    cfg = model.config
    H = cfg.hidden_size
    norm_cls = type(model.model.norm)
    full_idx = list(cfg.layer_types).index("full_attention")

    class MTP(nn.Module):
        def __init__(self):
            super().__init__()
            self.pre_fc_norm_embedding = norm_cls(H, eps=cfg.rms_norm_eps)
            self.pre_fc_norm_hidden = norm_cls(H, eps=cfg.rms_norm_eps)
            self.fc = nn.Linear(2 * H, H, bias=False)
            self.layers = nn.ModuleList([copy.deepcopy(model.model.layers[full_idx])])
            self.norm = norm_cls(H, eps=cfg.rms_norm_eps)

        def forward(self, emb_next, hidden, layer_kwargs):
            x = torch.cat([self.pre_fc_norm_embedding(emb_next), self.pre_fc_norm_hidden(hidden)], dim=-1)
            x = self.fc(x)
            for layer in self.layers:
                x = layer(x, **layer_kwargs)
                if isinstance(x, tuple):
                    x = x[0]
            return self.norm(x)

    mtp = MTP()
    std = getattr(cfg, "initializer_range", 0.02)
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in mtp.named_parameters():
            if p.dim() >= 2:  # 1-D ones (norms) keep their class's initial value
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return mtp, full_idx


class LayerKwargs:
    """Captures the keyword arguments the main model passes to its full-attention layer (rotary
    cos/sin, mask, positions) so the MTP layer runs with exactly the same ones."""

    def __init__(self, layer):
        self.kw = None
        layer.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        kw = {k: kwargs[k] for k in ("position_embeddings", "attention_mask", "position_ids") if k in kwargs}
        if "position_embeddings" not in kw and len(args) > 1:
            kw["position_embeddings"] = args[1]
        self.kw = kw


class RouterLogits:
    """Collects router logits of the given gates (forward hooks) for the load-balancing loss."""

    def __init__(self, gates):
        self.logits = []
        for g in gates:
            g.register_forward_hook(self._hook)

    def _hook(self, module, args, out):
        self.logits.append(out[0] if isinstance(out, tuple) else out)

    def balance_loss(self, num_experts, top_k):
        import torch
        if not self.logits:
            return None
        total = 0.0
        for lg in self.logits:
            p = torch.softmax(lg.float().reshape(-1, num_experts), dim=-1)
            idx = p.topk(top_k, dim=-1).indices
            f = torch.nn.functional.one_hot(idx, num_experts).sum(1).float().mean(0) / top_k
            total = total + num_experts * (f * p.mean(0)).sum()
        n = len(self.logits)
        self.logits = []
        return total / n


def forward_losses(model, mtp, lkw, input_ids, mtp_lambda):
    """Main CE (next token) and MTP CE (token after next) on a packed batch [B, T]."""
    import torch
    import torch.nn.functional as F
    out = model.model(input_ids=input_ids, use_cache=False)
    h = out.last_hidden_state  # after the final norm
    logits = model.lm_head(h).float()
    V = logits.shape[-1]
    main = F.cross_entropy(logits[:, :-1].reshape(-1, V), input_ids[:, 1:].reshape(-1))
    emb = model.model.embed_tokens(input_ids)
    emb_next = torch.cat([emb[:, 1:], emb[:, -1:]], dim=1)  # last position: no t+1, masked below
    hm = mtp(emb_next, h, lkw.kw)
    mlogits = model.lm_head(hm).float()
    mtp_loss = F.cross_entropy(mlogits[:, :-2].reshape(-1, V), input_ids[:, 2:].reshape(-1))
    return main, mtp_loss


def lr_schedule(step, frac, base_lr, warmup):
    """Linear warm-up over `warmup` steps, then cosine decay to a tenth at frac = 1."""
    if step < warmup:
        return base_lr * (step + 1) / warmup
    return base_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def optimizer_step(opt, params, loss):
    """Backward, gradient norm clipped to 1, one optimizer step; returns the norm before clipping."""
    import torch
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return gn


# ---------------------------------------------------------------- data
def encode_docs(tok, rows, eot):
    texts = [doc_text(r) for r in rows]
    enc = tok.encode_batch(texts, add_special_tokens=False)
    return [e.ids + [eot] for e in enc]


def epoch_batches(docs, seq_len, batch, rng):
    import numpy as np
    order = list(range(len(docs)))
    rng.shuffle(order)
    stream = np.fromiter((t for i in order for t in docs[i]), dtype=np.int64)
    n = len(stream) // seq_len
    chunks = stream[:n * seq_len].reshape(n, seq_len)
    perm = list(range(n))
    rng.shuffle(perm)
    for i in range(0, n - batch + 1, batch):
        yield chunks[perm[i:i + batch]]


# ---------------------------------------------------------------- save
def to_per_expert(tensors, prefix, n_experts, inter):
    """Fused experts (gate_up_proj [E, 2I, H], gate rows first; down_proj [E, H, I]) to per-expert."""
    out = {}
    gu = tensors.pop(prefix + "gate_up_proj")
    dn = tensors.pop(prefix + "down_proj")
    for e in range(n_experts):
        out["{}{}.gate_proj.weight".format(prefix, e)] = gu[e, :inter].contiguous()
        out["{}{}.up_proj.weight".format(prefix, e)] = gu[e, inter:].contiguous()
        out["{}{}.down_proj.weight".format(prefix, e)] = dn[e].contiguous()
    tensors.update(out)


def save_model(model, mtp, full_idx, out):
    import torch
    from safetensors.torch import load_file, save_file
    model.to(torch.bfloat16)
    mtp.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    files = [f for f in os.listdir(out) if f.endswith(".safetensors")]
    if files != ["model.safetensors"]:
        sys.exit("train_demo_model.py: save_pretrained wrote {} (expected one model.safetensors)".format(files))
    path = os.path.join(out, "model.safetensors")
    saved = load_file(path)
    cfg = model.config
    mtp_t = {"mtp." + k: v.detach().cpu().contiguous() for k, v in mtp.state_dict().items()}
    per_expert = "model.layers.{}.mlp.experts.0.gate_proj.weight".format(full_idx) in saved
    if per_expert:
        # transformers saved the experts one by one: check our conversion reproduces its tensors of the
        # main full-attention layer, then write the MTP layer's experts the same way.
        ref = {"x." + k: v.detach().cpu() for k, v in model.model.layers[full_idx].mlp.experts.state_dict().items()}
        to_per_expert(ref, "x.", cfg.num_experts, cfg.moe_intermediate_size)
        for k, v in ref.items():
            sk = "model.layers.{}.mlp.experts.".format(full_idx) + k[2:]
            if sk not in saved or not torch.equal(saved[sk], v):
                sys.exit("train_demo_model.py: per-expert layout of saved {} differs from the fused split; "
                         "cannot write mtp experts consistently".format(sk))
        to_per_expert(mtp_t, "mtp.layers.0.mlp.experts.", cfg.num_experts, cfg.moe_intermediate_size)
    saved.update(mtp_t)
    save_file(saved, path, metadata={"format": "pt"})
    with open(os.path.join(out, "config.json")) as f:
        c = json.load(f)
    c["mtp_num_hidden_layers"] = 1
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    return os.path.getsize(path), per_expert


def load_mtp(model, path):
    """Rebuilds the MTP head on a reloaded model from the mtp.* tensors of the saved file."""
    import torch
    from safetensors.torch import load_file
    cfg = model.config
    t = {k[4:]: v for k, v in load_file(path).items() if k.startswith("mtp.")}
    pre = "layers.0.mlp.experts."
    if pre + "0.gate_proj.weight" in t:
        E = cfg.num_experts
        t[pre + "gate_up_proj"] = torch.stack(
            [torch.cat([t.pop(pre + "{}.gate_proj.weight".format(e)), t.pop(pre + "{}.up_proj.weight".format(e))])
             for e in range(E)])
        t[pre + "down_proj"] = torch.stack([t.pop(pre + "{}.down_proj.weight".format(e)) for e in range(E)])
    mtp, full_idx = make_mtp(model)
    mtp.load_state_dict(t, strict=True)
    return mtp, full_idx


# ---------------------------------------------------------------- eval
def is_quatrain(text, n=5):
    lines = [l for l in text.strip().split("\n") if l.strip()]
    return len(lines) == 4 and all(len(CJK.findall(l)) == n and len(CJK.findall(l)) == len(
        re.sub(r"[，。？！；：、,.?!;:\s]", "", l)) for l in lines)


def evaluate(out, heldout_rows, args, device):
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(out)
    except Exception as e:  # keep evaluating; the report says the directory did not load through AutoTokenizer
        log("WARNING: AutoTokenizer.from_pretrained failed ({}: {}); using PreTrainedTokenizerFast".format(
            type(e).__name__, e))
        from transformers import PreTrainedTokenizerFast
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(out, "tokenizer.json"), eos_token="<|im_end|>",
                                      pad_token="<|endoftext|>")
        tok.chat_template = CHAT_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).to(device).eval()
    mtp, full_idx = load_mtp(model, os.path.join(out, "model.safetensors"))
    mtp.to(device=device, dtype=torch.float32).eval()
    lkw = LayerKwargs(model.model.layers[full_idx])
    ev = {"transformers_class": type(model).__name__, "tokenizer_class": type(tok).__name__, "errors": []}

    def error(msg):  # recorded, not fatal: the trained model is already saved and the rest is still worth having
        log("ERROR:", msg)
        ev["errors"].append(msg)

    # chat template: Jinja (transformers) == the Python rendering the training used
    msgs = [{"role": "user", "content": POEM_PROMPT}]
    for think in (False, True):
        j = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=think)
        if j != render_chat(msgs, True, think):
            error("chat template (enable_thinking={}) renders {!r}, training used {!r}".format(
                think, j, render_chat(msgs, True, think)))
    full = msgs + [{"role": "assistant", "content": "x"}]
    if tok.apply_chat_template(full, tokenize=False) != render_chat(full):
        error("chat template differs from the training rendering on an assistant turn")
    # transformers' tokenizer == the tokenizers one the training used; decoding round-trips
    from tokenizers import Tokenizer
    raw = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    for r in heldout_rows[:100]:
        text = doc_text(r)
        a = tok(text, add_special_tokens=False)["input_ids"]
        if a != raw.encode(text, add_special_tokens=False).ids:
            error("transformers tokenizes held-out {} differently from tokenizers".format(r["id"]))
            break
        if tok.decode(a) != unicodedata.normalize("NFC", text):
            error("decode(encode(text)) != text for held-out {}".format(r["id"]))
            break

    # held-out perplexity (fp32 compute on the bf16 weights), each text scored alone, from token 1 on
    texts = [doc_text(r) for r in heldout_rows]
    nll, count, per_doc = 0.0, 0, []
    mtp_true = mtp_main = main_true = mtp_n = 0
    with torch.no_grad():
        for text in texts:
            ids = tok(text, add_special_tokens=False)["input_ids"][:args.eval_max_tokens]
            if len(ids) < 3:
                continue
            x = torch.tensor([ids], device=device)
            o = model.model(input_ids=x, use_cache=False)
            h = o.last_hidden_state
            logits = model.lm_head(h).float()
            s = F.cross_entropy(logits[0, :-1], x[0, 1:], reduction="sum").item()
            nll += s
            count += len(ids) - 1
            per_doc.append([len(ids), round(s, 4)])
            # MTP acceptance by teacher forcing: mtp at t (given true x[t+1]) vs x[t+2] and vs main's argmax at t+1
            emb = model.model.embed_tokens(x)
            emb_next = torch.cat([emb[:, 1:], emb[:, -1:]], dim=1)
            mp = model.lm_head(mtp(emb_next, h, lkw.kw)).argmax(-1)[0, :-2]
            main_pred = logits.argmax(-1)[0]
            mtp_true += (mp == x[0, 2:]).sum().item()
            mtp_main += (mp == main_pred[1:-1]).sum().item()
            main_true += (main_pred[:-1] == x[0, 1:]).sum().item()
            mtp_n += len(ids) - 2
    ev["heldout"] = {"texts": len(per_doc), "tokens_scored": count, "nll_sum": nll,
                     "perplexity": math.exp(nll / max(count, 1)), "scoring": "each text of heldout_texts.jsonl "
                     "tokenized alone (no BOS), truncated to {} tokens, NLL of tokens 1..n-1, fp32 forward "
                     "of the bf16 weights".format(args.eval_max_tokens), "per_text_tokens_nll": per_doc}
    ev["mtp_acceptance"] = {"positions": mtp_n, "vs_true_token": mtp_true / max(mtp_n, 1),
                            "vs_main_argmax": mtp_main / max(mtp_n, 1),
                            "main_next_token_accuracy": main_true / max(count, 1),
                            "method": "teacher forcing on the held-out texts: the MTP head at t gets the main "
                            "hidden state at t and the true token t+1; compared with the true token t+2 and "
                            "with the main model's argmax at t+1"}

    # chat samples
    stop = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]

    def gen(prompt, sample, seed=0, thinking=False):
        p = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                    add_generation_prompt=True, enable_thinking=thinking)
        x = tok(p, add_special_tokens=False, return_tensors="pt")["input_ids"].to(device)
        torch.manual_seed(seed)
        # plain temperature sampling: top_k = vocabulary (the directory's generation_config says 20)
        kw = dict(do_sample=True, temperature=0.7, top_p=1.0, top_k=model.config.vocab_size) if sample else \
            dict(do_sample=False)
        with torch.no_grad():
            y = model.generate(x, max_new_tokens=args.gen_tokens, eos_token_id=stop, pad_token_id=stop[1], **kw)
        return tok.decode(y[0, x.shape[1]:], skip_special_tokens=True)

    greedy = gen(POEM_PROMPT, False)
    samples = [gen(POEM_PROMPT, True, seed=s) for s in range(args.samples)]
    ev["poem"] = {"prompt": POEM_PROMPT, "greedy": greedy, "greedy_is_4x5": is_quatrain(greedy),
                  "samples_temperature_0.7_seeds_0..{}".format(args.samples - 1): samples,
                  "samples_4x5": sum(is_quatrain(s) for s in samples),
                  "greedy_enable_thinking_true": gen(POEM_PROMPT, False, thinking=True)}
    ev["poem7"] = {"prompt": "写一首关于春的七言绝句", "greedy": gen("写一首关于春的七言绝句", False)}
    ev["quote"] = {"prompt": QUOTE_PROMPT, "greedy": gen(QUOTE_PROMPT, False),
                   "samples": [gen(QUOTE_PROMPT, True, seed=s) for s in range(min(3, args.samples))]}
    ev["quote_2"] = {"prompt": "Tell me a quote about computers.", "greedy": gen("Tell me a quote about computers.", False)}
    return ev


# ---------------------------------------------------------------- card
def write_card(out, args, stats, ev, sources_md):
    poem = ev["poem"]
    lines = [
        "---", "license: gpl-3.0", "language: [zh, en]", "---", "",
        "# tessera demo model (Qwen3.5-MoE architecture, with MTP head)", "",
        "A tiny model trained from scratch by `tools/train_demo_model.py` (issue 21) on freely licensed text "
        "from Debian packages, so that tessera ships a model that produces real text. It is a toy: it "
        "recites and recombines Tang/Song poems and English fortunes.", "",
        "## Architecture", "",
        "`Qwen3_5MoeForCausalLM` (`model_type: qwen3_5_moe_text`): {layers} layers ({lt}), hidden {hidden}, "
        "{heads} query / {kv} KV heads of {hd} (gated attention, RoPE on 1/4 of the head), Gated DeltaNet "
        "{lk} key / {lv} value heads of {hd}, {E} experts top-{k} (intermediate {mi}) plus a shared expert "
        "(intermediate {si}), tied embeddings, vocabulary {V}. One MTP layer (`mtp.*`, "
        "`mtp_num_hidden_layers: 1`) trained jointly (loss weight {lam}). {P:,} parameters including MTP; "
        "model.safetensors {MB:.1f} MB (bf16).".format(
            layers=args.layers, lt=", ".join(stats["layer_types"]), hidden=args.hidden, heads=args.heads,
            kv=args.kv_heads, hd=args.head_dim, lk=args.linear_k_heads, lv=args.linear_v_heads, E=args.experts,
            k=args.top_k, mi=args.moe_inter, si=args.shared_inter, V=stats["vocab_size"], lam=args.mtp_lambda,
            P=stats["parameters"], MB=stats["safetensors_bytes"] / 1e6), "",
        "Tokenizer: byte-level BPE trained on the corpus (HF `tokenizers`), ChatML special tokens "
        "`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, and `<think>`, `</think>`. The chat template "
        "supports `enable_thinking` (false: the assistant turn starts with an empty think block, as Qwen3).", "",
        "## Training", "",
        "AdamW (lr {lr}, betas 0.9/0.95, weight decay 0.1), bf16 autocast, warm-up then cosine decay over the "
        "time budget, sequence length {T}, batch {B}; {steps} steps, {tok:,} tokens ({ep:.1f} epochs) in "
        "{mins:.1f} min on {dev}. Final training loss {fl:.3f} (MTP {fm:.3f}). torch {tv}, transformers {trv}, "
        "seed {seed}. Command: `{cmd}`.".format(
            lr=args.lr, T=args.seq_len, B=args.batch, steps=stats["steps"], tok=stats["tokens_seen"],
            ep=stats["epochs"], mins=stats["train_seconds"] / 60, dev=stats["device"], fl=stats["final_loss"],
            fm=stats["final_mtp_loss"], tv=stats["torch"], trv=stats["transformers"], seed=args.seed,
            cmd=stats["command"]), "",
        "## Evaluation (eval.json has everything)", "",
        "- Held-out perplexity (transformers, fp32 forward of the bf16 weights, {n} texts of "
        "`heldout_texts.jsonl`, {c} tokens): **{ppl:.4f}**".format(
            n=ev["heldout"]["texts"], c=ev["heldout"]["tokens_scored"], ppl=ev["heldout"]["perplexity"]),
        "- MTP acceptance (teacher forcing on held-out text): {a:.3f} vs the true token, {b:.3f} vs the main "
        "model's argmax (main next-token accuracy {c:.3f})".format(
            a=ev["mtp_acceptance"]["vs_true_token"], b=ev["mtp_acceptance"]["vs_main_argmax"],
            c=ev["mtp_acceptance"]["main_next_token_accuracy"]),
        "- \"{p}\": {n}/{m} samples at temperature 0.7 are four lines of five characters; greedy:".format(
            p=poem["prompt"], n=poem["samples_4x5"], m=args.samples), "",
        "```", poem["greedy"], "```", "",
        "- \"{}\" (greedy):".format(ev["quote"]["prompt"]), "", "```", ev["quote"]["greedy"], "```", "",
        "## Data and licences", "", sources_md.split("\n", 1)[1].strip(), ""]
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


# ---------------------------------------------------------------- main
def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description="Train the tessera demo model (issue 21).")
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", default=os.path.join(here, "demo_data"))
    ap.add_argument("--minutes", type=float, default=6.0, help="training time budget")
    ap.add_argument("--steps", type=int, default=0, help="fixed step count instead of the time budget")
    ap.add_argument("--smoke", action="store_true", help="tiny model, 20 steps, small eval: checks the pipeline")
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--linear-k-heads", type=int, default=2)
    ap.add_argument("--linear-v-heads", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--moe-inter", type=int, default=48)
    ap.add_argument("--shared-inter", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--mtp-lambda", type=float, default=0.3)
    ap.add_argument("--aux-coef", type=float, default=0.01)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--max-mb", type=float, default=25.0, help="refuse sizes whose bf16 file exceeds this")
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--gen-tokens", type=int, default=80)
    ap.add_argument("--eval-max-tokens", type=int, default=1024)
    args = ap.parse_args()
    limit_train = limit_held = 0
    if args.smoke:
        args.vocab, args.hidden, args.layers, args.heads, args.kv_heads, args.head_dim = 1000, 64, 4, 2, 1, 32
        args.linear_k_heads, args.linear_v_heads, args.experts, args.moe_inter, args.shared_inter = 1, 2, 4, 32, 64
        args.seq_len, args.batch, args.steps, args.warmup, args.log_every = 128, 8, 20, 5, 5
        args.samples, args.gen_tokens, args.eval_max_tokens = 2, 24, 256
        limit_train, limit_held = 3000, 40

    t_start = time.time()
    check_transformers()
    import numpy as np  # noqa: F401  (needed by epoch_batches)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig
    if not torch.cuda.is_available():
        log("WARNING: no CUDA device; running on the CPU (only sensible with --smoke)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    os.makedirs(args.out, exist_ok=True)

    train_rows = load_rows(os.path.join(args.data, "train.jsonl"), limit_train)
    held_rows = load_rows(os.path.join(args.data, "heldout.jsonl"), limit_held)
    log("data: {} train, {} held-out rows".format(len(train_rows), len(held_rows)))
    tok, ids = train_tokenizer(train_rows, args.vocab, args.out)
    V = tok.get_vocab_size()
    log("tokenizer: vocab {} ids {}".format(V, ids))
    docs = encode_docs(tok, train_rows, ids["<|endoftext|>"])
    n_tokens = sum(len(d) for d in docs)
    log("corpus: {} tokens ({:.2f} bytes/token)".format(
        n_tokens, sum(len(doc_text(r).encode()) for r in train_rows) / n_tokens))
    with open(os.path.join(args.out, "heldout_texts.jsonl"), "w", encoding="utf-8") as f:
        for r in held_rows:
            f.write(json.dumps({"id": r["id"], "text": doc_text(r)}, ensure_ascii=False) + "\n")

    cls = check_transformers()
    cfg = make_config(args, V, ids)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    if not isinstance(model, cls):
        sys.exit("train_demo_model.py: AutoModelForCausalLM built {}, expected {}".format(
            type(model).__name__, cls.__name__))
    mtp, full_idx = make_mtp(model)
    n_main = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    mb = 2 * (n_main + n_mtp) / 1e6
    log("model {}: {:,} main + {:,} MTP parameters, ~{:.1f} MB in bf16; layer_types {}".format(
        type(model).__name__, n_main, n_mtp, mb, cfg.layer_types))
    if mb > args.max_mb:
        sys.exit("train_demo_model.py: the model would be {:.1f} MB in bf16, over --max-mb {}: use fewer "
                 "experts/layers or a smaller --vocab".format(mb, args.max_mb))
    model.to(device).train()
    mtp.to(device).train()
    lkw = LayerKwargs(model.model.layers[full_idx])
    routers = RouterLogits([l.mlp.gate for l in model.model.layers] + [mtp.layers[0].mlp.gate])

    params = list(model.parameters()) + list(mtp.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=(device == "cuda"))
    budget = args.minutes * 60

    rng = random.Random(args.seed)
    history = []
    step, tokens_seen, epoch = 0, 0, 0
    t0 = time.time()
    last = {"loss": float("nan"), "mtp": float("nan")}
    done = False
    while not done:
        for batch in epoch_batches(docs, args.seq_len, args.batch, rng):
            elapsed = time.time() - t0
            frac = step / args.steps if args.steps else elapsed / budget
            if frac >= 1.0:
                done = True
                break
            for g in opt.param_groups:
                g["lr"] = lr_schedule(step, frac if step >= args.warmup else 0.0, args.lr, args.warmup)
            x = torch.from_numpy(batch).to(device)
            with torch.autocast(device_type="cuda" if device == "cuda" else "cpu", dtype=torch.bfloat16):
                main_loss, mtp_loss = forward_losses(model, mtp, lkw, x, args.mtp_lambda)
                aux = routers.balance_loss(args.experts, args.top_k)
            loss = main_loss + args.mtp_lambda * mtp_loss + (args.aux_coef * aux if aux is not None else 0.0)
            gn = optimizer_step(opt, params, loss)
            step += 1
            tokens_seen += x.numel()
            if step % args.log_every == 0 or step == 1:
                last = {"loss": main_loss.item(), "mtp": mtp_loss.item()}
                rec = {"step": step, "seconds": round(time.time() - t0, 1), "loss": round(last["loss"], 4),
                       "mtp_loss": round(last["mtp"], 4), "aux": round(float(aux), 4) if aux is not None else None,
                       "grad_norm": round(float(gn), 3), "lr": opt.param_groups[0]["lr"], "epoch": epoch}
                history.append(rec)
                log("step {step} loss {loss} mtp {mtp_loss} aux {aux} gnorm {grad_norm} lr {lr:.2e} "
                    "epoch {epoch} {seconds}s".format(**rec))
                if not math.isfinite(last["loss"]):
                    sys.exit("train_demo_model.py: loss is not finite at step {}".format(step))
        epoch += 1
    train_seconds = time.time() - t0
    last = {"loss": main_loss.item(), "mtp": mtp_loss.item()}
    log("trained {} steps, {} tokens, {:.1f} s".format(step, tokens_seen, train_seconds))

    model.eval()
    nbytes, per_expert = save_model(model, mtp, full_idx, args.out)
    log("saved {} ({:.2f} MB; experts {})".format(os.path.join(args.out, "model.safetensors"), nbytes / 1e6,
                                                  "per expert" if per_expert else "fused"))
    gc = GenerationConfig(bos_token_id=ids["<|endoftext|>"], eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
                          pad_token_id=ids["<|endoftext|>"], do_sample=True, temperature=0.7, top_p=0.8, top_k=20)
    gc.save_pretrained(args.out)
    del model, mtp, opt
    torch.cuda.empty_cache() if device == "cuda" else None

    ev = evaluate(args.out, held_rows, args, device)
    stats = {"command": "python3 tools/train_demo_model.py " + " ".join(sys.argv[1:]), "smoke": args.smoke,
             "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
             "transformers": transformers.__version__, "vocab_size": V, "parameters": n_main + n_mtp,
             "parameters_main": n_main, "parameters_mtp": n_mtp, "layer_types": list(cfg.layer_types),
             "safetensors_bytes": nbytes, "steps": step, "tokens_seen": tokens_seen,
             "corpus_tokens": n_tokens, "epochs": tokens_seen / n_tokens, "train_seconds": train_seconds,
             "final_loss": last["loss"], "final_mtp_loss": last["mtp"], "total_seconds": time.time() - t_start}
    ev["training"] = stats
    with open(os.path.join(args.out, "eval.json"), "w", encoding="utf-8") as f:
        json.dump(ev, f, ensure_ascii=False, indent=1)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(history, f)
    with open(os.path.join(args.data, "SOURCES.md"), encoding="utf-8") as f:
        sources_md = f.read()
    write_card(args.out, args, stats, ev, sources_md)
    summary = {k: ev[k] for k in ("mtp_acceptance",)}
    summary["perplexity"] = ev["heldout"]["perplexity"]
    summary["poem_samples_4x5"] = ev["poem"]["samples_4x5"]
    summary["errors"] = ev["errors"]
    log("eval:", json.dumps(summary, ensure_ascii=False))
    log("poem greedy:", json.dumps(ev["poem"]["greedy"], ensure_ascii=False))
    log("quote greedy:", json.dumps(ev["quote"]["greedy"], ensure_ascii=False))
    log("done in {:.1f} s; files: {}".format(time.time() - t_start, sorted(os.listdir(args.out))))
    if ev["errors"]:
        sys.exit("train_demo_model.py: {} evaluation error(s), see eval.json".format(len(ev["errors"])))


if __name__ == "__main__":
    main()
