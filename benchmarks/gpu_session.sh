#!/bin/bash
# Everything that runs on a lent H100 for one task, phase by phase, resumable across machines.
#
#   bash benchmarks/gpu_session.sh WORK SECONDS PHASE...
#   bash benchmarks/gpu_session.sh WORK SECONDS issue-38     # the engine-like replay and the step's terms
#   bash benchmarks/gpu_session.sh WORK SECONDS issue-33     # the CUDA-graph session, in order
#
# WORK holds every output (a calibration killed by the deadline resumes from its partial
# files, a validation from its finished cases, when WORK is carried to the next machine);
# SECONDS is the wall-clock budget of the whole call: the last phase gets what is left. Dry-run
# it on a CPU first with DRY_RUN=1 (tiny models, CPU, seconds): every command, every path.
#
# Phases of the CUDA-graph session (issue 33), in its order:
#
#   env       the machine: nvidia-smi, python and package versions
#   tests     the graph path on CUDA: the replay with identical draft and target (every draft
#             accepted only if both KV caches are right after padded, graphed passes), the
#             draft's catch-up, and the model and rejection-sampler tests
#   calibrate llama-3.1-8b / llama-3.2-1b, bf16, decode/draft/verify passes from CUDA graphs,
#             on the GPU validation suite's grid: the profile the validation prices with
#             (shipped as sim/profiles/h100-graphs-llama-3.1-8b-llama-3.2-1b)
#   probe     benchmarks/replay_pass_probe.py: one target pass timed as calibration and as the
#             replay runs it (eager, and from its graph)
#   validate  benchmarks/validation.py --suite gpu on that profile (4 cases x 2 x 150 requests,
#             loads at 80% and 35% of the simulated capacity)
#   measure   part of the composed H100 profile's grid (batch 1..128), graphs, with an EAGLE-3
#             head: more points for the composed-vs-measured comparison
#             (benchmarks/composed_vs_measured.py) and the head's timing
#
# The session of issue 38 (the replay as an engine runs it; the step's terms measured), in its
# order, within 9 minutes of a lent H100/H200 (docs/gpu-profiles.md, docs/validation.md):
#
#   env       as above, and which attention the model picks on this GPU (calibrate.attention)
#   tests     as above (the replay's CUDA-event timing and split attention run in them)
#   calibrate as above, on the GPU it finds (the profile is named after it: h100-/h200-graphs-...)
#   terms     benchmarks/gpu_step_terms.py measure: LM head and sampler, decode attention
#             (grouped-query and multi-head at the same KV bytes), whole decode steps of
#             Llama-3.1-8B and Llama-2-7b from CUDA graphs, those passes taken apart by kernel,
#             a small kernel's floor, passes over rows of different contexts against their mean, and
#             the validation's target pass served for most of a minute against calibration's bursts
#   validate  as above, on the profile just calibrated
#   calibrate-ragged  the same grid with --ragged-contexts (each decode point's rows spread around
#             its context, as served rows are): the profile validation.py --reprice prices the
#             validate phase's replays with, against the uniform one (docs/validation.md)
#   overhead-refit  for a profile calibrated before a change to the replay's own work (carried in
#             WORK): calibration's overhead replays again, as calibration runs them (k = 2 at the
#             batches calibrate.overhead.sweep_batches picks), fitted into a copy that the later
#             phases use (WORK/...-refit)
#   overhead  benchmarks/overhead_by_batch.py: calibration's overhead replay at 1, 2, 4, 8 and 16 rows
#             (k = 3), whether the engine's time outside the passes grows with the batch
#   pack      everything under WORK into OUT (one tarball, plus the small result files apart)
#
# Earlier sessions' phases (issues 15 and 16) stay runnable: eager (the eager profile),
# opt (opt-6.7b / opt-125m), gc-check, smoke, replay-tests.
#
# Each phase runs under its own timeout and failures do not stop the next phase; every
# log is in WORK/logs. The machine has torch, numpy, pandas and scipy; simpy, tomli-w and
# tomlkit travel as wheels in .whl (see docs/gpu-profiles.md). NUMBA_DISABLE_JIT: the
# simulator's rules run interpreted (identical results), so no machine time goes to compiling.
set -u
WORK=$1; BUDGET=$2; shift 2
DEADLINE=$((SECONDS + BUDGET))
mkdir -p "$WORK/logs"
SITE=${SITE:-/tmp/site}  # where the wheels install (a test points it elsewhere)
export PYTHONUNBUFFERED=1 PYTHONPATH="$SITE:$PWD" SPECBATCH_CACHE_DIR=/tmp/specbatch-cache NUMBA_DISABLE_JIT=1
DEVICE=cuda TARGET=llama-3.1-8b DRAFT=llama-3.2-1b DTYPE=bfloat16 SUITE=gpu
if [ "${DRY_RUN:-0}" = 1 ]; then  # the same commands on a CPU with tiny models
  DEVICE=cpu TARGET=llama-160m DRAFT=llama-68m DTYPE=float32 SUITE=gpu-dry
