"""Exercise 23 (GPU): the recurrent backward pass of simple GLA as a CUDA kernel, launched through CuPy.

Exercise 19's backward, on the GPU. As in exercise 16, one thread block per (b, h) (blockIdx.x = b * H + h)
and one thread per value column j (threadIdx.x, blockDim.x = V), which keeps column j of a [K, V] matrix
in a local array of its own, float s[MAX_K] (registers, or per-thread local memory where the compiler cannot
unroll the loops over it). The kernel runs two passes over the sequence:

    1. forwards, t = 0 .. T-1:   S_t = exp(g_t) S_{t-1} + k_t v_t^T        (column j: s_i = e s_i + k_i v_j)
                                 dq_t = scale S_t do_t                     (row i: sum_j S_t[i, j] do_t[j])
       and at the end the final state S_{T-1} (for the gate's gradient).
    2. backwards, t = T-1 .. 0:  Sbar_t = exp(g_{t+1}) Sbar_{t+1} + scale q_t do_t^T,   Sbar_{T-1} from dstate
                                 dv_t = Sbar_t^T k_t                       (column j: sum_i sbar_i k_i: local)
                                 dk_t = Sbar_t v_t                         (row i: sum_j Sbar_t[i, j] v_t[j])
       and at the end dS0 = exp(g_0) Sbar_0.

dv_t[j] is a sum over the rows i that thread j holds: a loop in registers. dq_t[i] and dk_t[i] are sums
over the columns j, one per thread: every thread writes its terms into a shared table, part[i][j] =
s_i * do_t[j] (or s_i * v_t[j]), then __syncthreads(), then thread j sums the rows i = j, j + V, ... of the
table, one row each, and writes dq_t[i] (dk_t[i]). A third __syncthreads() keeps the next token from
overwriting the table, or q_t and k_t in shared memory, while another thread still reads them.

The gate's gradient needs no kernel of its own: exercise 19's reverse cumulative sum,
    dg_t = sum_{s >= t} (q_s . dq_s - k_s . dk_s)  (+ <dstate, S_{T-1}> for every t),
runs as CuPy array operations on the kernel's dq and dk (x[:, ::-1].cumsum(axis=1)[:, ::-1]).

Memory layout (C-contiguous float32): element (b, t, h, i) of a [B, T, H, K] tensor is at
((b * T + t) * H + h) * K + i; g [B, T, H] at (b * T + t) * H + h; a state [B, H, K, V] at
((b * H + h) * K + i) * V + j. The kernel's signature is fixed (the check compiles it under this name):

    extern "C" __global__ void recurrent_bwd(
        const float* q, const float* k, const float* v, const float* g, const float* dout,
        const float* dstate, const float* state0, float* dq, float* dk, float* dv, float* final_state,
        float* dstate0, int T, int H, int K, int V, float scale)

state0 and dstate are always passed (zeros when None); dstate0 receives exp(g_0) Sbar_0. Limits: K, V <= 64
(the shared table, part[64][64], is 16 KiB); raise ValueError beyond them. No #include under NVRTC (expf is
built in); pass scalars as np.int32 / np.float32.

Shapes: q, k [B, T, H, K]; v, do [B, T, H, V]; g [B, T, H]; states [B, H, K, V].
Check: `minilin check 23` on a machine where CuPy sees a GPU (float32 against minilin.mixers.simple_gla's
float64 recurrent_backward, to 1e-4 of each gradient's largest value).
"""
import numpy as np

MAX_K, MAX_V = 64, 64


def kernel_source():
    """The CUDA C++ source of `recurrent_bwd` (module docstring) as a string.

    A skeleton to start from:

        #define MAX_K 64
        #define MAX_V 64
        extern "C" __global__ void recurrent_bwd(const float* q, ..., float scale) {
            const int bh = blockIdx.x, b = bh / H, h = bh % H, j = threadIdx.x;
            __shared__ float q_t[MAX_K], k_t[MAX_K], part[MAX_K][MAX_V];
            float s[MAX_K];                  // column j of S, then of Sbar
            // 1. s from state0; for t = 0 .. T-1: load k_t, sync, update s and write part, sync,
            //    sum the rows of part into dq, sync; store s to final_state
            // 2. s from dstate; for t = T-1 .. 0: load q_t, k_t, sync, add scale q do_j, dv_j, part, sync,
            //    sum the rows into dk, decay s, sync; store s to dstate0
        }
    """
    raise NotImplementedError(
        "TODO: the two passes: forwards for dq and the final state, backwards for dv, dk and dS0 (module docstring) (about 65 lines)")


def recurrent_backward(q, k, v, g, *, do, dstate=None, scale=None, initial_state=None):
    """Exercise 19's recurrent_backward on the GPU: `recurrent_bwd` for dq, dk, dv and dS0, then the gate's
    gradient as a reverse cumulative sum in CuPy.

    q, k: [B, T, H, K]; v, do: [B, T, H, V]; g: [B, T, H]; dstate, initial_state: [B, H, K, V] or None
    (CuPy arrays of any float dtype and layout: make C-contiguous float32 copies first).
    Launch with grid (B * H,) and block (V,). Returns (dq, dk, dv, dg, dinitial_state), CuPy float32,
    dinitial_state None when initial_state is None. scale defaults to K ** -0.5.
    """
    raise NotImplementedError(
        "TODO: checks on K and V, float32 inputs (zeros for a missing state), outputs, the launch, then dg (about 20 lines)")
