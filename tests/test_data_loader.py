"""The packed loader: windows and targets, determinism, disjoint and complete rank partitioning, exact resume."""

import json

import numpy as np
import pytest
import torch

from depthlab import UserError
from depthlab.data.dataset import PackedSampler, eval_batches, shuffled, windows

SEQ = 4


def stream(n_windows: int, dtype=np.uint16) -> np.ndarray:
    """Tokens 0..n*SEQ: window i starts with token i*SEQ, so a batch names its windows."""
    return np.arange(n_windows * SEQ + 1, dtype=dtype)


def window_ids(x: torch.Tensor) -> list[int]:
    return (x[:, 0] // SEQ).tolist()


def test_windows_and_shifted_targets():
    s = PackedSampler(stream(10), SEQ, batch_size=3, seed=0)
    x, y = s.next_batch()
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (3, SEQ)
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)
    assert torch.equal(x, x[:, :1] + torch.arange(SEQ))  # contiguous, non-overlapping windows
    assert windows(np.zeros(2 * SEQ + 1), SEQ) == 2 and windows(np.zeros(2 * SEQ), SEQ) == 1


def test_every_window_once_per_epoch_and_seeded():
    n = 23
    a = PackedSampler(stream(n), SEQ, batch_size=5, seed=7)
    seen = [w for _ in range(9) for w in window_ids(a.next_batch()[0])]  # 45 windows: epoch 0 then part of 1
    assert sorted(seen[:n]) == list(range(n)) and len(set(seen[n:])) == len(seen[n:])
    assert seen[:n] != list(range(n))  # shuffled
    b = PackedSampler(stream(n), SEQ, batch_size=5, seed=7)
    assert [w for _ in range(9) for w in window_ids(b.next_batch()[0])] == seen
    c = PackedSampler(stream(n), SEQ, batch_size=5, seed=8)
    assert [w for _ in range(9) for w in window_ids(c.next_batch()[0])] != seen


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_are_disjoint_and_complete(world_size):
    n, batch, steps = 30, 2, 5  # world_size * batch * steps == n for world 3; spans a partial epoch for world 2
    ranks = [PackedSampler(stream(n), SEQ, batch, seed=1, rank=r, world_size=world_size) for r in range(world_size)]
    single = PackedSampler(stream(n), SEQ, batch * world_size, seed=1)
    per_rank = [[] for _ in ranks]
    for _ in range(steps):
        parts = [window_ids(r.next_batch()[0]) for r in ranks]
        flat = [w for p in parts for w in p]
        assert len(set(flat)) == len(flat)  # no overlap between ranks
        assert flat == window_ids(single.next_batch()[0])  # together exactly the global batch: no gaps
        for mine, p in zip(per_rank, parts):
            mine += p
    if world_size == 3:  # one epoch exactly: every window read by exactly one rank
        assert sorted(w for mine in per_rank for w in mine) == list(range(n))
        assert all(len(mine) == n // world_size for mine in per_rank)
    with pytest.raises(ValueError):
        PackedSampler(stream(n), SEQ, batch, seed=1, rank=2, world_size=2)


@pytest.mark.parametrize("stop", [0, 3, 4, 11])  # 23 windows / 5 per batch: step 4 crosses the epoch boundary
def test_exact_resume_position(stop):
    tokens = stream(23)
    uninterrupted = PackedSampler(tokens, SEQ, batch_size=5, seed=3)
    expected = [uninterrupted.next_batch() for _ in range(stop + 6)]
    first = PackedSampler(tokens, SEQ, batch_size=5, seed=3)
    for _ in range(stop):
        first.next_batch()
    state = json.loads(json.dumps(first.state_dict()))  # plain JSON survives a checkpoint
    resumed = PackedSampler(tokens, SEQ, batch_size=5, seed=3)
    resumed.load_state_dict(state)
    for want in expected[stop:]:
        got = resumed.next_batch()
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_resume_on_other_world_size_continues_the_global_order():
    tokens = stream(40)
    single = PackedSampler(tokens, SEQ, batch_size=4, seed=2)
    single.next_batch()
    state = single.state_dict()
    expected = window_ids(single.next_batch()[0])
    ranks = [PackedSampler(tokens, SEQ, batch_size=2, seed=2, rank=r, world_size=2) for r in range(2)]
    for r in ranks:
        r.load_state_dict(state)
    assert [w for r in ranks for w in window_ids(r.next_batch()[0])] == expected


def test_resume_on_different_data_is_refused():
    s = PackedSampler(stream(20), SEQ, batch_size=2, seed=0)
    s.next_batch()
    with pytest.raises(UserError, match="windows 20 -> 21"):
        PackedSampler(stream(21), SEQ, batch_size=2, seed=0).load_state_dict(s.state_dict())
    with pytest.raises(UserError, match="seed 0 -> 1"):
        PackedSampler(stream(20), SEQ, batch_size=2, seed=1).load_state_dict(s.state_dict())
    legacy = PackedSampler(stream(20), SEQ, batch_size=2, seed=0)
    legacy.load_state_dict({"epoch": 0, "cursor": 2})  # position-only states still load
    assert torch.equal(legacy.next_batch()[0], s.next_batch()[0])


def test_memory_mapped_tokens(tmp_path):
    stream(50, np.uint32).tofile(tmp_path / "t.bin")
    mm = np.memmap(tmp_path / "t.bin", dtype=np.uint32, mode="r")
    a, b = PackedSampler(mm, SEQ, 4, seed=5), PackedSampler(stream(50), SEQ, 4, seed=5)
    for _ in range(3):
        assert torch.equal(a.next_batch()[0], b.next_batch()[0])


def test_eval_batches_cover_every_window_in_order():
    tokens = stream(11)
    batches = list(eval_batches(tokens, SEQ, batch_size=4))
    assert [len(x) for x, _ in batches] == [4, 4, 3]
    assert [w for x, _ in batches for w in window_ids(x)] == list(range(11))
    assert all(torch.equal(y[:, :-1], x[:, 1:]) for x, y in batches)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 1000, 4097])
