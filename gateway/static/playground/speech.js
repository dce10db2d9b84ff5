// Speech tab: /v1/audio/speech. MP3 and AAC play while they stream in (Media Source
// Extensions); the other formats play once complete (raw pcm wrapped in a WAV header).

import { call } from "./api.js";
import { $, clearError, fill, showError } from "./ui.js";

// OpenAI's voice names: the gateway maps each onto the model's first voice.
const OPENAI_VOICES = ["alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse"];
const STREAMED = { mp3: "audio/mpeg", aac: "audio/aac" };
const PCM_RATE = 24000; // OpenAI's pcm: 24 kHz, 16-bit, mono

let voices = {}; // model -> its own voices
let url = null;

export function speechModels(loaded) {
  voices = Object.fromEntries(loaded.filter((m) => m.task === "speech").map((m) => [m.id, m.voices || []]));
  fillVoices();
}

function fillVoices() {
  const own = voices[$("speech-model").value] || [];
  fill($("speech-voice"), [...own, ...OPENAI_VOICES.map((v) => [v, `${v} (→ ${own[0] || "default"})`])]);
}

function wav(pcm) {
  const header = new DataView(new ArrayBuffer(44));
  const text = (at, s) => [...s].forEach((c, i) => header.setUint8(at + i, c.charCodeAt(0)));
  text(0, "RIFF");
  header.setUint32(4, 36 + pcm.byteLength, true);
  text(8, "WAVEfmt ");
  header.setUint32(16, 16, true);
  header.setUint16(20, 1, true);
  header.setUint16(22, 1, true);
  header.setUint32(24, PCM_RATE, true);
  header.setUint32(28, PCM_RATE * 2, true);
  header.setUint16(32, 2, true);
  header.setUint16(34, 16, true);
  text(36, "data");
  header.setUint32(40, pcm.byteLength, true);
  return new Blob([header, pcm], { type: "audio/wav" });
}

function play(audio, blobOrSource) {
  if (url) URL.revokeObjectURL(url);
  url = URL.createObjectURL(blobOrSource);
  audio.src = url;
  audio.play().catch(() => {}); // autoplay may be refused; the controls are there
}

/** Appends the response's chunks to a Media Source as they arrive; returns all the bytes. */
async function stream(response, audio, mime) {
  const source = new MediaSource();
  const opened = new Promise((resolve) => source.addEventListener("sourceopen", resolve, { once: true }));
  play(audio, source);
  await opened;
  const buffer = source.addSourceBuffer(mime);
  const chunks = [];
  const reader = response.body.getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    chunks.push(value);
    buffer.appendBuffer(value);
    await new Promise((resolve) => buffer.addEventListener("updateend", resolve, { once: true }));
  }
  source.endOfStream();
  return new Blob(chunks, { type: mime });
}

async function speak() {
  const error = $("speech-error");
  const status = $("speech-status");
  const audio = $("speech-audio");
  const link = $("speech-download");
  clearError(error);
  link.hidden = true;
  const format = $("speech-format").value;
  status.textContent = "…";
  $("speech-go").disabled = true;
  try {
    const response = await call("/v1/audio/speech", {
      method: "POST",
      json: {
        model: $("speech-model").value,
        input: $("speech-input").value,
        voice: $("speech-voice").value,
        response_format: format,
        speed: Number($("speech-speed").value || 1),
      },
    });
    let blob;
    if (STREAMED[format] && window.MediaSource && MediaSource.isTypeSupported(STREAMED[format])) {
      blob = await stream(response, audio, STREAMED[format]);
    } else {
      blob = await response.blob();
      if (format === "pcm") blob = wav(await blob.arrayBuffer());
      play(audio, blob);
    }
    link.href = URL.createObjectURL(blob);
    link.download = `speech.${format === "pcm" ? "wav" : format}`;
    link.hidden = false;
    status.textContent = `${Math.round(blob.size / 1024)} KiB of ${format}`;
  } catch (failure) {
    status.textContent = "";
    showError(error, failure);
  } finally {
    $("speech-go").disabled = false;
  }
}

export function setupSpeech() {
  $("speech-model").addEventListener("change", fillVoices);
  $("speech-form").addEventListener("submit", (event) => {
    event.preventDefault();
    speak();
  });
}
