"""The model: a LLaMA decoder whose blocks follow the chosen normalization scheme.

    llama.py        the parts: RMSNorm, DyT, RoPE, attention, SwiGLU MLP, the residual add, the GPAS gate
    schemes.py      the scheme registry: one block class per scheme (PreLNBlock and its variants), declaring
                    everything else asks about it (norm scale, default init, GPAS, HF export / patching)
    init.py         weight initialisation methods by name (`model.init`), the default taken from the scheme
    transformer.py  Transformer: embedding -> blocks -> final norm -> LM head; lm_loss
    validate.py     validate(config): every setting checked, against the registries too (exit 2 in the CLI)
"""

from depthlab.model.schemes import SCHEMES
from depthlab.model.transformer import Transformer, lm_loss

__all__ = ["SCHEMES", "Transformer", "lm_loss"]
