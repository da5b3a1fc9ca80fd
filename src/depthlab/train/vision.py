"""Training a ViT (model.arch=vit) with the same trainer: images and labels instead of token windows.

VisionHooks replaces only the Trainer's data hooks (depthlab.train.trainer.VisionTrainer = VisionHooks + Trainer;
`train()` picks it for model.arch=vit): the data (depthlab.data.images: scikit-learn's digits when no
path is given, an ImageFolder tree, a .npz, or CIFAR-10's pickles), the sampler (seeded, resumable exactly), and the
validation metrics (mean loss and top-1 accuracy over every held-out image). Everything else (optimizer, schedule,
checkpoints and exact resume, depth monitors, run-directory guarantees) is the Trainer's.
"""

from __future__ import annotations

import torch

from depthlab import UserError
from depthlab.data.images import ImageData, ImageSampler, build_image_data, eval_image_batches
from depthlab.train.runtime import autocast


class VisionHooks:
    """The Trainer's data hooks for images (a mixin: it uses the Trainer's cfg, env, device, data and model)."""

    def saved_tokenizer(self, ckpt):
        return None  # images need none

    def load_data(self, tokenizer) -> ImageData:
        m = self.cfg.model
        data = build_image_data(self.cfg.data.paths, m.image_size, m.channels, self.cfg.data.val_fraction)
        if data.num_classes > m.num_classes:
            raise UserError(f"the data has {data.num_classes} classes but model.num_classes is {m.num_classes}; "
                            f"set model.num_classes={data.num_classes}")
        return data

    def data_meta(self) -> dict:
        d = self.data
        return {"train_images": int(len(d.train_y)), "val_images": int(len(d.val_y)), "classes": list(d.classes),
                "pixel_mean": list(d.mean), "pixel_std": list(d.std)}

    def tokens_per_sample(self) -> int:
        return self.cfg.model.n_patches + (self.cfg.model.pool == "cls")

    def make_sampler(self):
        tc = self.cfg.train
        return ImageSampler(self.data.train_x, self.data.train_y, tc.batch_size, tc.seed, self.env.rank,
                            self.env.world_size)

    def validation(self) -> dict:
        tc = self.cfg.train
        return evaluate_images(self.model, self.data.val_x, self.data.val_y, tc.batch_size, self.device, tc.dtype)


@torch.no_grad()
def evaluate_images(model: torch.nn.Module, x, y, batch_size: int, device: torch.device, dtype: str = "fp32") -> dict:
    """Mean cross-entropy and top-1 accuracy over every image of (x, y), in order."""
    was_training = model.training
    model.eval()
    loss, correct, n = 0.0, 0, 0
    for images, labels in eval_image_batches(x, y, batch_size):
        images, labels = images.to(device), labels.to(device)
        with autocast(device, dtype):
            logits = model(images).float()
        loss += torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item()
        correct += int((logits.argmax(-1) == labels).sum())
        n += len(labels)
    model.train(was_training)
    return {"val_loss": loss / n, "val_acc": correct / n, "val_images": n}
