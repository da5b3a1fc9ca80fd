"""Training a ViT (model.family=vit) with the same trainer: images and labels instead of token windows.

ImageClassification is the Trainer's task for model.family=vit (depthlab.train.tasks; the Trainer picks it from the
config): the data (depthlab.data.images: scikit-learn's digits when no path is given, an ImageFolder tree, a .npz,
or CIFAR-10's pickles), the sampler (seeded, resumable exactly), and the
validation metrics (mean loss and top-1 accuracy over every held-out image). Everything else (optimizer, schedule,
checkpoints and exact resume, depth monitors, run-directory guarantees) is the Trainer's.
"""

from __future__ import annotations

from depthlab import UserError
from depthlab.data.images import ImageData, ImageSampler, build_image_data
from depthlab.eval.images import evaluate_images
from depthlab.train.tasks import Task


class ImageClassification(Task):
    """Images and labels (depthlab.data.images), mean loss and top-1 accuracy over every held-out image; no
    tokenizer. The checkpoint records the class names and the training split's pixel mean and std."""

    def load_data(self, cfg, tokenizer, progress: bool) -> ImageData:
        m = cfg.model
        data = build_image_data(cfg.data.paths, m.image_size, m.channels, cfg.data.val_fraction)
        if data.num_classes > m.num_classes:
            raise UserError(f"the data has {data.num_classes} classes but model.num_classes is {m.num_classes}; "
                            f"set model.num_classes={data.num_classes}")
        return data

    def data_meta(self, data: ImageData) -> dict:
        return {"train_images": int(len(data.train_y)), "val_images": int(len(data.val_y)),
                "classes": list(data.classes), "pixel_mean": list(data.mean), "pixel_std": list(data.std)}

    def tokens_per_sample(self, cfg) -> int:
        return cfg.model.n_patches + (cfg.model.pool == "cls")

    def sampler(self, cfg, data: ImageData, env) -> ImageSampler:
        tc = cfg.train
        return ImageSampler(data.train_x, data.train_y, tc.batch_size, tc.seed, env.rank, env.world_size)

    def validation(self, cfg, model, data: ImageData, env, device, progress: bool) -> dict:
        tc = cfg.train
        return evaluate_images(model, data.val_x, data.val_y, tc.batch_size, device, tc.dtype)
