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
    # TODO: the two passes: forwards for dq and the final state, backwards for dv, dk and dS0 (module docstring)
    return r"""
#define MAX_K 64
#define MAX_V 64

extern "C" __global__ void recurrent_bwd(const float* __restrict__ q, const float* __restrict__ k,
                                         const float* __restrict__ v, const float* __restrict__ g,
                                         const float* __restrict__ dout, const float* __restrict__ dstate,
                                         const float* __restrict__ state0, float* __restrict__ dq,
                                         float* __restrict__ dk, float* __restrict__ dv,
                                         float* __restrict__ final_state, float* __restrict__ dstate0,
                                         int T, int H, int K, int V, float scale) {
    const int bh = blockIdx.x;                // one block per (batch, head)
    const int b = bh / H, h = bh % H;
    const int j = threadIdx.x;                // one thread per value column
    __shared__ float q_t[MAX_K], k_t[MAX_K];
    __shared__ float part[MAX_K][MAX_V];      // part[i][j]: thread j's term of a sum over the columns
    float s[MAX_K];                           // column j of S (pass 1), then of Sbar (pass 2)

    // 1. forwards: the states, dq_t = scale S_t do_t, and the final state
    for (int i = 0; i < K; ++i) s[i] = state0[((long long)bh * K + i) * V + j];
    for (int t = 0; t < T; ++t) {
        const long long row = (long long)(b * T + t) * H + h;
        for (int i = j; i < K; i += blockDim.x) k_t[i] = k[row * K + i];
        __syncthreads();
        const float decay = expf(g[row]), v_j = v[row * V + j], do_j = dout[row * V + j];
        for (int i = 0; i < K; ++i) {
            s[i] = decay * s[i] + k_t[i] * v_j;
            part[i][j] = s[i] * do_j;
        }
        __syncthreads();
        for (int i = j; i < K; i += blockDim.x) {
            float acc = 0.0f;
            for (int c = 0; c < V; ++c) acc += part[i][c];
            dq[row * K + i] = scale * acc;
        }
        __syncthreads();                      // before the next token overwrites k_t and part
    }
    for (int i = 0; i < K; ++i) final_state[((long long)bh * K + i) * V + j] = s[i];

    // 2. backwards: the state's adjoint, dv_t = Sbar_t^T k_t, dk_t = Sbar_t v_t, and dS0
    for (int i = 0; i < K; ++i) s[i] = dstate[((long long)bh * K + i) * V + j];
    for (int t = T - 1; t >= 0; --t) {
        const long long row = (long long)(b * T + t) * H + h;
        for (int i = j; i < K; i += blockDim.x) {
            q_t[i] = q[row * K + i];
            k_t[i] = k[row * K + i];
        }
        __syncthreads();
        const float decay = expf(g[row]), v_j = v[row * V + j], do_j = dout[row * V + j];
        float acc = 0.0f;
        for (int i = 0; i < K; ++i) {
            s[i] += scale * q_t[i] * do_j;    // Sbar_t: token t's own read added
            acc += s[i] * k_t[i];
            part[i][j] = s[i] * v_j;
        }
        dv[row * V + j] = acc;
        __syncthreads();
        for (int i = j; i < K; i += blockDim.x) {
            float sum = 0.0f;
            for (int c = 0; c < V; ++c) sum += part[i][c];
            dk[row * K + i] = sum;
        }
        for (int i = 0; i < K; ++i) s[i] *= decay;   // carried back to token t - 1 through exp(g_t)
        __syncthreads();
    }
    for (int i = 0; i < K; ++i) dstate0[((long long)bh * K + i) * V + j] = s[i];
}
"""
    # END TODO


def recurrent_backward(q, k, v, g, *, do, dstate=None, scale=None, initial_state=None):
    """Exercise 19's recurrent_backward on the GPU: `recurrent_bwd` for dq, dk, dv and dS0, then the gate's
    gradient as a reverse cumulative sum in CuPy.

    q, k: [B, T, H, K]; v, do: [B, T, H, V]; g: [B, T, H]; dstate, initial_state: [B, H, K, V] or None
    (CuPy arrays of any float dtype and layout: make C-contiguous float32 copies first).
    Launch with grid (B * H,) and block (V,). Returns (dq, dk, dv, dg, dinitial_state), CuPy float32,
    dinitial_state None when initial_state is None. scale defaults to K ** -0.5.
    """
    # TODO: checks on K and V, float32 inputs (zeros for a missing state), outputs, the launch, then dg
    import cupy as cp

    B, T, H, K = q.shape
    V = v.shape[-1]
    if K > MAX_K or V > MAX_V:
        raise ValueError(f"q, v: expected K <= {MAX_K} and V <= {MAX_V} (the shared table), got K = {K}, V = {V}")
    scale = K ** -0.5 if scale is None else scale
    q, k, v, g, do = (cp.ascontiguousarray(x, dtype=cp.float32) for x in (q, k, v, g, do))
    S0 = cp.zeros((B, H, K, V), dtype=cp.float32) if initial_state is None else \
        cp.ascontiguousarray(initial_state, dtype=cp.float32)
    dS = cp.zeros((B, H, K, V), dtype=cp.float32) if dstate is None else cp.ascontiguousarray(dstate, dtype=cp.float32)
    dq, dk = cp.empty((B, T, H, K), dtype=cp.float32), cp.empty((B, T, H, K), dtype=cp.float32)
    dv = cp.empty((B, T, H, V), dtype=cp.float32)
    final, dS0 = cp.empty((B, H, K, V), dtype=cp.float32), cp.empty((B, H, K, V), dtype=cp.float32)
    kernel = cp.RawKernel(kernel_source(), "recurrent_bwd")
    kernel((B * H,), (V,), (q, k, v, g, do, dS, S0, dq, dk, dv, final, dS0, np.int32(T), np.int32(H), np.int32(K),
                           np.int32(V), np.float32(scale)))
    dG = (q * dq).sum(axis=-1) - (k * dk).sum(axis=-1)
    dG[:, -1] += (dS * final).sum(axis=(-2, -1))
    dg = dG[:, ::-1].cumsum(axis=1)[:, ::-1]
    return dq, dk, dv, dg, (None if initial_state is None else dS0)
    # END TODO
