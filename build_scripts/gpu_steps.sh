#!/usr/bin/env bash
# The GPU run of the gpu-vllm profile as a few whole steps, one per call to a GPU host that takes
# one bundle folder per transfer and keeps files (not foreground processes) between calls.
# docs/deploy_gpu.md, section 7, says what each gpu_offline command does; this only orders them.
#
#   build_scripts/gpu_steps.sh receive N   # take .bundle/parts/pNN; after the first, setup runs in
#                                          # the background (its own session) while the rest arrive
#   build_scripts/gpu_steps.sh serve       # wait for that setup, finish it, start the server, wait ready
#   build_scripts/gpu_steps.sh p1|p2       # the benchmark, results into $OUT/<gpu> (or loadtests/results/<gpu>)
#   build_scripts/gpu_steps.sh frontend    # start the OpenAI frontend, frontend vs gRPC to router_bls (FRONTEND_LEVELS)
#   build_scripts/gpu_steps.sh probe       # a level that stalls: one short round, gauges every 2 s
#   build_scripts/gpu_steps.sh peer        # stop the server, start plain vllm serve, same workload + vllm bench
#
# Environment: PY (default python3, the host's interpreter), JOBS (stub build), P1_LEVELS, P2_QPS (default 80),
# P2_POLICIES (default hybrid,round_robin,vllm_only,trtllm_only: one call per policy fits a short call limit),
# GPU_TAG (the results folder's name; default: the GPU's model from nvidia-smi, e.g. h200).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY="${PY:-python3}"
VPY=.runtime/gpu/venv/bin/python3
# Results go under a folder named for the GPU (h200, h100, ...): figures of two cards never mix.
GPU_TAG="${GPU_TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 \
    | grep -oiE '[A-Z][0-9]{2,3}[A-Z]?' | head -1 | tr 'A-Z' 'a-z')}"
RESULTS="${OUT:-loadtests/results}/${GPU_TAG:-gpu}"
SETUP_PID=.runtime/gpu-setup.pid
SETUP_LOG=.runtime/gpu-setup.log
mkdir -p .runtime "$RESULTS"

wait_setup() {
    # The background setup's PID, not a process-name match (pgrep -f would match this shell).
    if [ -f "$SETUP_PID" ]; then
        while kill -0 "$(cat "$SETUP_PID")" 2>/dev/null; do sleep 2; done
        rm -f "$SETUP_PID"
    fi
    [ -f "$SETUP_LOG" ] && grep -E "gpu-offline|smoke\]|model\]|Error|FAIL" "$SETUP_LOG" | tail -15
}

