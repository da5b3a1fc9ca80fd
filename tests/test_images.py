"""Image data: the four sources read from real files, conversion and resizing, the held-out rule, normalisation,
the seeded resumable sampler with rank slicing, evaluation batches, and one-line errors for user mistakes."""

import json
import os
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from depthlab import UserError
from depthlab.data.images import ImageSampler, build_image_data, eval_image_batches

CIFAR_NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]


def pixels(data, x: np.ndarray) -> np.ndarray:
    """Normalised images back to pixel values in [0, 1]."""
    mean, std = (np.array(v, dtype=np.float32)[:, None, None] for v in (data.mean, data.std))
    return x * std + mean


def held_out(n: int, period: int) -> np.ndarray:
    return np.arange(n) % period == period // 2


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    return load_digits()


# --- scikit-learn digits (no paths) ------------------------------------------------------------------------------


def test_digits_split_every_fifth_image_and_normalised(digits):
    data = build_image_data([], image_size=8, channels=1, val_fraction=0.2)
    val = held_out(1797, 5)
    assert len(data.train_x) + len(data.val_x) == 1797 and len(data.val_x) == 359
    assert data.train_x.shape == (1438, 1, 8, 8) and data.val_x.shape == (359, 1, 8, 8)
    assert data.train_x.dtype == np.float32 and data.train_y.dtype == np.int64
    assert data.classes == [str(i) for i in range(10)] and data.num_classes == 10
    assert (data.channels, data.image_size) == (1, 8)
    assert not hasattr(data, "tokenizer")  # images have none (ImageClassification.tokenizer says so)
    np.testing.assert_allclose(data.train_x.mean(axis=(0, 2, 3)), [0.0], atol=1e-5)
    np.testing.assert_allclose(data.train_x.std(axis=(0, 2, 3)), [1.0], atol=1e-4)
    raw = digits.images / 16
    np.testing.assert_allclose(data.mean, [raw[~val].mean()], rtol=1e-6)
    np.testing.assert_allclose(data.std, [raw[~val].std()], rtol=1e-6)
    np.testing.assert_allclose(pixels(data, data.val_x)[:, 0], raw[val], atol=1e-5)  # 8x8 at size 8: unchanged
    np.testing.assert_array_equal(data.val_y, digits.target[val])
    np.testing.assert_array_equal(data.train_y, digits.target[~val])
    assert "1438 train / 359 validation" in data.source and "1 in 5" in data.source and "\n" not in data.source


def test_digits_resized_to_16_and_replicated_to_rgb(digits):
    data = build_image_data([], image_size=16, channels=3, val_fraction=0.2)
    assert data.train_x.shape == (1438, 3, 16, 16) and data.val_x.shape == (359, 3, 16, 16)
    assert np.array_equal(data.train_x[:, 0], data.train_x[:, 1]) and np.array_equal(data.train_x[:, 0],
                                                                                      data.train_x[:, 2])
    raw = digits.images[~held_out(1797, 5)][:5] / 16
    up = F.interpolate(torch.tensor(raw, dtype=torch.float32)[:, None], size=(16, 16), mode="bilinear")
    got = pixels(data, data.train_x[:5])
    np.testing.assert_allclose(got[:, :1], up.numpy(), atol=1e-5)
    np.testing.assert_allclose(got[:, 0, 0, 0], raw[:, 0, 0], atol=1e-5)  # bilinear keeps the corner pixel


# --- ImageFolder ---------------------------------------------------------------------------------------------------


def colour(k: int) -> tuple[int, int, int]:
    return (10 * k + 5, 250 - 12 * k, (37 * k) % 256)


def write_class_folders(root, classes, per_class, size=(12, 10), mode="RGB", first=0) -> list:
    """Solid-colour PNGs root/<class>/img<j>.png, colour(k) for the k-th image overall; their colours."""
    colours = []
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for j in range(per_class):
            col = colour(first + len(colours))
            Image.new(mode, size, col if mode == "RGB" else col[0]).save(root / c / f"img{j}.png")
            colours.append(col)
    return colours


