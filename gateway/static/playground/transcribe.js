// Transcribe tab: /v1/audio/transcriptions with a chosen file or a recording from the
// microphone (MediaRecorder's WebM/Opus, which the gateway decodes like any upload).

import { call } from "./api.js";
import { $, clearError, showError } from "./ui.js";

let recorder = null;
let recording = null; // the last recording, a File

async function record() {
  const button = $("transcribe-record");
  const error = $("transcribe-error");
  clearError(error);
  if (recorder) {
    recorder.stop();
    return;
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (failure) {
    showError(error, `The microphone is not available: ${failure.message}`);
    return;
  }
  const chunks = [];
  recorder = new MediaRecorder(stream);
  recorder.addEventListener("dataavailable", (event) => chunks.push(event.data));
  recorder.addEventListener("stop", () => {
    stream.getTracks().forEach((track) => track.stop());
    const type = recorder.mimeType || "audio/webm";
    recording = new File(chunks, `recording.${type.includes("ogg") ? "ogg" : "webm"}`, { type });
    const preview = $("transcribe-recording");
    preview.src = URL.createObjectURL(recording);
    preview.hidden = false;
    $("transcribe-file").value = "";
    recorder = null;
    button.textContent = "Record";
    button.setAttribute("aria-pressed", "false");
    $("transcribe-status").textContent = "recorded; Transcribe sends it";
  });
  recorder.start();
  button.textContent = "Stop recording";
  button.setAttribute("aria-pressed", "true");
  $("transcribe-status").textContent = "recording…";
}

async function transcribe() {
  const error = $("transcribe-error");
  const status = $("transcribe-status");
  const output = $("transcribe-output");
  clearError(error);
  const file = $("transcribe-file").files[0] || recording;
  if (!file) {
    showError(error, "Choose an audio file or record one first.");
    return;
  }
  const format = $("transcribe-format").value;
  const form = new FormData();
  form.append("model", $("transcribe-model").value);
  form.append("file", file, file.name);
  form.append("response_format", format);
  const language = $("transcribe-language").value.trim();
  if (language) form.append("language", language);
  output.textContent = "";
  status.textContent = "…";
  $("transcribe-go").disabled = true;
  try {
    const response = await call("/v1/audio/transcriptions", { method: "POST", body: form });
    if (format === "json") output.textContent = (await response.json()).text;
    else if (format === "verbose_json") output.textContent = JSON.stringify(await response.json(), null, 2);
    else output.textContent = await response.text();
    status.textContent = `${file.name}, ${Math.round(file.size / 1024)} KiB`;
  } catch (failure) {
    status.textContent = "";
    showError(error, failure);
  } finally {
    $("transcribe-go").disabled = false;
  }
}

export function setupTranscribe() {
  $("transcribe-record").addEventListener("click", record);
  $("transcribe-file").addEventListener("change", () => {
    recording = null;
    $("transcribe-recording").hidden = true;
  });
  $("transcribe-form").addEventListener("submit", (event) => {
    event.preventDefault();
    transcribe();
  });
}
