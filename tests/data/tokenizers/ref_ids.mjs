// Reference ids for duet's tokenizer fixtures, from an independent
// implementation: @huggingface/tokenizers (pure JavaScript), version 0.2.0.
//
//   mkdir -p /tmp/tokref && cd /tmp/tokref && npm install @huggingface/tokenizers@0.2.0
//   NODE_PATH=/tmp/tokref/node_modules node tests/data/tokenizers/ref_ids.mjs
//
// (run from the repository root, after gen_fixtures.py).  Writes ref_*.json.
import fs from "fs";
import path from "path";
import { createRequire } from "module";

const read = (p) => JSON.parse(fs.readFileSync(p, "utf8"));
const require = createRequire(path.join(process.env.NODE_PATH || ".", "x.js"));
const { Tokenizer } = require("@huggingface/tokenizers");
const version = read(path.join(path.dirname(require.resolve("@huggingface/tokenizers")), "..", "package.json")).version;

const here = "tests/data/tokenizers";
const fixtures = [
  ["stories260K", "models/stories260K/tokenizer.json", "models/stories260K/tokenizer_config.json", "texts_sp.json"],
  ["sp_metaspace", `${here}/sp_metaspace/tokenizer.json`, "models/stories260K/tokenizer_config.json", "texts_sp.json"],
  ["bytelevel_gpt2", `${here}/bytelevel_gpt2/tokenizer.json`, null, "texts_gpt2.json"],
  ["bytelevel_llama3", `${here}/bytelevel_llama3/tokenizer.json`, null, "texts_split.json"],
  ["bytelevel_qwen2", `${here}/bytelevel_qwen2/tokenizer.json`, `${here}/bytelevel_qwen2/tokenizer_config.json`, "texts_split.json"],
];
const opts = (skip) => ({ skip_special_tokens: skip, clean_up_tokenization_spaces: false });

for (const [name, tj, cj, texts] of fixtures) {
  const tok = new Tokenizer(read(tj), cj ? read(cj) : {});
  const cases = read(`${here}/${texts}`).map((text) => {
    const ids = tok.encode(text, { add_special_tokens: true }).ids;
    const plain = tok.encode(text, { add_special_tokens: false }).ids;
    return {
      text, ids, plain,
      decoded: ids.length ? tok.decode(ids, opts(true)) : "",
      decoded_special: ids.length ? tok.decode(ids, opts(false)) : "",
    };
  });
  const out = {
    tokenizer: tj, config: cj,
    produced_by: `@huggingface/tokenizers ${version} (npm), node ${process.version}, tests/data/tokenizers/ref_ids.mjs`,
    cases,
  };
  fs.writeFileSync(`${here}/ref_${name}.json`, JSON.stringify(out, null, 0).replace(/\},\{"text"/g, '},\n{"text"') + "\n");
  console.log(name, cases.length, "cases");
}
