"""calibrate.attention: each row reads its own context, and the split path agrees with the dense one.

The split kernel is CUDA's flash attention; on a CPU it is stood in for by a row-by-row
implementation of the same contract (queries at ``cu_q``, a row's keys from ``cu_k`` for
``used_k`` tokens, causal within the new tokens), so the metadata a pass builds, the
token-major cache and the reshapes around the kernel are checked here, and the kernel
itself on a GPU (the check in split_attention runs there before any pass).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from calibrate import attention  # noqa: E402
from calibrate.attention import ATTENTION_ENV, split_attention, split_attention_notes  # noqa: E402
from calibrate.configs import get_config  # noqa: E402
from calibrate.model import Transformer  # noqa: E402


def varlen_on_cpu(q, k, v, s, causal):
    """The variable-length kernel's contract, one row at a time, in float32."""
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    for row in range(len(s.used_k)):
        qs = q[int(s.cu_q[row]):int(s.cu_q[row + 1])].float()
        used, start = int(s.used_k[row]), int(s.cu_k[row])
        keys = k[start:start + used].float().repeat_interleave(group, dim=1)
        values = v[start:start + used].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qs, keys) / qs.shape[-1] ** 0.5
        if causal:
            n = qs.shape[0]
            visible = torch.arange(used) <= (used - n + torch.arange(n))[:, None]
            scores = scores.masked_fill(~visible, float("-inf"))
        out[int(s.cu_q[row]):int(s.cu_q[row + 1])] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values).to(q.dtype)
    return out


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-opt"])
def test_split_path_gives_the_dense_logits_over_ragged_rows_and_rollbacks(name, monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(attention, "_flash_varlen", lambda *a, **kw: calls.append(1) or varlen_on_cpu(*a, **kw))
    cfg = get_config(name)
    dense, split = Transformer(cfg, seed=3), Transformer(cfg, seed=3)
    split.split = True
    caches = [dense.new_cache(3, 24), split.new_cache(3, 24)]
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (3, 5), generator=gen)
    for model, cache in zip((dense, split), caches):
        model(prompt, cache)
        cache.rollback(torch.tensor([0, 2, 4]))  # ragged rows: 5, 3 and 1 tokens
    for q in (1, 3, 1, 2):
        tokens = torch.randint(0, cfg.vocab_size, (3, q), generator=gen)
        want, got = (model(tokens, cache) for model, cache in zip((dense, split), caches))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        for cache in caches:
            cache.rollback(torch.tensor([0, 1, q - 1]))
    torch.testing.assert_close(caches[1].k, caches[0].k)
    assert len(calls) == 4 * cfg.num_layers  # every decode layer of the split model took the split path


def test_split_metadata_reads_each_row_to_its_own_length() -> None:
    cfg = get_config("tiny-llama")
    cache = Transformer(cfg).new_cache(3, 16)
    cache.lengths[:] = torch.tensor([2, 9, 5])
    cache.span = 9
    positions = cache.lengths[:, None] + torch.arange(2)
    context = attention.pass_context(cache, positions, cfg.num_heads, cfg.num_kv_heads, torch.float32, split=True)
    s = context.split
    assert context.mask is None and s.cu_q.tolist() == [0, 2, 4, 6] and s.cu_k.tolist() == [0, 16, 32, 48]
    assert s.used_k.tolist() == [4, 11, 7] and (s.max_q, s.max_k) == (2, 11)
    assert s.used_k.dtype == torch.int32 and s.cu_k.dtype == torch.int32
    assert attention.pass_context(cache.rows(0, 3, 0), positions, 4, 4, torch.float32, split=True) is None  # empty


def test_the_gpu_checks_reference_is_the_dense_kernel() -> None:
    gen = torch.Generator().manual_seed(2)
    lengths, max_len, q_len, heads, kv_heads, d = [3, 11, 6], 12, 2, 4, 2, 8
    k = torch.randn(len(lengths) * max_len, kv_heads, d, generator=gen)
    v = torch.randn(k.shape, generator=gen)
    q = torch.randn(len(lengths) * q_len, heads, d, generator=gen)
    rows = torch.arange(len(lengths) + 1, dtype=torch.int32)
    s = attention.SplitContext(rows * q_len, rows * max_len, torch.tensor(lengths, dtype=torch.int32), q_len, 11)
    torch.testing.assert_close(attention._reference(q, k, v, lengths, max_len, q_len), varlen_on_cpu(q, k, v, s, True))


def test_a_cpu_attends_densely_and_says_why(monkeypatch) -> None:
    monkeypatch.delenv(ATTENTION_ENV, raising=False)
    assert not split_attention(torch.device("cpu"), torch.float32, 4, 2, 8)
    assert any("dense: the split kernel is CUDA's" in note for note in split_attention_notes().values())
    assert not Transformer(get_config("tiny-llama")).split


def test_the_choice_can_be_forced_and_is_checked(monkeypatch) -> None:
    monkeypatch.setenv(ATTENTION_ENV, "dense")
    assert not split_attention(torch.device("cuda"), torch.bfloat16, 32, 8, 128)  # no check needed, nothing run
    monkeypatch.setenv(ATTENTION_ENV, "split")
    with pytest.raises(RuntimeError, match="SPECBATCH_ATTENTION=split, but the split kernel cannot run here"):
        split_attention(torch.device("cpu"), torch.float32, 4, 2, 8)
    monkeypatch.setenv(ATTENTION_ENV, "fast")
    with pytest.raises(ValueError, match="expected auto, split or dense"):
        split_attention(torch.device("cpu"), torch.float32, 4, 2, 8)
