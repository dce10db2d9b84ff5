// Chat tab: /v1/chat/completions streamed token by token; Stop aborts the request, which
// cancels the generation in Triton. A reasoning model's reasoning shows above its answer.

import { call, events } from "./api.js";
import { $, clearError, message, optionalNumber, showError } from "./ui.js";

let history = []; // the conversation this page keeps when no session id is given
let controller = null;

function bubble(role, text) {
  return message($("chat-output"), role, text);
}

// The reasoning block of an answer, made when its first reasoning delta arrives.
function reasoningOf(output) {
  const details = document.createElement("details");
  details.className = "reasoning";
  details.dataset.testid = "chat-reasoning";
  details.open = true;
  const summary = document.createElement("summary");
  summary.textContent = "Reasoning";
  const text = document.createElement("div");
  details.append(summary, text);
  output.before(details);
  return text;
}

async function send() {
  const input = $("chat-input");
  const text = input.value.trim();
  if (!text || controller) return;
  const error = $("chat-error");
  const status = $("chat-status");
  clearError(error);
  const session = $("chat-session").value.trim();
  const system = $("chat-system").value.trim();
  const user = { role: "user", content: text };
  // With a session the gateway remembers the conversation: send the new message only.
  const messages = session ? [user] : [...history, user];
  // The system message as it is now leads every request (a session takes it as its own).
  if (system) messages.unshift({ role: "system", content: system });
  const body = {
    model: $("chat-model").value,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: optionalNumber("chat-temperature"),
    max_tokens: optionalNumber("chat-max-tokens"),
  };
  bubble("user", text);
  input.value = "";
  const output = bubble("assistant", "");
  output.parentElement.classList.add("streaming");
  controller = new AbortController();
  $("chat-send").disabled = true;
  $("chat-stop").disabled = false;
  status.textContent = "…";
  let reply = "";
  let reasoning = null;
  try {
    const response = await call("/v1/chat/completions", {
      method: "POST",
      json: body,
      headers: session ? { "X-Session-ID": session } : {},
      signal: controller.signal,
    });
    let finish = null;
    for await (const chunk of events(response)) {
      for (const choice of chunk.choices || []) {
        const thought = choice.delta && (choice.delta.reasoning_content || choice.delta.reasoning);
        if (thought) {
          reasoning = reasoning || reasoningOf(output);
          reasoning.textContent += thought;
        }
        if (choice.delta && choice.delta.content) {
          reply += choice.delta.content;
          output.textContent = reply;
        }
        finish = choice.finish_reason || finish;
      }
      if (chunk.usage) {
        const u = chunk.usage;
        status.textContent = `${u.prompt_tokens} prompt + ${u.completion_tokens} completion tokens` +
          (finish && finish !== "stop" ? ` · finish: ${finish}` : "");
      }
    }
    if (!session) history.push(user, { role: "assistant", content: reply });
  } catch (failure) {
    if (failure.name === "AbortError") {
      status.textContent = "stopped";
      output.parentElement.classList.add("stopped");
      if (!session && reply) history.push(user, { role: "assistant", content: reply });
    } else {
      status.textContent = "";
      showError(error, failure);
      if (!reply) output.parentElement.remove();
    }
  } finally {
    output.parentElement.classList.remove("streaming");
    controller = null;
    $("chat-send").disabled = false;
    $("chat-stop").disabled = true;
  }
}

export function setupChat() {
  $("chat-form").addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  $("chat-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  $("chat-stop").addEventListener("click", () => controller && controller.abort());
  $("chat-clear").addEventListener("click", () => {
    if (controller) controller.abort();
    history = [];
    $("chat-output").replaceChildren();
    $("chat-status").textContent = "";
    clearError($("chat-error"));
  });
}
