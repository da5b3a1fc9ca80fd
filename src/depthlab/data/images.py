"""Images for vision transformers: four sources, one layout, a seeded resumable sampler.

Where the images come from depends on `paths` (at most one path):
  none                scikit-learn's handwritten digits (1,797 real 8x8 grey images shipped with the package)
  a folder            ImageFolder layout, root/<class>/<image files>; class ids are the sorted class-folder names.
                      With train/ and val/ (or test/) subfolders, each in that layout, those are the splits.
                      Files that do not decode are skipped and counted.
  a .npz file         arrays x and y, optionally x_val and y_val (the validation split) and classes (the names)
  a CIFAR-10 folder   the python-pickle batches (data_batch_1..5 train, test_batch validation), or the folder
                      holding cifar-10-batches-py/

Every image becomes float32 (channels, image_size, image_size) with pixel values in [0, 1]: grey is replicated to
RGB, RGB becomes grey by luminance, and the picture is resized bilinearly (antialiased when shrinking). A source
without a validation split holds out every val_period-th image, the held-out rule of the text data, so the split
depends on nothing but the order of the images. Both splits are then normalised with the training split's
per-channel mean and std.

ImageSampler draws the images in the one seeded, resumable order of every sampler (depthlab.data.dataset.SeededOrder).
"""

from __future__ import annotations

import io
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from depthlab import UserError
from depthlab.data.dataset import OrderedSampler, SeededOrder
from depthlab.data.tokens import is_val, val_period

__all__ = ["ImageData", "build_image_data", "fit_images", "ImageSampler", "eval_image_batches"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
LUMA = (0.299, 0.587, 0.114)  # ITU-R 601-2, the weights PIL's convert("L") uses
CIFAR_SUBFOLDER = "cifar-10-batches-py"
CHUNK = 2048  # images converted at a time: bounds the memory of the full-resolution float copy


@dataclass
class ImageData:
    train_x: np.ndarray  # (N, C, H, W) float32, normalised with the training split's per-channel mean / std
    train_y: np.ndarray  # (N,) int64 class ids
    val_x: np.ndarray
    val_y: np.ndarray
    classes: list[str]  # class names, index = class id
    source: str  # one line: where the images came from, how many, which split rule
    mean: list[float]  # per channel, of the resized training images with pixel values in [0, 1]
    std: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def channels(self) -> int:
        return self.train_x.shape[1]

    @property
    def image_size(self) -> int:
        return self.train_x.shape[2]


@dataclass
class SourceImages:
    """A source's images, converted and resized but neither split (if it has no split of its own) nor normalised."""

    train: tuple[np.ndarray, np.ndarray]
    val: tuple[np.ndarray, np.ndarray] | None  # None: hold out every val_period-th image
    classes: list[str]
    origin: str  # where from, e.g. "CIFAR-10 at data/cifar-10-batches-py"
    split: str = ""  # the source's own split rule, if it has one
    skipped: list[Path] | None = None  # unreadable image files


def one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


# --- conversion -------------------------------------------------------------------------------------------------


def resize(t: torch.Tensor, size: int) -> torch.Tensor:
    h, w = t.shape[-2:]
    if (h, w) == (size, size):
        return t
    return F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False, antialias=h > size or w > size)


def fit_images(x: np.ndarray, divisor: float, image_size: int, channels: int) -> np.ndarray:
    """(N, 1 or 3, H, W) pixels / divisor (into [0, 1]) as float32 (N, channels, image_size, image_size)."""
    out = np.empty((len(x), channels, image_size, image_size), dtype=np.float32)
    luma = torch.tensor(LUMA).view(1, 3, 1, 1)
    for i in range(0, len(x), CHUNK):
        t = torch.from_numpy(np.array(x[i:i + CHUNK], dtype=np.float32)) / divisor
        if channels == 1 and t.shape[1] == 3:
            t = (t * luma).sum(1, keepdim=True)
        out[i:i + CHUNK] = resize(t, image_size).expand(-1, channels, -1, -1).numpy()
    return out


