"""The models: a LLaMA decoder, and a Vision Transformer, whose blocks follow the chosen normalization scheme.

    parts.py        the parts: RMSNorm, DyT, RoPE, attention, the gated MLP, the residual add, the GPAS gate
    schemes.py      the scheme registry: one block class per scheme (PreLNBlock and its variants), declaring
                    everything else asks about it (norm scale, default init, GPAS, HF export / patching)
    init.py         weight initialisation methods by name (`model.init`), the default taken from the scheme
    transformer.py  Transformer: embedding -> blocks -> final norm -> LM head (logits, or the loss); loss_of(any LM);
                    build_model(config): the Transformer, or the ViT for model.family=vit
    vit.py          ViT: patches -> the same scheme blocks (vit family: LayerNorm, GELU, no RoPE) -> class head
    families/       the model families (llama, qwen2, olmo, olmo2, vit, ...), one module each: parts, HF
                    mapping, import rules, FLOPs, validation, presets (families/base.py: the spec)
    apply.py        apply_scheme / load_pretrained: a scheme (LNS) patched onto any HF decoder, saved folded
    blocks.py       find any model's decoder blocks and their norms without knowing its family
    lora.py         LoRA through peft: adapters on a model's linear layers, their checkpoint names
    meta.py         build_on_meta / materialize: a model built on the meta device, given storage later, with
                    the weights an eager build draws (FSDP's shards, layer-by-layer analysis's files)
    loss.py         lm_loss, and linear_cross_entropy: LM head + cross-entropy by chunks, never the full logits
    validate.py     validate(config): every setting checked, against the registries too (exit 2 in the CLI)
"""

from depthlab.model.loss import linear_cross_entropy, lm_loss
from depthlab.model.schemes import SCHEMES
from depthlab.model.transformer import Transformer, build_model, loss_of
from depthlab.model.vit import ViT

__all__ = ["SCHEMES", "Transformer", "ViT", "build_model", "linear_cross_entropy", "lm_loss", "loss_of"]
