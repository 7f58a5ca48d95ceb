"""torch.histc on integer tensors, accepted as CUDA accepts it (Transformers'
grouped-experts MoE routing counts tokens per expert with histc on int32 ids
on every non-CPU device): a histogram of the input's dtype with bins computed
exactly in integers."""
from __future__ import annotations

import pytest
import torch




@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16, torch.uint8])
def test_integer_histc_counts_like_the_float_histogram(dtype, both_modes):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 9, (500,), generator=g).to(dtype)
    got = torch.histc(x.to("tpu"), bins=8, min=0, max=7)
    assert got.dtype == dtype and got.device.type == "tpu"
    # values 8 are outside [0, 7] and skipped; 7 falls in the last bin
    want = torch.histc(x.float(), bins=8, min=0, max=7).to(dtype)
    assert torch.equal(got.cpu(), want)
    assert got.sum().item() == (x <= 7).sum().item()


def test_integer_bins_are_exact_and_the_range_comes_from_the_data(both_modes):
    x = torch.tensor([-3, 0, 1, 2, 5, 9, 10, 11], dtype=torch.int32)
    # range [0, 10], 4 bins: (v - 0) * 4 // 10 -> 0,0,0,2,3,3(10 -> last); -3 and 11 skipped
    got = torch.histc(x.to("tpu"), bins=4, min=0, max=10).cpu()
    assert got.tolist() == [3, 0, 1, 2]
    # min == max: the data's own range [-3, 11]
    auto = torch.histc(x.to("tpu"), bins=7).cpu()
    assert auto.tolist() == torch.histc(x.double(), bins=7).long().tolist()
    assert auto.sum().item() == x.numel()
    # one distinct value: the range widens to [v - 1, v + 1]
    assert torch.histc(torch.full((5,), 4, dtype=torch.int64, device="tpu"), bins=2).cpu().tolist() == [0, 5]


def test_moe_token_counts_as_transformers_computes_them(both_modes):
    expert_ids = torch.tensor([[0, 3], [1, 3], [3, 2], [0, 1]]).reshape(-1)
    ids_sorted, _ = torch.sort(expert_ids.to("tpu"))
    tokens_per_expert = torch.histc(ids_sorted.int(), bins=4, min=0, max=3)
    offsets = torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)
    assert tokens_per_expert.cpu().tolist() == [2, 2, 1, 3]
    assert offsets.cpu().tolist() == [2, 4, 5, 8]


def test_bad_integer_histc_raises_and_the_device_stays_usable():
    x = torch.arange(4, dtype=torch.int32, device="tpu")
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(x, bins=3, min=5, max=1)
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(x, bins=0)
    with pytest.raises(RuntimeError, match="floating point or integer"):
        torch.histc(torch.ones(3, dtype=torch.bool, device="tpu"))
    assert torch.histc(x, bins=4, min=0, max=3).cpu().tolist() == [1, 1, 1, 1]
