#!/usr/bin/env bash
# The one GPU check of the project.  Needs no package registry: it uses the python3 that already has torch
# (and transformers), installs this project from the source tree with
#     python3 -m pip install --no-index --no-deps --no-build-isolation -e .
# (falling back to PYTHONPATH when that install is not possible), and runs the steps listed below, each
# under its own timeout, skipping any step whose estimate would overrun the total budget.
#
#     OUT=/some/folder bash benchmarks/gpu_check.sh [--budget-s 480] [--only NAME[,NAME...]] [--list]
#
# Environment: OUT (result folder, default ./gpu_check_out), PYTHON (interpreter, default: the first of
# python3, python with torch), GPU_CHECK_BUDGET_S (total budget in s, default 480 = 8 minutes).
# Results: at most 8 files in $OUT: summary.txt (one line per step: rc, seconds, or why skipped), env.txt,
# the logs of up to 5 steps (in step order), and all.tar.gz with every log and result file of every step.
# Without a CUDA device (or without torch) it says so, writes summary.txt and exits 0.
set -u -o pipefail

BUDGET_S="${GPU_CHECK_BUDGET_S:-480}"
ONLY=""
LIST=0
while [ $# -gt 0 ]; do
    case "$1" in
        --budget-s) BUDGET_S="$2"; shift 2 ;;
        --only) ONLY="$2"; shift 2 ;;
        --list) LIST=1; shift ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "error: unknown argument $1 (use --budget-s S, --only NAMES, --list)" >&2; exit 2 ;;
    esac
done
case "$BUDGET_S" in ''|*[!0-9]*) echo "error: --budget-s must be a whole number of seconds, got $BUDGET_S" >&2; exit 2 ;; esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
OUT="${OUT:-$ROOT/gpu_check_out}"
mkdir -p "$OUT" || { echo "error: cannot create OUT=$OUT" >&2; exit 2; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
SUMMARY="$WORK/summary.txt"
: > "$SUMMARY"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
export NUMBA_CACHE_DIR="$WORK/numba_cache" WORK ROOT
T0=$SECONDS

# ------------------------------------------------------------------------------------------------ steps
# STEP LIST (hook point).  One line per step, run in this order:
#     add_step NAME ESTIMATE_S TIMEOUT_S 'shell command'
# ESTIMATE_S decides whether the step still fits the budget; TIMEOUT_S kills it.  A step writes its log
# (stdout+stderr) to $WORK/NAME.txt and may put result files under $WORK/NAME/ (created for it; exported
# as $STEP_DIR).  $PY is the interpreter with torch; the project is importable.  Keep the most important
# steps first: when the budget runs out, the last ones are skipped.
STEPS=()
add_step() { STEPS+=("$1|$2|$3|$4"); }

define_steps() {
    add_step gpu_tests 60 150 \
        '"$PY" -m pytest -q -m gpu -rA -p no:cacheprovider tests/test_profiler_latency.py'
    # the 32B config: serving attention (graph) vs transformers' own attention, and the extend step
    add_step profiles_qwen3_32b 150 240 \
        '"$PY" benchmarks/profiler_gpu_profiles.py --config data/models/Qwen3-32B/config.json --context 512 \
            --batch-sizes 1 2 4 8 16 --variants decode:serving decode:transformers extend4:serving \
            --steps 20 --out-dir "$STEP_DIR"'
    # the GPU serving runtime (both models, CUDA graphs, catch-up) and predicted vs measured B*(N), N = 1..16
    add_step runtime_vs_model 220 280 \
        '"$PY" benchmarks/gpu_runtime_check.py --window-s 3 --warmup-s 1 --repeats 1 --budget-s 230 \
            --out "$STEP_DIR"'
    add_step attention_layer 15 60 \
        '"$PY" benchmarks/profiler_attention_bench.py --batch-sizes 1 4 16 --context 512 --repeats 50'
    add_step profiles_qwen3_0p6b 45 120 \
        '"$PY" benchmarks/profiler_gpu_profiles.py --config data/models/Qwen3-0.6B/config.json --context 512 \
            --batch-sizes 1 2 4 8 16 32 --variants decode:serving decode:transformers --steps 30 \
            --out-dir "$STEP_DIR"'
    add_step timing_overhead 45 120 \
        '"$PY" benchmarks/profiler_overhead.py --batch-sizes 1 8 32 --context 512 --steps 50 --repeats 7 \
            --out "$STEP_DIR/overhead.json"'
}
# ------------------------------------------------------------------------------------------- end of steps

say() { echo "$*" | tee -a "$SUMMARY"; }

finish() {  # copy at most 8 files into $OUT: summary, env, up to 5 step logs, and the tar of everything
    local n=0 f
    cp "$SUMMARY" "$OUT/summary.txt"; n=1
    [ -f "$WORK/env.txt" ] && cp "$WORK/env.txt" "$OUT/env.txt" && n=$((n + 1))
    for f in "${RUN_LOGS[@]:-}"; do
        [ -n "$f" ] && [ -f "$WORK/$f.txt" ] || continue
        [ $n -ge 7 ] && break
        cp "$WORK/$f.txt" "$OUT/$f.txt"; n=$((n + 1))
    done
    tar -czf "$OUT/all.tar.gz" -C "$WORK" --exclude numba_cache . 2> /dev/null
    echo "results in $OUT ($((n + 1)) files)"
    rm -rf "$WORK"
}

# 1. an interpreter that already has torch
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    for cand in python3 python; do
        if command -v "$cand" > /dev/null && "$cand" -c "import torch" > /dev/null 2>&1; then PY="$cand"; break; fi
    done
fi
RUN_LOGS=()
if [ -z "$PY" ] || ! "$PY" -c "import torch" > /dev/null 2>&1; then
    say "no python with torch found (set PYTHON=...): nothing to check on a GPU; exit 0"
    finish
    exit 0
fi
export PY
if [ "$LIST" = 1 ]; then
    define_steps
    for s in "${STEPS[@]}"; do IFS='|' read -r n e t c <<< "$s"; echo "$n (estimate ${e}s, timeout ${t}s)"; done
    rm -rf "$WORK"
    exit 0
fi

# 2. CUDA or not
"$PY" - > "$WORK/env.txt" 2>&1 << 'EOF'
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available())
try:
    import transformers
    print("transformers", transformers.__version__)