fi
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    >"$WORK/logs/wheels.log" 2>&1 || echo "wheels failed" >&2
fi
left() { echo $((DEADLINE - SECONDS)); }
run() {  # run NAME SECONDS CMD...: one phase under a timeout (SIGINT: the calibration's clean stop)
  local name=$1 limit=$2; shift 2
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  if [ "$limit" -le 5 ]; then echo "[$name] skipped: no time left" | tee -a "$WORK/logs/phases.txt"; return; fi
  local t0=$SECONDS
  timeout -s INT -k 20 "$limit" "$@" >"$WORK/logs/$name.log" 2>&1
  local rc=$?
  echo "[$name] rc=$rc $((SECONDS - t0))s" | tee -a "$WORK/logs/phases.txt"
}
VALID_GRID="--batch-sizes 1,2,4,8,16 --k-max 4 --contexts 64,128,256,512,1024 --prompts 32,64,128,256,512
  --max-prefill-tokens 8192 --warmup 2 --repeats 10 --point-budget 0.3"
MEASURE_GRID="--batch-sizes 1,8,32,128 --k-max 4 --contexts 512,2048 --prompts 512 --max-prefill-tokens 32768
  --warmup 1 --repeats 5 --point-budget 0.2"
if [ "${DRY_RUN:-0}" = 1 ]; then
  VALID_GRID="--batch-sizes 1,2,4 --k-max 4 --contexts 16,64 --prompts 8,32 --max-prefill-tokens 128 --warmup 1 --repeats 2"
  MEASURE_GRID="$VALID_GRID"
fi
GPU_TAG=cpu
if [ "$DEVICE" = cuda ]; then
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H200*) GPU_TAG=h200 ;; *H100*) GPU_TAG=h100 ;; *) GPU_TAG=cuda ;;
  esac
fi
PROFILE="$WORK/$GPU_TAG-graphs-$TARGET-$DRAFT"
RAGGED_PROFILE="$WORK/$GPU_TAG-graphs-ragged-$TARGET-$DRAFT"
TERMS_SECTIONS=${TERMS_SECTIONS:-}  # e.g. "ragged": only the sections a session still needs (default: all)
[ "${1:-}" = issue-33 ] && set -- env tests calibrate probe validate measure
[ "${1:-}" = issue-38 ] && set -- env tests calibrate terms validate calibrate-ragged pack
for phase in "$@"; do
  case $phase in
    env)
      run env 60 bash -c 'nvidia-smi; python3 -c "import sys, torch, numpy, pandas, scipy; print(sys.version);
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), torch.cuda.mem_get_info());
print(numpy.__version__, pandas.__version__, scipy.__version__)"; python3 -m pip list 2>/dev/null |
grep -iE "^(numba|pyarrow|tqdm|simpy|tomli|tomlkit|hypothesis|pytest) "' ;
      run attention 60 python3 -c "import torch; from calibrate.attention import split_attention as s, split_attention_notes as n