def test_image_folder_split_by_the_held_out_rule_with_unreadable_files_skipped(tmp_path):
    colours = np.array(write_class_folders(tmp_path, ["dog", "cat", "emu"], 5), dtype=np.float32) / 255
    (tmp_path / "cat" / "broken.png").write_bytes(b"not an image at all")
    png = (tmp_path / "dog" / "img0.png").read_bytes()
    (tmp_path / "emu" / "cut.png").write_bytes(png[:40])  # a truncated real PNG
    (tmp_path / "dog" / "notes.txt").write_text("not an image file: ignored, not counted")
    (tmp_path / ".cache").mkdir()  # hidden: not a class
    data = build_image_data([str(tmp_path)], image_size=4, channels=3, val_fraction=0.2)
    assert data.classes == ["cat", "dog", "emu"]  # sorted folder names: cat 0, dog 1, emu 2
    # reading order: cat (written 5..9), dog (0..4), emu (10..14); every 5th from index 2 held out
    order = np.r_[5:10, 0:5, 10:15]
    val = held_out(15, 5)
    assert data.train_x.shape == (12, 3, 4, 4) and data.val_x.shape == (3, 3, 4, 4)
    np.testing.assert_array_equal(data.val_y, [0, 1, 2])
    np.testing.assert_array_equal(data.train_y, np.repeat([0, 1, 2], 4))
    expect = np.broadcast_to(colours[order][:, :, None, None], (15, 3, 4, 4))
    np.testing.assert_allclose(pixels(data, data.val_x), expect[val], atol=1e-5)
    np.testing.assert_allclose(pixels(data, data.train_x), expect[~val], atol=1e-5)
    assert "skipped 2 unreadable files" in data.source and "12 train / 3 validation" in data.source
    grey = build_image_data([str(tmp_path)], image_size=4, channels=1, val_fraction=0.2)
    luma = colours[order] @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
    np.testing.assert_allclose(pixels(grey, grey.val_x)[:, 0, 0, 0], luma[val], atol=1 / 255)


