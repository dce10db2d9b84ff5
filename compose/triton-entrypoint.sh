#!/usr/bin/env bash
# Starts tritonserver in explicit model-control mode with one --load-model per name in
# TRITON_MODELS (comma-separated). Extra arguments are passed on to tritonserver.
#
# Why not --load-model=* : it loads every directory of the repository, and a checkout that
# has run the models locally holds triton_repo/__pycache__/ (the shared modules beside the
# model folders are imported from there); Triton 2.51 then fails to start with "Could not
# determine backend for model '__pycache__'". TRITON_MODELS='*' still asks for exactly that.
set -euo pipefail

repository="${TRITON_MODEL_REPOSITORY:-/models}"
load_args=()
IFS=',' read -ra names <<< "${TRITON_MODELS:-}"
for name in "${names[@]}"; do
    name="${name//[[:space:]]/}"
    if [[ -n "$name" ]]; then
        load_args+=("--load-model=${name}")
    fi
done
if [[ ${#load_args[@]} -eq 0 ]]; then
    echo "triton-entrypoint: TRITON_MODELS is empty; set it to the models to load" >&2
    exit 64
fi

# --strict-readiness=false: the server's readiness (/v2/health/ready, the probes') means it
# serves, not that every model it ever tried is ready: with the default, one model that fails
# to load later (an admin's load of a broken model) would take every Triton pod out of the
# Service. A model of TRITON_MODELS that fails at start still stops the server
# (--exit-on-error, on by default), and the gateways check the models they serve themselves.
exec tritonserver \
    --model-repository="${repository}" \
    --model-control-mode=explicit \
    --strict-readiness=false \
    "${load_args[@]}" \
    "$@"
