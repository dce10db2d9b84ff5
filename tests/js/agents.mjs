// The official npm `openai` client against a running gateway: structured outputs, tool
// calls (forced, parsed, streamed), /v1/completions, n, logprobs and a bad request.
// Usage: OPENAI_BASE_URL=http://host:port/v1 OPENAI_API_KEY=sk-... node agents.mjs
// Runs every check (node:assert) and exits non-zero if any failed, printing what it got.
import assert from "node:assert/strict";
import OpenAI from "openai";
import { check, runChecks } from "./checks.mjs";

const client = new OpenAI();
const weather = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather in a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string" } },
      required: ["city"],
    },
  },
};
const person = {
  type: "object",
  properties: { name: { type: "string" }, age: { type: "integer" } },
  required: ["name", "age"],
  additionalProperties: false,
};
const ask = (content) => [{ role: "user", content }];

check("json_schema answer parses and fits", async () => {
  const reply = await client.chat.completions.create({
    model: "smollm2",
    messages: ask("Describe a person named Alice as JSON."),
    response_format: {
      type: "json_schema",
      json_schema: { name: "person", schema: person, strict: true },
    },
    temperature: 0,
    max_tokens: 64,
  });
  const value = JSON.parse(reply.choices[0].message.content);
  assert.equal(typeof value.name, "string");
  assert.ok(Number.isInteger(value.age));
});

check("required tool_choice returns a call; the tool result gets an answer", async () => {
  const messages = ask("What is the weather in Paris?");
  const reply = await client.chat.completions.create({
    model: "smollm2",
    messages,
    tools: [weather],
    tool_choice: "required",
    temperature: 0,
    max_tokens: 64,
  });
  const choice = reply.choices[0];
  assert.equal(choice.finish_reason, "tool_calls");
  const call = choice.message.tool_calls[0];
  assert.equal(call.function.name, "get_weather");
  assert.equal(typeof JSON.parse(call.function.arguments).city, "string");
  const answer = await client.chat.completions.create({
    model: "smollm2",
    messages: [
      ...messages,
      choice.message,
      { role: "tool", tool_call_id: call.id, content: '{"celsius": 7, "sky": "clear"}' },
    ],
    tools: [weather],
    tool_choice: "none",
    temperature: 0,
    max_tokens: 32,
  });
  assert.equal(answer.choices[0].message.tool_calls ?? undefined, undefined);
  assert.ok(answer.choices[0].message.content.length > 0);
});

check("streamed tool call assembles with the stream helper", async () => {
  const said = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>';
  const messages = ask(`[mock:say=${encodeURIComponent(said)}]`);
  const stream = client.chat.completions.stream({ model: "mock_chat", messages, tools: [weather] });
  const final = await stream.finalChatCompletion();
  const call = final.choices[0].message.tool_calls[0];
  assert.equal(call.function.name, "get_weather");
  assert.deepEqual(JSON.parse(call.function.arguments), { city: "Oslo" });
});

check("completions, n=2 and logprobs", async () => {
  const done = await client.completions.create({
    model: "mock_chat",
    prompt: ["one", "two"],
    max_tokens: 3,
    logprobs: 2,
  });
  assert.deepEqual(done.choices.map((c) => c.index), [0, 1]);
  assert.equal(done.choices[0].logprobs.tokens.length, 3);
  const chat = await client.chat.completions.create({
    model: "mock_chat",
    messages: ask("hello"),
    n: 2,
    max_tokens: 4,
    logprobs: true,
    top_logprobs: 2,
  });
  assert.equal(chat.choices.length, 2);
  assert.equal(chat.choices[1].logprobs.content[0].top_logprobs.length, 2);
  assert.equal(chat.usage.completion_tokens, 8);
});

check("bad input is a 400 naming the parameter", async () => {
  await assert.rejects(
    client.chat.completions.create({
      model: "mock_chat",
      messages: ask("hi"),
      tools: [weather],
      tool_choice: { type: "function", function: { name: "nope" } },
    }),
    (error) => error.status === 400 && error.param === "tool_choice",
  );
});

await runChecks();
