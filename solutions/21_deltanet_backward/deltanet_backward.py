"""Exercise 21: the backward pass of DeltaNet, recurrent.

Exercise 11's forward, one token (q'_t = scale q_t; S [K, V] per batch and head):

    p   = S_{t-1}^T k_t                  the memory's prediction for k_t            [V]
    r   = v_t - p                        the correction                              [V]
    S_t = S_{t-1} + beta_t k_t r^T       the delta write
    o_t = S_t^T q'_t                     the read

The backward pass gets do_t and dS_t = dL/dS_t as it arrives from the later tokens (dstate after the last
one) and walks the four lines bottom to top, one adjoint per line (for y = A x: dA = dy x^T, dx = A^T dy):

    o_t = S_t^T q'_t          ->  dS  = dS_t + q'_t do_t^T           (dS_t collects the read of this token)
                                  dq'_t = S_t do_t
    S_t = S_{t-1} + beta k r^T ->  dr = beta_t dS^T k_t,   dbeta_t = r . (dS^T k_t),   dk_t = beta_t dS r
                                  and S_{t-1} receives dS unchanged
    r = v_t - p               ->  dv_t = dr,               dp = -dr
    p = S_{t-1}^T k_t         ->  dk_t += S_{t-1} dp,      dS_{t-1} = dS + k_t dp^T

So k_t appears twice (in the write and in the prediction) and collects a gradient from both. The state's
adjoint passes back through I - beta_t k_t k_t^T, the transpose of the forward's transition, as it must:
dS_{t-1} = dS - k_t dr^T = (I - beta_t k_t k_t^T) dS.

`deltanet_recurrent_backward` runs the forward once to have every S_{t-1} (here all are kept: T states of
K x V; minilin's recurrent_backward keeps one every 64 tokens and recomputes the others), then the step
backward for t = T-1 down to 0, starting from dstate (zeros when None). dinitial_state is dS_{-1}, and
dq = scale dq'.

The chunked form (exercise 12) runs through the WY representation of a chunk instead:

    A = tril(diag(beta) K K^T, -1),   T = (I + A)^-1,   R = [diag(beta) K, diag(beta) V],   [W, U] = T R

and its backward (minilin's chunked_backward) needs the adjoint of that too (`wy_backward`): given dW and
dU, with X = [W, U] and dX = [dW, dU],

    X = T R                ->  dR = T^T dX           (the adjoint of a triangular solve is the transposed
                                                      solve: (I + A)^T dR = dX, upper triangular)
                               dT = dX R^T
    T = (I + A)^-1         ->  dA = -T^T dT T^T = -(T^T dX)(T R)^T = -dR X^T,   kept strictly lower (only
                                                      those entries of A are functions of the inputs)
    A_tj = beta_t k_t . k_j ->  dbeta_t += sum_j dA_tj (k_t . k_j),   dK += diag(beta) dA K + dA^T diag(beta) K
    R = [beta K, beta V]    ->  dK += diag(beta) dR_K,   dV = diag(beta) dR_V,
                               dbeta_t += k_t . dR_K,t + v_t . dR_V,t

where dR_K, dR_V are the first K and the last V columns of dR. (T^T dX: differentiate T (I + A) = I to get
dT = -T dA T, so <dT_bar, dT> = <-T^T dT_bar T^T, dA>.)

Shapes: q, k [B, T, H, K] (k unit-norm); v, do [B, T, H, V]; beta [B, T, H]; states [B, H, K, V]; in the
step, one token: q_t, k_t [B, H, K], v_t, do_t [B, H, V], beta_t [B, H]; in the WY functions one chunk:
k [..., C, K], v [..., C, V], beta [..., C], W and dW [..., C, K], U and dU [..., C, V] (leading axes are
independent chunks). scale defaults to K ** -0.5.
Check: `minilin check 21` (compares with minilin.mixers.deltanet's recurrent_backward and with central
finite differences of <do, o> + <dstate, S_T>; the WY backward with the exact derivative of
<dW, W> + <dU, U> through minilin.chunking's triangular inverse).
"""
import numpy as np


