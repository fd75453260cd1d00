"""The worked example of docs/python-api.md; tests/test_docs_examples.py checks that the page shows
exactly what this prints."""

import specbatch

# One run on the shipped H100 profile: plain keyword values, named like the run flags.
result = specbatch.run(profile="h100-llama-3.1-8b-llama-3.2-1b", policy="goodput", rate=18,
                       num_requests=400, seed=1)
print(f"completed {result.summary['completed']} requests, "
      f"p99 TTFT {result.summary['p99_ttft_ms']:.0f} ms, mean k {result.summary['mean_k']:.2f}")
print(result.requests[["arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "e2el_s"]].head(3).round(2))
decode = result.steps[result.steps.phase == 1]
print(decode.groupby("batch_size").k.mean().round(2).head(4))

# A sweep, written as a sweep file would be, on a process pool (this script needs no
# `if __name__ == "__main__":` guard: the workers never run it again). A DataFrame comes back.
table = specbatch.sweep({"scenario": {"profile": "h100-llama-3.1-8b-llama-3.2-1b",
                                      "workload": {"num_requests": 400}},
                         "axes": {"rate": [5, 20], "policy": ["none", "goodput"]}}, workers=2)
print(table[["workload.rate", "policy", "mean_e2el_ms", "output_throughput"]].round({"mean_e2el_ms": 0, "output_throughput": 2})
      .to_string(index=False))

# Bad input: the CLI's one-line error, as an exception.
try:
    specbatch.run(rate=-1)
except specbatch.InputError as error:
    print(f"InputError: {error}")
