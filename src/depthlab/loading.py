"""A depthlab checkpoint as a model: the model its config builds, holding its weights, a LoRA fine-tune's adapters
merged in (W + (alpha / r) B A, as peft's merge computes it), so that every command reading a checkpoint (eval,
export, analyze, fine-tuning from it) sees a plain model. `load_model` takes any model path, a Hugging Face
model directory included, with what every command needs around it (`Loaded`: tokenizer, windows, logits); the
LoRA adapters themselves (adding them, their live names) are depthlab.model.lora's.

A LoRA run's checkpoint stores the frozen base weights under their own names and each adapter as
`<module>.lora_A.weight` and `<module>.lora_B.weight` (see depthlab.model.lora).
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import logging
import os
import shutil
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from depthlab import UserError
from depthlab.checkpoint import CONFIG, TOKENIZER, CheckpointMeta, load_verified, load_weights, warn
from depthlab.config import Config
from depthlab.model import build_model
from depthlab.model.lora import merged
from depthlab.paths import EXPORT_INFO, Kind, find_checkpoint, model_path, read_json

DTYPES = ("float32", "bfloat16", "float16")


def torch_dtype(name: str):
    if name not in DTYPES:
        raise UserError(f"unknown dtype {name!r}; valid: {', '.join(DTYPES)}")
    return getattr(torch, name)


def load_checkpoint(path: str | Path, device: str = "cpu") -> tuple:
    """(model, config, CheckpointMeta) from a checkpoint or a run directory; the model is rebuilt with its saved
    scheme."""
    ckpt = find_checkpoint(path)
    meta = load_verified(ckpt)
    cfg = Config.load(ckpt / CONFIG)
    model = build_model(cfg.model, init=False).to(device)
    missing, unexpected = model.load_state_dict(plain_weights(ckpt, device), strict=False)
    missing = [k for k in missing if not (cfg.model.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise UserError(f"checkpoint {ckpt} does not match its config: missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]}")
    return model, cfg, meta


def plain_weights(ckpt, device: str = "cpu") -> dict:
    """A checkpoint's weights as a plain model of its config takes them: a LoRA run's adapters merged."""
    state = load_weights(ckpt, device)
    lora = Config.load(Path(ckpt) / CONFIG).train.lora
    return merged(state, lora) if lora.rank else state


@dataclass
class Loaded:
    """A model loaded from any model path, with what every command needs around it."""

    model: object  # a depthlab Transformer, or a transformers PreTrainedModel (kind HF)
    tokenizer: object | None  # tokenizers.Tokenizer (depthlab; None without tokenizer.json), transformers' (HF)
    kind: Kind  # CHECKPOINT or HF
    path: Path  # the checkpoint or HF directory that was loaded
    cfg: object | None = None  # the depthlab Config (None for HF)
    meta: CheckpointMeta | None = None  # the checkpoint's (None for HF)
    device_map: dict | None = None  # where a model placed by a device map has each module (None: on one device)
    device: torch.device | None = None  # where its inputs go: the one device, or a placed model's main device

    @property
    def context(self) -> int:
        """The longest window the model takes."""
        return self.cfg.model.max_seq_len if self.cfg is not None else hf_context(self.model.config)

    @property
    def seq_len(self) -> int:
        """The default window: the run's own (a depthlab export records its run's), or for other HF models their
        context up to 512."""
        if self.cfg is not None:
            return self.cfg.data.seq_len
        info = read_json(self.path / EXPORT_INFO) if self.kind is Kind.HF else None
        window = info.get("seq_len") if isinstance(info, dict) else None
        return min(window, self.context) if isinstance(window, int) and window > 0 else min(512, self.context)

    def lm(self):
        """The model as a module from token ids (B, T) to logits (B, T, V)."""
        return self.model if self.kind is Kind.CHECKPOINT else Logits(self.model)

    def fast_tokenizer(self):
        """The tokenizer as a `tokenizers.Tokenizer` (the packing and batch encoding use its batch API)."""
        if self.tokenizer is None:
            raise UserError(f"{self.path} has no {TOKENIZER}")
        return getattr(self.tokenizer, "backend_tokenizer", self.tokenizer)


class Logits(torch.nn.Module):
    """An HF causal LM returning bare logits, like depthlab's Transformer."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        # in the mode of the model it wraps, so that a caller restoring "its" mode (evaluate) changes nothing:
        # transformers re-kernelizes a model at each change of mode, which fails on one offloaded to disk
        self.training = inner.training

    def forward(self, ids):
        return self.inner(input_ids=ids, use_cache=False).logits


