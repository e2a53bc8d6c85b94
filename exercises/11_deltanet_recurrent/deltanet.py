"""Exercise 11: DeltaNet, recurrent. Read the state's prediction, subtract the old, write the new
(Schlag et al. 2021, "Linear Transformers Are Secretly Fast Weight Programmers").

Linear attention only adds: writing v for a key k that is already stored leaves the old value in
place, and a read returns their sum (exercise 04's interference, exercise 14's overwrite). The delta
rule first asks the memory what it holds for k_t, then writes only the correction:

    v_old = S_{t-1}^T k_t                                    the memory's prediction for k_t     [V]
    S_t   = S_{t-1} + beta_t k_t (v_t - v_old)^T              move it toward v_t, by beta_t
          = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t   = scale * S_t^T q_t

beta_t in [0, 1] is the writing strength. With a unit key and beta = 1 the memory then holds exactly
v_t for k_t: S_t^T k_t = v_old + (v_t - v_old) (k_t . k_t) = v_t. It is one step of gradient descent on
the regression loss ||S^T k_t - v_t||^2 / 2 with learning rate beta_t. Keys are L2-normalized; with
|k| > 1 the factor I - beta k k^T can amplify, and the recurrence can blow up.

Shapes: q, k [B, T, H, K] (k unit-norm); v [B, T, H, V]; beta [B, T, H]; o [B, T, H, V]; S [B, H, K, V];
scale defaults to K ** -0.5. Check: `minilin check 11` (compares with minilin.mixers.deltanet).
"""
import numpy as np


def delta_write(S, k_t, v_t, beta_t):
    """One delta-rule write: S + beta_t k_t (v_t - S^T k_t)^T, for every batch and head.

    S: [B, H, K, V]; k_t: [B, H, K]; v_t: [B, H, V]; beta_t: [B, H]. Returns the new S: [B, H, K, V].
    """
    raise NotImplementedError(
        "TODO: the prediction S^T k_t, the correction, the outer product with k_t scaled by beta_t (about 2 lines)")


def deltanet_recurrent(q, k, v, beta, *, scale=None, initial_state=None):
    """The token loop: S_t = delta_write(S_{t-1}, k_t, v_t, beta_t), o_t = scale * S_t^T q_t.

    q, k: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H]; initial_state: [B, H, K, V] or None (zeros).
    Returns (o [B, T, H, V], S_T [B, H, K, V]).
    """
    raise NotImplementedError(
        "TODO: start from initial_state (or zeros), write each token, then read it with q_t (about 8 lines)")
