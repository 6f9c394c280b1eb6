// The npm `openai` client (pinned in package.json) reading duet-router's
// logprobs, echo and n (docs/api-logprobs.md).
// Usage: node router_logprobs.mjs SPEC.json    SPEC: {base_url, model}
// Checks: completions with logprobs (tokens, token_logprobs, top_logprobs,
// text_offset), echo with logprobs, n = 2 with a seed (streamed and not,
// per-index), chat with logprobs + top_logprobs, and the SDK's typed 400
// for top_logprobs 21.  Exits 0 when every check passed; prints FAIL lines.
import fs from 'node:fs';
import OpenAI from 'openai';

const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const client = new OpenAI({ baseURL: spec.base_url, apiKey: 'none', maxRetries: 0,
                            timeout: 60000 });
let failures = 0;
function check(cond, msg) {
  if (!cond) {
    failures++;
    console.log('FAIL: ' + msg);
  }
}

const prompt = 'Once upon a time';
const r = await client.completions.create({ model: spec.model, prompt, max_tokens: 5,
                                            temperature: 0, logprobs: 3 });
const lp = r.choices[0].logprobs;
check(lp && lp.tokens.length === r.usage.completion_tokens &&
      lp.token_logprobs.every((v) => typeof v === 'number' && v <= 0) &&
      lp.top_logprobs.every((t) => Object.keys(t).length >= 1 && Object.keys(t).length <= 3) &&
      lp.text_offset.length === lp.tokens.length,
      `completions logprobs: ${JSON.stringify(lp)}`);
check(lp.tokens.join('') === r.choices[0].text, `tokens ${JSON.stringify(lp.tokens)} vs text`);

const e = await client.completions.create({ model: spec.model, prompt, max_tokens: 1,
                                            temperature: 0, logprobs: 1, echo: true });
const elp = e.choices[0].logprobs;
check(e.choices[0].text.startsWith(prompt) && elp.token_logprobs[0] === null &&
      elp.tokens.length === e.usage.prompt_tokens + 1,
      `echo: ${JSON.stringify(e.choices[0])}`);

const body = { model: spec.model, prompt, max_tokens: 6, temperature: 1, seed: 7, n: 2,
               logprobs: 1 };
const a = await client.completions.create(body);
const texts = [0, 1].map((i) => a.choices.find((c) => c.index === i).text);
const stream = await client.completions.create({ ...body, stream: true });
const streamed = ['', ''];
for await (const ch of stream) for (const c of ch.choices) streamed[c.index] += c.text;
check(JSON.stringify(streamed) === JSON.stringify(texts),
      `n=2 seeded: stream ${JSON.stringify(streamed)} vs ${JSON.stringify(texts)}`);

const c = await client.chat.completions.create({
  model: spec.model, messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 4,
  temperature: 0, logprobs: true, top_logprobs: 2 });
const content = c.choices[0].logprobs?.content ?? [];
check(content.length === c.usage.completion_tokens &&
      content.every((t) => typeof t.token === 'string' && Array.isArray(t.bytes) &&
                           t.top_logprobs.length === 2),
      `chat logprobs: ${JSON.stringify(c.choices[0].logprobs)}`);

try {
  await client.chat.completions.create({ model: spec.model, max_tokens: 2, logprobs: true,
                                         top_logprobs: 21,
                                         messages: [{ role: 'user', content: 'x' }] });
  check(false, 'top_logprobs 21 accepted');
} catch (err) {
  check(err instanceof OpenAI.BadRequestError && err.param === 'top_logprobs',
        `top_logprobs 21: ${err}`);
}

if (failures) process.exit(1);
console.log('openai client: completions/chat logprobs, echo, n=2 stream ok');
