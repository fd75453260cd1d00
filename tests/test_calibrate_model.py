"""The torch models and KV cache: cached multi-token passes equal token-by-token decoding."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from calibrate.configs import get_config, kv_bytes_per_token, param_count, weight_bytes  # noqa: E402
from calibrate.kvcache import KVCache  # noqa: E402
from calibrate.model import Transformer  # noqa: E402
from tests.conftest import TEST_DEVICE  # noqa: E402

ARCHS = ["tiny-llama", "tiny-opt"]
ATOL = 1e-5


@pytest.fixture(scope="module", params=ARCHS)
def model(request: pytest.FixtureRequest) -> Transformer:
    return Transformer(get_config(request.param), seed=0, device=TEST_DEVICE)


def _tokens(model: Transformer, b: int, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, model.cfg.vocab_size, (b, n), generator=torch.Generator().manual_seed(seed)).to(model.device)


def test_param_count_and_sizes_match_config(model: Transformer) -> None:
    cfg = model.cfg
    assert sum(p.numel() for p in model.parameters()) == param_count(cfg)
    assert weight_bytes(cfg, "float16") == 2 * param_count(cfg)
    assert kv_bytes_per_token(cfg, "float32") == 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4


def test_q_token_pass_equals_q_single_steps(model: Transformer) -> None:
    toks = _tokens(model, 3, 12)
    chunked = model.new_cache(3, 16)
    out = torch.cat([model(toks[:, :5], chunked), model(toks[:, 5:9], chunked), model(toks[:, 9:], chunked)], 1)
    stepped = model.new_cache(3, 16)
    ref = torch.cat([model(toks[:, i:i + 1], stepped) for i in range(12)], 1)
    assert out.shape == (3, 12, model.cfg.vocab_size)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)
    assert chunked.lengths.tolist() == [12, 12, 12] and chunked.span == 12
    torch.testing.assert_close(chunked.k, stepped.k, atol=ATOL, rtol=0)


def test_last_only_returns_the_last_position(model: Transformer) -> None:
    toks = _tokens(model, 2, 7)
    full = model(toks, model.new_cache(2, 8))
    last = model(toks, model.new_cache(2, 8), last_only=True)
    torch.testing.assert_close(last, full[:, -1:], atol=ATOL, rtol=0)


def test_rollback_then_reappend_reproduces_logits(model: Transformer) -> None:
    toks = _tokens(model, 2, 10)
    cache = model.new_cache(2, 12)
    first = model(toks, cache)
    cache.rollback(4)
    assert cache.lengths.tolist() == [6, 6] and cache.span == 6
    again = model(toks[:, 6:], cache)
    torch.testing.assert_close(again, first[:, 6:], atol=ATOL, rtol=0)


def test_ragged_rollback_masks_stale_entries(model: Transformer) -> None:
    toks = _tokens(model, 3, 8, seed=1)
    new = _tokens(model, 3, 3, seed=2)
    cache = model.new_cache(3, 12)
    model(toks, cache)
    cache.rollback(torch.tensor([0, 3, 7]))  # keep 8, 5 and 1 tokens
    assert cache.lengths.tolist() == [8, 5, 1] and cache.span == 8
    out = model(new, cache)
    for s, keep in enumerate([8, 5, 1]):
        alone = model.new_cache(1, 12)
        model(toks[s:s + 1, :keep], alone)
        ref = model(new[s:s + 1], alone)
        torch.testing.assert_close(out[s:s + 1], ref, atol=ATOL, rtol=0)


def test_rollback_rejects_bad_counts(model: Transformer) -> None:
    cache = model.new_cache(2, 4)
    model(_tokens(model, 2, 2), cache)
    with pytest.raises(ValueError):
        cache.rollback(3)
    with pytest.raises(ValueError):
        cache.rollback(torch.tensor([1, 3]))
    with pytest.raises(ValueError):
        model(_tokens(model, 2, 3), cache)  # 2 + 3 > 4 slots


def test_gqa_shapes() -> None:
    cfg = get_config("tiny-llama")
    assert cfg.num_kv_heads < cfg.num_heads
    model = Transformer(cfg)
    cache = model.new_cache(2, 8)
    assert cache.k.shape == (cfg.num_layers, 2, 8, cfg.num_kv_heads, cfg.head_dim)
    assert model.blocks[0].qkv_w.shape == (cfg.hidden_size + 2 * cfg.num_kv_heads * cfg.head_dim, cfg.hidden_size)
    assert model(_tokens(model, 2, 3), cache).shape == (2, 3, cfg.vocab_size)


def test_cache_append_without_model() -> None:
    cache = KVCache(2, 2, 1, 6, 4, dtype=torch.float32, device="cpu")
    kv = [(torch.ones(2, 1, 3, 4) * (i + 1), torch.ones(2, 1, 3, 4)) for i in range(2)]
    cache.append(kv)
    assert cache.lengths.tolist() == [3, 3]
    assert cache.k[1, :, :3].eq(2).all() and cache.k[:, :, 3:].eq(0).all()


def test_random_weights_give_finite_logits_in_half_precision() -> None:
    model = Transformer(get_config("tiny-llama"), dtype=torch.bfloat16, device=TEST_DEVICE)
    logits = model(torch.zeros(1, 4, dtype=torch.long, device=model.device), model.new_cache(1, 4))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
