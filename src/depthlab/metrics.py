"""The per-layer metrics, as streaming accumulators over calibration batches: one definition for `analyze`
(depthlab.analysis) and the training monitor (depthlab.train.callbacks). All statistics are accumulated in fp32/fp64
over real tokens only (the mask), whatever the model's dtype.

Definitions (h_l is the residual stream entering block l, h_L the raw output of the last block, before the final
norm; m_l the stream between block l's attention and MLP halves; "token" means a real, non-pad token):

- variance(l)      Var of all entries of h_l over tokens and channels: E[x^2] - E[x]^2.
- rms(l)           sqrt(E[x^2]).
- max_abs(l)       max |h_l| with its channel, position and token id (massive activations, Sun et al. 2024);
                   max_over_rms = max_abs / rms.
- update_ratio(l)  E_t ||h_{l+1} - h_l|| / ||h_l||: how much block l moves the stream, the per-token ratio averaged
                   over tokens (`token_update_ratio`; the training monitor's depth/update_ratio is the same quantity,
                   over the first micro-batch of a monitored step).
- attn_ratio(l)    E_t ||m_l - h_l|| / ||h_l||;  mlp_ratio(l)  E_t ||h_{l+1} - m_l|| / ||m_l||.
- angular distance d(l, m) = arccos(cos(h_l, h_m)) / pi, per token, then averaged: over the last real token of
                   every sequence ("last", as Gromov et al. 2024) and over all tokens ("all"). Computed as
                   2 atan2(||u - v||, ||u + v||) / pi on unit vectors u, v: the same angle, but with no acos domain
                   to leave (nothing to clamp) and full precision near 0, where acos(1 - eps) loses half the digits.
- block influence  BI(l) = 1 - E_t cos(h_l, h_{l+1})  (ShortGPT, Men et al. 2024).
- attn / MLP similarity  E_t cos(h_l, m_l) and E_t cos(m_l, h_{l+1}); importance = 1 - similarity
                   ("What Matters in Transformers", He et al. 2024).
- logit lens       p_l = softmax(head(final_norm(h_l))); KL(l) = E_t KL(p_L || p_l); CE(l) = E_t -log p_l(next token).
- massive positions (`massive_positions`): the tokens whose stream norm ||h_l|| exceeds FACTOR x the median norm
                   of the batch's real tokens at that state, at any state l (a few tokens, often the first and
                   delimiters, carry norms 100x the rest: Sun et al. 2024). variance_rest, rms_rest and the adjacent
                   angular distance over all tokens (`angular_adjacent_rest`) are then read over the other tokens,
                   so the growth of the stream is not the growth of those few.
"""

from __future__ import annotations

import math

import torch

