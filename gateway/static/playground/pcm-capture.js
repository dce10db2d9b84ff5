// AudioWorklet: the microphone's samples, resampled to 24 kHz 16-bit mono (the Realtime
// API's pcm16), posted to the page about every 40 ms.

class PcmCapture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.target = options.processorOptions.rate;
    this.step = sampleRate / this.target; // input samples per output sample
    this.position = 0; // where the next output sample lies, in input samples
    this.last = 0; // the previous block's last input sample
    this.size = Math.round(this.target * 0.04);
    this.out = new Int16Array(this.size);
    this.filled = 0;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    // Linear interpolation between neighbouring samples; speech needs no better here.
    while (this.position < channel.length) {
      const at = Math.floor(this.position);
      const fraction = this.position - at;
      const before = at === 0 ? this.last : channel[at - 1];
      const sample = before + (channel[at] - before) * fraction;
      this.out[this.filled++] = Math.max(-1, Math.min(1, sample)) * 0x7fff;
      if (this.filled === this.size) {
        this.port.postMessage(this.out.buffer, [this.out.buffer]);
        this.out = new Int16Array(this.size); // the posted one now belongs to the page
        this.filled = 0;
      }
      this.position += this.step;
    }
    this.position -= channel.length;
    this.last = channel[channel.length - 1];
    return true;
  }
}

registerProcessor("pcm-capture", PcmCapture);
