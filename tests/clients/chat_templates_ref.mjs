// The real chat templates in tests/data/chat_templates rendered by duet's
// interpreter (duet-chat-render) and by @huggingface/jinja (the reference),
// over conversations with system, multi-turn, tools, tool_calls and tool
// messages; the prompts must be byte-equal, and where the reference raises
// (raise_exception), duet must fail too.  duet defines neither strftime_now
// nor date_string, so the Llama templates use their "26 Jul 2024" default;
// the reference is made to do the same (its strftime_now is undefined here,
// where transformers and @huggingface/jinja would print today's date).
// usage: node chat_templates_ref.mjs DUET_CHAT_RENDER TEMPLATE_DIR
// Exits 77 (SKIP) when @huggingface/jinja is not installed.
import { spawnSync } from "node:child_process";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";

let Template, Environment;
try {
  ({ Template, Environment } = await import("@huggingface/jinja"));
} catch {
  console.log("SKIP: tests/clients/node_modules/@huggingface/jinja missing (npm ci in tests/clients)");
  process.exit(77);
}
const [render, dir] = process.argv.slice(2);
// Leave strftime_now out of the reference's globals (see above); the others
// (raise_exception, namespace, ...) stay as the package defines them.
const declare = Environment.prototype.set;
Environment.prototype.set = function (name, value) {
  return name === "strftime_now" ? undefined : declare.call(this, name, value);
};

const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Get the current weather in a city (\"now\"), e.g. Montréal",
      parameters: {
        type: "object",
        properties: {
          city: { type: "string", description: "The city" },
          unit: { type: "string", enum: ["celsius", "fahrenheit"] },
          days: { type: "integer", minimum: 1, maximum: 7 },
        },
        required: ["city"],
      },
    },
  },
  {
    type: "function",
    function: { name: "get_time", description: "Current time", parameters: { type: "object", properties: {} } },
  },
];
const sys = { role: "system", content: "You are a helpful assistant.\nAnswer briefly." };
const user = { role: "user", content: "  What's the weather in Paris?  " };
const call = (args, content = null) => ({
  role: "assistant",
  content,
  tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: args } }],
});
const toolMsg = { role: "tool", tool_call_id: "call_1", content: "{\"temp\": 21, \"sky\": \"clear\"}" };
const cases = {
  system_user: { messages: [sys, user] },
  multi_turn: {
    messages: [sys, { role: "user", content: "Hi" }, { role: "assistant", content: "Hello! How can I help?" },
      { role: "user", content: "Tell me a joke about \"quotes\" & <tags>." }],
  },
  no_system: {
    messages: [{ role: "user", content: "Hi" }, { role: "assistant", content: "Hello." }, { role: "user", content: "Bye — 再见" }],
  },
  tools: { messages: [sys, user], tools },
  tools_no_system: { messages: [user], tools },
  tools_no_user: { messages: [sys], tools },
  tool_call_string_args: { messages: [sys, user, call("{\"city\": \"Paris\"}", "")], tools },
  tool_call_null_content: { messages: [sys, user, call("{\"city\": \"Paris\"}")], tools },
  tool_call_dict_args: { messages: [sys, user, call({ city: "Paris", days: 2 }, "")], tools },
  tool_result: { messages: [sys, user, call({ city: "Paris" }, ""), toolMsg], tools },
  two_tool_results: {
    messages: [user, { role: "assistant", content: "Checking.", tool_calls: [
      { id: "a", type: "function", function: { name: "get_weather", arguments: { city: "Paris" } } },
      { id: "b", type: "function", function: { name: "get_time", arguments: {} } }] },
    toolMsg, { role: "tool", tool_call_id: "b", content: "12:00" },
    { role: "assistant", content: "It is 21 and clear at noon." }, { role: "user", content: "Thanks" }],
    tools,
  },
  thinking_history: {
    messages: [user, { role: "assistant", content: "<think>\nThe user asks.\n</think>\n\nSunny." },
      { role: "user", content: "And tomorrow?" }],
  },
  // Qwen3 strips these with .lstrip('\n') / .strip('\n'): see pythonStrip.
  thinking_spaces: {
    messages: [user, { role: "assistant", content: "<think>\n  step 1\n\n</think>\n\n  Sunny.\n" },
      { role: "user", content: "Ok" }, { role: "assistant", content: "\n<think>\n\tlast  \n</think>\n \nDone" }],
  },
  reasoning_content: {
    messages: [user, { role: "assistant", content: "Sunny.", reasoning_content: "\n\n checked \n" }],
  },
  thinking_last: { messages: [user, { role: "assistant", content: "<think>\nhmm\n</think>\n\nSunny." }] },
};