EPS = 1e-12
MASSIVE_LISTED = 200  # massive positions named in the results (all are counted)


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine along the last dim, in fp32; clamped into [-1, 1] so rounding cannot push acos out of its domain."""
    a, b = a.float(), b.float()
    c = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(EPS)
    return c.clamp(-1.0, 1.0)


def angular_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    u, v = unit(a), unit(b)
    return 2 * torch.atan2((u - v).norm(dim=-1), (u + v).norm(dim=-1)) / math.pi


def token_update_ratio(h_in: torch.Tensor, h_out: torch.Tensor) -> torch.Tensor:
    """||h_out - h_in|| / ||h_in|| per token (the last dim is the channel), in fp32: update_ratio before the mean."""
    a, b = h_in.float(), h_out.float()
    return (b - a).norm(dim=-1) / a.norm(dim=-1).clamp_min(EPS)


def update_ratios(hidden: list[torch.Tensor]) -> list[float]:
    """update_ratio(l) for each block from the N + 1 stream states of `Transformer(..., return_hidden=True)`."""
    return [token_update_ratio(a, b).mean().item() for a, b in zip(hidden[:-1], hidden[1:])]


@torch.no_grad()
def init_update_ratios(cfg, seed: int = 0, batch: int = 4, seq_len: int = 64) -> list[float]:
    """Each block's update ratio at initialisation, on random tokens: whether a configuration starts in the
    regime where blocks speak (about 0.27 per block for the paper's LLaMA-130M) or nearly silent."""
    from depthlab.model import Transformer

    torch.manual_seed(seed)
    model = Transformer(cfg).eval()
    idx = torch.randint(cfg.vocab_size, (batch, min(seq_len, cfg.max_seq_len)))
    return update_ratios(model(idx, return_hidden=True)[1])


def unit(h: torch.Tensor) -> torch.Tensor:
    h = h.float()
    return h / h.norm(dim=-1, keepdim=True).clamp_min(EPS)


def pairwise_angular(units: torch.Tensor) -> torch.Tensor:
    """units: (S, N, d) unit vectors of S stream states for N tokens -> (S, S) distance summed over tokens."""
    rows = [2 * torch.atan2((u - units).norm(dim=-1), (u + units).norm(dim=-1)).sum(-1) for u in units]
    return torch.stack(rows) / math.pi


def massive_positions(states: list[torch.Tensor], mask: torch.Tensor, factor: float) -> tuple[torch.Tensor, list]:
    """(B, T) bool: the real tokens whose norm is above `factor` x the median norm of the real tokens at some stream
    state; and per state the largest norm over that median among them (0.0 where there are none)."""
    massive = torch.zeros_like(mask)
    ratios = []
    for h in states:
        norms = h.float().norm(dim=-1)
        ratio = norms / norms[mask].median().clamp_min(EPS)
        massive |= mask & (ratio > factor)
        ratios.append(ratio)
    return massive, [float(r[massive].max()) if massive.any() else 0.0 for r in ratios]


def massive_lines(res: dict) -> list[str]:
    """What the massive positions do to the stream's variance and adjacent angular distance, in two lines."""
    m = res.get("massive")
    if m is None:
        return []
    st, adj = res["states"], m["angular_adjacent_rest"]
    named = ", ".join(f"{p['batch']}:{p['sequence']}:{p['position']}" + (f" {p['token']!r}" if "token" in p else "")
                      for p in m["positions"][:8])
    lines = [f"massive positions ({m['rule']}): {m['count']} of {res['tokens']} tokens"
             + (f" (batch:sequence:position {named}{', ...' if m['count'] > 8 else ''})" if m["count"] else "")]
    if m["count"]:
        lines += [f"variance without them: embedding {st[0]['variance_rest']:.4g} -> raw last "
                  f"{st[-1]['variance_rest']:.4g} (peak {max(s['variance_rest'] for s in st):.4g}; with them "
                  f"{max(s['variance'] for s in st):.4g}); adjacent angular distance (all tokens) without them: "
                  + " ".join(f"{x:.3f}" for x in adj)]
    return lines


class Accumulator:
    """Sums over calibration batches for every metric above. S = L + 1 stream states, L blocks. The sums live on
    the CPU in fp64 whatever device the activations are on."""

    def __init__(self, n_layers: int, massive_factor: float | None = None):
        L, S = n_layers, n_layers + 1
        self.L = L
        z = lambda *shape: torch.zeros(*shape, dtype=torch.float64)  # noqa: E731
        self.count, self.sum, self.sumsq = z(S + 1), z(S + 1), z(S + 1)  # index S: the final-normed output
        self.tokens = 0
        self.max_abs = [(-1.0, None)] * (S + 1)
        self.ratio = {k: z(L) for k in ("update", "attn", "mlp", "cos_block", "cos_attn", "cos_mlp")}
        self.has_mid = False
        self.ang_all, self.ang_last = z(S, S), z(S, S)
        self.n_last = 0
        self.kl, self.ce = z(S), z(S)
        self.n_pred = self.n_lens = 0  # n_lens: positions of a subsampled lens (lens_at); 0: every token
        self.massive_factor = massive_factor  # None: no massive positions set apart
        self.rest_count, self.rest_sum, self.rest_sumsq, self.rest_adjacent = z(S), z(S), z(S), z(L)
        self.rest_tokens, self.rest_batches, self.massive_ratio, self.massive_found = 0, 0, z(S), []

    # --- per stream state ------------------------------------------------------------------------------------
    def stream(self, s: int, h: torch.Tensor, mask: torch.Tensor, ids: torch.Tensor | None) -> None:
        """ids: the token ids, to name the token of the largest |h| (None for images: no token_id)."""
        x = h.float()[mask]  # (N, d)
        self.count[s] += x.numel()
        self.sum[s] += float(x.double().sum())
        self.sumsq[s] += float(x.double().pow(2).sum())
        a = x.abs()
        flat = int(a.argmax())
        top = float(a.view(-1)[flat])
        if top > self.max_abs[s][0]:
            tok, ch = divmod(flat, x.shape[1])
            rows, cols = mask.nonzero(as_tuple=True)
            r, c = int(rows[tok]), int(cols[tok])
            where = {"channel": ch, "position": c}
            self.max_abs[s] = (top, where if ids is None else {**where, "token_id": int(ids[r, c])})
        if s == 0:
            self.tokens += x.shape[0]

    def set_apart(self, states: list[torch.Tensor], mask: torch.Tensor, ids: torch.Tensor | None) -> None:
        """The massive positions of the next batch (all its stream states) set apart: the rest's sums, and which
        (numbered by the batch's place in the calls)."""
        massive, ratios = massive_positions(states, mask, self.massive_factor)
        rest = mask & ~massive
        for s, h in enumerate(states):
            x = h.float()[rest]
            self.rest_count[s] += x.numel()
            self.rest_sum[s] += float(x.double().sum())
            self.rest_sumsq[s] += float(x.double().pow(2).sum())
            self.massive_ratio[s] = max(float(self.massive_ratio[s]), ratios[s])
            if s:
                self.rest_adjacent[s - 1] += float(angular_distance(states[s - 1][rest], x).sum())
        self.rest_tokens += int(rest.sum())
        for r, c in massive.nonzero().tolist():
            at = {"batch": self.rest_batches, "sequence": r, "position": c}
            self.massive_found.append(at if ids is None else {**at, "token_id": int(ids[r, c])})
        self.rest_batches += 1

    # --- per block -------------------------------------------------------------------------------------------
    def block(self, l: int, h_in: torch.Tensor, h_mid: torch.Tensor | None, h_out: torch.Tensor,
              mask: torch.Tensor) -> None:
        a, b = h_in.float()[mask], h_out.float()[mask]
        na = a.norm(dim=-1).clamp_min(EPS)
        self.ratio["update"][l] += float(token_update_ratio(a, b).sum())
        self.ratio["cos_block"][l] += float(cosine(a, b).sum())
        if h_mid is not None:
            self.has_mid = True
            m = h_mid.float()[mask]
            self.ratio["attn"][l] += float(((m - a).norm(dim=-1) / na).sum())
            self.ratio["mlp"][l] += float(((b - m).norm(dim=-1) / m.norm(dim=-1).clamp_min(EPS)).sum())
            self.ratio["cos_attn"][l] += float(cosine(a, m).sum())
            self.ratio["cos_mlp"][l] += float(cosine(m, b).sum())

    # --- all pairs of stream states --------------------------------------------------------------------------
    def angular_all(self, units: torch.Tensor) -> None:
        """units: (S, N, d) unit vectors of every stream state for N real tokens (a chunk of them)."""
        self.ang_all += pairwise_angular(units).double().cpu()

    def angular_last(self, units: torch.Tensor) -> None:
        """units: (S, B, d) at each sequence's last real token."""
        self.ang_last += pairwise_angular(units).double().cpu()
        self.n_last += units.shape[1]

    # --- logit lens ------------------------------------------------------------------------------------------
    def lens(self, s: int, logits: torch.Tensor, final_logits: torch.Tensor, ids: torch.Tensor,
             mask: torch.Tensor) -> None:
        logp = torch.log_softmax(logits.float(), -1)
        logq = torch.log_softmax(final_logits.float(), -1)
        kl = (logq.exp() * (logq - logp)).sum(-1)
        self.kl[s] += float(kl[mask].sum())
        pred = mask[:, :-1] & mask[:, 1:]
        nll = -logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
        self.ce[s] += float(nll[pred].sum())
        if s == 0:
            self.n_pred += int(pred.sum())

    def lens_at(self, s: int, logits: torch.Tensor, final_logits: torch.Tensor, next_ids: torch.Tensor,
                has_next: torch.Tensor) -> None:
        """The lens at chosen positions only, (N, V) logits each: `next_ids` the token after each, `has_next`
        whether there is one (a real token) to score."""
        logp = torch.log_softmax(logits.float(), -1)
        logq = torch.log_softmax(final_logits.float(), -1)
        self.kl[s] += float((logq.exp() * (logq - logp)).sum())
        self.ce[s] += float(-logp[has_next].gather(-1, next_ids[has_next, None]).sum())
        if s == 0:
            self.n_pred += int(has_next.sum())
            self.n_lens += logits.shape[0]

    # --- results ---------------------------------------------------------------------------------------------
    def results(self) -> dict:
        S, L, N = self.L + 1, self.L, max(self.tokens, 1)

        def state(s):
            n = max(float(self.count[s]), 1.0)
            mean, ex2 = float(self.sum[s]) / n, float(self.sumsq[s]) / n
            top, where = self.max_abs[s]
            rms = math.sqrt(ex2)
            return {"variance": ex2 - mean * mean, "rms": rms, "mean": mean, "max_abs": top,
                    "max_over_rms": top / rms if rms > 0 else 0.0, **(where or {})}

        states = [state(s) for s in range(S)]
        for s, st in enumerate(states):
            st["index"] = s
            st["name"] = "embedding" if s == 0 else (f"block {s} out" if s < L else f"block {s} out (raw last)")
        blocks = []
        for l in range(L):
            r = {k: float(v[l]) / N for k, v in self.ratio.items()}
            b = {"block": l + 1, "update_ratio": r["update"], "block_influence": 1 - r["cos_block"]}
            if self.has_mid:
                b.update(attn_ratio=r["attn"], mlp_ratio=r["mlp"], attn_similarity=r["cos_attn"],
                         mlp_similarity=r["cos_mlp"], attn_importance=1 - r["cos_attn"],
                         mlp_importance=1 - r["cos_mlp"])
            blocks.append(b)
        ang_all = (self.ang_all / N).tolist()
        ang_last = (self.ang_last / max(self.n_last, 1)).tolist()
        best = []
        for n in range(1, L + 1):
            cand = [(ang_last[l][l + n], l) for l in range(0, S - n)]
            d, l = min(cand)
            best.append({"n": n, "start_block": l + 1, "blocks": [l + 1, l + n], "distance": d})
        out = {"states": states, "final_normed": state(S), "blocks": blocks,
               "angular": {"last_token": ang_last, "all_tokens": ang_all, "best_block": best}}
        if self.n_pred:
            out["lens"] = {"kl": (self.kl / (self.n_lens or N)).tolist(), "positions": self.n_lens or N,
                           "ce": (self.ce / self.n_pred).tolist(),
                           "ppl": [math.exp(min(c, 50.0)) for c in (self.ce / self.n_pred).tolist()]}
        out["tokens"], out["sequences"] = self.tokens, self.n_last
        if self.massive_factor is not None:
            out["massive"] = self.massive_results(states)
        return out

    def massive_results(self, states: list[dict]) -> dict:
        """The rest's variance and RMS beside each state's (written into `states`), and the massive positions."""
        for s, st in enumerate(states):
            n = max(float(self.rest_count[s]), 1.0)
            mean, ex2 = float(self.rest_sum[s]) / n, float(self.rest_sumsq[s]) / n
            st.update(variance_rest=ex2 - mean * mean, rms_rest=math.sqrt(ex2),
                      massive_norm_over_median=float(self.massive_ratio[s]))
        return {"rule": f"stream norm > {self.massive_factor:g} x the median norm of the batch's real tokens, at any "
                        "state", "factor": self.massive_factor, "count": len(self.massive_found),
                "positions": self.massive_found[:MASSIVE_LISTED], "rest_tokens": self.rest_tokens,
                "angular_adjacent_rest": (self.rest_adjacent / max(self.rest_tokens, 1)).tolist()}
