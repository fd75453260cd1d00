#!/bin/sh
# Regenerate the shipped composed GPU profiles (docs/gpu-profiles.md) from NVIDIA's kernel
# data: pip install -e ".[gpu-data]" first. Each profile's sidecar records its own line.
set -e
cd "$(dirname "$0")/.."
specbatch compose --gpu h100_sxm --target llama-3.1-8b --draft llama-3.2-1b --out sim/profiles/h100-llama-3.1-8b-llama-3.2-1b
specbatch compose --gpu h100_sxm --target llama-2-7b --draft llama-68m --out sim/profiles/h100-llama-2-7b-llama-68m
specbatch compose --gpu h100_sxm --target opt-6.7b --draft opt-125m --out sim/profiles/h100-opt-6.7b-opt-125m
specbatch compose --gpu h200_sxm --target llama-3.1-8b --draft llama-3.2-1b --out sim/profiles/h200-llama-3.1-8b-llama-3.2-1b
specbatch compose --gpu l40s --target llama-3.1-8b --draft llama-3.2-1b --out sim/profiles/l40s-llama-3.1-8b-llama-3.2-1b
# A100's vLLM data in aiconfigurator-core 0.12.0 is the 0.14.0 collection (no 0.24.0 set).
specbatch compose --gpu a100_sxm --framework-version 0.14.0 --target opt-6.7b --draft opt-125m --out sim/profiles/a100-opt-6.7b-opt-125m