// @huggingface/jinja 0.5.11's str.strip/lstrip/rstrip ignore their chars
// argument (they trim all whitespace), where Python's -- and so jinja2 and
// transformers -- strip only those chars; duet follows Python.  Where
// Qwen3's template strips '\n' next to other whitespace, the reference's
// text is corrected as Python renders it: [template, case, reference text,
// Python's text].
const pythonStrip = [
  ["Qwen-Qwen3-0.6B.jinja", "thinking_spaces", "assistant\nSunny.\n<|im_end|>", "assistant\n  Sunny.\n<|im_end|>"],
  ["Qwen-Qwen3-0.6B.jinja", "thinking_spaces", "<think>\nlast\n</think>\n\nDone", "<think>\n\tlast  \n</think>\n\n \nDone"],
  ["Qwen-Qwen3-0.6B.jinja", "reasoning_content", "<think>\nchecked\n</think>", "<think>\n checked \n</think>"],
];

const files = readdirSync(dir).filter((f) => f.endsWith(".jinja")).sort();
let failed = 0, n = 0;
for (const f of files) {
  const src = readFileSync(join(dir, f), "utf8");
  const tmpl = new Template(src);
  for (const [name, c] of Object.entries(cases)) {
    const variants = [{ add_generation_prompt: true }, { add_generation_prompt: false }];
    if (src.includes("enable_thinking")) variants.push({ add_generation_prompt: true, enable_thinking: false },
      { add_generation_prompt: true, enable_thinking: true });
    for (const v of variants) {
      const ctx = { ...c, ...v, bos_token: "<|begin_of_text|>", eos_token: "<|eot_id|>" };
      const label = `${f} ${name} ${JSON.stringify(v)}`;
      let want, wantErr = null;
      try {
        want = tmpl.render(structuredClone(ctx));
      } catch (e) {
        wantErr = String(e.message || e);
      }
      for (const [t, cn, ref, py] of pythonStrip) {
        if (t !== f || cn !== name) continue;
        if (wantErr !== null || !want.includes(ref)) {
          console.log(`FAIL ${label}: the reference no longer renders ${JSON.stringify(ref)}`);
          process.exit(1);
        }
        want = want.replace(ref, py);
      }
      const r = spawnSync(render, [join(dir, f)], { input: JSON.stringify(ctx), encoding: "utf8" });
      n++;
      if (wantErr !== null) {
        if (r.status === 0) {
          failed++;
          console.log(`FAIL ${label}: reference raised (${wantErr}) but duet rendered:\n${r.stdout}`);
        } else {
          console.log(`ok   ${label} (both refuse: ${wantErr.split("\n")[0]})`);
        }
      } else if (r.status !== 0) {
        failed++;
        console.log(`FAIL ${label}: duet failed: ${r.stderr.trim()}`);
      } else if (r.stdout !== want) {
        failed++;
        let i = 0;
        while (i < want.length && want[i] === r.stdout[i]) i++;
        console.log(`FAIL ${label}: differs at byte ${i}\n--- want: ${JSON.stringify(want.slice(Math.max(0, i - 80), i + 80))}\n--- duet: ${JSON.stringify(r.stdout.slice(Math.max(0, i - 80), i + 80))}`);
      } else {
        console.log(`ok   ${label} (${want.length} chars)`);
      }
    }
  }
}
console.log(`${n - failed}/${n} renders equal @huggingface/jinja's (${pythonStrip.length} strip corrections)`);
process.exit(failed ? 1 : 0);
