// The npm `openai` client (pinned in package.json) against duet-router.
// Usage: node router_openai.mjs SPEC.json
// SPEC: {base_url, model, api_key, cases: [{prompt | prompt_ids, max_tokens,
//        expect_text, expect_tokens}]}
// Checks models.list, non-streaming and streaming completions (text equal
// to the `duet generate --tp 1` oracle, usage, finish_reason), the
// include_usage stream chunk, and the SDK's typed errors for an unknown
// model (404) and chat on a model without a template (400).
// Exits 0 when every check passed; prints FAIL lines otherwise.
import fs from 'node:fs';
import OpenAI from 'openai';

const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const client = new OpenAI({ baseURL: spec.base_url, apiKey: spec.api_key || 'none',
                            maxRetries: 0, timeout: 60000 });
let failures = 0;
function check(cond, msg) {
  if (!cond) {
    failures++;
    console.log('FAIL: ' + msg);
  }
}

const models = await client.models.list();
const ids = [];
for await (const m of models) ids.push(m.id);
check(ids.length === 1 && ids[0] === spec.model, `models.list: ${JSON.stringify(ids)}`);
const one = await client.models.retrieve(spec.model);
check(one.id === spec.model && one.object === 'model', `models.retrieve: ${JSON.stringify(one)}`);

for (const c of spec.cases) {
  const prompt = c.prompt_ids ?? c.prompt;
  const label = JSON.stringify(prompt).slice(0, 40);
  const r = await client.completions.create({ model: spec.model, prompt, max_tokens: c.max_tokens,
                                              temperature: 0 });
  check(r.object === 'text_completion' && r.id.startsWith('cmpl-'), `${label}: ${r.object} ${r.id}`);
  check(r.model === spec.model, `${label}: model ${r.model}`);
  check(Number.isInteger(r.created) && r.created > 1.6e9, `${label}: created ${r.created}`);
  check(r.choices.length === 1 && r.choices[0].index === 0, `${label}: choices`);
  check(r.choices[0].text === c.expect_text,
        `${label}: non-stream text ${JSON.stringify(r.choices[0].text)} != ${JSON.stringify(c.expect_text)}`);
  check(r.choices[0].logprobs === null, `${label}: logprobs`);
  check(['stop', 'length'].includes(r.choices[0].finish_reason), `${label}: finish ${r.choices[0].finish_reason}`);
  check(r.usage.completion_tokens === c.expect_tokens,
        `${label}: completion_tokens ${r.usage.completion_tokens} != ${c.expect_tokens}`);
  check(r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens &&
        r.usage.prompt_tokens > 0, `${label}: usage ${JSON.stringify(r.usage)}`);

  const stream = await client.completions.create({ model: spec.model, prompt, max_tokens: c.max_tokens,
                                                   temperature: 0, stream: true,
                                                   stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, chunks = 0, id = null;
  for await (const ch of stream) {
    id = id ?? ch.id;
    check(ch.id === id, `${label}: chunk id changed`);
    if (ch.usage) usage = ch.usage;
    if (ch.choices.length) {
      chunks++;
      text += ch.choices[0].text;
      if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
    }
  }
  check(text === c.expect_text, `${label}: stream text ${JSON.stringify(text)} != ${JSON.stringify(c.expect_text)}`);
  check(chunks >= 2, `${label}: only ${chunks} chunks (not streamed?)`);
  check(finish === r.choices[0].finish_reason, `${label}: stream finish ${finish}`);
  check(usage && usage.completion_tokens === c.expect_tokens, `${label}: stream usage ${JSON.stringify(usage)}`);
}

try {
  await client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 1 });
  check(false, 'unknown model: no error');
} catch (e) {
  check(e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === 'model_not_found',
        `unknown model: ${e.constructor.name} ${e.status} ${e.code}`);
}
try {
  await client.completions.create({ model: spec.model, prompt: 'x', max_tokens: -1 });
  check(false, 'negative max_tokens: no error');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.param === 'max_tokens',
        `negative max_tokens: ${e.constructor.name} ${e.status} ${e.param}`);
}
if (spec.expect_chat_400) {
  try {
    await client.chat.completions.create({ model: spec.model, messages: [{ role: 'user', content: 'hi' }] });
    check(false, 'chat without a template: no error');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.code === 'chat_template_unavailable',
          `chat without a template: ${e.constructor.name} ${e.status} ${e.code}`);
  }
}
if (spec.chat) {
  const c = spec.chat;
  const r = await client.chat.completions.create({ model: spec.model, messages: c.messages,
                                                   max_tokens: c.max_tokens, temperature: 0 });
  check(r.object === 'chat.completion' && r.choices[0].message.role === 'assistant',
        `chat: ${JSON.stringify(r).slice(0, 200)}`);
  check(r.usage.prompt_tokens === c.expect_prompt_tokens,
        `chat: prompt_tokens ${r.usage.prompt_tokens} != ${c.expect_prompt_tokens}`);
  check(r.choices[0].message.content === c.expect_text,
        `chat: ${JSON.stringify(r.choices[0].message.content)} != ${JSON.stringify(c.expect_text)}`);
  const s = await client.chat.completions.create({ model: spec.model, messages: c.messages,
                                                  max_tokens: c.max_tokens, temperature: 0, stream: true });
  let text = '', role = null;
  for await (const ch of s) {
    if (ch.choices[0]?.delta?.role) role = ch.choices[0].delta.role;
    text += ch.choices[0]?.delta?.content ?? '';
  }
  check(role === 'assistant' && text === c.expect_text, `chat stream: ${role} ${JSON.stringify(text)}`);
}
console.log(failures ? `${failures} check(s) failed` : 'openai client: all checks passed');
process.exit(failures ? 1 : 0);
