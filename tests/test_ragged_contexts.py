"""Calibration's --ragged-contexts: decode rows spread around a point's context, the mean kept."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import calibrate.passes as passes  # noqa: E402
from calibrate.cli import main  # noqa: E402
from calibrate.configs import get_config  # noqa: E402
from calibrate.grid import Point  # noqa: E402
from calibrate.kvcache import KVCache, ragged_lengths  # noqa: E402
from calibrate.model import Transformer  # noqa: E402
from sim.costmodel.profile import load_profile  # noqa: E402

TINY = ["--target", "tiny-llama", "--draft", "tiny-llama", "--device", "cpu", "--batch-sizes", "1,4",
        "--k-max", "1", "--contexts", "16,32", "--prompts", "8", "--warmup", "0", "--repeats", "1", "--quiet",
        "--no-overhead"]


@pytest.mark.parametrize("rows, mean", [(16, 256), (16, 1024), (4, 32), (3, 10), (1, 7)])
def test_ragged_rows_hold_the_mean_and_spread_around_it(rows, mean):
    lengths = ragged_lengths(rows, mean)
    assert len(lengths) == rows and sum(lengths) == rows * mean and min(lengths) >= 1
    if rows >= 2:
        assert min(lengths) <= 0.3 * mean and max(lengths) >= 1.7 * mean


def test_ragged_rows_stay_under_a_cap_and_keep_the_mean():
    lengths = ragged_lengths(16, 1000, cap=1200)
    assert max(lengths) <= 1200 and sum(lengths) == 16 * 1000 and min(lengths) < 1000
    assert ragged_lengths(4, 500, cap=500) == [500] * 4  # no room above: every row at the mean


def test_fill_lengths_sets_each_row_and_the_span():
    cache = KVCache(2, 4, 1, 64, 8, dtype=torch.float32, device="cpu")
    cache.fill_lengths([3, 10, 7, 1])
    assert cache.lengths.tolist() == [3, 10, 7, 1] and cache.span == 10
    cache.rollback(1)
    assert cache.lengths.tolist() == [2, 9, 6, 0] and cache.span == 9
    with pytest.raises(ValueError, match="4 sequences"):
        cache.fill_lengths([1, 2])
    with pytest.raises(ValueError, match="64 tokens"):
        cache.fill_lengths([1, 2, 3, 65])


def _filled(monkeypatch, point: Point, ragged: bool) -> list[list[int]]:
    seen = []
    real_fill, real_fill_lengths = KVCache.fill, KVCache.fill_lengths
    monkeypatch.setattr(KVCache, "fill", lambda self, n: (seen.append([n] * self.batch), real_fill(self, n))[1])
    monkeypatch.setattr(KVCache, "fill_lengths",
                        lambda self, ls: (seen.append(list(ls)), real_fill_lengths(self, ls))[1])
    model = Transformer(get_config("tiny-llama"), device="cpu", dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    timed = passes.build_pass(point, {"target": model, "draft": model}, gen, ragged=ragged)
    timed.fn()
    return seen


@pytest.mark.parametrize("model", ["target", "draft"])
def test_a_ragged_decode_point_fills_rows_around_its_context(monkeypatch, model):
    point = Point("decode", model, 4, 2, 32)
    assert _filled(monkeypatch, point, ragged=False) == [[32] * 4]
    assert _filled(monkeypatch, point, ragged=True) == [ragged_lengths(4, 32)]


def test_prefill_is_not_ragged(monkeypatch):
    assert _filled(monkeypatch, Point("prefill", "target", 2, 8, 0), ragged=True) == [[0, 0]]


def test_calibration_records_ragged_contexts_and_will_not_resume_a_uniform_run(tmp_path: Path, capsys, monkeypatch):
    spread = []  # the flag reaches the timed passes, not the sidecar alone
    real_fill_lengths = KVCache.fill_lengths
    monkeypatch.setattr(KVCache, "fill_lengths", lambda self, ls: (spread.append(list(ls)), real_fill_lengths(self, ls))[1])
    out = tmp_path / "ragged"
    assert main([*TINY, "--ragged-contexts", "--out", str(out)]) == 0
    profile = load_profile(out)
    assert profile.meta["timing"]["decode_contexts"] == "ragged"
    assert (profile.points.latency_median_s > 0).all()
    assert ragged_lengths(4, 32) in spread and ragged_lengths(4, 16) in spread
    spread.clear()
    uniform = tmp_path / "uniform"
    assert main([*TINY, "--out", str(uniform)]) == 0
    assert load_profile(uniform).meta["timing"]["decode_contexts"] == "uniform"
    assert spread == []
