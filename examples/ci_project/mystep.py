"""StiefelAdam as a user might write it: a NumPy step with a state of its own (docs/ci.md).

`step(W, G, state, config)` follows the eight stages of docs/algorithm.md on frames W of shape
(..., d, r); `config` has lr, betas, eps, trust_radius and weight_decay.
"""

from typing import NamedTuple

import numpy as np


class State(NamedTuple):
    m: np.ndarray  # first moment, tangent at the current W
    v: np.ndarray  # one second moment per frame
    t: int


def init(W):
    return State(m=np.zeros_like(W), v=np.zeros(W.shape[:-2]), t=0)


def _transpose(A):
    return np.swapaxes(A, -1, -2)


def _project(W, X):
    WtX = _transpose(W) @ X
    return X - W @ ((WtX + _transpose(WtX)) / 2)


def _polar(A):
    U, _, Vh = np.linalg.svd(A, full_matrices=False)
    return U @ Vh


def step(W, G, state, config):
    beta1, beta2 = config.betas
    d, r = W.shape[-2:]
    g = _project(W, G + config.weight_decay * W)
    m = beta1 * state.m + (1 - beta1) * g
    v = beta2 * state.v + (1 - beta2) * np.sum(g * g, axis=(-2, -1)) / (d * r)
    t = state.t + 1
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    moves = v_hat > 0
    scale = np.where(moves, -config.lr / (np.sqrt(np.where(moves, v_hat, 1.0)) + config.eps), 0.0)
    xi = m_hat * scale[..., None, None]
    norm = np.sqrt(np.sum(xi * xi, axis=(-2, -1)))
    capped = norm > config.trust_radius
    xi = xi * np.where(capped, config.trust_radius / np.where(capped, norm, 1.0), 1.0)[..., None, None]
    W_new = _polar(W + xi)
    return W_new, State(m=_project(W_new, m), v=v, t=t)
