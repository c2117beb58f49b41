// Reference acceptance from xgrammar (compiled to WASM: @mlc-ai/web-xgrammar) for the grammar library's
// oracle test (tests/grammar/grammar_xgrammar_oracle_test.cpp).
//   node grammar_refs_xgrammar.mjs CASES.json
// CASES.json: [{"kind": "schema" | "ebnf" | "structural_tag" | "structural_format", "source": text,
//               "any_whitespace": bool, "strict": bool, "max_whitespace": n, "strings": [text, ...]}, ...]
// A structural_tag source is vLLM's {"structures": [{"begin", "schema", "end"}], "triggers": [...]}, built
// with xgrammar's StructuralTagItem form; a structural_format source is xgrammar's "format" object (any of
// the format types this version has: const_string, json_schema, grammar, regex, any_text, sequence, or, tag,
// triggered_tags, tags_with_separator, qwen_xml_parameter), built as {"type": "structural_tag", "format"}.
// Prints one JSON array: per case, an array of booleans (xgrammar accepts the whole string), or
// {"error": message} when xgrammar cannot build the grammar.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname } from "node:path";

// The package is a UMD bundle inside a "type": "module" package, which Node's loaders reject: run it
// as CommonJS by hand.
const require = createRequire(import.meta.url);
const file = require.resolve("@mlc-ai/web-xgrammar");
const source = readFileSync(file, "utf8");
function load() {
  const module = { exports: {} };
  new Function("exports", "module", "require", "__filename", "__dirname", source)(
    module.exports, module, require, file, dirname(file));
  return module.exports;
}
// A failed check aborts the WASM instance: a fresh one is loaded after each error.
let { Grammar, Testings, StructuralTagItem } = load();

function structuralTag(source) {
  const { structures, triggers } = JSON.parse(source);
  const items = structures.map((st) => new StructuralTagItem(st.begin, st.schema, st.end));
  return Grammar.fromStructuralTag(items, triggers);
}

const cases = JSON.parse(readFileSync(process.argv[2], "utf8"));
const out = [];
for (const c of cases) {
  let grammar;
  try {
    grammar = c.kind === "schema"
      ? await Grammar.fromJSONSchema(c.source, c.any_whitespace, undefined, undefined, c.strict, c.max_whitespace)
      : c.kind === "structural_tag" ? await structuralTag(c.source)
      : c.kind === "structural_format"
      ? await Grammar.fromStructuralTag({ type: "structural_tag", format: JSON.parse(c.source) })
      : await Grammar.fromEBNF(c.source, "root");
  } catch (e) {
    out.push({ error: String(e && e.message ? e.message : e) });
    ({ Grammar, Testings, StructuralTagItem } = load());
    continue;
  }
  const results = [];
  for (const s of c.strings) results.push(await Testings.isGrammarAcceptString(grammar, s));
  grammar.dispose();
  out.push(results);
}
process.stdout.write(JSON.stringify(out) + "\n");