case "${1:-}" in
    receive)
        n="$(printf '%02d' "${2:?receive N}")"
        "$PY" -m build_scripts.gpu_offline receive ".bundle/parts/p$n" || exit 1
        if [ ! -f "$SETUP_PID" ] && [ ! -f .runtime/gpu/.model.done ]; then
            setsid "$PY" -m build_scripts.gpu_offline setup --jobs "${JOBS:-14}" >"$SETUP_LOG" 2>&1 </dev/null &
            echo $! >"$SETUP_PID"
            echo "[gpu-steps] setup started in the background (pid $(cat "$SETUP_PID"), log $SETUP_LOG)"
        fi
        ;;
    serve)
        wait_setup
        "$PY" -m build_scripts.gpu_offline setup --jobs "${JOBS:-14}" || exit 1
        "$PY" -m build_scripts.gpu_offline serve --detach --set router_policy_override=true --timeout 540
        rc=$?
        grep -E "engine ready|successfully loaded|failed to load|^E[0-9]{4}" build/gpu-vllm/server.log | cut -c1-300
        exit $rc
        ;;
    p1)
        "$VPY" -m loadtests.gpu_bench p1 --levels "${P1_LEVELS:-1,16,64,256}" --repeats 3 --duration 8 \
            --procs 8 --out "$RESULTS"
        curl -s localhost:8002/metrics | grep -E "^(router_|nv_gpu|nv_inference_count|vllm:)" >"$RESULTS/metrics_p1.txt"
        ;;
    p2)
        "$VPY" -m loadtests.gpu_bench p2 --qps "${P2_QPS:-80}" --duration 12 --repeats 3 --out "$RESULTS" \
            --policies "${P2_POLICIES:-hybrid,round_robin,vllm_only,trtllm_only}"
        curl -s localhost:8002/metrics | grep -E "^(router_|nv_gpu)" >"$RESULTS/metrics_p2.txt"
        ;;
    frontend)
        # The OpenAI frontend beside the running server, then the same workload through it and
        # straight over gRPC to router_bls, in one run.
        model=models/random-llama-1b
        "$VPY" -m frontend --model-name random-llama-1b --tokenizer "$model" --port 9000 \
            >build/gpu-vllm/frontend.log 2>&1 </dev/null &
        fpid=$!
        for _ in $(seq 60); do curl -sf localhost:9000/health >/dev/null && break; sleep 1; done
        curl -sf localhost:9000/health >/dev/null || { tail -30 build/gpu-vllm/frontend.log; kill "$fpid"; exit 1; }
        "$VPY" -m loadtests.gpu_bench frontend --openai-url http://127.0.0.1:9000 --model random-llama-1b \
            --levels "${FRONTEND_LEVELS:-1,16,64}" --repeats 3 --duration 8 --procs 8 --tokenizer "$model" \
            --out "$RESULTS"
        kill "$fpid"; wait "$fpid" 2>/dev/null
        tail -5 build/gpu-vllm/frontend.log
        ;;
    probe)
        # For a level that stalls: one round of PROBE_LEVELS (default 256) streams per target with
        # a short request timeout and Triton's and the engines' gauges sampled every 2 s.
        ( for _ in $(seq 90); do echo "# $(date +%T.%N)"
            curl -s localhost:8002/metrics | grep -E "^(vllm:num_requests|vllm:kv_cache_usage|nv_inference_pending|nv_inference_request_success|nv_inference_exec_count|nv_gpu_utilization|router_in_flight|router_requests_total)"
            sleep 2; done ) >"$RESULTS/probe_metrics.txt" 2>&1 &
        mpid=$!
        "$VPY" -m loadtests.gpu_bench p1 --levels "${PROBE_LEVELS:-256}" --repeats 1 --duration 8 --procs 8 \
            --timeout-s "${PROBE_TIMEOUT_S:-45}" --out "$RESULTS/probe"
        kill "$mpid" 2>/dev/null
        ps -eo pid,pcpu,rss,nlwp,args | grep -E "tritonserver|stub|EngineCore|VLLM" | grep -v grep | cut -c1-200
        cp build/gpu-vllm/server.log "$RESULTS/server_probe.log"
        ;;
    peer)
        "$PY" -m build_scripts.gpu_offline stop
        "$PY" -m build_scripts.gpu_offline peer --timeout 400 || { tail -40 build/gpu-vllm/vllm-serve.log; exit 1; }
        "$VPY" -m loadtests.gpu_bench peer --levels "${P1_LEVELS:-1,16,64,256}" --repeats 3 --duration 8 \
            --procs 8 --out "$RESULTS"
        model="$(pwd)/models/random-llama-1b"
        "$VPY" -m vllm.entrypoints.cli.main bench serve --backend openai --base-url http://127.0.0.1:8100 \
            --endpoint /v1/completions --model "$model" --tokenizer "$model" --dataset-name random \
            --random-input-len 256 --random-output-len 128 --num-prompts 1280 --max-concurrency 64 \
            --save-result --result-dir "$RESULTS" --result-filename vllm_bench_serve_c64.json 2>&1 | tail -25
        "$VPY" -m loadtests.gpu_bench report --out "$RESULTS" >/dev/null
        ;;
    *)
        sed -n '2,13p' "$0"
        exit 2
        ;;
esac