def load_model(path: str | Path, device: str = "cpu", dtype: str = "float32", hf: bool = True,
               trust_remote_code: bool = False, warn: Callable[[str], None] = warn,
               device_map: str | dict | None = None, max_memory: dict | None = None,
               offload_folder: str | Path | None = None) -> Loaded:
    """A model from any model path (see model_path), on `device` in `dtype`, in eval mode; or, with `device_map`,
    read into host memory and spread over devices by `place` (then `device` stays "cpu")."""
    if device_map is None and (max_memory is not None or offload_folder is not None):
        raise UserError("max_memory and offload_folder place a model by a device map; give device_map too")
    if device_map is not None and str(device) != "cpu":
        raise UserError(f"a device map places the model itself; device {device!r} has no effect beside it")
    if device_map is not None:
        need_accelerate()
    kind, p = model_path(path, hf=hf, warn=warn)
    if kind is Kind.HF:
        loaded = _load_hf(p, device, dtype, trust_remote_code)
    else:
        model, cfg, meta = load_checkpoint(p, device=str(device))
        from depthlab.data.tokenizer import load_tokenizer

        tok = load_tokenizer(p / TOKENIZER) if (p / TOKENIZER).is_file() else None
        loaded = Loaded(model.to(torch_dtype(dtype)).eval(), tok, Kind.CHECKPOINT, p, cfg, meta)
    if device_map is None:
        loaded.device = torch.device(device)
    else:
        loaded.device_map, loaded.device = place(loaded.model, device_map, max_memory, offload_folder)
    return loaded


# --- placing a model over several devices (accelerate's big-model dispatch) ----------------------------------

DEVICE_MAPS = ("auto", "balanced", "sequential")  # the strategies transformers' from_pretrained takes ("auto" is
# "balanced")


def need_accelerate() -> None:
    if importlib.util.find_spec("accelerate") is None:
        raise UserError("a device map places the model with `accelerate`, which is not installed (pip install "
                        "accelerate)")


def add_placement_options(p, same: str) -> None:
    """--device-map, --max-memory and --offload-folder on a command's parser (`same`: what the user gets from a
    placed model, said in the help)."""
    from depthlab.flags import only_with
    from depthlab.ownership import FOLDER, INPUT

    p.add_argument("--device-map", type=INPUT, metavar="auto|balanced|sequential|FILE.json", help="place the model "
                   "over several "
                   "devices with accelerate (when one device is too small): a strategy, as transformers' "
                   "from_pretrained takes it, or a JSON file {module name: device} (a GPU index, cpu, disk); the "
                   f"model is read into host memory first; {same}")
    p.add_argument("--max-memory", nargs="+", type=str, metavar="DEVICE=SIZE", help="with a --device-map strategy: "
                   "what each "
                   "device may hold, e.g. 0=20GiB 1=20GiB cpu=60GiB (default: their free memory)")
    p.add_argument("--offload-folder", type=FOLDER, metavar="DIR", help="with --device-map: where the weights the map "
                   "puts on disk are written (a fresh folder inside DIR, removed at exit; a killed run's, by the next "
                   "run offloading into DIR)")
    only_with(p, "--device-map", "--max-memory", "--offload-folder")


def placed_device(args, layer_by_layer: bool = False) -> str:
    """--device as load_model takes it: "cpu" under --device-map (the model is read into host memory, then placed),
    which refuses an explicit --device and --layer-by-layer in one line."""
    from depthlab.device import resolve_device

    if args.device_map is None:
        return str(resolve_device(args.device, "--device"))
    for flag, given, what in (("--device", args.device != "auto", "puts it on one device"),
                              ("--layer-by-layer", layer_by_layer, "streams it one block at a time instead")):
        if given:
            raise UserError(f"--device-map places the whole model over devices; {flag} {what}: drop one of them")
    return "cpu"


PLACEMENT = ("device_map", "max_memory", "offload_folder")  # load_model's names for what `placement` returns


def placement(args) -> tuple:
    """(device map, max memory, offload folder) from the options, as load_model takes them, checked before any
    model loads."""
    if args.device_map is None:
        return None, None, None
    need_accelerate()
    device_map = read_device_map(args.device_map)
    if args.max_memory and isinstance(device_map, dict):
        raise UserError(f"--max-memory sizes the devices of a --device-map strategy; the map {args.device_map} names "
                        "each module's device itself: drop --max-memory")
    return device_map, args.max_memory and read_max_memory(args.max_memory), args.offload_folder


