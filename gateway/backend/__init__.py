"""The one interface between the gateway and an inference server.

:class:`Backend` is implemented by :class:`gateway.backend.triton.TritonBackend` (the only
module that imports ``tritonclient``) and by :class:`gateway.backend.fake.FakeBackend` for
unit tests.
"""

from gateway.backend.base import (
    OPTION_PARAMETERS,
    SAMPLING_PARAMETERS,
    AudioChunk,
    Backend,
    Embeddings,
    GenerationChunk,
    ModelInfo,
    RepositoryModel,
    SamplingOptions,
    Segment,
    TokenLogprob,
    TopLogprob,
    TranscriptionOptions,
    Word,
)

__all__ = [
    "OPTION_PARAMETERS",
    "SAMPLING_PARAMETERS",
    "AudioChunk",
    "Backend",
    "Embeddings",
    "GenerationChunk",
    "ModelInfo",
    "RepositoryModel",
    "SamplingOptions",
    "Segment",
    "TokenLogprob",
    "TopLogprob",
    "TranscriptionOptions",
    "Word",
]
