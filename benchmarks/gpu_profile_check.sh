#!/usr/bin/env bash
# GPU check of the profiler (issue 5).  Run from the repository root on a fresh CUDA machine with
# Python 3.11 and pip access to PyPI only:
#
#     OUT=/some/folder bash benchmarks/gpu_profile_check.sh
#
# Creates a venv (.venv-gpu), installs the project with its profile extra and pytest, then
#   1. runs the gpu-marked profiler tests,
#   2. profiles a small random-weight Llama config (8 layers, hidden 1024, bf16) on CUDA:
#      decode and extend (8 tokens), each with and without --cuda-graph, 6 batch sizes,
#   3. measures the profiling overhead (CUDA events per step vs untimed vs synchronize per step).
# Everything lands under $OUT (default ./gpu_profile_out): env.txt, gpu_tests.txt, latency_*.json/.txt,
# overhead.json/.txt and summary.txt (one line per step with its exit code).
# Expected wall time: ~4-6 min: 2-3 min for the pip install of torch (~2.5 GB of CUDA wheels) and the
# project's dependencies, then ~2-3 min for the checks (each step has its own timeout; worst case ~17 min).
set -u -o pipefail

OUT="${OUT:-$PWD/gpu_profile_out}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 NUMBA_CACHE_DIR="${TMPDIR:-/tmp}/tr_profile_numba_cache" PIP_DISABLE_PIP_VERSION_CHECK=1

step() {  # step NAME TIMEOUT_S CMD...: run, tee the log, record the exit code, never abort the script
    local name="$1" limit="$2"
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > >(tee "$OUT/$name.txt") 2>&1
    local rc=$?
    echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$SUMMARY"
    return 0
}

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if command -v python3.11 > /dev/null; then PY=python3.11; else PY=python3; fi
fi

if [ ! -x .venv-gpu/bin/python ]; then
    # --system-site-packages: a preinstalled CUDA torch satisfies the requirement and is not downloaded again
    "$PY" -m venv --system-site-packages .venv-gpu || { echo "venv rc=1" >> "$SUMMARY"; exit 1; }
fi
# shellcheck disable=SC1091
. .venv-gpu/bin/activate
# the gpu tests need only pytest from the test extra; skipping the notebook/jupyter extras saves install time
step pip_install 360 pip install -q -e '.[profile]' 'pytest>=7'

step env 60 python -c "
import torch, transformers, numpy, numba
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())
print('device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
print('transformers', transformers.__version__, 'numpy', numpy.__version__, 'numba', numba.__version__)
"

step gpu_tests 180 python -m pytest -q -m gpu -rA tests/test_profiler_latency.py

CFG=benchmarks/profiler_configs/small-llama.json
SIZES=1,2,4,8,16,32
profile() {  # profile MODE GRAPH_FLAG
    local tag="latency_${1}_$([ -n "$2" ] && echo graph || echo eager)"
    step "$tag" 120 tr-profile latency --config "$CFG" --device cuda --dtype bf16 --mode "$1" \
        --extend-tokens 8 --context 512 --batch-sizes "$SIZES" --warmup 5 --steps 30 --measure-overhead \
        $2 --out "$OUT/$tag.json" --format table
}
# most important first, in case the machine's time runs out: decode eager/graph, overhead, then extend
profile decode ""
profile decode --cuda-graph
step overhead 120 python benchmarks/profiler_overhead.py --config "$CFG" --batch-sizes 1,8,32 --context 512 \
    --steps 50 --repeats 7 --out "$OUT/overhead.json"
profile extend ""
profile extend --cuda-graph

echo "done; outputs in $OUT" | tee -a "$SUMMARY"