def read_device_map(text: str) -> str | dict:
    """--device-map's value: a strategy (DEVICE_MAPS), or a JSON file holding {module name: device}."""
    if text in DEVICE_MAPS:
        return text
    try:
        got = json.loads(Path(text).read_text())
    except (OSError, ValueError, RecursionError) as e:
        why = getattr(e, "strerror", None) or getattr(e, "msg", None) or str(e)
        raise UserError(f"--device-map {text}: neither {', '.join(DEVICE_MAPS)} nor a readable JSON file ({why})") \
            from None
    if not isinstance(got, dict) or not got:
        raise UserError(f"--device-map {text}: the file must hold a JSON object {{module name: device}}")
    return got


def read_max_memory(items: list[str]) -> dict:
    """--max-memory's DEVICE=SIZE items (0=20GiB cpu=60GiB) as accelerate's max_memory {0: "20GiB", "cpu": ...}:
    each device once, each GPU one this machine has."""
    from accelerate.utils import convert_file_size_to_int

    memory, given = {}, {}
    for item in items:
        key, eq, size = item.partition("=")
        key = key.removeprefix("cuda:")
        if not eq or not (key.isdigit() or key in ("cpu", "mps", "disk")):
            raise UserError(f"--max-memory {item!r}: give DEVICE=SIZE, the device a GPU index (0, cuda:1), cpu, mps "
                            "or disk, e.g. 0=20GiB cpu=60GiB")
        try:
            if convert_file_size_to_int(size) <= 0:
                raise ValueError
        except ValueError:
            raise UserError(f"--max-memory {item!r}: {size!r} is not a size (e.g. 20GiB, 500MB, 10**9 bytes as "
                            "1000000000)") from None
        device = _device(int(key), "--max-memory") if key.isdigit() else key
        if device in given:
            raise UserError(f"--max-memory: {given[device]!r} and {item!r} size the same device; give each device "
                            "once")
        memory[device], given[device] = size, item
    return memory


def _device(value, where: str):
    """A device map's value as accelerate takes it: a GPU index, cpu, disk, or a device name; checked here."""
    from depthlab.device import resolve_device

    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        resolve_device(f"cuda:{value}", where, "use cpu or disk")
        return value
    if value in ("cpu", "disk"):
        return value
    if isinstance(value, str) and value.split(":")[0] in ("cuda", "mps", "xpu"):
        return str(resolve_device(value, where, "use cpu or disk"))
    raise UserError(f"{where}: {value!r} is not a device (a GPU index, cpu, disk, cuda:N)")


def _checked_map(model, device_map: dict) -> dict:
    modules = [n for n, _ in model.named_modules()]
    names = {*modules, *(n for n, _ in model.named_parameters()), *(n for n, _ in model.named_buffers())}
    unknown = [k for k in device_map if k not in names]
    if unknown:
        raise UserError(f"device map: {type(model).__name__} has no module {unknown[0]!r} (its module names look "
                        f"like {', '.join(modules[1:4])})")
    return {k: _device(v, f"device map entry {k!r}") for k, v in device_map.items()}


