#!/usr/bin/env bash
# GPU check of the profiler (issue 5).  Run from the repository root on a fresh CUDA machine with
# Python 3.11 and pip access to PyPI only:
#
#     OUT=/some/folder bash benchmarks/gpu_profile_check.sh
#
# Creates a venv (.venv-gpu), installs the project with its profile and test extras, then
#   1. runs the gpu-marked profiler tests,
#   2. profiles a small random-weight Llama config (8 layers, hidden 1024, bf16) on CUDA:
#      decode and extend (8 tokens), each with and without --cuda-graph, 6 batch sizes,
#   3. measures the profiling overhead (CUDA events per step vs untimed vs synchronize per step).
# Everything lands under $OUT (default ./gpu_profile_out): env.txt, gpu_tests.txt, latency_*.json/.txt,
# overhead.json/.txt and summary.txt (one line per step with its exit code).
# Expected wall time: ~4-6 min, most of it the pip install of torch (~2.5 GB of wheels); the checks take ~1-2 min.
set -u -o pipefail

OUT="${OUT:-$PWD/gpu_profile_out}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 NUMBA_CACHE_DIR="$OUT/.numba_cache" PIP_DISABLE_PIP_VERSION_CHECK=1

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
    "$PY" -m venv .venv-gpu || { echo "venv rc=1" >> "$SUMMARY"; exit 1; }
fi
# shellcheck disable=SC1091
. .venv-gpu/bin/activate
step pip_install 420 pip install -q -e '.[profile,test]'

step env 60 python -c "
import torch, transformers, numpy, numba
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())
print('device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
print('transformers', transformers.__version__, 'numpy', numpy.__version__, 'numba', numba.__version__)
"

step gpu_tests 240 python -m pytest -q -m gpu -rA tests/test_profiler_latency.py

CFG=benchmarks/profiler_configs/small-llama.json
SIZES=1,2,4,8,16,32
for mode in decode extend; do
    for graph in "" "--cuda-graph"; do
        tag="latency_${mode}_$([ -n "$graph" ] && echo graph || echo eager)"
        step "$tag" 240 tr-profile latency --config "$CFG" --device cuda --dtype bf16 --mode "$mode" \
            --extend-tokens 8 --context 512 --batch-sizes "$SIZES" --warmup 5 --steps 50 --measure-overhead \
            $graph --out "$OUT/$tag.json" --format table
    done
done

step overhead 240 python benchmarks/profiler_overhead.py --config "$CFG" --batch-sizes 1,8,32 --context 512 \
    --steps 50 --repeats 7 --out "$OUT/overhead.json"

echo "done; outputs in $OUT" | tee -a "$SUMMARY"
