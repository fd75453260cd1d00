"""The two terms of a composed profile that kernel tables cannot give, fitted on real runs.

Kept apart from :mod:`sim.compose.build` so that a command can show them (its flags' help) without
loading what composing needs (pandas, the kernel tables).
"""

# What kernel tables cannot say: the serving stack's latency per request as its client sees it (HTTP,
# tokenization, the hop to the engine and back, detokenization, streaming) and the engine's time per
# step that asynchronous scheduling does not hide. Fitted on the dev runs of real vLLM
# (benchmarks/real_vllm.py, ../shared/validation) leaving one model out: the latency is carried because
# it lowers the held-out runs' errors; the step time comes to 0 in every fold since the sampler is
# priced as vLLM sampled those runs (sim/compose/sampler.py), so it is not carried (docs/validation.md).
REQUEST_LATENCY_S = 8.0495e-3
EXPOSED_OVERHEAD_S = 0.0
FITTED_TERMS_SOURCE = (
    "fitted, not measured here: the serving frontend's latency per request (TTFT and E2E, not the time between "
    "tokens) {latency:.3f} ms, fitted by benchmarks/real_vllm.py on the dev runs of vLLM 0.15.1 on H100 SXM "
    "(Llama-2-7b, Llama-2-70b TP 4, Mixtral-8x7B TP 2, CodeLlama-34b TP 2; ../shared/validation/vllm-h100) and "
    "carried because, leaving one model out, it lowers the held-out runs' errors; the engine's time per step that "
    "asynchronous scheduling does not hide, {exposed:.3f} ms (fitted the same way it comes to 0 in every fold "
    "once the sampler is priced as vLLM sampled those runs) (docs/validation.md); override with "
    "--request-latency-ms / --exposed-overhead-ms")
REQUEST_LATENCY_SOURCE = FITTED_TERMS_SOURCE.format(latency=REQUEST_LATENCY_S * 1e3, exposed=EXPOSED_OVERHEAD_S * 1e3)
