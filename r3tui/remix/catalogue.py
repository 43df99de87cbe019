"""The named source transformations a mutation asks for, one small change each.

Small models do far better asked for one concrete, named change than for "make it faster".
Each :class:`Transformation` has a ``family`` from :data:`FAMILIES`, which MAP-Elites uses as a
feature dimension (a variant's family is the family of the change that made it), and, when the
change is mechanical, the name of the deterministic operator in :mod:`r3tui.remix.rules` that
makes it without a model.

Launch bounds are not in the catalogue: the inner loop injects ``__launch_bounds__`` itself
and replaces any the source has, so a source change that adds them is undone by the tuner.
"""

from __future__ import annotations

from dataclasses import dataclass

from r3tui.errors import ConfigError

FAMILIES = ("memory", "tiling", "loops", "parallelism", "tuning")


@dataclass(frozen=True)
class Transformation:
    name: str
    family: str  # one of FAMILIES
    instruction: str  # what the prompt asks for, in one or two short sentences
    rule: str | None = None  # the operator in rules.RULES that makes this change mechanically
    # the change is to the kernel's parameter list: the model's SEARCH text may include it
    # (every other change edits the body, and the grammar keeps SEARCH there)
    signature: bool = False
    # the change may edit the unit's preprocessor lines above the kernel (a ``#define``): the
    # grammar lets SEARCH copy them too, in a unit of its own (an application's device unit
    # keeps the kernel's definition alone: r3 apply writes back only that)
    macros: bool = False
    # a worked example, (before, after): a few lines of some other kernel with the change
    # made, shown to the model as an edit block (written here, checked to compile)
    example: tuple[str, str] | None = None
    # a hint to the compiler (aliasing, read-only caching, an unroll pragma, a named constant)
    # that seldom changes the code it makes: the campaign's bandit starts it with two misses
    # (r3tui.search.bandit)
    hint: bool = False
    # a transformation this one's variants pay with, proposed on each of them next
    # (CampaignSettings.follow_up): register blocking alone seldom pays, a tile of the
    # blocked loop pays most (sgemm, H100, session 45: 1.075x, then 2.237x with the tile)
    enables: str | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"transformation {self.name}: unknown family {self.family!r}")