def delta_step_backward(S_prev, q_t, k_t, v_t, beta_t, do_t, dS_t):
    """One token of the backward pass (module docstring), q_t already multiplied by scale.

    S_prev: [B, H, K, V], the state before the token; q_t, k_t: [B, H, K]; v_t, do_t: [B, H, V];
    beta_t: [B, H]; dS_t: [B, H, K, V], dL/dS_t from the later tokens (the read of this one not included).
    Returns (dS_prev [B, H, K, V], dq_t [B, H, K], dk_t [B, H, K], dv_t [B, H, V], dbeta_t [B, H]).
    """
    # TODO: recompute p, r and S_t; then the adjoints of the read, the write, the correction and the prediction
    p = np.einsum("bhkv,bhk->bhv", S_prev, k_t)
    r = v_t - p
    S_t = S_prev + np.einsum("bhk,bhv->bhkv", beta_t[..., None] * k_t, r)
    dS = dS_t + np.einsum("bhk,bhv->bhkv", q_t, do_t)
    dq_t = np.einsum("bhkv,bhv->bhk", S_t, do_t)
    dS_k = np.einsum("bhkv,bhk->bhv", dS, k_t)                          # dS^T k_t
    dr = beta_t[..., None] * dS_k
    dbeta_t = np.sum(r * dS_k, axis=-1)
    dk_t = beta_t[..., None] * np.einsum("bhkv,bhv->bhk", dS, r) - np.einsum("bhkv,bhv->bhk", S_prev, dr)
    dS_prev = dS - np.einsum("bhk,bhv->bhkv", k_t, dr)
    return dS_prev, dq_t, dk_t, dr, dbeta_t
    # END TODO


def deltanet_recurrent_backward(q, k, v, beta, *, do, dstate=None, scale=None, initial_state=None):
    """Gradients of L = sum_t <do_t, o_t> + <dstate, S_{T-1}> through exercise 11's recurrence.

    q, k: [B, T, H, K]; v, do: [B, T, H, V]; beta: [B, T, H]; dstate, initial_state: [B, H, K, V] or None.
    Returns (dq, dk, dv, dbeta, dinitial_state), shaped like q, k, v, beta and initial_state;
    dinitial_state is None when initial_state is None.
    """
    # TODO: the forward, keeping the state before each token; then delta_step_backward for t = T-1 down to 0
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    S = np.zeros((B, H, K, v.shape[-1])) if initial_state is None else initial_state
    before = np.empty((B, T, H, K, v.shape[-1]))
    for t in range(T):
        before[:, t] = S
        p = np.einsum("bhkv,bhk->bhv", S, k[:, t])
        S = S + np.einsum("bhk,bhv->bhkv", beta[:, t, :, None] * k[:, t], v[:, t] - p)
    dq, dk, dv, dbeta = np.empty(q.shape), np.empty(k.shape), np.empty(v.shape), np.empty(beta.shape)
    dS = np.zeros(S.shape) if dstate is None else dstate
    for t in range(T - 1, -1, -1):
        dS, dq_t, dk[:, t], dv[:, t], dbeta[:, t] = delta_step_backward(
            before[:, t], scale * q[:, t], k[:, t], v[:, t], beta[:, t], do[:, t], dS)
        dq[:, t] = scale * dq_t
    return dq, dk, dv, dbeta, (None if initial_state is None else dS)
    # END TODO


def wy_backward(k, v, beta, dW, dU):
    """The gradients of L = <dW, W> + <dU, U> through exercise 12's WY representation (module docstring).

    k: [..., C, K]; v: [..., C, V]; beta: [..., C]; dW: [..., C, K]; dU: [..., C, V].
    Returns (dk [..., C, K], dv [..., C, V], dbeta [..., C]).
    """
    # TODO: recompute A and X = [W, U]; dR by the transposed solve; dA = tril(-dR X^T, -1); then A's and R's backward
    C, K = k.shape[-2:]
    k_beta = beta[..., None] * k
    I_A = np.eye(C) + np.tril(k_beta @ np.swapaxes(k, -1, -2), -1)               # I + A
    X = np.linalg.solve(I_A, np.concatenate([k_beta, beta[..., None] * v], axis=-1))   # [W, U]
    dR = np.linalg.solve(np.swapaxes(I_A, -1, -2), np.concatenate([dW, dU], axis=-1))  # T^T dX
    dA = np.tril(-dR @ np.swapaxes(X, -1, -2), -1)
    dR_K, dR_V = dR[..., :K], dR[..., K:]
    dbeta = (np.sum(dA * (k @ np.swapaxes(k, -1, -2)), axis=-1) + np.sum(k * dR_K, axis=-1)
             + np.sum(v * dR_V, axis=-1))
    dk = beta[..., None] * (dA @ k + dR_K) + np.swapaxes(dA, -1, -2) @ k_beta
    dv = beta[..., None] * dR_V
    return dk, dv, dbeta
    # END TODO