@pytest.mark.parametrize("val_name", ["val", "test"])
def test_image_folder_with_its_own_train_and_val_folders(tmp_path, val_name):
    write_class_folders(tmp_path / "train", ["a", "b"], 3, size=(9, 9), mode="L")
    write_class_folders(tmp_path / val_name, ["b"], 2, size=(9, 9), mode="L", first=6)  # val need not hold every class
    data = build_image_data([str(tmp_path)], image_size=9, channels=3, val_fraction=0.5)
    assert data.classes == ["a", "b"]
    assert data.train_x.shape == (6, 3, 9, 9) and data.val_x.shape == (2, 3, 9, 9)  # val_fraction unused
    np.testing.assert_array_equal(data.train_y, [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(data.val_y, [1, 1])
    grey_values = np.array([colour(6)[0], colour(7)[0]], dtype=np.float32) / 255
    np.testing.assert_allclose(pixels(data, data.val_x), np.broadcast_to(grey_values[:, None, None, None],
                                                                         (2, 3, 9, 9)), atol=1e-5)
    assert f"validation = {val_name}/" in data.source


# --- .npz ---------------------------------------------------------------------------------------------------------


def npz_images(layout: str) -> tuple[np.ndarray, np.ndarray]:
    """20 random 6x6 images in `layout`, and the same as (N, C, H, W) pixel values in [0, 1]."""
    base = np.random.default_rng(0).integers(0, 256, size=(20, 6, 6, 3), dtype=np.uint8)
    nchw = base.transpose(0, 3, 1, 2) / 255
    return {"nhw": (base[..., 0], nchw[:, :1]), "nhwc": (base, nchw),
            "nchw": (np.ascontiguousarray(base.transpose(0, 3, 1, 2)), nchw),
            "nhwc-float": ((base / 255).astype(np.float32), nchw), "nhwc-float64": (base / 255, nchw)}[layout]


@pytest.mark.parametrize("layout", ["nhw", "nhwc", "nchw", "nhwc-float", "nhwc-float64"])
def test_npz_in_each_layout(tmp_path, layout):
    x, expect = npz_images(layout)
    f = tmp_path / "images.npz"
    np.savez(f, x=x, y=np.arange(20) % 4)
    channels = expect.shape[1]
    data = build_image_data([str(f)], image_size=6, channels=channels, val_fraction=0.2)
    val = held_out(20, 5)
    assert data.train_x.shape == (16, channels, 6, 6) and data.val_x.shape == (4, channels, 6, 6)
    np.testing.assert_allclose(pixels(data, data.val_x), expect[val], atol=1e-5)
    np.testing.assert_allclose(data.mean, expect[~val].mean(axis=(0, 2, 3)), rtol=1e-5)
    np.testing.assert_array_equal(data.val_y, [2, 3, 0, 1])
    assert data.classes == ["0", "1", "2", "3"]
    if channels == 3:  # RGB to grey by luminance
        grey = build_image_data([str(f)], image_size=6, channels=1, val_fraction=0.2)
        luma = np.einsum("nchw,c->nhw", expect[val], [0.299, 0.587, 0.114])
        np.testing.assert_allclose(pixels(grey, grey.val_x)[:, 0], luma, atol=1e-5)


def test_npz_with_its_own_validation_split_and_class_names(tmp_path):
    rng = np.random.default_rng(1)
    x, x_val = rng.integers(0, 256, (10, 5, 5), dtype=np.uint8), rng.integers(0, 256, (4, 5, 5), dtype=np.uint8)
    f = tmp_path / "split.npz"
    np.savez(f, x=x, y=np.arange(10) % 3, x_val=x_val, y_val=np.array([2, 1, 0, 2]),
             classes=np.array(["zero", "one", "two"]))
    data = build_image_data([str(f)], image_size=5, channels=1, val_fraction=0.2)
    assert len(data.train_x) == 10 and len(data.val_x) == 4
    assert data.classes == ["zero", "one", "two"]
    np.testing.assert_allclose(pixels(data, data.val_x)[:, 0], x_val / 255, atol=1e-5)
    np.testing.assert_array_equal(data.val_y, [2, 1, 0, 2])
    assert "x_val" in data.source


def test_shrinking_is_antialiased(tmp_path):
    """A 12x12 checkerboard shrunk to 4x4 averages to grey; plain bilinear would sample pure black and white."""
    board = np.indices((12, 12)).sum(0) % 2
    amplitude = np.array([60, 120, 180, 240])
    f = tmp_path / "boards.npz"
    np.savez(f, x=(board * amplitude[:, None, None]).astype(np.uint8), y=np.array([0, 1, 0, 1]))
    data = build_image_data([str(f)], image_size=4, channels=1, val_fraction=0.5)
    got = pixels(data, data.train_x)[:, 0]  # train: boards 0 and 2
    half = amplitude[[0, 2]] / 255 / 2
    assert np.abs(got - half[:, None, None]).max() < 0.05 * half.max()


# --- CIFAR-10 -----------------------------------------------------------------------------------------------------


def write_cifar(folder, per_batch: int = 2, test: int = 3) -> tuple[np.ndarray, list, np.ndarray, list]:
    """The python-pickle layout: batches.meta, data_batch_1..5, test_batch; the train and test data and labels."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(2)
    meta = {b"num_cases_per_batch": per_batch, b"label_names": CIFAR_NAMES, b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta))
    batches = {}
    for name, n in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", test)]:
        batch = {b"batch_label": name.encode(), b"labels": rng.integers(0, 10, n).tolist(),
                 b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"filenames": [b"x.png"] * n}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        batches[name] = batch
    train = [batches[f"data_batch_{i}"] for i in range(1, 6)]
    return (np.concatenate([b[b"data"] for b in train]), sum((b[b"labels"] for b in train), []),
            batches["test_batch"][b"data"], batches["test_batch"][b"labels"])


@pytest.mark.parametrize("given", ["batches folder", "its parent"])
def test_cifar10_pickles(tmp_path, given):
    folder = tmp_path / "cifar-10-batches-py"
    x, y, x_test, y_test = write_cifar(folder)
    path = folder if given == "batches folder" else tmp_path
    data = build_image_data([str(path)], image_size=32, channels=3, val_fraction=0.5)
    assert data.classes == [n.decode() for n in CIFAR_NAMES]
    assert data.train_x.shape == (10, 3, 32, 32) and data.val_x.shape == (3, 3, 32, 32)
    np.testing.assert_array_equal(data.train_y, y)
    np.testing.assert_array_equal(data.val_y, y_test)
    np.testing.assert_allclose(pixels(data, data.train_x), x.reshape(-1, 3, 32, 32) / 255, atol=1e-5)
    np.testing.assert_allclose(pixels(data, data.val_x)[:, 2, 31, 31], x_test[:, 3071] / 255, atol=1e-5)  # last B
    assert "validation = test_batch" in data.source
    small = build_image_data([str(path)], image_size=16, channels=1, val_fraction=0.5)
    assert small.train_x.shape == (10, 1, 16, 16) and small.val_x.shape == (3, 1, 16, 16)


class RunsCode:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.remove, (self.target,))


def test_cifar_pickle_that_would_run_code_is_refused(tmp_path):
    folder = tmp_path / "cifar"
    write_cifar(folder)
    sentinel = tmp_path / "keep-me"
    sentinel.write_text("still here")
    (folder / "data_batch_3").write_bytes(pickle.dumps({b"data": RunsCode(str(sentinel)), b"labels": [0]}))
    with pytest.raises(UserError, match="data_batch_3: not a CIFAR-10 python batch") as e:
        build_image_data([str(folder)], image_size=8, channels=3, val_fraction=0.2)
    assert sentinel.exists() and "\n" not in str(e.value)


# --- the sampler and evaluation batches ----------------------------------------------------------------------------


def numbered(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n 1x2x2 images; image i is filled with the value i and labelled i."""
    return np.repeat(np.arange(n, dtype=np.float32), 4).reshape(n, 1, 2, 2), np.arange(n, dtype=np.int64)


def test_sampler_visits_every_image_once_per_epoch_in_a_seeded_order():
    x, y = numbered(23)
    a = ImageSampler(x, y, batch_size=5, seed=7)
    batches = [a.next_batch() for _ in range(9)]  # 45 images: epoch 0, then 22 of epoch 1
    images, labels = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    assert images.dtype == torch.float32 and labels.dtype == torch.int64 and images.shape == (45, 1, 2, 2)
    assert torch.equal(images[:, 0, 0, 0].long(), labels)  # each image with its own label
    seen = labels.tolist()
    assert sorted(seen[:23]) == list(range(23)) and seen[:23] != list(range(23))
    assert len(set(seen[23:])) == 22 and seen[23:] != seen[:22]  # a new order in epoch 1
    b = ImageSampler(x, y, batch_size=5, seed=7)
    assert [b.next_batch()[1].tolist() for _ in range(9)] == [t[1].tolist() for t in batches]
    c = ImageSampler(x, y, batch_size=5, seed=8)
    assert [c.next_batch()[1].tolist() for _ in range(9)] != [t[1].tolist() for t in batches]


def test_sampler_resumed_from_state_continues_bitwise():
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((37, 3, 4, 4)).astype(np.float32), rng.integers(0, 10, 37)
    a = ImageSampler(x, y, batch_size=4, seed=11)
    for _ in range(5):
        a.next_batch()
    state = json.loads(json.dumps(a.state_dict()))  # plain data, as a checkpoint stores it
    assert state == {"epoch": 0, "cursor": 20, "seed": 11, "images": 37}
    b = ImageSampler(x, y, batch_size=4, seed=11)
    b.load_state_dict(state)
    for _ in range(12):  # across the epoch boundary
        (xa, ya), (xb, yb) = a.next_batch(), b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert a.state_dict() == b.state_dict() and a.state_dict()["epoch"] == 1


def test_two_ranks_take_disjoint_slices_of_the_single_process_batch():
    x, y = numbered(30)
    whole = ImageSampler(x, y, batch_size=6, seed=5)
    ranks = [ImageSampler(x, y, batch_size=3, seed=5, rank=r, world_size=2) for r in range(2)]
    for _ in range(8):
        wx, wy = whole.next_batch()
        (x0, y0), (x1, y1) = (r.next_batch() for r in ranks)
        assert not set(y0.tolist()) & set(y1.tolist())
        assert torch.equal(torch.cat([x0, x1]), wx) and torch.equal(torch.cat([y0, y1]), wy)


def test_sampler_refuses_a_state_from_other_data_or_seed():
    x, y = numbered(10)
    state = ImageSampler(x, y, batch_size=2, seed=1).state_dict()
    for sampler in (ImageSampler(x, y, batch_size=2, seed=2), ImageSampler(x[:9], y[:9], batch_size=2, seed=1)):
        with pytest.raises(UserError, match="does not fit") as e:
            sampler.load_state_dict(state)
        assert "\n" not in str(e.value)


def test_eval_batches_cover_every_validation_image_once_in_order():
    x, y = numbered(10)
    batches = list(eval_image_batches(x, y, batch_size=4))
    assert [len(b[1]) for b in batches] == [4, 4, 2]
    assert torch.equal(torch.cat([b[0] for b in batches]), torch.from_numpy(x))
    assert torch.cat([b[1] for b in batches]).tolist() == list(range(10))
    assert batches[0][0].dtype == torch.float32 and batches[0][1].dtype == torch.int64


# --- user mistakes -------------------------------------------------------------------------------------------------


def npz_file(tmp_path, **arrays):
    f = tmp_path / "bad.npz"
    np.savez(f, **arrays)
    return [str(f)]


def written(path, content: bytes):
    path.write_bytes(content)
    return [str(path)]


def folders(tmp_path, *files):
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".png"):
            Image.new("L", (4, 4), 7).save(tmp_path / name)
        else:
            (tmp_path / name).write_text("text")
    return [str(tmp_path)]


IMGS = np.random.default_rng(4).integers(0, 256, (6, 4, 4), dtype=np.uint8)
ERRORS = {  # name: (paths given tmp_path, overrides of image_size / channels / val_fraction, message)
    "missing path": (lambda t: [str(t / "nope")], {}, "no such file or folder"),
    "two paths": (lambda t: [str(t), str(t)], {}, "give one image source"),
    "empty folder": (lambda t: [str(t)], {}, "no class folders"),
    "loose images": (lambda t: folders(t, "x.png"), {}, "no class folders"),
    "no images": (lambda t: folders(t, "a/readme.txt"), {}, "no readable images"),
    "unknown val class": (lambda t: folders(t, "train/a/x.png", "val/b/x.png"), {}, "b are not in"),
    "text file": (lambda t: written(t / "x.txt", b"hello"), {}, "must be a .npz"),
    "not a zip": (lambda t: written(t / "x.npz", b"garbage"), {}, "not an .npz archive"),
    "no labels": (lambda t: npz_file(t, x=IMGS), {}, "needs arrays x"),
    "x_val only": (lambda t: npz_file(t, x=IMGS, y=np.zeros(6, int), x_val=IMGS), {}, "both x_val and y_val"),
    "label count": (lambda t: npz_file(t, x=IMGS, y=np.zeros(5, int)), {}, "shape \\(5,\\) for 6 images"),
    "negative label": (lambda t: npz_file(t, x=IMGS, y=np.array([0, 1, -1, 0, 1, 0])), {}, ">= 0"),
    "fractional label": (lambda t: npz_file(t, x=IMGS, y=np.full(6, 1.5)), {}, "integer class ids"),
    "five channels": (lambda t: npz_file(t, x=np.zeros((6, 5, 4, 5), np.uint8), y=np.zeros(6, int)), {},
                      "1 or 3 channels"),
    "float 0..255": (lambda t: npz_file(t, x=IMGS.astype(np.float32), y=np.zeros(6, int)), {}, "in \\[0, 1\\]"),
    "object classes": (lambda t: npz_file(t, x=IMGS, y=np.zeros(6, int), classes=np.array([{}], dtype=object)), {},
                       "not a readable .npz"),
    "too few names": (lambda t: npz_file(t, x=IMGS, y=np.arange(6), classes=np.array(["a"])), {}, "class names"),
    "empty split": (lambda t: npz_file(t, x=IMGS[:1], y=np.zeros(1, int)), {"val_fraction": 0.5}, "both splits"),
    "constant images": (lambda t: npz_file(t, x=np.zeros((6, 4, 4), np.uint8), y=np.arange(6) % 2), {}, "constant"),
    "no test_batch": (lambda t: (write_cifar(t / "c"), os.remove(t / "c" / "test_batch"), [str(t / "c")])[-1], {},
                      "test_batch"),
    "two channels": (lambda t: [], {"channels": 2}, "1 \\(grey\\) or 3"),
    "val_fraction 0": (lambda t: npz_file(t, x=IMGS, y=np.zeros(6, int)), {"val_fraction": 0.0}, "between 0 and 1"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_user_mistakes_raise_one_line_user_errors(tmp_path, case):
    make_paths, overrides, message = ERRORS[case]
    args = {"image_size": 4, "channels": 1, "val_fraction": 0.2} | overrides
    with pytest.raises(UserError, match=message) as e:
        build_image_data(make_paths(tmp_path), **args)
    assert "\n" not in str(e.value)
