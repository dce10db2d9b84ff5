"""Audio encoding and decoding with PyAV (FFmpeg's codecs; no hand-written codecs).

- Speech out (:mod:`._encoding`): :class:`StreamEncoder` encodes synthesized PCM into an
  OpenAI speech ``response_format``, sentence by sentence.
- Files in (:mod:`._decoding`): :func:`decode_to_pcm` decodes an upload, opened as one of
  :data:`UPLOAD_FORMATS` only, into 16 kHz mono float32 samples held once.
- Slots (:mod:`._slots`): :class:`DecodeSlots` runs those decodes in worker threads and
  bounds the jobs whose samples one replica holds (``GATEWAY_MAX_DECODES``).
"""

from gateway.serving.audio._decoding import (
    NOT_AUDIO,
    STT_RATE,
    UPLOAD_FORMATS,
    AudioTooLongError,
    UndecodableAudioError,
    decode_to_pcm,
)
from gateway.serving.audio._encoding import FORMATS, PCM_RATE, AudioFormat, StreamEncoder
from gateway.serving.audio._slots import DecodeSlot, DecodeSlots

__all__ = [
    "FORMATS",
    "NOT_AUDIO",
    "PCM_RATE",
    "STT_RATE",
    "UPLOAD_FORMATS",
    "AudioFormat",
    "AudioTooLongError",
    "DecodeSlot",
    "DecodeSlots",
    "StreamEncoder",
    "UndecodableAudioError",
    "decode_to_pcm",
]
