"""A ViT's loss and top-1 accuracy on labelled images: the trainer's validation of an image classifier
(depthlab.train.vision) and `depthlab eval` on a ViT."""

from __future__ import annotations

import torch

from depthlab.data.images import eval_image_batches
from depthlab.device import autocast
from depthlab.progress import progress_bar


@torch.no_grad()
def evaluate_images(model: torch.nn.Module, x, y, batch_size: int, device: torch.device, dtype: str = "fp32",
                    progress: bool = False) -> dict:
    """Mean cross-entropy and top-1 accuracy over every image of (x, y), in order (`progress`: a bar of its
    batches on a terminal)."""
    was_training = model.training
    model.eval()
    loss, correct, n = 0.0, 0, 0
    batches = progress_bar(eval_image_batches(x, y, batch_size), enabled=progress, desc="eval",
                           total=-(-len(y) // batch_size), unit="batch")
    for images, labels in batches:
        images, labels = images.to(device), labels.to(device)
        with autocast(device, dtype):
            logits = model(images).float()
        loss += torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item()
        correct += int((logits.argmax(-1) == labels).sum())
        n += len(labels)
    model.train(was_training)
    return {"val_loss": loss / n, "val_acc": correct / n, "val_images": n}
