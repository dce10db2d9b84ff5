// The official npm `openai` client against a running gateway: the Responses API (a stored
// conversation continued, streaming, retrieve, delete) and embeddings.
// Usage: OPENAI_BASE_URL=http://host:port/v1 OPENAI_API_KEY=sk-... node responses.mjs
import assert from "node:assert/strict";
import OpenAI from "openai";
import { check, runChecks } from "./checks.mjs";

const client = new OpenAI();

check("responses.create, continued with previous_response_id", async () => {
  const first = await client.responses.create({ model: "mock_chat", input: "remember this" });
  assert.equal(first.status, "completed");
  assert.equal(first.output_text, "The quick brown fox jumps over the lazy dog.");
  const second = await client.responses.create({
    model: "mock_chat",
    input: "and now?",
    previous_response_id: first.id,
  });
  assert.ok(second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens);
  const fetched = await client.responses.retrieve(second.id);
  assert.equal(fetched.output_text, second.output_text);
  await client.responses.delete(first.id);
  await assert.rejects(client.responses.retrieve(first.id), (error) => error.status === 404);
});

check("responses stream events", async () => {
  const stream = await client.responses.create({ model: "mock_chat", input: "hi", stream: true });
  let text = "";
  let last;
  for await (const event of stream) {
    if (event.type === "response.output_text.delta") text += event.delta;
    last = event;
  }
  assert.equal(last.type, "response.completed");
  assert.equal(text, last.response.output_text ?? last.response.output[0].content[0].text);
});

check("embeddings.create: base64 by default, float on request, related texts closer", async () => {
  const texts = ["a cat sits on the mat", "a kitten rests on a rug", "stock markets fell today"];
  const result = await client.embeddings.create({ model: "e5_small", input: texts });
  assert.equal(result.data.length, 3);
  const [a, b, c] = result.data.map((d) => d.embedding);
  assert.equal(a.length, 384);
  const dot = (x, y) => x.reduce((sum, v, i) => sum + v * y[i], 0);
  assert.ok(dot(a, b) > dot(a, c), `${dot(a, b)} <= ${dot(a, c)}`);
  const floats = await client.embeddings.create({
    model: "e5_small",
    input: texts[0],
    encoding_format: "float",
  });
  assert.ok(Math.abs(floats.data[0].embedding[0] - a[0]) < 1e-6);
  assert.ok(result.usage.prompt_tokens > 0);
});

await runChecks();