d = torch.device('$DEVICE'); t = getattr(torch, '$DTYPE')
[s(d, t, h, kv, hd) for h, kv, hd in ((32, 8, 128), (32, 32, 128), (32, 8, 64))]; print(n())" ;;
    tests)
      run tests 120 env SPECBATCH_TEST_DEVICE=$DEVICE python3 -m pytest -q -p no:cacheprovider -x \
        tests/test_replay.py tests/test_calibrate_attention.py -k "identical or catch_up or graph_keys or attention" ;
      run model-tests 45 env SPECBATCH_TEST_DEVICE=$DEVICE python3 -m pytest -q -p no:cacheprovider \
        tests/test_calibrate_model.py tests/test_calibrate_verify.py ;;
    calibrate)
      # shellcheck disable=SC2086
      run calibrate 200 python3 -m calibrate --device $DEVICE --target $TARGET --draft $DRAFT --dtype $DTYPE \
        $VALID_GRID --quiet --out "$PROFILE" ;;
    calibrate-ragged)
      # shellcheck disable=SC2086
      run calibrate-ragged 200 python3 -m calibrate --device $DEVICE --target $TARGET --draft $DRAFT --dtype $DTYPE \
        $VALID_GRID --ragged-contexts --quiet --out "$RAGGED_PROFILE" ;;
    probe)
      if [ "$DEVICE" = cuda ]; then run probe 60 python3 benchmarks/replay_pass_probe.py;
      else run probe 60 python3 benchmarks/replay_pass_probe.py --target $TARGET --repeats 3; fi ;;
    validate)
      run validate 300 python3 benchmarks/validation.py --suite $SUITE --profile "$PROFILE" \
        --out "$WORK/validation-gpu" ;;
    terms)
      sections=(); [ -n "$TERMS_SECTIONS" ] && read -r -a sections <<<"--sections $TERMS_SECTIONS"
      if [ "$DEVICE" = cuda ]; then run terms 130 python3 benchmarks/gpu_step_terms.py measure --out "$WORK/terms" --budget 110 "${sections[@]}";
      else run terms 60 python3 benchmarks/gpu_step_terms.py measure --out "$WORK/terms" --dry-run "${sections[@]}"; fi ;;
    overhead-refit)
      sweep=$(python3 -c "import json, sys; from calibrate.overhead import sweep_batches
print(','.join(map(str, sweep_batches(json.load(open(sys.argv[1]))['grid']['batch_sizes']))))" "$PROFILE/profile.json")
      run overhead-refit 120 python3 benchmarks/overhead_by_batch.py measure --profile "$PROFILE" --batches "$sweep" \
        --k 2 --out "$WORK/overhead_refit.json"
      run refit 30 python3 benchmarks/overhead_by_batch.py profile "$WORK/overhead_refit.json" --profile "$PROFILE" \
        --out "$PROFILE-refit"
      PROFILE="$PROFILE-refit" ;;
    overhead)  # the engine's time outside the passes by batch size: calibration's overhead replay at 1-16 rows
      run overhead 120 python3 benchmarks/overhead_by_batch.py measure --profile "$PROFILE" --out "$WORK/overhead_by_batch.json" ;;
    pack)  # OUT (the device tool's folder, if set) gets it all: what comes back is 8 files at most
      if [ -n "${OUT:-}" ]; then
        cp "$WORK/logs/phases.txt" "$OUT/" 2>/dev/null
        cp "$WORK/overhead_by_batch.json" "$WORK/overhead_refit.json" "$OUT/" 2>/dev/null
        cp "$WORK/terms/gpu_step_terms.json" "$OUT/" 2>/dev/null
        cp "$WORK/validation-gpu/results.json" "$OUT/validation-results.json" 2>/dev/null
        tar czf "$OUT/session.tgz" -C "$(dirname "$WORK")" "$(basename "$WORK")"
      fi ;;
    measure)
      # shellcheck disable=SC2086
      run measure 600 python3 -m calibrate --device $DEVICE --target $TARGET --draft $DRAFT --dtype $DTYPE \
        --drafters eagle3 $MEASURE_GRID --quiet --out "$WORK/h100-measured-$TARGET-$DRAFT" ;;
    smoke)
      run smoke-calibrate 120 python3 -m calibrate --device cuda --target tiny-llama --draft tiny-llama \
        --batch-sizes 1,4 --k-max 2 --contexts 16,64 --prompts 8,32 --max-prefill-tokens 128 --warmup 1 \
        --repeats 3 --point-budget 0.1 --out "$WORK/tiny-cuda"
      run smoke-tests 240 env SPECBATCH_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
        tests/test_calibrate_model.py tests/test_calibrate_verify.py tests/test_replay.py ;;
    replay-tests)
      run replay-tests 240 env SPECBATCH_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider tests/test_replay.py ;;
    eager)
      run eager 300 python3 -m calibrate --device cuda --target llama-3.1-8b --draft llama-3.2-1b \
        --dtype bfloat16 --no-cuda-graphs --batch-sizes 1,2,4,8,16 --k-max 4 --contexts 64,128,256,512,1024 \
        --prompts 32,64,128,256,512 --max-prefill-tokens 8192 --warmup 2 --repeats 10 --point-budget 0.3 \
        --out "$WORK/h100-eager-llama-3.1-8b-llama-3.2-1b" ;;
    opt)
      # shellcheck disable=SC2086
      run opt 600 python3 -m calibrate --device cuda --target opt-6.7b --draft opt-125m --dtype float16 \
        --batch-sizes 1,2,4,8,16,32,64,128,256 --k-max 8 --contexts 128,256,512,1024,2039 \
        --prompts 128,256,512,1024,2048 --max-prefill-tokens 32768 --warmup 2 --repeats 10 --point-budget 0.3 --out "$WORK/h100-measured-opt-6.7b-opt-125m" ;;
    validate)
      run validate 600 python3 benchmarks/validation.py --suite gpu \
        --profile "$WORK/h100-eager-llama-3.1-8b-llama-3.2-1b" --out "$WORK/validation-gpu" ;;
    probe)
      run probe 120 python3 benchmarks/replay_pass_probe.py ;;
    gc-check)  # one validate case twice, one replay each: the garbage collector off, then on
      args=(validate --profile "$WORK/h100-eager-llama-3.1-8b-llama-3.2-1b" --batching continuous --rate 5.5
            --num-requests 150 --repeat 1 --prompt-tokens uniform:64:512 --output-tokens uniform:16:112
            --max-batch-size 16 --alpha 0.7 --seed 1 --policy fixed --k 3 --no-logic)
      run gc-off 150 python3 -c "import gc, sys; gc.disable(); from specbatch.commands.cli import main; sys.exit(main(sys.argv[1:]))" \
        "${args[@]}" --out "$WORK/gc-off"
      run gc-on 150 python3 -c "import sys; from specbatch.commands.cli import main; sys.exit(main(sys.argv[1:]))" \
        "${args[@]}" --out "$WORK/gc-on" ;;
    *) echo "unknown phase $phase" >&2 ;;
  esac
done
exit 0
