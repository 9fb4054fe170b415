"""The same step as mystep.py, ported to float32 as a user might: frames, gradients and moments are
float32 arrays, every stage computes in float32 (docs/ci.md#float32-and-bfloat16).

The certifier reads the dtype from the frames this step returns and holds it to the analysis of
float32 (u = 2^-24), as `certify run` does: a correct port passes, a mistake in a stage still fails.
"""

from typing import NamedTuple

import numpy as np

F = np.float32


class State(NamedTuple):
    m: np.ndarray  # first moment, tangent at the current W, float32
    v: np.ndarray  # one second moment per frame, float32
    t: int


def init(W):
    W = np.asarray(W, dtype=F)
    return State(m=np.zeros_like(W), v=np.zeros(W.shape[:-2], dtype=F), t=0)


def _transpose(A):
    return np.swapaxes(A, -1, -2)


def _project(W, X):
    WtX = _transpose(W) @ X
    return X - W @ ((WtX + _transpose(WtX)) / 2)


def _polar(A):
    U, _, Vh = np.linalg.svd(A, full_matrices=False)
    return U @ Vh


def step(W, G, state, config):
    W, G = np.asarray(W, dtype=F), np.asarray(G, dtype=F)
    beta1, beta2 = config.betas
    d, r = W.shape[-2:]
    g = _project(W, G + F(config.weight_decay) * W)
    m = F(beta1) * state.m + F(1 - beta1) * g
    v = F(beta2) * state.v + F(1 - beta2) * np.sum(g * g, axis=(-2, -1)) / F(d * r)
    t = state.t + 1
    m_hat, v_hat = m / F(1 - beta1**t), v / F(1 - beta2**t)
    moves = v_hat > 0
    scale = np.where(moves, F(-config.lr) / (np.sqrt(np.where(moves, v_hat, F(1))) + F(config.eps)), F(0))
    xi = m_hat * scale[..., None, None]
    norm = np.sqrt(np.sum(xi * xi, axis=(-2, -1)))
    capped = norm > config.trust_radius
    xi = xi * np.where(capped, F(config.trust_radius) / np.where(capped, norm, F(1)), F(1))[..., None, None]
    W_new = _polar(W + xi)
    return W_new, State(m=_project(W_new, m), v=np.asarray(v, dtype=F), t=t)
