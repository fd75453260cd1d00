#!/bin/bash
# What ran on the lent H100 (issues 15 and 16), phase by phase, resumable across machines.
#
#   bash benchmarks/gpu_session.sh WORK SECONDS PHASE...
#
# WORK holds every output (a calibration killed by the deadline resumes from its partial
# files when WORK is carried to the next machine); SECONDS is the wall-clock budget of the
# whole call: the last phase gets what is left. Phases:
#
#   env       the machine: nvidia-smi, python and package versions
#   smoke     a tiny CUDA calibration, then the real-model tests on CUDA
#             (SPECBATCH_TEST_DEVICE=cuda: model, rejection sampler, real replay)
#   replay-tests  the real replay's tests alone on CUDA
#   eager     llama-3.1-8b / llama-3.2-1b, bf16, timed eagerly on a small grid: the profile
#             the GPU validation prices with (the real replay runs its passes eagerly too)
#   measure   llama-3.1-8b / llama-3.2-1b, bf16, CUDA graphs, on the composed H100 profile's
#             grid (batch 1..256, q 1..9, context 128..32759, prompts 128..4096)
#   validate  benchmarks/validation.py --suite gpu on the eager profile
#   opt       opt-6.7b / opt-125m, fp16, CUDA graphs, on the composed profile's grid
#   probe     benchmarks/replay_pass_probe.py: one target pass timed as calibration and as the replay do
#   gc-check  one validate case replayed with the garbage collector off, then on
#
# Each phase runs under its own timeout and failures do not stop the next phase; every
# log is in WORK/logs. The machine has torch, numpy, pandas and scipy; simpy, tomli-w and
# tomlkit travel as wheels in .whl (see docs/gpu-profiles.md).
set -u
WORK=$1; BUDGET=$2; shift 2
DEADLINE=$((SECONDS + BUDGET))
mkdir -p "$WORK/logs"
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD" SPECBATCH_CACHE_DIR=/tmp/specbatch-cache
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
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
GRID_H100="--batch-sizes 1,2,4,8,16,32,64,128,256 --k-max 8 --contexts 128,256,512,1024,2048,4096,8192,16384,32759
  --prompts 128,256,512,1024,2048,4096 --max-prefill-tokens 32768 --warmup 2 --repeats 10 --point-budget 0.3"
for phase in "$@"; do
  case $phase in
    env)
      run env 60 bash -c 'nvidia-smi; python3 -c "import sys, torch, numpy, pandas, scipy; print(sys.version);
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), torch.cuda.mem_get_info());
print(numpy.__version__, pandas.__version__, scipy.__version__)"; python3 -m pip list 2>/dev/null |
grep -iE "^(numba|pyarrow|tqdm|simpy|tomli|tomlkit|hypothesis|pytest) "' ;;
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
    measure)
      # shellcheck disable=SC2086
      run measure 600 python3 -m calibrate --device cuda --target llama-3.1-8b --draft llama-3.2-1b \
        --dtype bfloat16 $GRID_H100 --out "$WORK/h100-measured-llama-3.1-8b-llama-3.2-1b" ;;
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
      run gc-off 150 python3 -c "import gc, sys; gc.disable(); from sim.commands.cli import main; sys.exit(main(sys.argv[1:]))" \
        "${args[@]}" --out "$WORK/gc-off"
      run gc-on 150 python3 -c "import sys; from sim.commands.cli import main; sys.exit(main(sys.argv[1:]))" \
        "${args[@]}" --out "$WORK/gc-on" ;;
    *) echo "unknown phase $phase" >&2 ;;
  esac
done
exit 0
