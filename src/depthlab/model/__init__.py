from depthlab.model.schemes import SCHEMES
from depthlab.model.transformer import Transformer, lm_loss

__all__ = ["SCHEMES", "Transformer", "lm_loss"]
