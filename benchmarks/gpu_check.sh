#!/usr/bin/env bash
# The one GPU check of the project.  Needs no package registry: it uses the python3 that already has torch
# (and transformers), installs this project from the source tree with
#     python3 -m pip install --no-index --no-deps --no-build-isolation -e .
# (falling back to PYTHONPATH when that install is not possible), and runs the steps below in order of value,
# each under its own timeout, skipping any step whose estimate no longer fits the total budget.
#
#     OUT=/some/folder bash benchmarks/gpu_check.sh [--budget-s 420] [--only NAME[,NAME...]]
#                                                   [--step-timeout-s S] [--list]
#
# --list prints the plan: every step's estimate (computed from its parameters), timeout, the running sum
# against the budget, and the exact commands.  A budget that fits no step is refused (exit 2).
# Environment: OUT (result folder, default ./gpu_check_out), PYTHON (interpreter, default: the first of
# python3, python with torch), GPU_CHECK_BUDGET_S (total budget in s, default 420 = 7 minutes).
# Results, refreshed in $OUT as soon as each step ends (a killed run keeps what finished), at most 8 files:
# summary.txt (one line per step: rc, seconds, estimate, or why skipped), env.txt, all.tar.gz (every step's
# log and result files), the logs of the first 4 steps run, and all.tar.gz.part only while it is rewritten.
# Exit 0 when every step that ran exited 0, 1 when one failed or timed out, 2 for bad arguments.
# Without a CUDA device (or without torch) it says so, writes summary.txt and exits 0.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SELF="$ROOT/benchmarks/gpu_check.sh"
cd "$ROOT" || exit 2

# ------------------------------------------------------------------------------------------- parameters
# What the steps run; the estimates below are computed from the same numbers.
SMALL=data/models/Qwen3-0.6B/config.json
LARGE=data/models/Qwen3-32B/config.json
W_SMALL_GB=2                    # bf16 weights, rounded up: 1.19 GB / 65.5 GB (Qwen3Shape.weight_bytes)
W_LARGE_GB=66
CTX=512                         # KV positions per request in every profile
GPU_TEST_FILES="$(grep -l '^@pytest\.mark\.gpu' tests/test_*.py 2> /dev/null | tr '\n' ' ')"
N_GPU_TESTS="$(cat $GPU_TEST_FILES /dev/null | grep -c '^@pytest\.mark\.gpu')"   # test functions (not parameters)
CORUN_BS="1 2 4 8 16"           # co-running: the timed model's batch sizes
CORUN_OTHER_BS="1 4 16"         # ... the other model's batch (probe: all; tr-profile --corun: the middle one)
CORUN_WARMUP=2 CORUN_STEPS=6 CORUN_REPEATS=3
RT_N=1,2,4,8,16                 # runtime: predicted vs measured B*(N)
RT_WINDOW_S=3 RT_WARMUP_S=1 RT_REPEATS=1 RT_PROFILE_STEPS=12 RT_SIM_STEPS=150000 RT_T_BUCKETS=6
P32_BS="1 2 4 8 16" P32_VARIANTS="decode:serving extend4:serving" P32_WARMUP=3 P32_STEPS=20
P06_BS="1 2 4 8 16" P06_VARIANTS="decode:serving" P06_WARMUP=3 P06_STEPS=30
ATT_BS="1 4 16" ATT_REPEATS=50
OVH_BS="1 8 32" OVH_STEPS=50 OVH_REPEATS=7

# ------------------------------------------------------------------------------------------- cost model
# Milliseconds on one H200.  Step times come from the H200 profiles (../shared/data/h200-profiles: 0.6B graph
# decode 4.6-7.3 ms, 32B 26-48 ms, extend4 28-54 ms, the co-running probe x2.8-3.6); start-up, build and
# capture costs are assumptions, rounded up: summary.txt prints each step's seconds beside its estimate, so
# the first real run calibrates them.
C_START=10000                   # a python process importing torch, CUDA context
C_HF_IMPORT=3000                # + transformers
C_SETUP=20000                   # env probe + editable install, before the first step
C_HF_MS_PER_GB=250              # transformers from_config on the GPU (init, dtype), per GB of weights
C_EXEC_MS_PER_GB=50             # the runtime's random_weights (normal_ on the GPU), per GB
C_STEP_LARGE=50 C_STEP_SMALL=8  # one graph step at b <= 16
C_EAGER_LARGE=100 C_EAGER_SMALL=25   # one eager forward (graph-capture warm-ups: 3 per captured graph)
C_CORUN_X=4 C_CORUN_LARGE_PCT=120    # small step beside the large: x4; large beside the small: +20%
C_SIZE=1000                     # profiler: fixed cost per (variant, batch size): caches, capture, rewind check
C_TEST=8000                     # one gpu-marked test (tiny models, graph captures)
C_SIM=50                        # one simulator call of RT_SIM_STEPS steps (10-16 ms on the 2-core dev box)
C_TINY_STEP=5                   # one step of the small-llama config (timing-overhead step), eager
C_TAIL=5000                     # writing results, exit

