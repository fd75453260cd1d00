"""Writes the two SYNTHETIC vLLM-format examples under docs/examples/ (neither is a real vLLM run).

* ``acceptance-trace.jsonl``: per-request ``metrics.speculative_decoding`` objects in the shape
  vLLM's ``--per-request-spec-decode-metrics detailed`` returns, with acceptance that falls with
  position and differs by request (each request's own rate from a Beta, the conditional rate at
  position j scaled by 1 - 0.08 j), for ``--acceptance-model trace``.
* ``vllm-result-synthetic.json``: the layout of ``vllm bench serve --save-result --save-detailed``,
  for ``specbatch run --trace-vllm`` and ``specbatch compare``. Its requests were simulated with
  specbatch on the default H100 profile and then perturbed as a real client would see them (a
  fixed client overhead and noise on TTFT, per-chunk jitter on the ITLs), so that a comparison
  shows non-zero errors; its metrics are computed from those lists with vLLM's definitions.

Run from the repository root: ``python docs/examples/make_vllm_examples.py`` (deterministic).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import specbatch
from sim.metrics import distribution_stats

HERE = Path(__file__).parent
LABEL = "SYNTHETIC example, not a real vLLM run (docs/examples/make_vllm_examples.py)"


def acceptance_trace(path: Path, requests: int = 60, k: int = 4, seed: int = 11) -> None:
    rng = np.random.default_rng(seed)
    lines = []
    for r in range(requests):
        alpha = rng.beta(0.75 * 12, 0.25 * 12)
        conditional = alpha * (1 - 0.08 * np.arange(k))
        steps = int(np.clip(rng.lognormal(np.log(45), 0.6), 3, 200))
        kept = rng.random((steps, k)) < conditional  # position j kept if it and all before it are
        accepted = np.cumprod(kept, axis=1).sum(axis=1).astype(int).tolist()
        a, d = sum(accepted), k * steps
        lines.append({"request_id": f"synthetic-{r}", "metrics": {"speculative_decoding": {
            "mean_acceptance_length": 1 + a / steps, "draft_acceptance_rate": a / d,
            "acceptance_histogram": np.bincount(accepted, minlength=k + 1).tolist(), "num_spec_steps": steps,
            "num_accepted_draft_tokens": a, "num_draft_tokens": d, "num_spec_tokens": k,
            "per_step_accepted": accepted, "per_step_drafted": [k] * steps}}})
    path.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))


def vllm_result(path: Path, seed: int = 5) -> None:
    run = specbatch.run(rate=6, num_requests=100, seed=seed, output_tokens="lognormal:128:0.6:512",
                        prompt_tokens="lognormal:400:0.6:2048", k=3)
    t = run.requests
    rng = np.random.default_rng(seed)
    ttft = t.ttft_s.to_numpy() * rng.lognormal(0.0, 0.15, len(t)) + 0.008  # client overhead and noise
    itls = []
    for steps, span in zip(t.decode_steps.to_numpy(), (t.e2el_s - t.ttft_s).to_numpy()):
        chunks = max(int(steps), 1)
        itls.append([round(float(x), 6) for x in span * 1.04 * rng.dirichlet(np.full(chunks, 6.0))])
    e2el = ttft + np.array([sum(x) for x in itls])
    output = t.output_tokens.to_numpy()
    multi = output > 1
    duration = float(np.max(t.arrival_s.to_numpy() + e2el))
    done = len(t)
    result = {
        "date": "20260101-000000", "backend": "vllm", "label": LABEL,
        "model_id": "meta-llama/Llama-3.1-8B-Instruct", "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct",
        "num_prompts": done, "request_rate": 6.0, "burstiness": 1.0, "max_concurrency": None,
        "duration": duration, "completed": done,
        "total_input_tokens": int(t.prompt_tokens.sum()), "total_output_tokens": int(output.sum()),
        "request_throughput": done / duration, "request_goodput": None,
        "output_throughput": float(output.sum()) / duration,
        "total_token_throughput": float(t.prompt_tokens.sum() + output.sum()) / duration,
        "input_lens": t.prompt_tokens.astype(int).tolist(), "output_lens": output.astype(int).tolist(),
        "start_times": [round(float(x), 6) for x in t.arrival_s], "ttfts": [round(float(x), 6) for x in ttft],
        "itls": itls, "generated_texts": [""] * done, "errors": [""] * done,
    }
    for name, values in (("ttft", ttft), ("tpot", (e2el - ttft)[multi] / (output[multi] - 1)),
                         ("itl", np.concatenate([np.asarray(x) for x in itls])), ("e2el", e2el)):
        stats = distribution_stats(name, values)
        result.update({key: stats[key] for key in (f"mean_{name}_ms", f"median_{name}_ms", f"std_{name}_ms",
                                                   f"p99_{name}_ms")})
    path.write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    acceptance_trace(HERE / "acceptance-trace.jsonl")
    vllm_result(HERE / "vllm-result-synthetic.json")
