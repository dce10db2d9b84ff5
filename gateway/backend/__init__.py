"""The one interface between the gateway and an inference server.

:class:`Backend` is implemented by :class:`gateway.backend.triton.TritonBackend` and by
:class:`gateway.backend.fake.FakeBackend` for unit tests. Two modules speak gRPC to Triton
and import ``tritonclient``: :mod:`gateway.backend.triton` and
:mod:`gateway.backend.grpc_streams` (the ``ModelStreamInfer`` calls it keeps open, built
on tritonclient's generated stubs).
"""

from gateway.backend.base import (
    OPTION_PARAMETERS,
    SAMPLING_PARAMETERS,
    AudioChunk,
    Backend,
    ChatImage,
    Embeddings,
    GenerationChunk,
    ImageInput,
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
    "ChatImage",
    "Embeddings",
    "GenerationChunk",
    "ImageInput",
    "ModelInfo",
    "RepositoryModel",
    "SamplingOptions",
    "Segment",
    "TokenLogprob",
    "TopLogprob",
    "TranscriptionOptions",
    "Word",
]
