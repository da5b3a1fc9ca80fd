"""The usefulness of a block: how much the loss rises when the block is replaced by the least-squares linear map
from its input to its output. A block a linear map replaces at no cost does no nonlinear work ("When does sparsity
mitigate the curse of depth", ICML 2026, scores layers this way).

The map is affine, y ≈ [h, 1] W, fitted per block with torch.linalg.lstsq in float64 on the real tokens of fit
windows: calibration text read after the evaluation windows, never scored. `fit_residual` is how much of the
block's update the map misses on those tokens, ‖[h, 1] W − y‖ / ‖y − h‖ (0: the block is affine there).
"""

from __future__ import annotations

import warnings

import torch


class LinearMap:
    """h -> [h, 1] W, in float64, returned in h's dtype."""

    def __init__(self, W: torch.Tensor, fit_residual: float, tokens: int):
        self.W, self.fit_residual, self.tokens = W, fit_residual, tokens

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        W = self.W.to(h.device)
        return (h.double() @ W[:-1] + W[-1]).to(h.dtype)


@torch.no_grad()
def fit_linear(h: torch.Tensor, y: torch.Tensor) -> LinearMap:
    """The least-squares affine map from the rows of h (N, d) to the rows of y (N, d)."""
    N, d = h.shape
    if N <= d:
        warnings.warn(f"the linear maps are fitted on {N} tokens for {d + 1} coefficients per output: they "
                      "interpolate the fit windows; give more --linear-fit-tokens", stacklevel=2)
    X = torch.cat([h.double(), torch.ones(N, 1, dtype=torch.float64, device=h.device)], 1)
    W = torch.linalg.lstsq(X, y.double()).solution
    update = (y.double() - h.double()).norm()
    miss = (X @ W - y.double()).norm()
    return LinearMap(W.cpu(), float(miss / update) if update > 0 else 0.0, N)


def real_tokens(states: list[torch.Tensor], masks: list[torch.Tensor]) -> torch.Tensor:
    """(N, d): the rows of real tokens of several batches' states."""
    return torch.cat([h[m] for h, m in zip(states, masks)])
