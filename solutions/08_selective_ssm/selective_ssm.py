"""Exercise 08: the selective SSM. Discretize a continuous state space (zero-order hold), then write
Mamba's selective scan (Gu & Dao 2023).

A state-space model is a continuous-time linear system, here with a diagonal A (one number per state):

    h'(t) = A h(t) + B x(t),       y(t) = C h(t) + D x(t)

Sampling it with step dt, holding x constant over each step (zero-order hold), gives exactly

    h_t = A_bar h_{t-1} + B_bar x_t,     A_bar = exp(dt A),     B_bar = (exp(dt A) - 1) / A * B
                                                                      = dt * phi(dt A) * B,   phi(z) = (e^z - 1) / z

phi(0) = 1, so as A -> 0 the state integrates: B_bar -> dt B. Near z = 0, e^z - 1 computed as
exp(z) - 1 loses digits (cancellation); np.expm1(z) does not. A = 0 exactly must not divide by zero.
A <= 0 keeps |A_bar| <= 1: the state never grows.

Mamba makes the SSM selective: dt, B and C depend on the token (they are projections of the input),
so the model chooses, token by token, what to write (B), what to read (C) and how fast to forget (dt).
For each channel d and state n (A: [D, N], one decay per channel and state):

    h_t[d, n] = exp(dt_t[d] A[d, n]) h_{t-1}[d, n] + dt_t[d] B_t[n] x_t[d]
    y_t[d]    = sum_n C_t[n] h_t[d, n] + D[d] x_t[d]

(Mamba simplifies B_bar to dt B, the first-order term of the ZOH one.) Per (d, n) that is exercise 07's
h_t = a_t h_{t-1} + b_t with a = exp(dt A) and b = dt B x: a selective SSM is a scan, so it parallelizes
in log depth. Unlike Mamba-2 (exercise 09), the decay differs per channel and state, so there is no
shared [T, T] matrix to build: Mamba scans instead.

Paper symbols -> code: Delta -> dt (after softplus, >= 0), A, B, C, D as in the paper, h the state,
N the state size. Shapes: x, dt [B, T, D]; A [D, N]; B, C [B, T, N]; D [D]; y [B, T, D]; h [B, D, N].
Check: `minilin check 8` (compares with minilin.mixers.s4.discretize and minilin.mixers.mamba; the parallel
form may not loop over tokens). Of minilin, this file may call minilin.scan only.
"""
import numpy as np

from minilin.scan import associative_scan


def zoh(dt, A, B):
    """Zero-order hold of a diagonal SSM: (A_bar, B_bar) = (exp(dt A), dt * phi(dt A) * B).

    dt: [H] (one step per channel); A, B: [H, N] real, A <= 0. Returns A_bar, B_bar: [H, N].
    phi(z) = expm1(z) / z with phi(0) = 1 (np.where, dividing by 1 where z == 0).
    """
    # TODO: z = dt A; A_bar = exp(z); B_bar = dt * expm1(z) / z * B, with the z == 0 case
    z = dt[:, None] * A
    zero = z == 0
    phi = np.where(zero, 1.0, np.expm1(z) / np.where(zero, 1.0, z))
    return np.exp(z), dt[:, None] * phi * B
    # END TODO


def selective_scan(x, dt, A, B, C, D):
    """Mamba's selective SSM, token by token (module docstring), from h_{-1} = 0.

    x, dt: [B, T, D]; A: [D, N]; B, C: [B, T, N]; D: [D].
    Returns (y [B, T, D], h_T [B, D, N]).
    """
    # TODO: per token: a = exp(dt A), b = dt x B (outer product over d, n), h = a h + b, y = h C + D x
    batch, T, channels = x.shape
    h = np.zeros((batch, channels, A.shape[1]))
    y = np.empty_like(x)
    for t in range(T):
        a = np.exp(dt[:, t, :, None] * A)                                   # [B, D, N]
        b = (dt[:, t] * x[:, t])[:, :, None] * B[:, t, None, :]             # [B, D, N]
        h = a * h + b
        y[:, t] = np.einsum("bdn,bn->bd", h, C[:, t]) + D * x[:, t]
    return y, h
    # END TODO


def selective_scan_parallel(x, dt, A, B, C, D):
    """The same (y, h_T), with every token's (a, b) built at once and the recurrence run by
    minilin.scan.associative_scan (exercise 07's scan, along axis 1) instead of a loop.
    Memory: all T states [B, T, D, N] at once (Mamba's fused kernel avoids that)."""
    # TODO: a and b for all tokens [B, T, D, N], one associative scan, then the read of every state
    a = np.exp(dt[..., None] * A)                                           # [B, T, D, N]
    b = (dt * x)[..., None] * B[:, :, None, :]
    h = associative_scan(a, b, axis=1)
    y = np.einsum("btdn,btn->btd", h, C) + D * x
    return y, h[:, -1]
    # END TODO
