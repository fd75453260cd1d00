#!/bin/sh
# Regenerate the shipped composed GPU profiles (docs/gpu-profiles.md) from NVIDIA's kernel
# data: pip install -e ".[gpu-data]" first. Each profile's sidecar records its own line.
# The H100 Llama-3.1-8B profile also prices every drafter (docs/speculation-methods.md): its heads from the
# kernel data, its host proposers (ngram, suffix) timed on this machine's CPU.
set -e
cd "$(dirname "$0")/.."
specbatch compose --gpu h100_sxm --target llama-3.1-8b --draft llama-3.2-1b --drafters eagle,eagle3,mtp,medusa,ngram,suffix --out sim/profiles/h100-llama-3.1-8b-llama-3.2-1b
specbatch compose --gpu h100_sxm --target llama-2-7b --draft llama-68m --out sim/profiles/h100-llama-2-7b-llama-68m
specbatch compose --gpu h100_sxm --target opt-6.7b --draft opt-125m --out sim/profiles/h100-opt-6.7b-opt-125m
specbatch compose --gpu h200_sxm --target llama-3.1-8b --draft llama-3.2-1b --out sim/profiles/h200-llama-3.1-8b-llama-3.2-1b
specbatch compose --gpu l40s --target llama-3.1-8b --draft llama-3.2-1b --out sim/profiles/l40s-llama-3.1-8b-llama-3.2-1b
# A100's vLLM data in aiconfigurator-core 0.12.0 is the 0.14.0 collection (no 0.24.0 set).
specbatch compose --gpu a100_sxm --framework-version 0.14.0 --target opt-6.7b --draft opt-125m --out sim/profiles/a100-opt-6.7b-opt-125m
# Replicas of several GPUs (tensor parallelism). The real vLLM runs' targets, without a draft:
specbatch compose --gpu h100_sxm --tp 4 --target llama-2-70b --out sim/profiles/h100-tp4-llama-2-70b
specbatch compose --gpu h100_sxm --tp 2 --target mixtral-8x7b --out sim/profiles/h100-tp2-mixtral-8x7b
specbatch compose --gpu h100_sxm --tp 2 --target codellama-34b --out sim/profiles/h100-tp2-codellama-34b
# 70B targets with a draft in the same group (vLLM's default), and the 8B pair on four GPUs:
specbatch compose --gpu h100_sxm --tp 4 --target llama-3.1-70b --draft llama-3.1-8b --out sim/profiles/h100-tp4-llama-3.1-70b-llama-3.1-8b
specbatch compose --gpu h100_sxm --tp 4 --target llama-3.1-70b --draft llama-3.2-1b --out sim/profiles/h100-tp4-llama-3.1-70b-llama-3.2-1b
specbatch compose --gpu h100_sxm --tp 4 --target llama-3.1-8b --draft llama-3.2-1b --out sim/profiles/h100-tp4-llama-3.1-8b-llama-3.2-1b
specbatch compose --gpu h200_sxm --tp 2 --dtype fp8 --target llama-3.1-70b --draft llama-3.2-1b --out sim/profiles/h200-tp2-llama-3.1-70b-llama-3.2-1b
# What kernel tables cannot say: the serving stack's own latency per request (its frontend) and the
# engine's per-step time no overlap hides. Fitted (specbatch fit, leave-one-run-out errors in the
# sidecar) to the three Llama-2-7b vLLM 0.15.1 runs on H100 that ../shared/validation holds, then
# carried over to the other composed profiles (the same serving stack on other models and GPUs:
# the runs of other models measure how well the terms carry, docs/validation.md).
RUNS="${SPECBATCH_VALIDATION:-../shared/validation}/vllm-h100"
FITTED=sim/profiles/h100-llama-2-7b-llama-68m
specbatch fit --profile "$FITTED" --out "$FITTED" --terms request_latency_s,exposed_overhead_s \
    --measured "$RUNS/llama-2-7b-tp1-codegen.csv.gz" "$RUNS/llama-2-7b-tp1-general.csv.gz" "$RUNS/llama-2-7b-tp1-roleplay.csv.gz" \
    --policy none --max-num-seqs 128 --max-num-batched-tokens 2048 --block-size 16 --kv-cache-tokens 119392
for profile in sim/profiles/h100-llama-3.1-8b-llama-3.2-1b sim/profiles/h100-opt-6.7b-opt-125m \
               sim/profiles/h200-llama-3.1-8b-llama-3.2-1b sim/profiles/l40s-llama-3.1-8b-llama-3.2-1b \
               sim/profiles/a100-opt-6.7b-opt-125m \
               sim/profiles/h100-tp4-llama-2-70b sim/profiles/h100-tp2-mixtral-8x7b sim/profiles/h100-tp2-codellama-34b \
               sim/profiles/h100-tp4-llama-3.1-70b-llama-3.1-8b sim/profiles/h100-tp4-llama-3.1-70b-llama-3.2-1b \
               sim/profiles/h100-tp4-llama-3.1-8b-llama-3.2-1b sim/profiles/h200-tp2-llama-3.1-70b-llama-3.2-1b; do
    specbatch fit --profile "$profile" --out "$profile" --terms request_latency_s,exposed_overhead_s --terms-from "$FITTED"
done
