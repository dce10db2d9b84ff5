// Voice tab: a Realtime API conversation over /v1/realtime. The page asks for a client secret
// (POST /v1/realtime/client_secrets, with the key, as a server of yours would) and opens the
// WebSocket with that secret in the browser's subprotocol form (a browser WebSocket cannot
// send headers): the key itself never goes into the handshake. The microphone streams as
// pcm16 at 24 kHz; the gateway's server VAD ends each turn; answers play as they arrive.

import { callJson } from "./api.js";
import { $, clearError, fromBase64, message, showError, toBase64 } from "./ui.js";

const RATE = 24000;

let session = null;

function log(role, text) {
  return message($("voice-log"), role, text, "li");
}

function status(text) {
  $("voice-status").textContent = text;
}

/** Plays pcm16 chunks back to back; `stop()` silences what is queued (barge-in). */
class Player {
  constructor(context) {
    this.context = context;
    this.next = 0;
    this.sources = new Set();
  }

  /** Queues the chunk; returns its length in seconds. */
  play(bytes) {
    const samples = new Int16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >> 1);
    if (!samples.length) return 0;
    const buffer = this.context.createBuffer(1, samples.length, RATE);
    const channel = buffer.getChannelData(0);
    for (let i = 0; i < samples.length; i++) channel[i] = samples[i] / 0x8000;
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    this.next = Math.max(this.next, this.context.currentTime + 0.05);
    source.start(this.next);
    this.next += buffer.duration;
    this.sources.add(source);
    source.addEventListener("ended", () => this.sources.delete(source));
    return buffer.duration;
  }

  stop() {
    for (const source of this.sources) source.stop();
    this.sources.clear();
    this.next = 0;
  }
}

class Session {
  constructor(model) {
    this.model = model;
    this.reply = null; // the log entry of the answer being spoken
    this.spoken = 0; // seconds of its audio received
    this.closed = false;
  }

  async start() {
    // The microphone first: without it there is nothing to talk with.
    this.stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
    });
    this.context = new AudioContext();
    await this.context.audioWorklet.addModule("/playground/assets/pcm-capture.js");
    this.player = new Player(this.context);
    // One session's secret, good for a minute: the model rides in it, not in the URL.
    const secret = await callJson("/v1/realtime/client_secrets", {
      method: "POST",
      json: { expires_after: { anchor: "created_at", seconds: 60 }, session: { type: "realtime", model: this.model } },
    });
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const url = `${scheme}//${location.host}/v1/realtime`;
    this.socket = new WebSocket(url, ["realtime", `openai-insecure-api-key.${secret.value}`]);
    this.socket.addEventListener("message", (message) => this.onEvent(JSON.parse(message.data)));
    this.socket.addEventListener("close", (event) => this.onClose(event));
    await new Promise((resolve, reject) => {
      this.socket.addEventListener("open", resolve, { once: true });
      this.socket.addEventListener("error", () => reject(new Error(
        "The gateway refused the Realtime connection: check the key, its limits and the model.")), { once: true });
    });
    const microphone = this.context.createMediaStreamSource(this.stream);
    // Its output is silence; connected so that the graph pulls it in every browser.
    this.capture = new AudioWorkletNode(this.context, "pcm-capture", { processorOptions: { rate: RATE } });
    this.capture.connect(this.context.destination);
    this.capture.port.onmessage = (message) => {
      if (this.socket.readyState !== WebSocket.OPEN) return;
      const audio = toBase64(new Uint8Array(message.data));
      this.socket.send(JSON.stringify({ type: "input_audio_buffer.append", audio }));
    };
    microphone.connect(this.capture);
  }

  onEvent(event) {
    switch (event.type) {
      case "session.created":
        status("listening: speak, then pause");
        break;
      case "input_audio_buffer.speech_started":
        this.player.stop(); // the user talks over the answer: stop playing it
        status("hearing you…");
        break;
      case "input_audio_buffer.speech_stopped":
        status("thinking…");
        break;
      case "conversation.item.input_audio_transcription.completed":
        log("user", event.transcript.trim());
        break;
      case "response.output_audio_transcript.delta":
      case "response.output_text.delta":
        this.answer().textContent += event.delta;
        break;
      case "response.output_audio.delta": {
        status("answering…");
        this.spoken += this.player.play(fromBase64(event.delta));
        const entry = this.answer().parentElement;
        entry.dataset.audioSeconds = this.spoken.toFixed(2);
        entry.querySelector(".who").textContent = `assistant · ${this.spoken.toFixed(1)} s of audio`;
        break;
      }
      case "response.done": {
        const done = event.response;
        if (this.reply) {
          const entry = this.reply.parentElement;
          entry.dataset.status = done.status;
          entry.classList.toggle("stopped", done.status !== "completed");
        }
        this.reply = null;
        this.spoken = 0;
        status("listening: speak, then pause");
        break;
      }
      case "error":
        showError($("voice-error"), event.error.message);
        break;
      default:
        break;
    }
  }

  /** The log entry's text of the answer being given, made on its first piece. */
  answer() {
    if (!this.reply) this.reply = log("assistant", "");
    return this.reply;
  }

  onClose(event) {
    if (!this.closed && event.code !== 1000) {
      showError($("voice-error"), event.reason || `The connection closed (${event.code}).`);
    }
    this.stop();
  }

  stop() {
    if (this.closed) return;
    this.closed = true;
    if (this.socket && this.socket.readyState <= WebSocket.OPEN) this.socket.close(1000);
    if (this.stream) this.stream.getTracks().forEach((track) => track.stop());
    if (this.context) this.context.close();
    ended();
  }
}

function ended() {
  session = null;
  $("voice-start").disabled = false;
  $("voice-stop").disabled = true;
  status("stopped");
}

async function start() {
  clearError($("voice-error"));
  $("voice-start").disabled = true;
  $("voice-stop").disabled = false;
  status("connecting…");
  session = new Session($("voice-model").value);
  try {
    await session.start();
  } catch (failure) {
    showError($("voice-error"), failure);
    if (session) session.stop();
  }
}

export function setupVoice() {
  $("voice-start").addEventListener("click", start);
  $("voice-stop").addEventListener("click", () => session && session.stop());
}