except Exception as e:
    print("transformers missing:", e)
for mod in ("numpy", "numba", "scipy"):
    try:
        print(mod, __import__(mod).__version__)
    except Exception as e:
        print(mod, "missing:", e)
if torch.cuda.is_available():
    for k in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(k)
        print(f"device {k}: {p.name}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs")
EOF
command -v nvidia-smi > /dev/null && nvidia-smi >> "$WORK/env.txt" 2>&1
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" > /dev/null 2>&1; then
    say "no CUDA device visible to $PY (torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)): nothing to check on a GPU; exit 0"
    finish
    exit 0
fi
say "gpu_check: $(grep '^device 0' "$WORK/env.txt"), budget ${BUDGET_S}s"

# 3. the project, from this source tree, without a registry
if "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . > "$WORK/install.txt" 2>&1; then
    say "install rc=0 $((SECONDS - T0))s (pip install --no-index --no-deps --no-build-isolation -e .)"
else
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    say "install rc=1 $((SECONDS - T0))s: editable install not possible here; using PYTHONPATH=$ROOT (see install.txt)"
fi

# 4. the steps
define_steps
for s in "${STEPS[@]}"; do
    IFS='|' read -r name est limit cmd <<< "$s"
    if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$name,"* ]]; then continue; fi
    used=$((SECONDS - T0))
    if [ $((used + est)) -gt "$BUDGET_S" ]; then
        say "$name skipped: ${used}s used + estimate ${est}s > budget ${BUDGET_S}s"
        continue
    fi
    left=$((BUDGET_S - used))
    [ "$limit" -gt "$left" ] && limit=$left
    export STEP_DIR="$WORK/$name"
    mkdir -p "$STEP_DIR"
    t=$SECONDS
    timeout --kill-after=10 "$limit" bash -c "$cmd" > "$WORK/$name.txt" 2>&1
    rc=$?
    RUN_LOGS+=("$name")
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        say "$name rc=$rc $((SECONDS - t))s (timed out after ${limit}s)"
    else
        say "$name rc=$rc $((SECONDS - t))s"
    fi
done
say "done in $((SECONDS - T0))s"
finish
exit 0
