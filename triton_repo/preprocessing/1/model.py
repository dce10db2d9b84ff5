"""Stand-in for TensorRT-LLM's ``preprocessing`` model (tensorrtllm_backend r25.05).

Tokenizes as the real one does with a Hugging Face tokenizer, but with the stand-ins' byte
tokenizer (token id = UTF-8 byte, end and pad id 256): the prompt to ``INPUT_ID`` (padded with
the pad id), stop and bad words to the engine's ``[2, L]`` word lists, end and pad ids from the
request or the tokenizer. With a ``multimodal_model_path`` (``preprocessing_vision``) it reads
``IMAGE_URL`` as the real one's ``load_images_from_urls`` does (``../standin_vision.py``) and
sends ``PIXEL_VALUES`` and ``IMAGE_SIZES``; ``IMAGE_BYTES`` and ``VIDEO_BYTES`` are not supported.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        # Shared modules sit at the repository root; no __pycache__ beside the models.
        sys.dont_write_bytecode = True
        sys.path.insert(0, os.path.dirname(args["model_repository"]))
        import standin_engine
        import standin_trtllm
        import standin_vision

        self.engine = standin_engine
        self.trtllm = standin_trtllm
        self.vision = standin_vision
        params = json.loads(args["model_config"]).get("parameters", {})
        self.multimodal = bool(params.get("multimodal_model_path", {}).get("string_value"))

    def _tensor(self, request: Any, name: str) -> np.ndarray | None:
        found = pb_utils.get_input_tensor_by_name(request, name)
        return None if found is None else found.as_numpy()

    def _ids(self, texts: np.ndarray, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
        """``_create_request``: token ids padded to the longest, and each one's length."""
        ids = [self.engine.tokenize(t[0].decode("utf-8")) for t in texts]
        width = max(len(i) for i in ids)
        padded = np.array([i + [pad_id] * (width - len(i)) for i in ids], dtype=np.int32)
        return padded.reshape(len(ids), width), np.array([[len(i)] for i in ids], np.int32)

    def _embedding_bias(
        self, words: np.ndarray | None, weights: np.ndarray | None, batch: int
    ) -> np.ndarray:
        if words is None or weights is None:
            return np.empty([batch, 0], dtype=np.float32)
        out = np.zeros([batch, self.engine.VOCAB_SIZE], dtype=np.float32)
        for i, (item_words, item_weights) in enumerate(zip(words, weights, strict=True)):
            for word, weight in zip(item_words, item_weights, strict=True):
                for token in self.engine.tokenize(word.decode("utf-8")):
                    out[i, token] += weight
        return out

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        eos = self.engine.EOS
        for request in requests:
            query = self._tensor(request, "QUERY")
            batch = query.shape[0]
            end_id = self._tensor(request, "END_ID")
            pad_id = self._tensor(request, "PAD_ID")
            end_id = end_id if end_id is not None else [[eos]] * batch
            pad_id = pad_id if pad_id is not None else [[eos]] * batch
            input_id, input_len = self._ids(query, eos)
            decoder_query = self._tensor(request, "DECODER_QUERY")
            if decoder_query is not None:
                decoder_id, decoder_len = self._ids(decoder_query, eos)
            else:
                decoder_id = np.array(pad_id, dtype=np.int32) * np.ones((batch, 1), np.int32)
                decoder_len = np.ones((batch, 1), np.int32)
            to_words = self.trtllm.to_word_list_format
            bad_words = to_words(self._tensor(request, "BAD_WORDS_DICT"), batch)
            stop_words = to_words(self._tensor(request, "STOP_WORDS_DICT"), batch)
            tensors = [
                pb_utils.Tensor("INPUT_ID", input_id),
                pb_utils.Tensor("DECODER_INPUT_ID", decoder_id.astype(np.int32)),
                pb_utils.Tensor("BAD_WORDS_IDS", bad_words),
                pb_utils.Tensor("STOP_WORDS_IDS", stop_words),
                pb_utils.Tensor("REQUEST_INPUT_LEN", input_len),
                pb_utils.Tensor("REQUEST_DECODER_INPUT_LEN", decoder_len),
                pb_utils.Tensor("REQUEST_OUTPUT_LEN", self._tensor(request, "REQUEST_OUTPUT_LEN")),
                pb_utils.Tensor(
                    "EMBEDDING_BIAS",
                    self._embedding_bias(
                        self._tensor(request, "EMBEDDING_BIAS_WORDS"),
                        self._tensor(request, "EMBEDDING_BIAS_WEIGHTS"),
                        batch,
                    ),
                ),
                pb_utils.Tensor("OUT_END_ID", np.array(end_id, dtype=np.int32)),
                pb_utils.Tensor("OUT_PAD_ID", np.array(pad_id, dtype=np.int32)),
            ]
            if self._tensor(request, "PROMPT_TABLE_EXTRA_ID") is not None:
                # only ids beyond the vocabulary (prompt-table rows) get the extra id: none here
                tensors.append(
                    pb_utils.Tensor(
                        "OUT_PROMPT_TABLE_EXTRA_IDS", np.zeros_like(input_id, dtype=np.uint64)
                    )
                )
            urls = self._tensor(request, "IMAGE_URL") if self.multimodal else None
            if urls is not None:
                try:
                    tensors += self._images(query, urls)
                except Exception as exc:  # the request's own error, as a failed load would be
                    error = pb_utils.TritonError(f"{type(exc).__name__}: {exc}")
                    responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                    continue
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def _images(self, query: np.ndarray, urls: np.ndarray) -> list[Any]:
        """``PIXEL_VALUES`` ``[batch, images, 3, H, W]`` and ``IMAGE_SIZES`` ``[batch, 2]``;
        the prompt must hold one ``<image>`` per image."""
        pixels = []
        for i in range(query.shape[0]):
            item = list(urls[i].reshape(-1))
            prompt = query[i][0].decode("utf-8")
            self.vision.check_placeholders(prompt, self.vision.url_images(item))
            pixels.append(self.vision.url_pixels(item))
        sizes = np.array([p.shape[2:] for p in pixels], dtype=np.int64)
        return [
            pb_utils.Tensor("PIXEL_VALUES", np.stack(pixels)),
            pb_utils.Tensor("IMAGE_SIZES", sizes),
        ]
