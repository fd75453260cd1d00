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
# Replicas of several GPUs (tensor parallelism). The real vLLM runs' targets, without a draft, sampling as vLLM
# sampled those runs' requests (their client sent no sampling parameters, so each model's generation_config.json
# ruled: Llama 2's top_p 0.9, none for Mixtral and CodeLlama; benchmarks/real_vllm.py's SAMPLING):
specbatch compose --gpu h100_sxm --tp 4 --target llama-2-70b --sampling top-p --out sim/profiles/h100-tp4-llama-2-70b
specbatch compose --gpu h100_sxm --tp 2 --target mixtral-8x7b --sampling random --out sim/profiles/h100-tp2-mixtral-8x7b
specbatch compose --gpu h100_sxm --tp 2 --target codellama-34b --sampling random --out sim/profiles/h100-tp2-codellama-34b
# 70B targets with a draft in the same group (vLLM's default), and the 8B pair on four GPUs:
specbatch compose --gpu h100_sxm --tp 4 --target llama-3.1-70b --draft llama-3.1-8b --out sim/profiles/h100-tp4-llama-3.1-70b-llama-3.1-8b
specbatch compose --gpu h100_sxm --tp 4 --target llama-3.1-70b --draft llama-3.2-1b --out sim/profiles/h100-tp4-llama-3.1-70b-llama-3.2-1b
specbatch compose --gpu h100_sxm --tp 4 --target llama-3.1-8b --draft llama-3.2-1b --out sim/profiles/h100-tp4-llama-3.1-8b-llama-3.2-1b
specbatch compose --gpu h200_sxm --tp 2 --dtype fp8 --target llama-3.1-70b --draft llama-3.2-1b --out sim/profiles/h200-tp2-llama-3.1-70b-llama-3.2-1b
# What kernel tables cannot say, the serving frontend's latency per request, compose writes itself
# (sim/compose/build.py's REQUEST_LATENCY_S, fitted by benchmarks/real_vllm.py leaving one model out):
# a profile composed by hand is the profile shipped. No fitted term is carried over afterwards.