def test_shuffled_is_a_permutation(n):
    from depthlab.data.dataset import shuffled

    p = shuffled(np.arange(n), n, seed=0, epoch=0)
    assert sorted(p.tolist()) == list(range(n))
    assert np.array_equal(shuffled(np.arange(3, n), n, 0, 0), p[3:])  # any slice of it, computed alone
    if n >= 64:
        assert not np.array_equal(p, shuffled(np.arange(n), n, seed=0, epoch=1))
        assert abs(np.corrcoef(np.arange(n), p)[0, 1]) < 0.2  # no trace of the input order


def test_shuffled_needs_no_memory_for_a_billion_windows():
    from depthlab.data.dataset import shuffled

    n = 3_000_000_000
    p = shuffled(np.arange(n - 1000, n), n, seed=1, epoch=0)
    assert len(set(p.tolist())) == 1000 and p.min() >= 0 and p.max() < n


def old_order(n: int, batch: int, world: int, rank: int, seed: int, steps: int) -> list[list[int]]:
    """The first `steps` batches of rank `rank` as the samplers drew them before SeededOrder: the global order is
    shuffled(0..n-1, epoch) epoch after epoch, cut into batches of batch * world, rank r taking the r-th slice."""
    flat = np.concatenate([shuffled(np.arange(n), n, seed, e) for e in range(steps * batch * world // n + 1)])
    return [flat[s * batch * world + rank * batch:][:batch].tolist() for s in range(steps)]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_sampler_draws_the_old_order_bitwise(world):
    from depthlab.data.images import ImageSampler
    from depthlab.train.finetune import ExampleSampler

    n, batch, seed, steps = 23, 3, 9, 12  # 36 * world items: across one epoch boundary or more
    for rank in range(world):
        want = old_order(n, batch, world, rank, seed, steps)
        packed = PackedSampler(stream(n), SEQ, batch, seed, rank, world)
        assert [window_ids(packed.next_batch()[0]) for _ in range(steps)] == want
        images = np.arange(n, dtype=np.float32)[:, None, None, None] * np.ones((1, 1, 2, 2), np.float32)
        vision = ImageSampler(images, np.arange(n), batch, seed, rank, world)
        assert [vision.next_batch()[1].tolist() for _ in range(steps)] == want
        rows = np.repeat(np.arange(n, dtype=np.int32), SEQ)  # row i is all i
        examples = ExampleSampler(rows, -rows, SEQ, batch, seed, rank, world)
        got = [examples.next_batch() for _ in range(steps)]
        assert [x[:, 0].tolist() for x, _ in got] == want and all(torch.equal(y, -x) for x, y in got)


def test_old_checkpoint_states_resume_every_sampler():
    """The loader states checkpoints have always stored (these keys, in this order) load and continue the order."""
    from depthlab.data.images import ImageSampler
    from depthlab.train.finetune import ExampleSampler

    n, want = 23, old_order(23, 4, 1, 0, 5, 8)
    old = {"epoch": 0, "cursor": 16, "seed": 5, "windows": n, "seq_len": SEQ}  # 4 batches of 4 drawn
    packed = PackedSampler(stream(n), SEQ, 4, seed=5)
    packed.load_state_dict(json.loads(json.dumps(old)))
    assert [window_ids(packed.next_batch()[0]) for _ in range(4)] == want[4:]
    assert json.dumps(packed.state_dict()) == json.dumps({**old, "epoch": 1, "cursor": 9})
    rows = np.repeat(np.arange(n, dtype=np.int32), SEQ)
    examples = ExampleSampler(rows, rows, SEQ, 4, seed=5)
    examples.load_state_dict(old)
    assert [examples.next_batch()[0][:, 0].tolist() for _ in range(4)] == want[4:]
    assert json.dumps(examples.state_dict()) == json.dumps({**old, "epoch": 1, "cursor": 9})
    old_images = {"epoch": 0, "cursor": 16, "seed": 5, "images": n}
    vision = ImageSampler(np.zeros((n, 1, 2, 2), np.float32), np.arange(n), 4, seed=5)
    vision.load_state_dict(old_images)
    assert [vision.next_batch()[1].tolist() for _ in range(4)] == want[4:]
    assert json.dumps(vision.state_dict()) == json.dumps({**old_images, "epoch": 1, "cursor": 9})
    with pytest.raises(UserError, match=r"the image loader state does not fit this data \(images 23 -> 22\); "
                                        "resume with the same images and seed"):
        ImageSampler(np.zeros((22, 1, 2, 2), np.float32), np.arange(22), 4, seed=5).load_state_dict(old_images)
    with pytest.raises(UserError, match=r"the data loader state does not fit this data \(windows 23 -> 22\); "
                                        "resume with the same data, seq_len and seed"):
        ExampleSampler(rows[:-SEQ], rows[:-SEQ], SEQ, 4, seed=5).load_state_dict(old)


def test_no_sampler_subclasses_another():
    """Each sampler holds a SeededOrder and only gathers its items: its state is the order's, written once
    (OrderedSampler), and none subclasses another sampler."""
    from depthlab.data.dataset import OrderedSampler, SeededOrder
    from depthlab.data.images import ImageSampler
    from depthlab.train.finetune import ExampleSampler

    samplers = (PackedSampler, ImageSampler, ExampleSampler)
    assert all(cls.__bases__ == (OrderedSampler,) for cls in samplers)
    assert not {"state_dict", "load_state_dict"} & {name for cls in samplers for name in vars(cls)}
    assert isinstance(PackedSampler(stream(4), SEQ, 2, seed=0).order, SeededOrder)