words() { echo $#; }
secs() { echo $(( ($1 + 999) / 1000 )); }          # ms -> whole seconds, rounded up

est_gpu_tests() { secs $(( C_START + C_HF_IMPORT + N_GPU_TESTS * C_TEST + C_TAIL )); }
est_corun() {
    local nb no per
    nb=$(words $CORUN_BS); no=$(words $CORUN_OTHER_BS)
    if [ "${CORUN_MODE:-probe}" = tr-profile ]; then  # two tr-profile calls (each model timed once), two loads each
        per=$(( C_START + C_HF_IMPORT + (W_SMALL_GB + W_LARGE_GB) * C_HF_MS_PER_GB ))
        secs $(( 2 * per + nb * (2 * C_SIZE + (CORUN_WARMUP + CORUN_STEPS + 1) * (C_STEP_SMALL * C_CORUN_X
                 + C_STEP_LARGE * C_CORUN_LARGE_PCT / 100)) + 2 * C_TAIL ))
    else                                                # one process: both models, each timed alone and beside
        per=$(( CORUN_REPEATS * (CORUN_WARMUP + CORUN_STEPS) * nb ))
        secs $(( C_START + (W_SMALL_GB + W_LARGE_GB) * C_EXEC_MS_PER_GB
                 + (nb + no) * 3 * (C_EAGER_SMALL + C_EAGER_LARGE)
                 + per * (C_STEP_SMALL + no * C_STEP_SMALL * C_CORUN_X)
                 + per * (C_STEP_LARGE + no * C_STEP_LARGE * C_CORUN_LARGE_PCT / 100) + C_TAIL ))
    fi
}
rt_fixed_ms() {  # the runtime check: build (graphs for b = 1..max N), profile, calibration, at the max N
    local maxN=0 n next=0 steps=$(( 2 + RT_PROFILE_STEPS ))
    for n in ${RT_N//,/ }; do [ "$n" -gt "$maxN" ] && maxN=$n; done
    for n in 1 2 4 8 16; do [ "$n" -le "$maxN" ] && next=$(( next + 1 )); done
    echo $(( C_START + (W_SMALL_GB + W_LARGE_GB) * C_EXEC_MS_PER_GB
             + maxN * RT_T_BUCKETS * 3 * (C_EAGER_SMALL + C_EAGER_LARGE)
             + (maxN + next) * steps * (C_STEP_SMALL + C_STEP_LARGE)
             + next * steps * (C_STEP_SMALL * C_CORUN_X + C_STEP_LARGE * C_CORUN_LARGE_PCT / 100)
             + (RT_WINDOW_S + RT_WARMUP_S) * 500 + 1000 + C_TAIL ))
}
rt_n_ms() {  # ... one N: 2N - 1 candidate B (B0 <= 2) simulated twice; at most 5 measured (eager, B*s, neighbours)
    local c=$(( 2 * $1 - 1 )) m
    m=$c; [ $m -gt 5 ] && m=5
    echo $(( 2 * c * C_SIM + m * RT_REPEATS * ((RT_WINDOW_S + RT_WARMUP_S) * 1150 + 1000) ))
}
est_runtime_vs_model() {
    local ms n; ms=$(rt_fixed_ms)
    for n in ${RT_N//,/ }; do ms=$(( ms + $(rt_n_ms "$n") )); done
    secs $ms
}
# elastic: it runs when this much is left (everything but the measurements at N > 4); its own --budget-s
# stops the measurements 20 s before its timeout, which is at most the time left
min_est_runtime_vs_model() {
    local ms n; ms=$(rt_fixed_ms)
    for n in ${RT_N//,/ }; do [ "$n" -le 4 ] && ms=$(( ms + $(rt_n_ms "$n") )); done
    secs $ms
}
est_profile() {  # GB of weights, step ms, number of variants, number of batch sizes, warm-up, steps
    secs $(( C_START + C_HF_IMPORT + $1 * C_HF_MS_PER_GB + $3 * $4 * (C_SIZE + ($5 + $6 + 1) * $2) + C_TAIL ))
}
est_profiles_qwen3_32b() {
    est_profile $W_LARGE_GB $C_STEP_LARGE $(words $P32_VARIANTS) $(words $P32_BS) $P32_WARMUP $P32_STEPS
}
est_profiles_qwen3_0p6b() {
    est_profile $W_SMALL_GB $C_STEP_SMALL $(words $P06_VARIANTS) $(words $P06_BS) $P06_WARMUP $P06_STEPS
}
est_roofline() { secs $(( 3000 + C_TAIL )); }     # reads the JSON profiles; no torch
est_attention_32b_transformers() { est_profile $W_LARGE_GB $C_STEP_LARGE 1 $(words $P32_BS) $P32_WARMUP $P32_STEPS; }
est_attention_layer() { secs $(( C_START + $(words $ATT_BS) * 2 * 2 * ATT_REPEATS * 2 + C_TAIL )); }
est_timing_overhead() {
    secs $(( C_START + C_HF_IMPORT + 2 * $(words $OVH_BS) * (OVH_REPEATS * 3 * OVH_STEPS + 10) * C_TINY_STEP + C_TAIL ))
}

# ------------------------------------------------------------------------------------------------ steps
# Order: the gpu tests first (if graph replay != eager, no figure after it means anything), then the short
# fixed-size measurements the model needs (co-running slowdown, solo profiles of both configs, their
# roofline), then the runtime's predicted vs measured B*(N): the longest step and the one that can trade
# measurements for time, so it takes whatever the budget has left (elastic) and cannot starve the others.
# Then extras, which a 7-minute budget skips (run them later with --only).
# A step is a function step_NAME run as its own process (`bash gpu_check.sh --run-step NAME`, so no command
# is ever split or re-parsed) with $PY (the interpreter with torch), $STEP_DIR (its result folder) and
# $STEP_LIMIT_S (its timeout) set; its stdout+stderr is its log.  Every command goes through `x`, which
# --list prints instead of running.
STEPS=(gpu_tests corun profiles_qwen3_32b profiles_qwen3_0p6b roofline runtime_vs_model
       attention_32b_transformers attention_layer timing_overhead)
declare -A WHAT=(
    [gpu_tests]="the gpu-marked tests: CUDA-graph replay == eager (runtime and profiler), event timing"
    [corun]="each model's decode step alone and while the other decodes (co-running slowdown by b)"
    [runtime_vs_model]="the runtime on both models: profile, predicted vs measured B*(N), N = $RT_N"
    [profiles_qwen3_32b]="tr-profile latency, Qwen3-32B config, graph, serving attention: decode, extend4"
    [profiles_qwen3_0p6b]="tr-profile latency, Qwen3-0.6B config, graph, serving attention: decode"
    [roofline]="tr-profile roofline over the profiles: measured / memory-bandwidth floor"
    [attention_32b_transformers]="Qwen3-32B decode with transformers' own attention (vs serving)"
    [attention_layer]="one attention layer, masked vs serving"
    [timing_overhead]="cost of per-step CUDA-event timing"
)

x() {
    if [ "${GPU_CHECK_DRY:-0}" = 1 ]; then printf '    %s\n' "$*"; else "$@"; fi
}

step_gpu_tests() {
    local rc=0
    # shellcheck disable=SC2086
    x "$PY" -m pytest -q -m gpu -rA -p no:cacheprovider --junitxml="$STEP_DIR/junit.xml" $GPU_TEST_FILES || rc=$?
    # on a CUDA machine a skipped gpu test is a failure of the check (it would say nothing about the GPU)
    if [ "${GPU_CHECK_DRY:-0}" != 1 ] && [ -f "$STEP_DIR/junit.xml" ] && grep -q '<skipped' "$STEP_DIR/junit.xml"; then
        echo "error: $(grep -o '<skipped' "$STEP_DIR/junit.xml" | wc -l) gpu test(s) skipped on a CUDA machine (see above)" >&2
        [ $rc -eq 0 ] && rc=5
    fi
    return $rc
}

step_corun() {
    if [ "${CORUN_MODE:-probe}" = tr-profile ]; then
        # ---- HOOK: `tr-profile latency --corun OTHER_CONFIG` is listed by `tr-profile latency --help`:
        # each model's co-running curve by the profiler itself (its batch-size flag when it has one)
        local extra=() others=($CORUN_OTHER_BS) mid rc=0
        mid=${others[$(( (${#others[@]} - 1) / 2 ))]}
        [ -n "${CORUN_BATCH_FLAG:-}" ] && extra=("$CORUN_BATCH_FLAG" "$mid")
        # shellcheck disable=SC2086
        x "$PY" -m profiler.cli latency --config "$SMALL" --corun "$LARGE" ${extra[@]+"${extra[@]}"} --cuda-graph \
            --context "$CTX" --batch-sizes $CORUN_BS --warmup-steps "$CORUN_WARMUP" --steps "$CORUN_STEPS" \
            --out "$STEP_DIR/Qwen3-0.6B_corun.json" || rc=$?
        # shellcheck disable=SC2086
        x "$PY" -m profiler.cli latency --config "$LARGE" --corun "$SMALL" ${extra[@]+"${extra[@]}"} --cuda-graph \
            --context "$CTX" --batch-sizes $CORUN_BS --warmup-steps "$CORUN_WARMUP" --steps "$CORUN_STEPS" \
            --out "$STEP_DIR/Qwen3-32B_corun.json" || rc=$?
        return $rc
    fi
    # the runtime executor's probe (tr_model.serving.runtime.torch_executor.profile_step_latency with other=)
    # shellcheck disable=SC2086
    x "$PY" benchmarks/gpu_corun_probe.py --small-config "$SMALL" --large-config "$LARGE" \
        --batch-sizes $CORUN_BS --other-batch-sizes $CORUN_OTHER_BS --context "$CTX" \
        --warmup-steps "$CORUN_WARMUP" --steps "$CORUN_STEPS" --repeats "$CORUN_REPEATS" --out-dir "$STEP_DIR"
}

step_runtime_vs_model() {
    # its own --budget-s stops the measurements 20 s before this step's timeout (partial results are written)
    local b=$(( ${STEP_LIMIT_S:-600} - 20 ))
    [ $b -lt 30 ] && b=30
    x "$PY" benchmarks/gpu_runtime_check.py --N "$RT_N" --window-s "$RT_WINDOW_S" --warmup-s "$RT_WARMUP_S" \
        --repeats "$RT_REPEATS" --profile-steps "$RT_PROFILE_STEPS" --sim-steps "$RT_SIM_STEPS" --budget-s "$b" \
        --out "$STEP_DIR"
}

step_profiles_qwen3_32b() {
    # shellcheck disable=SC2086
    x "$PY" benchmarks/profiler_gpu_profiles.py --config "$LARGE" --context "$CTX" --batch-sizes $P32_BS \
        --variants $P32_VARIANTS --warmup-steps "$P32_WARMUP" --steps "$P32_STEPS" --out-dir "$STEP_DIR"
}

step_profiles_qwen3_0p6b() {
    # shellcheck disable=SC2086
    x "$PY" benchmarks/profiler_gpu_profiles.py --config "$SMALL" --context "$CTX" --batch-sizes $P06_BS \
        --variants $P06_VARIANTS --warmup-steps "$P06_WARMUP" --steps "$P06_STEPS" --out-dir "$STEP_DIR"
}

step_roofline() {
    local files=() f
    if [ "${GPU_CHECK_DRY:-0}" = 1 ]; then
        files=("$WORK/profiles_qwen3_32b/*.json" "$WORK/profiles_qwen3_0p6b/*.json")
    else
        for f in "$WORK"/profiles_qwen3_32b/*.json "$WORK"/profiles_qwen3_0p6b/*.json; do
            [ -f "$f" ] && files+=("$f")
        done
        if [ ${#files[@]} -eq 0 ]; then
            echo "error: no profiles from the steps profiles_qwen3_32b / profiles_qwen3_0p6b (skipped or failed)" >&2
            return 3
        fi
    fi
    x "$PY" -m profiler.cli roofline "${files[@]}" --format table
    x "$PY" -m profiler.cli roofline "${files[@]}" --quiet --out "$STEP_DIR/roofline.json"
}

step_attention_32b_transformers() {
    # shellcheck disable=SC2086
    x "$PY" benchmarks/profiler_gpu_profiles.py --config "$LARGE" --context "$CTX" --batch-sizes $P32_BS \
        --variants decode:transformers --warmup-steps "$P32_WARMUP" --steps "$P32_STEPS" --out-dir "$STEP_DIR"
}

step_attention_layer() {
    # shellcheck disable=SC2086
    x "$PY" benchmarks/profiler_attention_bench.py --batch-sizes $ATT_BS --context "$CTX" --repeats "$ATT_REPEATS"
}

step_timing_overhead() {
    # shellcheck disable=SC2086
    x "$PY" benchmarks/profiler_overhead.py --batch-sizes $OVH_BS --context "$CTX" --steps "$OVH_STEPS" \
        --repeats "$OVH_REPEATS" --out "$STEP_DIR/overhead.json"
}
# ------------------------------------------------------------------------------------------- end of steps

timeout_of() {  # a step's timeout: 1.5 x its estimate + 20 s, at most --step-timeout-s
    local t=$(( $1 * 3 / 2 + 20 ))
    [ -n "$STEP_CAP_S" ] && [ "$t" -gt "$STEP_CAP_S" ] && t=$STEP_CAP_S
    echo "$t"
}

# ------------------------------------------------------------------------------------------- arguments
BUDGET_S="${GPU_CHECK_BUDGET_S:-420}"
ONLY=""
LIST=0
STEP_CAP_S=""
usage_error() { echo "error: $1 (use --budget-s S, --only NAMES, --step-timeout-s S, --list)" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --run-step)  # internal: one step, in its own process (see "steps" above)
            [ $# -ge 2 ] && declare -F "step_${2}" > /dev/null || usage_error "--run-step needs a step name"
            "step_$2"
            exit $? ;;
        --budget-s|--only|--step-timeout-s)
            [ $# -ge 2 ] || usage_error "$1 needs a value"
            case "$1" in --budget-s) BUDGET_S="$2" ;; --only) ONLY="$2" ;; *) STEP_CAP_S="$2" ;; esac
            shift 2 ;;
        --list) LIST=1; shift ;;
        -h|--help) sed -n '2,19p' "$SELF"; exit 0 ;;
        *) usage_error "unknown argument $1" ;;
    esac
done
case "$BUDGET_S" in ''|*[!0-9]*) echo "error: --budget-s must be a whole number of seconds, got $BUDGET_S" >&2; exit 2 ;; esac
case "$STEP_CAP_S" in *[!0-9]*|0) echo "error: --step-timeout-s must be a whole number of seconds >= 1, got $STEP_CAP_S" >&2; exit 2 ;; esac
if [ -n "$ONLY" ]; then
    for n in ${ONLY//,/ }; do
        [[ " ${STEPS[*]} " == *" $n "* ]] || { echo "error: --only: no step named $n (steps: ${STEPS[*]})" >&2; exit 2; }
    done
fi

# ------------------------------------------------------------------------------------------- the plan
# an interpreter that already has torch
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    for cand in python3 python; do
        if command -v "$cand" > /dev/null && "$cand" -c "import torch" > /dev/null 2>&1; then PY="$cand"; break; fi
    done
fi
HAVE_TORCH=0
[ -n "$PY" ] && "$PY" -c "import torch" > /dev/null 2>&1 && HAVE_TORCH=1
# the co-running step: tr-profile latency --corun where it exists, else the runtime executor's probe
CORUN_MODE=probe CORUN_BATCH_FLAG=""
if [ "$HAVE_TORCH" = 1 ]; then
    help="$("$PY" -m profiler.cli latency --help 2> /dev/null)"
    if grep -q -e '--corun\b' <<< "$help"; then
        CORUN_MODE=tr-profile
        CORUN_BATCH_FLAG="$(grep -o -e '--corun-batch[a-z-]*' <<< "$help" | head -n 1)"
    fi
fi
export PY="${PY:-python3}" CORUN_MODE CORUN_BATCH_FLAG

# a step fits when its estimate (an elastic step: its minimum) fits what is left of the budget; an elastic
# step is then charged its estimate or what is left, whichever is less
PLAN=() PLAN_SKIPPED=()
declare -A EST=() NEED=() LIMIT=() CHARGE=()
cum=$(secs $C_SETUP)
for name in "${STEPS[@]}"; do
    if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$name,"* ]]; then continue; fi
    EST[$name]=$("est_$name")
    NEED[$name]=${EST[$name]}
    declare -F "min_est_$name" > /dev/null && NEED[$name]=$("min_est_$name")
    LIMIT[$name]=$(timeout_of "${EST[$name]}")
    if [ $(( cum + NEED[$name] )) -le "$BUDGET_S" ]; then
        c=${EST[$name]}; [ $(( cum + c )) -gt "$BUDGET_S" ] && c=$(( BUDGET_S - cum ))
        CHARGE[$name]=$c; cum=$(( cum + c )); PLAN+=("$name")
    else
        PLAN_SKIPPED+=("$name")
    fi
done

if [ "$LIST" = 1 ]; then
    printf '%-28s %10s %9s %12s  %s\n' step estimate_s timeout_s cumulative_s plan
    printf '%-28s %10s %9s %12s  %s\n' "(setup: env, install)" "$(secs $C_SETUP)" - "$(secs $C_SETUP)" run
    c=$(secs $C_SETUP)
    declare -A RUN_LIMIT=()
    for name in "${STEPS[@]}"; do
        [ -n "${EST[$name]:-}" ] || continue
        note=""; [ "${NEED[$name]}" != "${EST[$name]}" ] && note=" (elastic: needs ${NEED[$name]} s)"
        if [ -n "${CHARGE[$name]:-}" ]; then
            left=$(( BUDGET_S - c )); [ "${LIMIT[$name]}" -lt "$left" ] && left=${LIMIT[$name]}
            RUN_LIMIT[$name]=$left
            c=$(( c + CHARGE[$name] ))
            [ "${CHARGE[$name]}" != "${EST[$name]}" ] && note="$note, trimmed to ${CHARGE[$name]} s"
            printf '%-28s %10s %9s %12s  %s\n' "$name" "${EST[$name]}" "${LIMIT[$name]}" "$c" "run$note"
        else
            printf '%-28s %10s %9s %12s  %s\n' "$name" "${EST[$name]}" "${LIMIT[$name]}" - "skip (over budget)$note"
        fi
    done
    total=$(secs $C_SETUP); for name in "${!EST[@]}"; do total=$(( total + EST[$name] )); done
    echo "planned: ${#PLAN[@]} steps, ${c} s of the ${BUDGET_S} s budget; all listed steps: ${total} s"
    echo "co-running step: $CORUN_MODE"
    echo "(each step's timeout: 1.5 x its estimate + 20 s, at most what is left of the budget when it starts)"
    echo
    WORK='$WORK' STEP_LIMIT_S='$STEP_LIMIT_S'
    export WORK GPU_CHECK_DRY=1
    for name in "${STEPS[@]}"; do
        [ -n "${EST[$name]:-}" ] || continue
        echo "$name: ${WHAT[$name]}"
        STEP_DIR="\$WORK/$name" STEP_LIMIT_S="${RUN_LIMIT[$name]:-${LIMIT[$name]}}" "step_$name"
    done
    exit 0
fi
if [ ${#PLAN[@]} -eq 0 ]; then
    echo "error: the budget of ${BUDGET_S} s fits no step (setup $(secs $C_SETUP) s + ${PLAN_SKIPPED[0]} ${NEED[${PLAN_SKIPPED[0]}]} s; see --list)" >&2
    exit 2
fi

# ------------------------------------------------------------------------------------------- the run
OUT="${OUT:-$ROOT/gpu_check_out}"
mkdir -p "$OUT" || { echo "error: cannot create OUT=$OUT" >&2; exit 2; }
rm -f "$OUT/all.tar.gz.part" "$OUT/summary.txt.part"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
SUMMARY="$WORK/summary.txt"
: > "$SUMMARY"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
export NUMBA_CACHE_DIR="$WORK/numba_cache" WORK ROOT
T0=$SECONDS
MAX_LOGS=4
LOGS_COPIED=0
CURRENT="" STEP_PID=""
FAILED=0

say() { echo "$*" | tee -a "$SUMMARY"; }

publish() {  # summary, env and the tar of everything so far into $OUT, each replaced whole (temp, then rename)
    cp "$SUMMARY" "$OUT/summary.txt.part" && mv -f "$OUT/summary.txt.part" "$OUT/summary.txt"
    [ -f "$WORK/env.txt" ] && [ ! -f "$OUT/env.txt" ] && cp "$WORK/env.txt" "$OUT/env.txt"
    tar -czf "$OUT/all.tar.gz.part" -C "$WORK" --exclude ./numba_cache . 2> /dev/null \
        && mv -f "$OUT/all.tar.gz.part" "$OUT/all.tar.gz"
}

finish() {  # $1: exit code
    publish
    echo "results in $OUT ($(ls "$OUT" | wc -l) files)"
    rm -rf "$WORK"
    exit "$1"
}

on_signal() {  # killed from outside: keep what finished, then what the interrupted step left
    trap - TERM INT HUP
    say "${CURRENT:-gpu_check} interrupted by SIG$1 after $((SECONDS - T0))s; the finished steps are in all.tar.gz"
    publish
    if [ -n "$STEP_PID" ]; then
        kill -TERM "$STEP_PID" 2> /dev/null
        wait "$STEP_PID" 2> /dev/null
    fi
    finish 143
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap 'on_signal HUP' HUP

if [ "$HAVE_TORCH" != 1 ]; then
    say "no python with torch found (set PYTHON=...): nothing to check on a GPU; exit 0"
    finish 0
fi

# CUDA or not
"$PY" - > "$WORK/env.txt" 2>&1 << 'EOF'
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available())
try:
    import transformers
    print("transformers", transformers.__version__)
except Exception as e:
    print("transformers missing:", e)
for mod in ("numpy", "numba", "scipy", "pandas", "pytest", "hypothesis"):
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
    finish 0
fi
say "gpu_check: $(grep '^device 0' "$WORK/env.txt"), budget ${BUDGET_S}s, co-running step: $CORUN_MODE"
say "plan: ${PLAN[*]}${PLAN_SKIPPED[0]:+; over budget by estimate: ${PLAN_SKIPPED[*]}}"

# the project, from this source tree, without a registry
if "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . > "$WORK/install.txt" 2>&1; then
    say "install rc=0 $((SECONDS - T0))s (pip install --no-index --no-deps --no-build-isolation -e .)"
else
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    say "install rc=1 $((SECONDS - T0))s: editable install not possible here; using PYTHONPATH=$ROOT (see install.txt)"
fi
publish

# the steps
for name in "${PLAN[@]}"; do
    est=${EST[$name]}
    used=$((SECONDS - T0))
    if [ $((used + NEED[$name])) -gt "$BUDGET_S" ]; then
        say "$name skipped: ${used}s used + estimate ${NEED[$name]}s > budget ${BUDGET_S}s"
        continue
    fi
    limit=${LIMIT[$name]}
    left=$((BUDGET_S - used))
    [ "$limit" -gt "$left" ] && limit=$left
    export STEP_DIR="$WORK/$name" STEP_LIMIT_S="$limit"
    mkdir -p "$STEP_DIR"
    CURRENT=$name
    t=$SECONDS
    timeout --kill-after=10 "$limit" bash "$SELF" --run-step "$name" > "$WORK/$name.txt" 2>&1 < /dev/null &
    STEP_PID=$!
    wait "$STEP_PID"
    rc=$?
    STEP_PID="" CURRENT=""
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        say "$name rc=$rc $((SECONDS - t))s (estimate ${est}s; timed out after ${limit}s)"
    else
        say "$name rc=$rc $((SECONDS - t))s (estimate ${est}s)"
    fi
    [ $rc -ne 0 ] && FAILED=$((FAILED + 1))
    if [ $LOGS_COPIED -lt $MAX_LOGS ]; then
        cp "$WORK/$name.txt" "$OUT/$name.txt" && LOGS_COPIED=$((LOGS_COPIED + 1))
    fi
    publish
done
for name in ${PLAN_SKIPPED[@]+"${PLAN_SKIPPED[@]}"}; do
    say "$name skipped: estimate ${EST[$name]}s does not fit the budget ${BUDGET_S}s after the steps before it (run it with --only)"
done
say "done in $((SECONDS - T0))s: $FAILED step(s) failed"
[ $FAILED -eq 0 ] && finish 0
finish 1
