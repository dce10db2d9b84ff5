// The gateway's public API, called as an SDK would: the key typed into the page goes in
// `Authorization: Bearer`, errors come back as the API's own message.

const KEY_STORE = "gateway-playground-key";

export function apiKey() {
  return sessionStorage.getItem(KEY_STORE) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_STORE, key);
  else sessionStorage.removeItem(KEY_STORE);
}

/** An error the API answered: its message, and its HTTP status and code when it has them. */
export class ApiError extends Error {
  constructor(message, status = 0, code = null) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** The API's error of a failed response, from its OpenAI error body when it has one. */
async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  let code = null;
  try {
    const body = await response.json();
    if (body && body.error) {
      message = body.error.message || message;
      code = body.error.code || null;
    }
  } catch {
    // Not JSON (a proxy's page): the status line is all there is.
  }
  return new ApiError(message, response.status, code);
}

/** `fetch` against the API with the key; a non-2xx answer throws its ApiError. */
export async function call(path, { method = "GET", json, body, headers = {}, signal } = {}) {
  const init = { method, signal, headers: { Authorization: `Bearer ${apiKey()}`, ...headers } };
  if (json !== undefined) {
    init.body = JSON.stringify(json);
    init.headers["Content-Type"] = "application/json";
  } else if (body !== undefined) {
    init.body = body;
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(`The gateway could not be reached (${error.message}).`);
  }
  if (!response.ok) throw await failure(response);
  return response;
}

export async function callJson(path, options) {
  return (await call(path, options)).json();
}

/**
 * The JSON events of a server-sent event stream, as they arrive. An `error` event (the API's
 * error after the stream began) throws its ApiError; `[DONE]` ends the stream.
 */
export async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block
          .split("\n")
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).replace(/^ /, ""))
          .join("\n");
        if (!data) continue;
        if (data === "[DONE]") return;
        const event = JSON.parse(data);
        if (event.error) throw new ApiError(event.error.message, 0, event.error.code);
        yield event;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

/** The loaded models the key may use, from /v1/models. */
export async function models() {
  return (await callJson("/v1/models")).data;
}