MAX_CLASSES = 100_000  # ImageNet-21k has 21,841; a label of 10^9 would build a billion class names


def labels_of(y: np.ndarray, n: int, where: str) -> np.ndarray:
    """y as int64 class ids, one per image: integer-valued and non-negative."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or len(y) != n:
        raise UserError(f"{where}: labels of shape {y.shape} for {n} images; give one class id per image")
    integral = np.issubdtype(y.dtype, np.integer) or (
        np.issubdtype(y.dtype, np.floating) and bool(np.all(np.isfinite(y) & (y == np.round(y)))))
    if not integral:
        raise UserError(f"{where}: labels must be integer class ids, got dtype {y.dtype}")
    if n and y.min() < 0:
        raise UserError(f"{where}: labels must be class ids >= 0, found {int(y.min())}")
    if n and y.max() >= MAX_CLASSES:
        raise UserError(f"{where}: a label of {int(y.max()):,} means {int(y.max()) + 1:,} classes; at most "
                        f"{MAX_CLASSES:,} are supported (class ids count from 0)")
    return y.astype(np.int64)


# --- sources ----------------------------------------------------------------------------------------------------


def digits(image_size: int, channels: int) -> SourceImages:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise UserError("the built-in digits need scikit-learn (pip install scikit-learn), or give image data "
                        "with data.paths") from None
    d = load_digits()
    x = fit_images(d.images[:, None], 16.0, image_size, channels)  # pixel values 0..16
    return SourceImages((x, d.target.astype(np.int64)), None, [str(c) for c in d.target_names],
                  "scikit-learn handwritten digits (8x8 grey)")


def as_nchw(x: np.ndarray, where: str) -> np.ndarray:
    """(N, H, W), (N, H, W, C) or (N, C, H, W) with C 1 or 3 as an (N, C, H, W) view; channels-last wins a tie."""
    if x.ndim == 3:
        return x[:, None]
    if x.ndim == 4 and x.shape[3] in (1, 3):
        return x.transpose(0, 3, 1, 2)
    if x.ndim == 4 and x.shape[1] in (1, 3):
        return x
    raise UserError(f"{where}: images must be (N, H, W), (N, H, W, C) or (N, C, H, W) with 1 or 3 channels, "
                    f"got shape {x.shape}")


def pixel_divisor(x: np.ndarray, where: str) -> float:
    """255 for integer pixels 0..255, 1 for float pixels in [0, 1]; anything else is refused."""
    if np.issubdtype(x.dtype, np.integer):
        if x.size and (x.min() < 0 or x.max() > 255):
            raise UserError(f"{where}: integer pixels must be 0..255, found {x.min()}..{x.max()}")
        return 255.0
    if np.issubdtype(x.dtype, np.floating):
        if x.size and not (np.isfinite(x).all() and x.min() >= 0 and x.max() <= 1 + 1e-6):
            raise UserError(f"{where}: float pixels must be finite and in [0, 1], found {x.min()}..{x.max()}; "
                            f"divide by 255 or save uint8")
        return 1.0
    raise UserError(f"{where}: pixels must be uint8 (0..255) or float ([0, 1]), got dtype {x.dtype}")


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays x, y and, if present, x_val, y_val, classes, read without unpickling anything."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(6)
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    if magic[:4] != b"PK\x03\x04" and magic != b"\x93NUMPY":  # np.load takes anything else for a pickle
        raise UserError(f"{path}: not an .npz archive (its first bytes are {magic!r}); save images with "
                        "numpy.savez(path, x=images, y=labels)")
    try:
        f = np.load(path, allow_pickle=False)
        if not isinstance(f, np.lib.npyio.NpzFile):
            raise ValueError("a single .npy array, not an .npz archive")
        with f:
            return {k: f[k] for k in ("x", "y", "x_val", "y_val", "classes") if k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise UserError(f"{path}: not a readable .npz of plain arrays ({one_line(e)})") from None


def npz_split(arrays: dict, xk: str, yk: str, path: Path, image_size: int, channels: int) -> tuple:
    where = f"{path} [{xk}]"
    x = as_nchw(arrays[xk], where)
    y = labels_of(arrays[yk], len(x), f"{path} [{yk}]")
    return fit_images(x, pixel_divisor(x, where), image_size, channels), y


def npz(path: Path, image_size: int, channels: int) -> SourceImages:
    arrays = read_npz(path)
    if "x" not in arrays or "y" not in arrays:
        raise UserError(f"{path}: an image .npz needs arrays x (images) and y (labels); it has {sorted(arrays)}")
    if ("x_val" in arrays) != ("y_val" in arrays):
        raise UserError(f"{path}: give both x_val and y_val, or neither")
    train = npz_split(arrays, "x", "y", path, image_size, channels)
    val = npz_split(arrays, "x_val", "y_val", path, image_size, channels) if "x_val" in arrays else None
    labels = np.concatenate([train[1]] + ([val[1]] if val else []))
    n_classes = int(labels.max()) + 1 if len(labels) else 0
    if "classes" in arrays:
        classes = [str(c) for c in np.asarray(arrays["classes"]).reshape(-1)]
        if len(classes) < n_classes:
            raise UserError(f"{path}: {len(classes)} class names but labels go up to {n_classes - 1}")
    else:
        classes = [str(c) for c in range(n_classes)]
    return SourceImages(train, val, classes, f"{path} (.npz)", "validation = x_val / y_val" if val else "")


class ArraysOnly(pickle.Unpickler):
    """CIFAR-10's pickles hold dicts, lists, bytes and numpy arrays: any other global (code to run) is refused."""

    ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")} | {
        (f"{np_core}.{module}", name) for np_core in ("numpy.core", "numpy._core")
        for module, name in (("multiarray", "_reconstruct"), ("numeric", "_frombuffer"))}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def unpickle(path: Path, keys: tuple[bytes, ...]) -> dict:
    try:
        d = ArraysOnly(io.BytesIO(path.read_bytes()), encoding="bytes").load()
    except Exception as e:  # whatever a damaged or foreign pickle raises, the file is not a CIFAR-10 batch
        raise UserError(f"{path}: not a CIFAR-10 python batch ({one_line(e)})") from None
    if not isinstance(d, dict) or not all(k in d for k in keys):
        raise UserError(f"{path}: not a CIFAR-10 python batch (a dict with {', '.join(map(repr, keys))})")
    return d


