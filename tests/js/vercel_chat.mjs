// The Vercel AI SDK (`ai` + `@ai-sdk/openai`) holding a three-turn chat on the Responses
// provider, as its docs show: each turn passes the earlier messages back, and the SDK sends
// the stored assistant messages as `item_reference` items.
// Usage: OPENAI_BASE_URL=http://host:port/v1 OPENAI_API_KEY=sk-... node vercel_chat.mjs
//
// mock_chat answers the last `[mock:say=TEXT]` directive of its prompt. Turn 1 asks for an
// answer that is itself a directive, whose text is another directive: turn 2 answers what
// turn 1's answer says, and turn 3 what turn 2's says, so each answer proves the model saw
// the answer before it (without it, the earlier directive would win).
import assert from "node:assert/strict";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText } from "ai";
import { check, runChecks } from "./checks.mjs";

const say = (text) => `[mock:say=${encodeURIComponent(text)}]`;
const THIRD = "Turn three saw turn two.";
const SECOND = say(THIRD);
const FIRST = say(SECOND);

// Every request body the SDK sends, to check that it references the stored messages.
const sent = [];
const openai = createOpenAI({
  baseURL: process.env.OPENAI_BASE_URL,
  apiKey: process.env.OPENAI_API_KEY,
  fetch: async (url, init) => {
    sent.push(JSON.parse(init.body));
    return fetch(url, init);
  },
});
const model = openai("mock_chat");
const references = (body) => body.input.filter((item) => item.type === "item_reference");

check("three turns, each seeing the answer before it through item_reference", async () => {
  const messages = [{ role: "user", content: `Answer this: ${say(FIRST)}` }];
  const answers = [];
  for (const next of ["And now?", "And the last one?", null]) {
    const turn = await generateText({ model, messages });
    assert.equal(turn.finishReason, "stop");
    answers.push(turn.text);
    messages.push(...turn.response.messages);
    if (next) messages.push({ role: "user", content: next });
  }
  assert.deepEqual(answers, [FIRST, SECOND, THIRD]);
  assert.equal(sent.length, 3);
  assert.equal(sent[0].model, "mock_chat");
  assert.deepEqual(sent.map((body) => references(body).length), [0, 1, 2]);
});

await runChecks();