def place(model, device_map: str | dict, max_memory: dict | None = None,
          offload_folder: str | Path | None = None) -> tuple[dict, torch.device]:
    """Spread `model`, held in host memory, over devices as accelerate's dispatch does (hooks move each module's
    inputs to its device; what the map puts on "cpu" beside GPUs, or on "disk", is loaded at each forward); a
    strategy is turned into a map by accelerate from the free memory, or `max_memory`, as transformers'
    from_pretrained does. Returns (the map, the main device: where the inputs go)."""
    need_accelerate()
    from accelerate import dispatch_model
    from accelerate.utils import get_balanced_memory, get_max_memory, infer_auto_device_map, offload_state_dict

    from depthlab.model.blocks import find_blocks

    block = type(find_blocks(model)[1][0]).__name__
    if isinstance(device_map, str):
        whole = {*(getattr(model, "_no_split_modules", None) or ()), block}
        try:
            memory = (get_max_memory(dict(max_memory or {}) or None) if device_map == "sequential" else
                      get_balanced_memory(model, dict(max_memory or {}) or None, no_split_module_classes=list(whole)))
            device_map = infer_auto_device_map(model, max_memory=memory, no_split_module_classes=list(whole))
        except ValueError as e:
            raise UserError(f"--max-memory: {str(e).splitlines()[0]}") from None
    else:
        if max_memory:
            raise UserError("max_memory sizes the devices of a device-map strategy; a map naming each module's "
                            "device does not use it")
        device_map = _checked_map(model, device_map)
    devices = list(device_map.values())
    if "disk" in devices and offload_folder is None:
        raise UserError("the device map puts weights on disk: give an offload folder (--offload-folder DIR)")
    main = next((d for d in devices if d not in ("cpu", "disk")), "cpu")
    # the live tensors, not state_dict(): a model under a patched scheme folds its scale into the saved norm weights
    live = {k: t.detach() for k, t in [*model.named_buffers(), *model.named_parameters(remove_duplicate=False)]}

    def part(where: str) -> dict:
        names = [k for k, d in device_map.items() if d == where]
        return {k: t for k, t in live.items() if any(n in ("", k) or k.startswith(n + ".") for n in names)}

    folder = None
    if "disk" in devices:  # a fresh folder of our own: accelerate would reuse any offloaded weights it finds
        folder = str(offload_copy(model, Path(offload_folder)))
        offload_state_dict(folder, part("disk"))
    said = logging.getLogger("accelerate.big_modeling")  # "some parameters are on the meta device": by design
    level, _ = said.level, said.setLevel(logging.ERROR)
    try:
        # an offloaded block loads all its weights on entry: depthlab's blocks read their Linears' weights directly
        dispatch_model(model, device_map, main_device=main, offload_dir=folder, preload_module_classes=[block],
                       state_dict=part("cpu") if main != "cpu" and "cpu" in devices else None)
    except ValueError as e:  # a map that leaves some weights without a device
        raise UserError(f"device map: {str(e).splitlines()[0]}") from None
    finally:
        said.setLevel(level)
    return dict(device_map), torch.device(f"cuda:{main}" if isinstance(main, int) else main)


_OFFLOADS = itertools.count()  # a process may place several models into one folder


def offload_copy(model, parent: Path) -> Path:
    """A fresh folder inside `parent` for the weights a device map puts on disk, as large as those weights; it goes
    with `model` (or at exit). It is written as a writer's temporary sibling under its own lock (depthlab.ownership):
    a run killed before it could remove it (SIGKILL) leaves a dead writer's leftover, which the next run that
    offloads into `parent` clears when it takes its lock, as every writer clears those beside its output."""
    from depthlab.ownership import locked

    role = "a folder for the weights the device map puts on disk"
    if parent.exists() and not parent.is_dir():
        raise UserError(f"--offload-folder {parent} is a file; give {role}")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--offload-folder {parent}: cannot create it ({e.strerror or e}); give {role}") from None
    name = f"depthlab-offload-{os.getpid()}-{next(_OFFLOADS)}"
    held = contextlib.ExitStack()
    held.enter_context(locked(parent / name, "offloading", label="--offload-folder: "))
    folder = parent.resolve() / f".{name}.tmp-{os.getpid()}"
    held.callback(shutil.rmtree, folder, True)  # before the lock goes
    weakref.finalize(model, held.close)
    folder.mkdir()
    return folder


def quiet_transformers() -> None:
    """Commands print their own one-line summaries; transformers' per-load progress bars only add noise."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def _load_hf(p: Path, device: str, dtype: str, trust_remote_code: bool) -> Loaded:
    if importlib.util.find_spec("transformers") is None:
        raise UserError(f"{p} is a Hugging Face model directory; loading it needs `transformers` "
                        "(pip install depthlab[hf])")
    from depthlab.model.apply import load_pretrained

    quiet_transformers()
    # load_pretrained: a model saved after apply_scheme comes back with its scheme; a plain one as plain HF
    model = load_pretrained(str(p), dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code)
    return Loaded(model.to(device).eval(), load_hf_tokenizer(p, trust_remote_code), Kind.HF, p)


def load_hf_tokenizer(p: Path, trust_remote_code: bool = False):
    """The transformers tokenizer saved with an HF model."""
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(str(p), trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError) as e:
        raise UserError(f"{p}: no usable tokenizer in the model directory ({str(e).splitlines()[0]})") from None


def hf_context(config) -> int:
    """The longest window an HF model takes, from its config."""
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 512