def cifar_folder(path: Path) -> Path | None:
    """The folder holding batches.meta: `path` itself or its cifar-10-batches-py/; None if neither."""
    return next((d for d in (path, path / CIFAR_SUBFOLDER) if (d / "batches.meta").is_file()), None)


def cifar_batches(files: list[Path], image_size: int, channels: int) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for f in files:
        d = unpickle(f, (b"data", b"labels"))
        data = np.asarray(d[b"data"], dtype=np.uint8)
        if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise UserError(f"{f}: CIFAR-10 data must be (N, 3072) uint8, got shape {data.shape}")
        xs.append(fit_images(data.reshape(-1, 3, 32, 32), 255.0, image_size, channels))
        ys.append(labels_of(np.asarray(d[b"labels"]), len(data), str(f)))
    return np.concatenate(xs), np.concatenate(ys)


def cifar(folder: Path, image_size: int, channels: int) -> SourceImages:
    train_files = sorted(folder.glob("data_batch_*"), key=lambda p: p.name.rpartition("_")[2].zfill(9))
    if not train_files or not (folder / "test_batch").is_file():
        raise UserError(f"{folder}: a CIFAR-10 folder needs data_batch_1..5 and test_batch next to batches.meta")
    names = [n.decode() if isinstance(n, bytes) else str(n)
             for n in unpickle(folder / "batches.meta", (b"label_names",))[b"label_names"]]
    train = cifar_batches(train_files, image_size, channels)
    val = cifar_batches([folder / "test_batch"], image_size, channels)
    if max(train[1].max(initial=0), val[1].max(initial=0)) >= len(names):
        raise UserError(f"{folder}: labels beyond the {len(names)} label_names of batches.meta")
    return SourceImages(train, val, names, f"CIFAR-10 at {folder}", "validation = test_batch")


