"""The variance recursion of the paper (arXiv 2502.05795, section 3), iterated to large depth.

Lemma 3.2 (Pre-LN) states the recursion in Θ-form, sigma^2_{l+1} = sigma^2_l * Θ(1 + 1/sigma_l): a Pre-LN
block adds an update whose size does not depend on the stream (the norm divides it out), so the relative
growth per block is 1/sigma_l. With LayerNorm Scaling the update is multiplied by l^(-p) (p = 1/2), so the
relative growth is 1/(l^p sigma_l). We make the hidden constant explicit as c and iterate

    Pre-LN:  sigma^2_{l+1} = sigma^2_l (1 + c / sigma_l)
    LNS:     sigma^2_{l+1} = sigma^2_l (1 + c / (l^p sigma_l))

from sigma_1 = sigma0. The paper's bounds follow from the same recursion: Pre-LN lies between Θ(L) (every factor at
least 1 + c/sigma_l with sigma_l growing) and Θ(exp L) (every factor at most 1 + c/sigma0); LNS between Θ(L) and
Θ(L^(2-ε)). Iterated, Pre-LN grows as L^2 / 4 (sigma_l grows by about c/2 a block) and LNS as about L, so the
question of exponential vs polynomial is about how much the bound on the growth factor allows, and the plot shows
both trajectories against both bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Simulation:
    depth: np.ndarray  # l = 1..L
    pre: np.ndarray  # sigma^2_l, Pre-LN
    lns: np.ndarray  # sigma^2_l, LNS
    pre_lower: np.ndarray  # Θ(L): sigma0^2 + c sigma0 (l - 1)
    pre_upper: np.ndarray  # Θ(exp L): sigma0^2 (1 + c / sigma0)^(l - 1), inf where it overflows
    lns_upper: np.ndarray  # Θ(L^(2-ε)) drawn at ε = 0: sigma0^2 l^2
    c: float
    sigma0: float
    power: float

    def growth_exponent(self, which: str) -> float:
        """Slope of log sigma^2 against log l over the last decade of depth (2: quadratic, 1: linear)."""
        v = getattr(self, which)
        L = len(v)
        lo = max(1, L // 10)
        return float(np.polyfit(np.log(self.depth[lo - 1:]), np.log(v[lo - 1:]), 1)[0])

    def summary(self) -> list[str]:
        L = len(self.depth)
        rows = [f"variance recursion, c={self.c}, sigma0={self.sigma0}, LNS power {self.power}"]
        for l in sorted({10, 100, L} & set(range(1, L + 1))):
            up = self.pre_upper[l - 1]
            rows.append(f"  depth {l:5d}: Pre-LN {self.pre[l - 1]:12.4g}   LNS {self.lns[l - 1]:10.4g}   "
                        f"Pre-LN bounds [{self.pre_lower[l - 1]:.4g}, {up:.4g}]")
        rows.append(f"  growth exponent (log-log slope): Pre-LN {self.growth_exponent('pre'):.3f}, "
                    f"LNS {self.growth_exponent('lns'):.3f}")
        return rows


def iterate(depth: int, c: float, sigma0: float, power: float | None) -> np.ndarray:
    """sigma^2_l for l = 1..depth; power None is Pre-LN, else LNS with l^(-power)."""
    v = np.empty(depth)
    v[0] = sigma0 ** 2
    for l in range(1, depth):
        s = math.sqrt(v[l - 1])
        damp = 1.0 if power is None else l ** -power
        v[l] = v[l - 1] * (1.0 + c * damp / s)
    return v


def simulate(depth: int = 1000, c: float = 1.0, sigma0: float = 1.0, power: float = 0.5) -> Simulation:
    l = np.arange(1, depth + 1, dtype=np.float64)
    log_upper = 2 * math.log(sigma0) + (l - 1) * math.log1p(c / sigma0)
    upper = np.where(log_upper < 700, np.exp(np.minimum(log_upper, 700)), np.inf)  # beyond float64: inf
    return Simulation(l, iterate(depth, c, sigma0, None), iterate(depth, c, sigma0, power),
                      sigma0 ** 2 + c * sigma0 * (l - 1), upper, sigma0 ** 2 * l ** 2, c, sigma0, power)


PLOT, TABLE = "variance_recursion.png", "variance_recursion.csv"


def is_theory(path: Path) -> bool:
    """A folder `depthlab theory` wrote (the one it may write over)."""
    return path.is_dir() and (path / TABLE).is_file() and {p.name for p in path.iterdir()} <= {PLOT, TABLE}


def write_theory_report(sim: Simulation, out: Path) -> dict[str, Path]:
    from depthlab.plots import pyplot, save_figure

    plt = pyplot()

    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, scale in zip(axes, ["semilog", "loglog"]):
        ax.plot(sim.depth, sim.pre, label="Pre-LN recursion", lw=2)
        ax.plot(sim.depth, sim.lns, label=f"LNS recursion (l^-{sim.power:g})", lw=2)
        ax.plot(sim.depth, sim.pre_lower, "k:", label="Θ(L) lower bound")
        ax.plot(sim.depth, np.where(np.isfinite(sim.pre_upper), sim.pre_upper, np.nan), "r--",
                label="Θ(exp L) Pre-LN upper bound")
        ax.plot(sim.depth, sim.lns_upper, "g--", label="Θ(L^2) LNS upper bound (ε → 0)")
        ax.set_yscale("log")
        if scale == "loglog":
            ax.set_xscale("log")
        top = max(sim.pre.max(), sim.lns_upper.max()) * 10
        ax.set_ylim(sim.sigma0 ** 2 / 2, top)
        ax.set_xlabel("depth l")
        ax.set_ylabel("variance σ²_l")
        ax.grid(alpha=0.3)
        ax.set_title("log-linear axes: exponentials are straight lines" if scale == "semilog" else
                     "log-log axes: powers of L are straight lines", fontsize=9)
    axes[0].legend(fontsize=8)
    plot = save_figure(fig, out / PLOT)
    table = out / TABLE
    np.savetxt(table, np.column_stack([sim.depth, sim.pre, sim.lns, sim.pre_lower, sim.pre_upper, sim.lns_upper]),
               delimiter=",", header="depth,pre_ln,lns,lower_L,pre_upper_exp,lns_upper_L2", comments="")
    return {"plot": plot, "table": table}
