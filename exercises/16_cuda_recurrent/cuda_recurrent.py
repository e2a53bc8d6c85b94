"""Exercise 16 (GPU): a recurrent kernel in CUDA C++, launched through CuPy.

The recurrence is scalar-gated linear attention (exercise 06 with a decay per token; RetNet, Lightning,
Mamba-2 and simple GLA are all this):

    S_t = exp(g_t) S_{t-1} + k_t v_t^T,       o_t = scale * S_t^T q_t,       S_0 = 0,   S: [K, V]

On the GPU the B * H sequences are independent: one thread block per (b, h), blockIdx.x = b * H + h.
Inside a block, thread j (threadIdx.x, one per value column, blockDim.x = V) owns column j of the state,
S[:, j], as K floats in its own registers (a local array float s[MAX_K]). Per token t:

    1. the block loads q_t and k_t (K floats each) into shared memory: every thread reads all of them;
       threads share the loading (thread j loads elements j, j + V, j + 2V, ...), then __syncthreads();
    2. thread j:  s_i = exp(g_t) * s_i + k_t[i] * v_t[j]    for i < K       (its column of the update)
                  o_t[j] = scale * sum_i s_i * q_t[i]                       (its entry of the read)
    3. __syncthreads() again before the next token's load overwrites q_t, k_t in shared memory.

At the end thread j writes its column to state[b, h, :, j]. No thread ever waits on another's column:
the only sequential work is the loop over t, the recurrence itself.

Memory layout (CuPy arrays, C-contiguous float32): element (b, t, h, i) of a [B, T, H, K] tensor is at
((b * T + t) * H + h) * K + i; g [B, T, H] at (b * T + t) * H + h; state [B, H, K, V] at
((b * H + h) * K + i) * V + j.

The kernel's signature is fixed (the check compiles it under this name):

    extern "C" __global__ void recurrent_fwd(const float* q, const float* k, const float* v, const float* g,
                                             float* o, float* state, int T, int H, int K, int V, float scale)

NVRTC (CuPy's compiler) has no standard headers: use the built-in expf, no #include. Pass scalars to a
RawKernel as np.int32 / np.float32 (a Python int would arrive as 64 bits). Limits: K <= MAX_K = 128 (the
register array) and V <= 1024 (threads per block); raise ValueError beyond them.

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H] (log-space, <= 0); o [B, T, H, V]; state [B, H, K, V].
Check: `minilin check 16` on a machine where CuPy sees a GPU (compares with minilin.mixers.simple_gla,
float32 against the float64 reference, to 1e-4 of the largest output).
"""
import numpy as np

MAX_K = 128


def kernel_source():
    """The CUDA C++ source of `recurrent_fwd` (module docstring) as a string.

    A skeleton to start from:

        #define MAX_K 128
        extern "C" __global__ void recurrent_fwd(const float* q, const float* k, const float* v,
                                                 const float* g, float* o, float* state,
                                                 int T, int H, int K, int V, float scale) {
            const int b = blockIdx.x / H, h = blockIdx.x % H, j = threadIdx.x;
            __shared__ float q_t[MAX_K], k_t[MAX_K];
            float s[MAX_K];                       // column j of the state
            // zero s; for t in 0..T-1: load, sync, update and read, sync; write s to state
        }
    """
    raise NotImplementedError(
        "TODO: write the kernel: zero the column, loop over tokens (load to shared, sync, update + read, sync), store (about 30 lines)")


def recurrent_forward(q, k, v, g, *, scale=None):
    """Run `recurrent_fwd` on CuPy arrays: q, k [B, T, H, K], v [B, T, H, V], g [B, T, H].

    Make the inputs C-contiguous float32 (cupy.ascontiguousarray(x, dtype=cupy.float32)), allocate o and
    state (cupy.empty), compile with cupy.RawKernel(kernel_source(), "recurrent_fwd") and launch it with
    grid (B * H,), block (V,) and the arguments in the signature's order.
    Returns (o [B, T, H, V], state [B, H, K, V]): CuPy float32 arrays. scale defaults to K ** -0.5.
    """
    raise NotImplementedError(
        "TODO: checks on K and V, contiguous float32 inputs, outputs, the RawKernel launch (about 15 lines)")
