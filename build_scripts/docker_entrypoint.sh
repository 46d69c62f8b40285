#!/usr/bin/env bash
# Entry point of the gpu image (build_scripts/Dockerfile).
#   no arguments, or tritonserver flags  -> re-render if HYBRID_RENDER_SET is set, start tritonserver
#   a command                            -> run it, e.g. python3 -m build_scripts.build_trtllm_engine ...
# HYBRID_RENDER_SET: space-separated NAME=VALUE overrides of the gpu profile (values without spaces).
set -euo pipefail

if [ "$#" -gt 0 ] && [ "${1#-}" = "$1" ]; then
    exec "$@"
fi

repository="${HYBRID_REPOSITORY:-/opt/hybrid/repository}"
if [ -n "${HYBRID_RENDER_SET:-}" ]; then
    sets=()
    for item in ${HYBRID_RENDER_SET}; do
        sets+=(--set "$item")
    done
    (cd /opt/hybrid && python3 -m build_scripts.render --profile gpu --out "$repository" "${sets[@]}")
fi

# vLLM's virtualenv first on PATH for the server only: the Python backend stubs then use
# its site-packages (vLLM, its torch, transformers, numpy 2), while python3 in other
# processes keeps the container's torch and tensorrt_llm.
export PATH="${VLLM_VENV:-/opt/vllm}/bin:${PATH}"

# Fixed ports inside the container (router_bls reads 127.0.0.1:8000 and :8002); map them
# with docker run -p. Extra arguments go to tritonserver (e.g. --log-verbose=1).
exec tritonserver \
    --model-repository="$repository" \
    --http-port=8000 --grpc-port=8001 --metrics-port=8002 \
    --allow-gpu-metrics=true \
    --grpc-infer-allocation-pool-size="${HYBRID_GRPC_POOL:-256}" \
    --exit-timeout-secs="${HYBRID_EXIT_TIMEOUT_S:-3}" \
    "$@"
