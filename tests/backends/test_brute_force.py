"""The brute force every conformance test is held to runs paths of one length side by side as batch rows, each on
its own copy of the prompt's cache; here it equals scoring each path alone, on a full-attention, a sliding-window
and a recurrent cache, in PyTorch and in MLX."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import (
    load_mlx_twin,
    mlx_available,
    mlx_brute_force,
    mlx_brute_force_one_by_one,
    same_length_groups,
    save_tiny,
    tiny_model,
    torch_brute_force,
    torch_brute_force_one_by_one,
)

ARCHS = ["llama", "gemma2", "lfm2", "qwen3_5", "gemma4"]  # full attention, sliding windows, recurrent layers


def prompt_and_paths(vocab: int) -> tuple[list[int], list[list[int]]]:
    """A 40-token prompt and 70 paths of one to four tokens, many sharing their first tokens (as label paths do),
    more than one batch of one length."""
    rng = np.random.default_rng(0)
    context = rng.integers(0, vocab, 40).tolist()
    stems = rng.integers(0, vocab, (5, 3)).tolist()
    paths = [[*stems[i % 5][: (i % 3)], int(t)] for i, t in enumerate(rng.integers(0, vocab, 70))]
    return context, [*paths, rng.integers(0, vocab, 4).tolist()]


def test_same_length_groups_cover_each_path_once_in_bounded_groups():
    paths = [[1], [1, 2], [3, 4], [5, 6, 7], [8, 9]]
    groups = list(same_length_groups(paths, size=1)) + list(same_length_groups(paths))
    assert sorted(i for g in groups[:4] for i in g) == [1, 2, 3, 4]
    assert all(len({len(paths[i]) for i in g}) == 1 for g in groups)
    assert groups[4:] == [[1, 2, 4], [3]]


def check_rows_equal_alone(batched_brute_force, one_by_one, model, vocab: int) -> None:
    context, paths = prompt_and_paths(vocab)
    batched = batched_brute_force(model, context, paths)
    alone = one_by_one(model, context, paths)
    assert [len(b) for b in batched] == [len(p) for p in paths]
    for b, a in zip(batched, alone, strict=True):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_torch_rows_equal_each_path_alone(arch, smol_tokenizer):
    model = tiny_model(arch, len(smol_tokenizer))
    check_rows_equal_alone(torch_brute_force, torch_brute_force_one_by_one, model, len(smol_tokenizer))


@pytest.mark.mlx
@pytest.mark.skipif(not mlx_available(), reason="mlx and mlx-lm are not installed (pip install 'pcd-llm[mlx]')")
@pytest.mark.parametrize("arch", ARCHS)
def test_mlx_rows_equal_each_path_alone(arch, smol_tokenizer, tmp_path):
    _, plain = load_mlx_twin(save_tiny(tiny_model(arch, len(smol_tokenizer)), smol_tokenizer, tmp_path), smol_tokenizer)
    check_rows_equal_alone(mlx_brute_force, mlx_brute_force_one_by_one, plain, len(smol_tokenizer))
