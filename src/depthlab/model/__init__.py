"""The model: a LLaMA decoder whose blocks follow the chosen normalization scheme.

    llama.py        the parts: RMSNorm, DyT, RoPE, attention, SwiGLU MLP, the residual add, the GPAS gate
    schemes.py      the scheme registry: one block class per scheme (PreLNBlock and its variants), declaring
                    everything else asks about it (norm scale, default init, GPAS, HF export / patching)
    init.py         weight initialisation methods by name (`model.init`), the default taken from the scheme
    transformer.py  Transformer: embedding -> blocks -> final norm -> LM head (logits, or the loss); loss_of(any LM)
    loss.py         lm_loss, and linear_cross_entropy: LM head + cross-entropy by chunks, never the full logits
    validate.py     validate(config): every setting checked, against the registries too (exit 2 in the CLI)
"""

from depthlab.model.loss import linear_cross_entropy, lm_loss
from depthlab.model.schemes import SCHEMES
from depthlab.model.transformer import Transformer, loss_of

__all__ = ["SCHEMES", "Transformer", "linear_cross_entropy", "lm_loss", "loss_of"]
