// The page: the key, the tabs, and the model pickers every tab shares.

import { ApiError, apiKey, callJson, models, setApiKey } from "./api.js";
import { setupAdmin, showAdmin } from "./admin.js";
import { setupChat } from "./chat.js";
import { setupSpeech, speechModels } from "./speech.js";
import { setupTranscribe } from "./transcribe.js";
import { $, clearError, fill, showError } from "./ui.js";
import { setupVoice } from "./voice.js";

const tabs = [...document.querySelectorAll('[role="tab"]')];

function select(tab, focus = false) {
  for (const other of tabs) {
    const chosen = other === tab;
    other.setAttribute("aria-selected", String(chosen));
    other.tabIndex = chosen ? 0 : -1;
    $(other.getAttribute("aria-controls")).hidden = !chosen;
  }
  if (focus) tab.focus();
  if (tab.id === "tab-admin") showAdmin();
}

function setupTabs() {
  for (const tab of tabs) tab.addEventListener("click", () => select(tab));
  // Arrow keys, Home and End move between tabs (the WAI-ARIA tabs pattern).
  document.querySelector('[role="tablist"]').addEventListener("keydown", (event) => {
    const shown = tabs.filter((tab) => !tab.hidden);
    const at = shown.indexOf(document.activeElement);
    if (at < 0) return;
    const next = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: shown.length - 1 }[event.key];
    if (next === undefined) return;
    event.preventDefault();
    select(shown[(next + shown.length) % shown.length], true);
  });
}

/** Fills every model picker (`data-task`) with the loaded models of its task. */
async function loadModels() {
  const loaded = await models();
  for (const picker of document.querySelectorAll("select[data-task]")) {
    fill(picker, loaded.filter((m) => m.task === picker.dataset.task).map((m) => m.id));
  }
  speechModels(loaded);
}

/** Checks the key (/v1/me), then loads what the tabs need; shows the API's error if not. */
async function useKey() {
  const whoami = $("whoami");
  const error = $("key-error");
  clearError(error);
  whoami.textContent = "";
  $("tab-admin").hidden = true;
  if (!apiKey()) return;
  try {
    const me = await callJson("/v1/me");
    whoami.textContent = `${me.name} (${me.role})`;
    $("tab-admin").hidden = me.role !== "admin";
    await loadModels();
  } catch (failure) {
    showError(error, failure instanceof ApiError ? failure : `Could not use the key: ${failure}`);
  }
  const current = tabs.find((tab) => tab.getAttribute("aria-selected") === "true");
  if (current.hidden) select(tabs[0]);
}

function setupKey() {
  const input = $("api-key");
  input.value = apiKey();
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    setApiKey(input.value.trim());
    useKey();
  });
  $("key-forget").addEventListener("click", () => {
    input.value = "";
    setApiKey("");
    useKey();
  });
}

setupTabs();
setupKey();
setupChat();
setupSpeech();
setupTranscribe();
setupVoice();
setupAdmin(loadModels);
useKey();
