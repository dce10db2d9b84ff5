// Small helpers shared by the tabs.

export const $ = (id) => document.getElementById(id);

/** Shows an error (an ApiError's message is the API's own) in a panel's alert line. */
export function showError(element, error) {
  element.textContent = error instanceof Error ? error.message : String(error);
  element.hidden = false;
}

export function clearError(element) {
  element.textContent = "";
  element.hidden = true;
}

/** Replaces a select's options with `values` (value, or [value, label]), keeping the options
 * marked `data-keep` and the current choice when it is still there. */
export function fill(select, values) {
  const previous = select.value;
  for (const option of [...select.options]) if (!option.hasAttribute("data-keep")) option.remove();
  for (const entry of values) {
    const [value, label] = Array.isArray(entry) ? entry : [entry, entry];
    select.add(new Option(label, value));
  }
  if ([...select.options].some((o) => o.value === previous)) select.value = previous;
}

/** An element with text, for building tables and logs. */
export function el(tag, text = "", attributes = {}) {
  const element = document.createElement(tag);
  element.textContent = text;
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, value);
  return element;
}

/** Appends a conversation entry (`role` above its text) to `log`, scrolled into view;
 * returns the element of its text, for a reply that streams in. */
export function message(log, role, text, tag = "div") {
  const entry = el(tag, "", { class: `message ${role}`, "data-role": role });
  entry.append(el("span", role, { class: "who" }), el("span", text, { class: "text" }));
  log.append(entry);
  entry.scrollIntoView({ block: "end" });
  return entry.querySelector(".text");
}

/** An optional number field's value; undefined when empty (JSON.stringify leaves it out). */
export function optionalNumber(id) {
  const value = $(id).value.trim();
  return value === "" ? undefined : Number(value);
}

/** Runs `task` with `button` disabled meanwhile. */
export async function busy(button, task) {
  button.disabled = true;
  try {
    return await task();
  } finally {
    button.disabled = false;
  }
}

/** base64 of bytes (Realtime audio events). */
export function toBase64(bytes) {
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

export function fromBase64(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}
