"""Exercise 17 (GPU): a chunked linear-attention kernel in CUDA C++.

Exercise 05's chunked form on the GPU. One thread block per (b, h) walks its sequence chunk by chunk,
holding the state S [K, V] in shared memory the whole time; inside a chunk of C = 16 tokens all the
work is small dense products that the block's 256 threads share:

    for each chunk (tokens t0 .. t0 + C - 1; past T, treat q, k, v as 0 and write nothing):
        1. load  Q_c (already times scale), K_c [C, K] and V_c [C, V] into shared memory;     sync
        2. A = tril(Q_c K_c^T)    [C, C]: thread x computes entries x, x + 256, ...           sync
        3. O_c = A V_c + Q_c S    [C, V]: one output entry per thread and step of 256; written
                                  to o only for tokens < T                                    sync
        4. S  += K_c^T V_c        [K, V]: one state entry per thread and step of 256          sync
    finally write S to state[b, h].

Step 3 reads S before step 4 changes it (the chunk's own tokens are counted once, in A V_c); the syncs
between steps make every thread see the other threads' results. Shared memory: S 64 x 64 floats
(16 KiB) plus the chunk tiles, about 29 KiB per block, within the 48 KiB a block may take statically.

Memory layout (C-contiguous float32): element (b, t, h, i) of a [B, T, H, K] tensor is at
((b * T + t) * H + h) * K + i; state [B, H, K, V] at ((b * H + h) * K + i) * V + j.

The kernel's signature is fixed (the check compiles it under this name):

    extern "C" __global__ void chunked_fwd(const float* q, const float* k, const float* v, float* o,
                                           float* state, int T, int H, int K, int V, float scale)

launched with grid (B * H,) and block (256,). Limits: K, V <= 64; raise ValueError beyond them.
No #include under NVRTC; pass scalars as np.int32 / np.float32.

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; o [B, T, H, V]; state [B, H, K, V].
Check: `minilin check 17` on a machine where CuPy sees a GPU (compares with
minilin.mixers.linear_attention, float32 against the float64 reference, to 1e-4 of the largest output).
"""
import numpy as np

CHUNK, MAX_K, MAX_V, THREADS = 16, 64, 64, 256


def kernel_source():
    """The CUDA C++ source of `chunked_fwd` (module docstring) as a string.

    A skeleton to start from:

        #define CHUNK 16
        #define MAX_K 64
        #define MAX_V 64
        extern "C" __global__ void chunked_fwd(const float* q, const float* k, const float* v, float* o,
                                               float* state, int T, int H, int K, int V, float scale) {
            const int b = blockIdx.x / H, h = blockIdx.x % H, tid = threadIdx.x, n = blockDim.x;
            __shared__ float S[MAX_K][MAX_V], q_c[CHUNK][MAX_K], k_c[CHUNK][MAX_K], v_c[CHUNK][MAX_V],
                             A[CHUNK][CHUNK];
            // zero S; for each chunk: steps 1-4 with __syncthreads() after each; write S to state
        }
    Loop over a step's entries with `for (int x = tid; x < rows * cols; x += n)`, x -> (x / cols, x % cols).
    """
    raise NotImplementedError(
        "TODO: write the kernel: zero S, then per chunk the four steps with a __syncthreads() after each, then store S (about 55 lines)")


def chunked_forward(q, k, v, *, scale=None):
    """Run `chunked_fwd` on CuPy arrays q, k [B, T, H, K], v [B, T, H, V]: grid (B * H,), block (256,).
    Returns (o [B, T, H, V], state [B, H, K, V]), CuPy float32. scale defaults to K ** -0.5."""
    raise NotImplementedError(
        "TODO: checks on K and V, contiguous float32 inputs, outputs, the RawKernel launch (about 15 lines)")
