# The Triton image of compose/ with the model repository inside, for Kubernetes (where no
# host directory is mounted). From the repository's root:
#   docker build -f compose/triton.Dockerfile -t triton-gateway/triton:24.10 compose
#   docker build -f k8s/triton-models.Dockerfile -t triton-gateway/triton-models:24.10 .
ARG TRITON_IMAGE=triton-gateway/triton:24.10
FROM ${TRITON_IMAGE}
COPY triton_repo /models