CATALOGUE: tuple[Transformation, ...] = (
    Transformation(
        "restrict_const",
        "memory",
        "Declare every pointer parameter that the kernel only reads as `const T* __restrict__`, "
        "so the compiler knows it does not alias the outputs.",
        rule="restrict_const",
        signature=True,
        example=(
            "__global__ void scale(float* out, float* in, float a, int n) {",
            "__global__ void scale(float* __restrict__ out, const float* __restrict__ in, float"
            " a, int n) {",
        ),
        hint=True,
    ),
    Transformation(
        "read_only_loads",
        "memory",
        "Load the arrays that the kernel never writes through the read-only data cache: "
        "replace `p[i]` by `__ldg(&p[i])`.",
        rule="ldg_loads",
        example=(
            "    out[i] = a * in[i] + in[i + 1];",
            "    out[i] = a * __ldg(&in[i]) + __ldg(&in[i + 1]);",
        ),
        hint=True,
    ),
    Transformation(
        "vectorized_loads",
        "memory",
        "Load and store 4 consecutive floats (or 2 doubles) at once through `float4` / "
        "`double2` where the index is a multiple of 4 (or 2); handle the remainder separately.",
        rule="vector_access",
        example=(
            "    for (int i = t; i < n; i += stride) {\n"
            "        y[i] = a * x[i];\n"
            "    }",
            "    int n4 = n / 4;\n"
            "    for (int i = t; i < n4; i += stride) {\n"
            "        float4 v = reinterpret_cast<const float4*>(x)[i];\n"
            "        reinterpret_cast<float4*>(y)[i] = make_float4(a * v.x, a * v.y, a * v.z, a"
            " * v.w);\n"
            "    }\n"
            "    for (int i = 4 * n4 + t; i < n; i += stride) {\n"
            "        y[i] = a * x[i];\n"
            "    }",
        ),
    ),
    Transformation(
        "hoist_invariant_loads",
        "memory",
        "Move a load or a computation that does not change inside a loop out of the loop, into "
        "a local variable set once before it.",
        example=(
            "    for (int k = 0; k < m; ++k) {\n"
            "        acc += w[row * m + k] * scale[0];\n"
            "    }",
            "    const float s = scale[0];\n"
            "    const float* wr = w + row * m;\n"
            "    for (int k = 0; k < m; ++k) {\n"
            "        acc += wr[k] * s;\n"
            "    }",
        ),
    ),
    Transformation(
        "shared_memory_tile",
        "tiling",
        "Stage the part of the input that neighbouring threads all read in a `__shared__` "
        "array: load it cooperatively, `__syncthreads()`, compute from it, `__syncthreads()`.",
        rule="tile_shared",
        example=(
            "    float acc = 0.0f;\n"
            "    for (int j = 0; j < n; ++j) {\n"
            "        acc += f(p[i], p[j]);\n"
            "    }",
            "    __shared__ float tile[256];\n"
            "    float acc = 0.0f;\n"
            "    float pi = i < n ? p[i] : 0.0f;\n"
            "    for (int base = 0; base < n; base += blockDim.x) {\n"
            "        if (base + threadIdx.x < n) tile[threadIdx.x] = p[base + threadIdx.x];\n"
            "        __syncthreads();\n"
            "        for (int j = 0; j < blockDim.x && base + j < n; ++j) {\n"
            "            acc += f(pi, tile[j]);\n"
            "        }\n"
            "        __syncthreads();\n"
            "    }",
        ),
    ),
    Transformation(
        "register_blocking",
        "tiling",
        "Let each thread compute 2 or 4 neighbouring outputs instead of one, keeping the "
        "partial results in registers and reusing each loaded value for all of them.",
        rule="coarsen",
        enables="shared_memory_tile",
        example=(
            "    for (int c = t; c < N; c += stride) {\n"
            "        float acc = 0.0f;\n"
            "        for (int k = 0; k < K; ++k) acc += A[r * K + k] * B[k * N + c];\n"
            "        C[r * N + c] = acc;\n"
            "    }",
            "    for (int c = 2 * t; c < N; c += 2 * stride) {\n"
            "        float acc0 = 0.0f, acc1 = 0.0f;\n"
            "        for (int k = 0; k < K; ++k) {\n"
            "            float a = A[r * K + k];\n"
            "            acc0 += a * B[k * N + c];\n"
            "            if (c + 1 < N) acc1 += a * B[k * N + c + 1];\n"
            "        }\n"
            "        C[r * N + c] = acc0;\n"
            "        if (c + 1 < N) C[r * N + c + 1] = acc1;\n"
            "    }",
        ),
    ),
    Transformation(
        "stream_along_axis",
        "tiling",
        "In a stencil whose neighbours along one axis are a row or plane apart, let each "
        "thread walk ROWS consecutive points along that axis, keeping the values the next "
        "point shares in registers (one new load a point instead of three); declare "
        "`// r3: tune ROWS 1 2 4 8 16` and `// r3: work_per_thread ROWS y` (the axis it "
        "walks): the tuner then launches a grid that many times smaller along it.",
        rule="stream_axis",
        example=(
            "    int col = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    int row = blockIdx.y * blockDim.y + threadIdx.y;\n"
            "    if (col < n && row > 0 && row < m - 1) {\n"
            "        out[row * n + col] = in[(row - 1) * n + col] + in[row * n + col]"
            " + in[(row + 1) * n + col];\n"
            "    }",
            "    // r3: tune ROWS 1 2 4 8 16\n"
            "    // r3: work_per_thread ROWS y\n"
            "#ifndef ROWS\n"
            "#define ROWS 4\n"
            "#endif\n"
            "    int col = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    int row0 = (blockIdx.y * blockDim.y + threadIdx.y) * ROWS;\n"
            "    if (col < n && row0 < m) {\n"
            "        float up = row0 > 0 ? in[(row0 - 1) * n + col] : 0.0f;\n"
            "        float mid = in[row0 * n + col];\n"
            "        for (int row = row0; row < row0 + ROWS && row < m; ++row) {\n"
            "            float down = row + 1 < m ? in[(row + 1) * n + col] : 0.0f;\n"
            "            if (row > 0 && row < m - 1) out[row * n + col] = up + mid + down;\n"
            "            up = mid;\n"
            "            mid = down;\n"
            "        }\n"
            "    }",
        ),
    ),
    Transformation(
        "unroll_inner_loop",
        "loops",
        "Unroll the innermost `for` loop by a factor the tuner chooses: declare "
        "`// r3: tune R3_UNROLL 1 2 4 8 16` with an `#ifndef`-guarded `#define R3_UNROLL 4`, "
        "and put `constexpr int r3_unroll = R3_UNROLL;` and `#pragma unroll r3_unroll` "
        "before the loop.",
        rule="unroll_pragma",
        example=(
            "    for (int k = 0; k < K; ++k) {\n"
            "        acc += A[row * K + k] * x[k];\n"
            "    }",
            "    // r3: tune R3_UNROLL 1 2 4 8 16\n"
            "#ifndef R3_UNROLL\n"
            "#define R3_UNROLL 4\n"
            "#endif\n"
            "    constexpr int r3_unroll = R3_UNROLL;\n"
            "    #pragma unroll r3_unroll\n"
            "    for (int k = 0; k < K; ++k) {\n"
            "        acc += A[row * K + k] * x[k];\n"
            "    }",
        ),
        hint=True,
    ),
    Transformation(
        "fuse_loops",
        "loops",
        "Merge two consecutive loops over the same range into one loop, so the data is read once.",
        example=(
            "    for (int k = 0; k < n; ++k) mx = fmaxf(mx, x[k]);\n"
            "    for (int k = 0; k < n; ++k) sum += x[k];",
            "    for (int k = 0; k < n; ++k) {\n"
            "        float v = x[k];\n"
            "        mx = fmaxf(mx, v);\n"
            "        sum += v;\n"
            "    }",
        ),
    ),
    Transformation(
        "simplify_index_math",
        "loops",
        "Compute an array offset once and advance it by a constant stride each iteration "
        "instead of recomputing products of indices in every access.",
        example=(
            "    for (int k = 0; k < K; ++k) {\n"
            "        acc += A[row * K + k] * B[k * N + col];\n"
            "    }",
            "    const float* a = A + row * K;\n"
            "    const float* b = B + col;\n"
            "    for (int k = 0; k < K; ++k, b += N) {\n"
            "        acc += a[k] * *b;\n"
            "    }",
        ),
    ),
    Transformation(
        "warp_shuffle_reduction",
        "parallelism",
        "Finish the reduction inside each warp with `__shfl_down_sync(0xffffffff, v, offset)` "
        "for offset 16, 8, 4, 2, 1 instead of shared memory and `__syncthreads()`.",
        rule="warp_shuffle_reduction",
        example=(
            "    for (int s = blockDim.x / 2; s > 0; s /= 2) {\n"
            "        if (tid < s) buf[tid] += buf[tid + s];\n"
            "        __syncthreads();\n"
            "    }",
            "    for (int s = blockDim.x / 2; s > 16; s /= 2) {\n"
            "        if (tid < s) buf[tid] += buf[tid + s];\n"
            "        __syncthreads();\n"
            "    }\n"
            "    if (tid < 32) {\n"
            "        float v = buf[tid] + buf[tid + 16];\n"
            "        for (int offset = 8; offset > 0; offset /= 2) v +="
            " __shfl_down_sync(0xffffffff, v, offset);\n"
            "        if (tid == 0) buf[0] = v;\n"
            "    }",
        ),
    ),
    Transformation(
        "grid_stride_loop",
        "parallelism",
        "Let each thread handle several elements with a grid-stride loop "
        "(`for (i = start; i < n; i += gridDim.x * blockDim.x)`), and declare how many with "
        "`// r3: tune WPT 1 2 4 8` and `// r3: work_per_thread WPT`: the tuner then launches "
        "a grid WPT times smaller.",
        rule="grid_stride",
        example=(
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    if (i < n) {\n"
            "        y[i] = a * x[i] + y[i];\n"
            "    }",
            "    // r3: tune WPT 1 2 4 8\n"
            "    // r3: work_per_thread WPT\n"
            "    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x *"
            " blockDim.x) {\n"
            "        y[i] = a * x[i] + y[i];\n"
            "    }",
        ),
    ),
    Transformation(
        "accumulate_before_reduce",
        "parallelism",
        "Before a block reduction, let each thread sum several elements in a register with a "
        "loop over the grid's threads, and declare how many with `// r3: tune WPT 1 2 4 8` "
        "and `// r3: work_per_thread WPT`: the tree and its barriers are then paid once for "
        "WPT elements, and the tuner launches a grid WPT times smaller.",
        rule="strided_accumulate",
        example=(
            "    buf[tid] = (i < n) ? x[i] : 0.0f;",
            "    // r3: tune WPT 1 2 4 8\n"
            "    // r3: work_per_thread WPT\n"
            "    float acc = 0.0f;\n"
            "    for (int k = i; k < n; k += gridDim.x * blockDim.x) acc += x[k];\n"
            "    buf[tid] = acc;",
        ),
    ),
    Transformation(
        "split_loop_over_threads",
        "parallelism",
        "Give each output several neighbouring threads of a warp instead of one: each sums "
        "every SPLIT-th iteration of the output's loop, the warp adds their sums with "
        "`__shfl_xor_sync`, and the first of them stores; declare SPLIT with "
        "`// r3: tune SPLIT 1 2 4 8 16 32` and `// r3: threads_per_item SPLIT`: the tuner "
        "then launches a grid SPLIT times larger.",
        rule="split_loop",
        example=(
            "    int r = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    if (r >= n) return;\n"
            "    float acc = 0.0f;\n"
            "    for (int k = 0; k < m; ++k) acc += A[r * m + k] * w[k];\n"
            "    C[r] = acc;",
            "    // r3: tune SPLIT 1 2 4 8 16 32\n"
            "    // r3: threads_per_item SPLIT\n"
            "    // r3: require BLOCK_X % SPLIT == 0\n"
            "#ifndef SPLIT\n"
            "#define SPLIT 1\n"
            "#endif\n"
            "    int r = (blockIdx.x * blockDim.x + threadIdx.x) / SPLIT;\n"
            "    int lane = threadIdx.x % SPLIT;\n"
            "    if (r >= n) return;\n"
            "    float acc = 0.0f;\n"
            "    for (int k = lane; k < m; k += SPLIT) acc += A[r * m + k] * w[k];\n"
            "    unsigned mask = (0xffffffffu >> (32 - SPLIT)) << (threadIdx.x % 32u / SPLIT *"
            " SPLIT);\n"
            "    for (int o = SPLIT / 2; o > 0; o /= 2) acc += __shfl_xor_sync(mask, acc, o,"
            " SPLIT);\n"
            "    if (lane == 0) C[r] = acc;",
        ),
    ),
    Transformation(
        "swap_xy",
        "parallelism",
        "Exchange the x and y thread axes in the kernel (`threadIdx.x` with `threadIdx.y`, and "
        "so for `blockIdx`, `blockDim` and `gridDim`) where the row of an array comes from x, "
        "so that consecutive threads of a warp access consecutive addresses.",
        rule="swap_xy",
        example=(
            "    int r = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    int c = blockIdx.y * blockDim.y + threadIdx.y;\n"
            "    if (r < m && c < n) out[r * n + c] = a * in[r * n + c];",
            "    int r = blockIdx.y * blockDim.y + threadIdx.y;\n"
            "    int c = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    if (r < m && c < n) out[r * n + c] = a * in[r * n + c];",
        ),
    ),
    Transformation(
        "expose_tunable",
        "tuning",
        "Turn one fixed block, tile or unroll size into `#define NAME value` with the line "
        "`// r3: tune NAME v1 v2 v3` above it, so the tuner can try other values.",
        rule="expose_tunable",
        macros=True,
        example=(
            "#define TILE 16",
            "// r3: tune TILE 8 16 32\n"
            "#ifndef TILE\n"
            "#define TILE 16\n"
            "#endif",
        ),
        hint=True,
    ),
)

_BY_NAME = {t.name: t for t in CATALOGUE}


def transformation(name: str) -> Transformation:
    """The catalogue entry called ``name``; :class:`ConfigError` if there is none."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ConfigError(
            f"unknown transformation {name!r}", hint=f"known: {', '.join(_BY_NAME)}"
        ) from None


def mechanical() -> tuple[Transformation, ...]:
    """The transformations a rule can make without a model."""
    return tuple(t for t in CATALOGUE if t.rule is not None)