def read_image(path: Path, image_size: int, channels: int) -> np.ndarray | None:
    """One image file as float32 (channels, image_size, image_size), or None if it does not decode."""
    try:
        with Image.open(path) as img:
            a = np.asarray(img.convert("L" if channels == 1 else "RGB"))  # PIL: luminance, or grey replicated
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None
    return fit_images(a[None, None] if a.ndim == 2 else a.transpose(2, 0, 1)[None], 255.0, image_size, channels)[0]


def class_folders(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def read_class_folders(root: Path, classes: list[str], image_size: int, channels: int) -> tuple:
    """Every image file of root/<class>/ (sub-folders included), in sorted order; and the files that failed."""
    images, labels, skipped = [], [], []
    for label, name in enumerate(classes):
        files = sorted(p for p in (root / name).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        for f in files:
            a = read_image(f, image_size, channels)
            if a is None:
                skipped.append(f)
            else:
                images.append(a)
                labels.append(label)
    if not images:
        raise UserError(f"{root}: no readable images ({', '.join(IMAGE_SUFFIXES)}) in its class folders "
                        f"{', '.join(classes)} ({len(skipped)} unreadable)")
    return (np.stack(images), np.array(labels, dtype=np.int64)), skipped


def split_folders(root: Path) -> tuple[Path, Path | None]:
    """root/train and root/val (or root/test) when both exist; else root alone, with no split of its own."""
    val = next((root / n for n in ("val", "test") if (root / n).is_dir()), None)
    return (root / "train", val) if val and (root / "train").is_dir() else (root, None)


def image_folder(root: Path, image_size: int, channels: int) -> SourceImages:
    train_root, val_root = split_folders(root)
    classes = class_folders(train_root)
    if not classes:
        raise UserError(f"{train_root}: no class folders; expected the ImageFolder layout "
                        f"<folder>/<class>/<image files>")
    train, skipped = read_class_folders(train_root, classes, image_size, channels)
    val, split = None, ""
    if val_root:
        unknown = sorted(set(class_folders(val_root)) - set(classes))
        if unknown:
            raise UserError(f"{val_root}: class folders {', '.join(unknown)} are not in {train_root}")
        val, more = read_class_folders(val_root, classes, image_size, channels)
        skipped, split = skipped + more, f"validation = {val_root.name}/"
    return SourceImages(train, val, classes, f"{root} (image folders)", split, skipped)


# --- the splits -------------------------------------------------------------------------------------------------


def load(paths: list[str], image_size: int, channels: int) -> SourceImages:
    if len(paths) > 1:
        raise UserError(f"give one image source (a folder, a .npz file or a CIFAR-10 folder), got {len(paths)} "
                        f"paths: {' '.join(paths)}")
    if not paths:
        return digits(image_size, channels)
    path = Path(paths[0]).expanduser()
    if not path.exists():
        raise UserError(f"{path}: no such file or folder")
    if path.is_file():
        if path.suffix.lower() != ".npz":
            raise UserError(f"{path}: an image data file must be a .npz with arrays x and y (or give a folder)")
        return npz(path, image_size, channels)
    folder = cifar_folder(path)
    return cifar(folder, image_size, channels) if folder else image_folder(path, image_size, channels)


def hold_out(x: np.ndarray, y: np.ndarray, val_fraction: float) -> tuple[tuple, tuple, str]:
    """The text data's held-out rule over image indices: deterministic, independent of any seed."""
    if not 0 < val_fraction < 1:
        raise UserError(f"data.val_fraction must be between 0 and 1 to hold out validation images, got {val_fraction}")
    period = val_period(val_fraction)
    val = is_val(np.arange(len(x)), period)
    return (x[~val], y[~val]), (x[val], y[val]), f"1 in {period} images held out for validation"


def normalise(train_x: np.ndarray, val_x: np.ndarray) -> tuple[list[float], list[float]]:
    """Both splits, in place, with the training split's per-channel mean and std; and those statistics."""
    mean = train_x.mean(axis=(0, 2, 3), dtype=np.float64)
    squares = sum(((train_x[i:i + CHUNK] - mean[:, None, None]) ** 2).sum(axis=(0, 2, 3))
                  for i in range(0, len(train_x), CHUNK))
    std = np.sqrt(squares / (train_x.size // train_x.shape[1]))
    if (std < 1e-6).any():
        raise UserError(f"the training images are constant in channel(s) {np.flatnonzero(std < 1e-6).tolist()}; "
                        f"there is nothing to normalise or learn")
    for x in (train_x, val_x):
        x -= mean.astype(np.float32)[:, None, None]
        x /= std.astype(np.float32)[:, None, None]
    return mean.tolist(), std.tolist()


def skipped_note(loaded: SourceImages) -> str:
    """'; skipped 2 unreadable files (the first of them)', or nothing."""
    skipped = loaded.skipped or []
    if not skipped:
        return ""
    more = ", ..." if len(skipped) > 1 else ""
    return f"; skipped {len(skipped)} unreadable file{'s' if len(skipped) > 1 else ''} ({skipped[0]}{more})"


def build_image_data(paths: list[str], image_size: int, channels: int, val_fraction: float) -> ImageData:
    """The images of `paths` (see the module docstring) as normalised float32 train / validation splits."""
    if channels not in (1, 3):
        raise UserError(f"model.channels must be 1 (grey) or 3 (RGB) for image data, got {channels}")
    if image_size < 1:
        raise UserError(f"model.image_size must be at least 1, got {image_size}")
    loaded = load(paths, image_size, channels)
    (train_x, train_y), split = loaded.train, loaded.split
    if loaded.val is None:
        (train_x, train_y), (val_x, val_y), split = hold_out(train_x, train_y, val_fraction)
    else:
        val_x, val_y = loaded.val
    if not len(train_x) or not len(val_x):
        raise UserError(f"{loaded.origin}: {len(train_x)} training and {len(val_x)} validation images; both "
                        f"splits need at least one image (give more images or another data.val_fraction)")
    if len(loaded.classes) < 2:
        raise UserError(f"{loaded.origin}: one class ({loaded.classes[0] if loaded.classes else 'none'}); a "
                        "classifier needs images of at least two (image folders: one sub-folder per class)")
    mean, std = normalise(train_x, val_x)
    source = (f"{loaded.origin}: {len(train_x)} train / {len(val_x)} validation images, "
              f"{len(loaded.classes)} classes, {channels}x{image_size}x{image_size}; {split}{skipped_note(loaded)}")
    return ImageData(train_x, train_y, val_x, val_y, loaded.classes, source, mean, std)


# --- batches ----------------------------------------------------------------------------------------------------


class ImageSampler(OrderedSampler):
    """Yields (images, labels) batches in the SeededOrder of the images (epoch after epoch, per rank, resumable):
    a resumed run sees exactly the images it would have seen, on any world size."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        self.order = SeededOrder(len(x), batch_size, seed, rank, world_size, name="image", same="images",
                                 images=len(x))
        if len(x) != len(y):
            raise ValueError(f"{len(x)} images but {len(y)} labels")
        if len(x) < 1:
            raise UserError("no training images to sample from")
        self.x, self.y = x, y

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.order.next()
        return (torch.from_numpy(np.asarray(self.x[idx], dtype=np.float32)),
                torch.from_numpy(np.asarray(self.y[idx], dtype=np.int64)))


def eval_image_batches(x: np.ndarray, y: np.ndarray, batch_size: int):
    """Every validation image once, in order, as (images float32 (B, C, H, W), labels int64 (B,)) batches."""
    for start in range(0, len(x), batch_size):
        yield (torch.from_numpy(np.array(x[start:start + batch_size], dtype=np.float32)),
               torch.from_numpy(np.array(y[start:start + batch_size], dtype=np.int64)))
