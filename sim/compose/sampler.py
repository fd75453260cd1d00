"""vLLM V1's sampler over the vocabulary, priced per step for the sampling the requests ask for.

What vLLM 0.15's ``Sampler`` (``vllm/v1/sample/sampler.py``) runs each step on the target's
logits, b sequences at k + 1 positions each (rows = b (k + 1)), V columns:

* every mode: the bf16 logits cast to fp32 (read 2 bytes, write 4 an element);
* ``greedy`` (temperature 0, ``vllm bench serve``'s default): an argmax (read 4), or at k >= 1
  the rejection sampler (reads fp32 probabilities of k + 1 target and k draft positions);
* ``random`` (temperature > 0, no top-k / top-p: a model whose ``generation_config.json`` sets
  none, requested without sampling parameters): at every position the temperature divide (read
  and write 4), a softmax (read 8, write 4) and the exponential race that draws a token (write 4
  random numbers, divide: read 8 write 4, argmax: read 4; at k >= 1 the recovered tokens of the k
  draft positions and the bonus token), plus at k >= 1 the rejection sampler's reads as above;
* ``top-p`` (nucleus sampling, e.g. Llama 2 and 3's ``generation_config.json``: temperature 0.6,
  top_p 0.9, which vLLM applies to requests that set none, ``--generation-config auto``): as
  ``random`` plus ``apply_top_k_top_p``, which in vLLM 0.15 sorts every row over the whole
  vocabulary (PyTorch's sort, then softmax, cumsum, mask and scatter back): the FlashInfer sampler
  was off by default from vLLM PR #26859 (October 2025) until #40376 (v0.21), and the Triton
  top-k / top-p kernel (#33538) came after 0.15. Its time is read from H100 measurements of that
  function (SORT_TABLE), interpolated log-log in rows x V and scaled to another GPU by its memory
  bandwidth.

Element passes are priced at the spec sheet's achievable bandwidth, each kernel with the sheet's
fixed latency of a memory-bound kernel. Per sequence this is vocabulary-sized work, so it grows
with the batch and with the vocabulary (128k columns for Llama 3, 32k for Llama 2), and with
tensor parallelism every GPU samples the whole gathered vocabulary: the same time on a shorter step.
"""

from __future__ import annotations

import numpy as np

from sim.compose.shapes import ACT_BYTES
from sim.costmodel.profile import SAMPLERS as SAMPLING_MODES  # the profile format names them (verify rows)

PROB_BYTES = 4  # fp32 logits and probabilities
# apply_top_k_top_p's PyTorch path with top-p on every row, measured on an H100 (vLLM's
# benchmarks/benchmark_topk_topp.py, "PyTorch" column, scenario topp_whole): (rows x vocabulary, seconds).
# Rows 1 and 4 of a 32768 vocabulary from vLLM PR #42191 ("benchmark results on a H100"), the rest
# from PR #33538 (same script and author: 56, 512 and 1024 rows of 32768; 512 and 1024 of 131072). That
# table's 48-row point, 0.986 ms, is left out: 2.5 times its 56-row neighbour's 0.393 ms, where its own
# 48-row top-k-and-top-p case, which does more, took 0.481 ms.
SORT_TABLE = ((32768, 0.094e-3), (131072, 0.179e-3), (1835008, 0.393e-3), (16777216, 2.252e-3),
              (33554432, 4.236e-3), (67108864, 8.787e-3), (134217728, 16.312e-3))
SORT_SOURCE = ("vLLM 0.15's PyTorch top-p (sort over the vocabulary), measured on an H100 in vLLM PRs #42191 and "
               "#33538 (benchmarks/benchmark_topk_topp.py, topp_whole)")
SORT_GPU_BW = 3.35e12  # the H100 SXM's spec-sheet bandwidth: SORT_TABLE is scaled by it to another GPU's


GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: a temperature under it is greedy (top-p, top-k and min-p then unused)


def sampling_of(temperature: float | None, top_p: float | None = None, top_k: int | None = None,
                min_p: float | None = None) -> str:
    """The sampler path vLLM 0.15 runs for requests with these parameters (``vllm bench serve``'s
    ``--temperature/--top-p/--top-k/--min-p``; a parameter not given is None).

    ``vllm bench serve`` sends temperature 0 unless told otherwise, and vLLM samples greedily below
    :data:`GREEDY_BELOW`; at a positive temperature a top-p under 1 or a top-k above 0 goes through
    ``apply_top_k_top_p``, priced as its sort over the vocabulary (with top-k alone vLLM takes
    ``torch.topk`` instead, which costs less: the sort is then an upper bound); min-p alone is a
    comparison against each row's maximum, within the random path's element passes."""
    if temperature is None or temperature < GREEDY_BELOW:
        return "greedy"
    if (top_p is not None and top_p < 1.0) or (top_k is not None and top_k > 0):
        return "top-p"
    return "random"


def sort_time(elements, mem_bw: float) -> np.ndarray:
    """apply_top_k_top_p over ``elements`` = rows x vocabulary (seconds): log-log between SORT_TABLE's
    points, the first point's time below it (launch-bound), proportional to elements past the last."""
    x = np.asarray(elements, dtype=float)
    sizes = np.log([n for n, _ in SORT_TABLE])
    times = np.log([t for _, t in SORT_TABLE])
    inside = np.exp(np.interp(np.log(np.maximum(x, 1.0)), sizes, times))
    top_n, top_t = SORT_TABLE[-1]
    beyond = top_t * x / top_n
    return np.where(x > top_n, beyond, inside) * (SORT_GPU_BW / mem_bw)


def sampler_time(b, k, vocab: int, mode: str, bw: float, mem_bw: float, latency: float) -> np.ndarray:
    """One step's sampling of b sequences verifying k draft tokens each (k = 0: plain decoding), seconds.
    ``bw``: achievable bandwidth; ``mem_bw``: the sheet's (scales the measured sort); ``latency``: one
    memory-bound kernel's fixed cost."""
    if mode not in SAMPLING_MODES:
        raise ValueError(f"sampling '{mode}' is not one of {', '.join(SAMPLING_MODES)}")
    b, k = np.broadcast_arrays(np.asarray(b, dtype=float), np.asarray(k, dtype=float))
    elements = b * vocab
    rows_elements = elements * (k + 1)  # every verified position's logits
    cast = rows_elements * (ACT_BYTES + PROB_BYTES)
    rejection = elements * (2 * k + 1) * PROB_BYTES  # target probabilities at k + 1 positions, draft at k
    if mode == "greedy":
        argmax = elements * PROB_BYTES
        return 2 * latency + (cast + np.where(k > 0, rejection, argmax)) / bw
    temperature = rows_elements * 2 * PROB_BYTES
    softmax = rows_elements * 3 * PROB_BYTES
    race = rows_elements * (1 + 3 + 1) * PROB_BYTES  # exponential draws written, divided (read 2, write 1), argmax
    kernels = np.where(k > 0, 7, 6)  # cast, temperature, softmax, draw, divide, argmax (+ the rejection kernel)
    time = kernels * latency + (cast + temperature + softmax + race + np.where(k > 0, rejection, 0.0)) / bw
    if mode == "top-p":
        time = time + sort_time(rows_elements, mem_bw)
    return time
