/* r3rec: the R³ recording interposer, loaded with LD_PRELOAD by `r3 record -- ./app`.
 *
 * Why dlsym: the static CUDA runtime dlopens libcuda.so.1 and fetches cuGetProcAddress_v2
 * with dlsym on that handle, and the shared runtime gets every driver entry point through
 * cuGetProcAddress too, so hooking dlsym + cuGetProcAddress sees the driver calls of both
 * builds.  Driver-API programs that link libcuda directly reach the exported wrappers below.
 *
 * Device allocations are served from a VMM range reserved at exactly R3_ARENA_BASE (the
 * address r3tui/record/arena.py uses, with the same bump/alignment rules) so a replay in
 * another process maps the same addresses.  Each allocation keeps R3_GUARD_BYTES (default
 * 64 KiB) of mapped, zero-filled memory that belongs to no allocation before and after it:
 * a kernel that reads a few elements out of bounds, harmless where the driver's allocator
 * has memory mapped around a buffer, must not fault in a tight arena (replay maps the same).
 * A fault (an illegal address, a trap, ...) is detected where the interposer synchronizes or
 * reads its events, reported once as a "fault" event naming the launch, and from then on
 * every launch passes through untouched: no snapshot, no timing, and never read as a stream
 * capture (a sticky error makes cuStreamIsCapturing fail too).
 * The first launch of each (function, grid, block,
 * dynamic shared memory) is snapshotted (prologue/epilogue of the live allocations, or only
 * the reachable ones), and so is its second launch, as a check launch that candidates must
 * also pass (R3_RECORD_CHECKS=0: none); every launch is counted and timed with events read lazily, and so,
 * apart, are the launches whose argument bytes equal the recorded first launch's: those are
 * the launches a replay of the recording reproduces.
 * Snapshots are bounded: each costs a synchronization and two copies of the memory it keeps
 * (Rodinia lud, whose grid changes on every iteration, made 768 configurations and filled a
 * 64 GiB disk), so only the first R3_RECORD_MAX_CONFIGS configurations of each function are
 * snapshotted, and none once the bytes written to data/ would pass R3_RECORD_MAX_BYTES; the
 * others are counted and timed like any launch, and their "config" event says why not.  A
 * file that cannot be written (a full disk) is reported once ("write_error") and ends all
 * snapshots.
 * Strata: later launches that do other work (R3_RECORD_STRATA_FILE, written by `r3 record
 * --strata-from` from an earlier recording): a configuration's launches can pass other
 * arguments (an elimination step, an offset), and a replay of its first launch reproduces that
 * launch's work only.  Each line of the file names a configuration (entry point, grid, block,
 * shared memory) and pairs of its launch numbers (begin, snapshot): at `begin` a stratum, a
 * configuration of the same grid and block, starts (its launches count and time toward it from
 * there), and its launch `snapshot` is snapshotted as its first, with a check launch after it,
 * within the byte budget and apart from R3_RECORD_MAX_CONFIGS.
 * Stream capture and CUDA graphs: a launch into a capturing stream becomes a graph node, not
 * work, and an event or a synchronization there would break the capture, so it passes
 * through untouched (counted); graph launches are counted and timed as a whole, with the
 * kernel nodes each instantiated graph holds, but their kernels are not recorded.
 * Output: $R3_RECORD_DIR/index.jsonl (one JSON object a line, flushed per event, so a crash
 * loses at most the profile totals) and $R3_RECORD_DIR/data/ (raw snapshots and images).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define R3_ARENA_BASE 0x153940000000ULL
#define R3_DEFAULT_RESERVE (64ULL << 30)
#define R3_ALIGNMENT 256ULL
#define R3_MIN_CHUNK (64ULL << 20)
#define R3_MAX_PENDING 4096
#define R3_DEFAULT_GUARD (64ULL << 10)
#define R3_DEFAULT_MAX_CONFIGS 4ULL
#define R3_DEFAULT_MAX_BYTES (8ULL << 30)

/* ---------------------------------------------------------------- state ---------------- */
typedef struct { uint64_t addr, size; int live; } block_t;
/* launches: how many times the wrappers saw it launched (outside captures, before a fault) */
/* snapped: its configurations snapshotted so far (R3_RECORD_MAX_CONFIGS caps them);
 * need: the bytes its last snapshot took or would have taken (0: none tried yet) */
/* cache, carveout: what the application set with cu{Func,Kernel}SetCacheConfig and the
 * preferred shared-memory carveout attribute (-1: never set), for the replay to set alike;
 * from: the CUkernel a CUfunction was got from (cuKernelGetFunction), whose settings it has */
typedef struct { const void *key; int image; int is_kernel; char *name;
                 unsigned long long launches, snapped; uint64_t need;
                 int cache, carveout; const void *from; } func_t;
typedef struct { const void *handle; int image; } handle_t;
typedef struct { const void *data; size_t size; int dumped; } image_t;
typedef struct { int image; char *name; uint64_t addr, size; } global_t;
typedef struct {
    const void *func; unsigned g[3], b[3], shm; int id; int recorded;
    long fidx;  /* its function in funcs_, or -1 */
    /* checked: its second launch was snapshotted too, as a check launch: the same kernel on
     * the data (and arguments) the application had moved on to, which a candidate that fits
     * the first launch alone fails (docs/verification.md) */
    int checked;
    unsigned long long count; double time_s; unsigned long long timed;
    /* The recorded first launch's argument bytes are the reference (ref, packed at
     * ref_offs/ref_sizes when layout_known, else the launch's `extra` buffer); the launches
     * whose arguments equal them, the first included, are counted and timed apart (same_*):
     * they are what a replay reproduces.  ref_known 0: no reference (not recorded, or neither
     * a layout nor an argument buffer), so no same-args figures. */
    int ref_known, layout_known; unsigned char *ref; size_t nref, nparams, *ref_offs, *ref_sizes;
    unsigned long long same_count; double same_time_s; unsigned long long same_timed;
    /* strata (R3_RECORD_STRATA_FILE): root, the id of the key's first configuration (its
     * own); from, the key's launch number this one began at (1: the first); snap_at, the
     * launch to snapshot as its first (0: none pending); at, the one snapshotted; on the root,
     * the key's launches over all its strata, its line of the file and the next pair due */
    int root; unsigned long long from, snap_at, at, key_launches;
    const struct strata_s *strata; size_t next;
} config_t;
/* One line of R3_RECORD_STRATA_FILE: a configuration and its strata's (begin, snapshot). */
typedef struct strata_s {
    char *name; unsigned g[3], b[3], shm; size_t n; unsigned long long *begin, *snap;
} strata_t;
/* graph: 0 for a kernel configuration's launch, else index + 1 into graphs_; same: the
 * launch's arguments equal its configuration's reference; nth: the kernel's (or the
 * graph's) launch number, launch: the process's, both from 1, to name a fault */
typedef struct { CUevent a, b; int config, graph, same; unsigned long long nth, launch; } pending_t;
/* An executable graph: its kernel nodes when instantiated (-1: instantiated where the
 * wrappers did not see it) and its launches. */
typedef struct {
    const void *exec; int id, kernel_nodes;
    unsigned long long launches, timed; double time_s;
} graph_t;

static pthread_mutex_t lock_ = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static FILE *index_;
static char dir_[4096];
static int reachable_, checks_ = 1, getproc_seen_, exported_seen_, arena_failed_, finished_;
static unsigned long long launches_;
static char *only_;  /* comma-separated kernel names, or NULL for all */

static block_t *blocks_; static size_t nblocks_, capblocks_;
static func_t *funcs_; static size_t nfuncs_, capfuncs_;
static handle_t *handles_; static size_t nhandles_, caphandles_;
static image_t *images_; static size_t nimages_, capimages_;
static global_t *globals_; static size_t nglobals_, capglobals_;
static config_t *configs_; static size_t nconfigs_, capconfigs_;
static pending_t pending_[R3_MAX_PENDING]; static size_t npending_;
static graph_t *graphs_; static size_t ngraphs_, capgraphs_;
/* captures begun through the wrappers and not yet ended, process-wide */
static int capturing_;
static unsigned long long graph_launches_, captured_launches_, capture_skipped_;
/* faulted_: a fault was seen (and reported once); launches after it pass through, counted.
 * capture_unknown_: launches passed through because cuStreamIsCapturing failed otherwise. */
static int faulted_, launch_blocking_;
static unsigned long long after_fault_, capture_unknown_;
static CUresult capture_error_;

/* Snapshot bounds: configurations per function, bytes written to data/ (snap_bytes_, images
 * included).  A kernel's first configuration may take what is left of the byte budget; its
 * later configurations and check launches keep room (reserve_for()) for the largest first
 * snapshot taken so far, so one kernel cannot spend the budget before the kernels launched
 * after it are seen (Rodinia nw: its first kernel's configurations took 3 GiB and its second
 * kernel, half the device time, was never snapshotted).  budget_spent_: some snapshot did
 * not fit (budget_need_ its size, budget_reserve_ the room kept then); write_errno_: a file
 * could not be written (reported once), so no snapshot is taken any more. */
static unsigned long long max_configs_ = R3_DEFAULT_MAX_CONFIGS;
static strata_t *strata_; static size_t nstrata_, capstrata_;
static uint64_t max_bytes_ = R3_DEFAULT_MAX_BYTES, snap_bytes_, budget_need_, budget_reserve_;
static uint64_t largest_first_;
static int budget_spent_, write_errno_;

/* Snapshot files by content: bytes equal to a file written before are not written again, and
 * the event names that file (write_snapshot()).  A buffer the kernel does not write has an
 * epilogue equal to its prologue, and a buffer nothing wrote between two snapshots has the
 * prologue of the one the epilogue of the other: Rodinia lulesh's snapshots of 499 MiB each
 * left 9 of its 15 kernels outside a 3 GiB budget.  The budget counts the bytes written.
 * R3_RECORD_DEDUP=0: every file written. */
typedef struct { uint64_t hash[2], size; char name[40]; } written_t;
static written_t *written_; static size_t nwritten_, capwritten_;
static int dedup_ = 1;

static uint64_t arena_reserved_, arena_mapped_, arena_top_, granularity_, guard_;
static int arena_ready_, device_;
static CUmemAllocationProp prop_;

#define GROW(arr, n, cap) do { if ((n) == (cap)) { (cap) = (cap) ? 2 * (cap) : 64; \
    (arr) = realloc((arr), (cap) * sizeof *(arr)); } } while (0)

/* ---------------------------------------------------------------- real entry points ---- */
typedef void *(*dlsym_fn)(void *, const char *);
typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa1_fn)(const char *, void **, int, cuuint64_t);
static dlsym_fn real_dlsym_;
static gpa2_fn real_gpa2_;
static gpa1_fn real_gpa1_;

static void init_real_dlsym(void) {
    if (real_dlsym_) return;
    real_dlsym_ = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym_) real_dlsym_ = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
}

/* Driver functions this library calls itself, fetched through the real cuGetProcAddress
 * (`flags`: CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM for a _ptsz variant). */
static void *driver_fn_flags(const char *name, int version, cuuint64_t flags) {
    void *p = NULL;
    if (real_gpa2_) {
        CUdriverProcAddressQueryResult st;
        if (real_gpa2_(name, &p, version, flags, &st) == CUDA_SUCCESS) return p;
    }
    if (real_gpa1_ && real_gpa1_(name, &p, version, flags) == CUDA_SUCCESS)
        return p;
    if (!real_gpa2_ && !real_gpa1_) {  /* a program linked against libcuda: ask the linker */
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        init_real_dlsym();
        if (lib) {
            gpa2_fn gpa = (gpa2_fn)real_dlsym_(lib, "cuGetProcAddress_v2");
            CUdriverProcAddressQueryResult st;
            if (gpa && gpa(name, &p, version, flags, &st) == CUDA_SUCCESS) return p;
        }
    }
    return NULL;
}
static void *driver_fn(const char *name, int version) {
    return driver_fn_flags(name, version, CU_GET_PROC_ADDRESS_DEFAULT);
}
#define DRV(type, name, version) ((type)driver_fn(name, version))

typedef CUresult (*memalloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*mempitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef CUresult (*memfree_fn)(CUdeviceptr);
typedef CUresult (*memmanaged_fn)(CUdeviceptr *, size_t, unsigned int);
typedef CUresult (*memasync_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*mempool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*memfreeasync_fn)(CUdeviceptr, CUstream);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*launchex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, unsigned, CUstream, void **);
typedef CUresult (*getglobal_fn)(CUdeviceptr *, size_t *, void *, const char *);
typedef CUresult (*modload_fn)(CUmodule *, const void *);
typedef CUresult (*modloadex_fn)(CUmodule *, const void *, unsigned, CUjit_option *, void **);
typedef CUresult (*libload_fn)(CUlibrary *, const void *, CUjit_option *, void **, unsigned,
                               CUlibraryOption *, void **, unsigned);
typedef CUresult (*getfunc_fn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*getkernel_fn)(CUkernel *, CUlibrary, const char *);
typedef CUresult (*kernfunc_fn)(CUfunction *, CUkernel);
typedef CUresult (*libmod_fn)(CUmodule *, CUlibrary);
typedef CUresult (*funccache_fn)(CUfunction, CUfunc_cache);
typedef CUresult (*kerncache_fn)(CUkernel, CUfunc_cache, CUdevice);
typedef CUresult (*ctxcache_fn)(CUfunc_cache);
typedef CUresult (*funcattr_fn)(CUfunction, CUfunction_attribute, int);
typedef CUresult (*kernattr_fn)(CUfunction_attribute, int, CUkernel, CUdevice);
typedef CUresult (*capbegin_fn)(CUstream, CUstreamCaptureMode);
/* the edge data (CUgraphEdgeData, CUDA 12.3) as a plain pointer: older headers lack the type */
typedef CUresult (*captograph_fn)(CUstream, CUgraph, const CUgraphNode *, const void *, size_t,
                                  CUstreamCaptureMode);
typedef CUresult (*capend_fn)(CUstream, CUgraph *);
typedef CUresult (*ginst_fn)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*ginstp_fn)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
typedef CUresult (*glaunch_fn)(CUgraphExec, CUstream);

/* One slot per wrapped function; the *_ptsz slots hold per-thread-default-stream variants. */
static memalloc_fn r_alloc; static mempitch_fn r_pitch; static memfree_fn r_free;
static memmanaged_fn r_managed; static memasync_fn r_async, r_async_ptsz;
static mempool_fn r_pool, r_pool_ptsz; static memfreeasync_fn r_freeasync, r_freeasync_ptsz;
static launch_fn r_launch, r_launch_ptsz; static launchex_fn r_launchex, r_launchex_ptsz;
static coop_fn r_coop, r_coop_ptsz;
static getglobal_fn r_modglobal, r_libglobal;
static modload_fn r_modload, r_modfat; static modloadex_fn r_modloadex; static libload_fn r_libload;
static getfunc_fn r_getfunc; static getkernel_fn r_getkernel; static kernfunc_fn r_kernfunc;
static libmod_fn r_libmod;
static funccache_fn r_funccache; static kerncache_fn r_kerncache; static ctxcache_fn r_ctxcache;
static funcattr_fn r_funcattr; static kernattr_fn r_kernattr;
static capbegin_fn r_capbegin, r_capbegin_ptsz; static captograph_fn r_captograph, r_captograph_ptsz;
static capend_fn r_capend, r_capend_ptsz; static ginst_fn r_ginst;
static ginstp_fn r_ginstp, r_ginstp_ptsz; static glaunch_fn r_glaunch, r_glaunch_ptsz;

/* ---------------------------------------------------------------- output ---------------- */
/* Each process that reaches the driver writes its own p<pid>/ directory, created on its
 * first CUDA event: children that never use CUDA (a shell, a compiler) leave nothing, and a
 * forked child does not append to its parent's index. */
static pid_t index_pid_;

/* A count from the environment (`r3 record` sets it); unset or not a number: `fallback`. */
static unsigned long long env_count(const char *name, unsigned long long fallback) {
    const char *v = getenv(name);
    if (!v || !*v || *v == '-') return fallback;
    char *end = NULL;
    unsigned long long n = strtoull(v, &end, 10);
    return end && !*end ? n : fallback;
}

/* The configurations R3_RECORD_STRATA_FILE names (see the top of this file): one a line,
 * `entry gx gy gz bx by bz shm begin1 snap1 begin2 snap2 ...`; a line that does not parse is
 * left out. */
static void read_strata(const char *path) {
    FILE *f = path && *path ? fopen(path, "r") : NULL;
    if (!f) return;
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        char name[4096];
        strata_t s;
        memset(&s, 0, sizeof s);
        int used = 0;
        if (sscanf(line, "%4095s %u %u %u %u %u %u %u%n", name, &s.g[0], &s.g[1], &s.g[2],
                   &s.b[0], &s.b[1], &s.b[2], &s.shm, &used) != 8) continue;
        unsigned long long pairs[2 * 64];
        size_t n = 0;
        const char *at = line + used;
        int step = 0;
        while (n < 2 * 64 && sscanf(at, "%llu%n", &pairs[n], &step) == 1) { n++; at += step; }
        if (n < 2 || n % 2) continue;
        s.name = strdup(name);
        s.n = n / 2;
        s.begin = malloc(s.n * sizeof *s.begin);
        s.snap = malloc(s.n * sizeof *s.snap);
        for (size_t i = 0; i < s.n; i++) { s.begin[i] = pairs[2 * i]; s.snap[i] = pairs[2 * i + 1]; }
        GROW(strata_, nstrata_, capstrata_);
        strata_[nstrata_++] = s;
    }
    fclose(f);
}

/* The line of R3_RECORD_STRATA_FILE for this configuration, or NULL. */
static const strata_t *strata_of(const char *name, const unsigned g[3], const unsigned b[3],
                                 unsigned shm) {
    for (size_t i = 0; name && i < nstrata_; i++) {
        const strata_t *s = &strata_[i];
        if (!strcmp(s->name, name) && !memcmp(s->g, g, sizeof s->g) &&
            !memcmp(s->b, b, sizeof s->b) && s->shm == shm) return s;
    }
    return NULL;
}

static void open_index(void) {
    if (index_ && index_pid_ != getpid()) { index_ = NULL; }  /* forked: the FILE is the parent's */
    if (index_ || finished_) return;
    const char *d = getenv("R3_RECORD_DIR");
    if (!d || !*d) return;
    index_pid_ = getpid();
    mkdir(d, 0755);
    snprintf(dir_, sizeof dir_, "%s/p%d", d, (int)index_pid_);
    char path[4200];
    mkdir(dir_, 0755);
    snprintf(path, sizeof path, "%s/data", dir_);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/index.jsonl", dir_);
    index_ = fopen(path, "a");
    if (!index_) return;
    const char *r = getenv("R3_RECORD_REACHABLE");
    reachable_ = r && *r == '1';
    const char *ck = getenv("R3_RECORD_CHECKS");
    checks_ = !(ck && *ck == '0');
    const char *k = getenv("R3_RECORD_KERNELS");
    only_ = k && *k ? strdup(k) : NULL;
    max_configs_ = env_count("R3_RECORD_MAX_CONFIGS", R3_DEFAULT_MAX_CONFIGS);
    max_bytes_ = env_count("R3_RECORD_MAX_BYTES", R3_DEFAULT_MAX_BYTES);
    const char *dd = getenv("R3_RECORD_DEDUP");
    dedup_ = !(dd && *dd == '0');
    read_strata(getenv("R3_RECORD_STRATA_FILE"));
    fprintf(index_, "{\"ev\":\"start\",\"pid\":%d,\"reachable\":%d,\"max_configs\":%llu,"
            "\"max_bytes\":%llu,\"strata\":%zu,\"dedup\":%d}\n", (int)index_pid_, reachable_,
            max_configs_, (unsigned long long)max_bytes_, nstrata_, dedup_);
    fflush(index_);
}

static void emit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void emit(const char *fmt, ...) {
    open_index();
    if (!index_) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(index_, fmt, ap);
    va_end(ap);
    fputc('\n', index_);
    fflush(index_);
}

static void emit_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* The first file that could not be written (a full disk, a quota): reported once with the
 * bytes written before it.  The partial file is removed, so the index lines that follow
 * (this event, the profile) find room. */
static void note_write_error(const char *path, int err) {
    if (write_errno_) return;
    write_errno_ = err ? err : EIO;
    open_index();
    if (!index_) return;
    fputs("{\"ev\":\"write_error\",\"file\":", index_);
    emit_string(index_, path);
    fprintf(index_, ",\"errno\":%d,\"text\":", write_errno_);
    emit_string(index_, strerror(write_errno_));
    fprintf(index_, ",\"bytes\":%llu}\n", (unsigned long long)snap_bytes_);
    fflush(index_);
}

/* Write data/<name>; -1 when it could not be (then, and after any earlier failure, nothing
 * more is written: the disk is full or the directory gone). */
static int write_file(const char *name, const void *data, size_t size) {
    if (write_errno_) return -1;
    char path[4300];
    snprintf(path, sizeof path, "%s/data/%s", dir_, name);
    FILE *f = fopen(path, "wb");
    if (!f) { note_write_error(path, errno); return -1; }
    errno = 0;
    size_t n = size ? fwrite(data, 1, size, f) : 0;
    int err = n == size ? 0 : errno ? errno : EIO;
    if (fclose(f) != 0 && !err) err = errno ? errno : EIO;
    if (err) {
        unlink(path);
        note_write_error(path, err);
        return -1;
    }
    snap_bytes_ += size;
    return 0;
}

/* ---------------------------------------------------------------- arena ----------------- */
static uint64_t round_up(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

static void fault_pending(CUresult rc, const char *where);
static int is_fault(CUresult rc);

/* R3_GUARD_BYTES (set by `r3 record --guard-bytes N`), rounded up to the allocation
 * alignment; unset or not a number: the default.  The guard need not be a multiple of the
 * VMM granularity: the arena is one contiguous mapping, so a guard is only a gap left by the
 * bump allocator, mapped with the chunk around it. */
static uint64_t guard_from_env(void) {
    const char *v = getenv("R3_GUARD_BYTES");
    if (!v || !*v || *v == '-') return R3_DEFAULT_GUARD;
    char *end = NULL;
    unsigned long long n = strtoull(v, &end, 10);
    return end && !*end ? round_up(n, R3_ALIGNMENT) : R3_DEFAULT_GUARD;
}

/* Where an allocation of n bytes goes when the bump offset is `top`: at least `guard` bytes
 * after the end of the previous allocation (the first: after the arena's base), aligned.
 * *end is how far the arena must be mapped: its last byte and the guard after it. */
static uint64_t arena_place(uint64_t top, uint64_t n, uint64_t guard, uint64_t *end) {
    uint64_t off = round_up(top + guard, R3_ALIGNMENT);
    *end = off + n + guard;
    return off;
}

static int arena_init(void) {
    if (arena_ready_) return 0;
    if (arena_failed_) return -1;
    CUresult (*ctxdev)(CUdevice *) = DRV(CUresult (*)(CUdevice *), "cuCtxGetDevice", 2000);
    CUresult (*gran)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags) =
        DRV(CUresult (*)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags),
            "cuMemGetAllocationGranularity", 10020);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long) =
        DRV(CUresult (*)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long),
            "cuMemAddressReserve", 10020);
    CUresult (*attr)(int *, CUdevice_attribute, CUdevice) =
        DRV(CUresult (*)(int *, CUdevice_attribute, CUdevice), "cuDeviceGetAttribute", 2000);
    CUdevice dev = 0;
    if (!ctxdev || !gran || !reserve || ctxdev(&dev) != CUDA_SUCCESS) {
        arena_failed_ = 1;
        emit("{\"ev\":\"arena\",\"ok\":0,\"error\":\"driver VMM entry points or context missing\"}");
        return -1;
    }
    device_ = (int)dev;
    memset(&prop_, 0, sizeof prop_);
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device_;
    size_t g = 0;
    if (gran(&g, &prop_, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS || !g) g = 2 << 20;
    granularity_ = g;
    const char *env = getenv("R3_ARENA_RESERVE");
    uint64_t want = env ? strtoull(env, NULL, 10) : 0;
    if (want < R3_DEFAULT_RESERVE) want = R3_DEFAULT_RESERVE;
    want = round_up(want, g);
    CUdeviceptr got = 0;
    CUresult rc = reserve(&got, want, g, R3_ARENA_BASE, 0);
    if (rc != CUDA_SUCCESS || got != R3_ARENA_BASE) {
        arena_failed_ = 1;
        emit("{\"ev\":\"arena\",\"ok\":0,\"error\":\"cuMemAddressReserve gave %#llx (error %d), "
             "not %#llx\"}", (unsigned long long)got, (int)rc, R3_ARENA_BASE);
        return -1;
    }
    int major = 0, minor = 0;
    if (attr) {
        attr(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
        attr(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    }
    arena_reserved_ = want;
    arena_ready_ = 1;
    guard_ = guard_from_env();
    emit("{\"ev\":\"arena\",\"ok\":1,\"base\":%llu,\"reserved\":%llu,\"granularity\":%llu,"
         "\"device\":%d,\"arch\":\"sm_%d%d\",\"guard\":%llu}", R3_ARENA_BASE,
         (unsigned long long)want, (unsigned long long)g, device_, major, minor,
         (unsigned long long)guard_);
    return 0;
}

/* Zero a newly mapped chunk, so the guards and alignment gaps read as zero, as they do in
 * replay (its prologue image is zero outside the allocations).  The memset runs on the legacy
 * stream, so wait for it before the memory is handed out.  Not while a capture is open: a
 * memset and a synchronization there are prohibited calls that would break it. */
static void zero_chunk(CUdeviceptr addr, size_t size) {
    if (capturing_ > 0 || faulted_) return;
    CUresult (*memset8)(CUdeviceptr, unsigned char, size_t) =
        DRV(CUresult (*)(CUdeviceptr, unsigned char, size_t), "cuMemsetD8", 3020);
    CUresult (*sync)(void) = DRV(CUresult (*)(void), "cuCtxSynchronize", 2000);
    if (!memset8 || !sync || memset8(addr, 0, size) != CUDA_SUCCESS) return;
    CUresult rc = sync();
    if (is_fault(rc)) fault_pending(rc, "cuCtxSynchronize after zeroing new arena memory");
}

static int arena_map_until(uint64_t end) {
    if (end <= arena_mapped_) return 0;
    if (end > arena_reserved_) return -1;
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long) =
        DRV(CUresult (*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                         unsigned long long), "cuMemCreate", 10020);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) =
        DRV(CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                         unsigned long long), "cuMemMap", 10020);
    CUresult (*access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t) =
        DRV(CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t),
            "cuMemSetAccess", 10020);
    if (!create || !map || !access) return -1;
    uint64_t rest = arena_reserved_ - arena_mapped_;
    uint64_t want = end - arena_mapped_;
    uint64_t floor = R3_MIN_CHUNK < rest ? R3_MIN_CHUNK : rest;
    if (want < floor) want = floor;
    uint64_t size = round_up(want, granularity_);
    if (size > rest) size = rest;
    CUmemGenericAllocationHandle h;
    if (create(&h, size, &prop_, 0) != CUDA_SUCCESS) return -1;
    if (map(R3_ARENA_BASE + arena_mapped_, size, 0, h, 0) != CUDA_SUCCESS) return -1;
    CUmemAccessDesc desc;
    memset(&desc, 0, sizeof desc);
    desc.location = prop_.location;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (access(R3_ARENA_BASE + arena_mapped_, size, &desc, 1) != CUDA_SUCCESS) return -1;
    zero_chunk(R3_ARENA_BASE + arena_mapped_, size);
    arena_mapped_ += size;
    return 0;
}

/* Returns the block index, or -1 when the arena cannot serve it (caller passes through). */
static long arena_alloc(uint64_t size, CUdeviceptr *out) {
    if (arena_init() != 0) return -1;
    uint64_t n = size ? size : 1, end;
    uint64_t off = arena_place(arena_top_, n, guard_, &end);
    if (arena_map_until(end) != 0) return -1;
    arena_top_ = off + n;
    GROW(blocks_, nblocks_, capblocks_);
    blocks_[nblocks_] = (block_t){R3_ARENA_BASE + off, size, 1};
    *out = R3_ARENA_BASE + off;
    return (long)nblocks_++;
}

/* Blocks are appended in address order (a bump allocator never reuses), so bisect. */
static long block_at(uint64_t addr) {
    size_t lo = 0, hi = nblocks_;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (blocks_[mid].addr <= addr) lo = mid + 1; else hi = mid;
    }
    if (lo == 0) return -1;
    block_t *b = &blocks_[lo - 1];
    return (b->live && addr < b->addr + (b->size ? b->size : 1)) ? (long)(lo - 1) : -1;
}

static int in_arena(uint64_t addr) {
    return arena_ready_ && addr >= R3_ARENA_BASE && addr < R3_ARENA_BASE + arena_reserved_;
}

/* ---------------------------------------------------------------- allocation wrappers --- */
static CUresult serve(CUdeviceptr *dptr, size_t size, const char *api) {
    pthread_mutex_lock(&lock_);
    long id = arena_alloc(size, dptr);
    if (id >= 0)
        emit("{\"ev\":\"alloc\",\"id\":%ld,\"addr\":%llu,\"size\":%zu,\"kind\":\"arena\",\"api\":\"%s\"}",
             id, (unsigned long long)*dptr, size, api);
    pthread_mutex_unlock(&lock_);
    return id >= 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
}

static void note_outside(CUdeviceptr p, size_t size, const char *kind, const char *api) {
    pthread_mutex_lock(&lock_);
    emit("{\"ev\":\"alloc\",\"id\":-1,\"addr\":%llu,\"size\":%zu,\"kind\":\"%s\",\"api\":\"%s\"}",
         (unsigned long long)p, size, kind, api);
    pthread_mutex_unlock(&lock_);
}

static CUresult w_alloc(CUdeviceptr *dptr, size_t size) {
    if (!r_alloc) r_alloc = (memalloc_fn)driver_fn("cuMemAlloc", 3020);
    if (serve(dptr, size, "cuMemAlloc") == CUDA_SUCCESS) return CUDA_SUCCESS;
    CUresult rc = r_alloc ? r_alloc(dptr, size) : CUDA_ERROR_NOT_INITIALIZED;
    if (rc == CUDA_SUCCESS) note_outside(*dptr, size, "device", "cuMemAlloc");
    return rc;
}

static CUresult w_pitch(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned elem) {
    /* The driver pads rows to its texture pitch alignment; 512 bytes covers sm_50..sm_90. */
    size_t p = (size_t)round_up(width ? width : 1, 512);
    if (serve(dptr, p * height, "cuMemAllocPitch") == CUDA_SUCCESS) { *pitch = p; return CUDA_SUCCESS; }
    CUresult rc = r_pitch ? r_pitch(dptr, pitch, width, height, elem) : CUDA_ERROR_NOT_INITIALIZED;
    if (rc == CUDA_SUCCESS) note_outside(*dptr, *pitch * height, "device", "cuMemAllocPitch");
    return rc;
}

static CUresult w_free(CUdeviceptr p) {
    pthread_mutex_lock(&lock_);
    if (in_arena(p)) {
        long id = block_at(p);
        if (id >= 0 && blocks_[id].addr == p) {
            blocks_[id].live = 0;
            emit("{\"ev\":\"free\",\"id\":%ld,\"addr\":%llu}", id, (unsigned long long)p);
        }
        pthread_mutex_unlock(&lock_);
        return id >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    }
    emit("{\"ev\":\"free\",\"id\":-1,\"addr\":%llu}", (unsigned long long)p);
    pthread_mutex_unlock(&lock_);
    if (!r_free) r_free = (memfree_fn)driver_fn("cuMemFree", 3020);
    return r_free ? r_free(p) : CUDA_ERROR_NOT_INITIALIZED;
}

static CUresult w_managed(CUdeviceptr *dptr, size_t size, unsigned flags) {
    if (!r_managed) r_managed = (memmanaged_fn)driver_fn("cuMemAllocManaged", 6000);
    CUresult rc = r_managed ? r_managed(dptr, size, flags) : CUDA_ERROR_NOT_INITIALIZED;
    if (rc == CUDA_SUCCESS) note_outside(*dptr, size, "managed", "cuMemAllocManaged");
    return rc;
}

static CUresult w_async(CUdeviceptr *d, size_t n, CUstream s) {
    CUresult rc = r_async(d, n, s);
    if (rc == CUDA_SUCCESS) note_outside(*d, n, "stream_ordered", "cuMemAllocAsync");
    return rc;
}
static CUresult w_async_ptsz(CUdeviceptr *d, size_t n, CUstream s) {
    CUresult rc = r_async_ptsz(d, n, s);
    if (rc == CUDA_SUCCESS) note_outside(*d, n, "stream_ordered", "cuMemAllocAsync");
    return rc;
}
static CUresult w_pool(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) {
    CUresult rc = r_pool(d, n, p, s);
    if (rc == CUDA_SUCCESS) note_outside(*d, n, "stream_ordered", "cuMemAllocFromPoolAsync");
    return rc;
}
static CUresult w_pool_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) {
    CUresult rc = r_pool_ptsz(d, n, p, s);
    if (rc == CUDA_SUCCESS) note_outside(*d, n, "stream_ordered", "cuMemAllocFromPoolAsync");
    return rc;
}
static CUresult w_freeasync(CUdeviceptr d, CUstream s) {
    emit("{\"ev\":\"free\",\"id\":-1,\"addr\":%llu}", (unsigned long long)d);
    return r_freeasync(d, s);
}
static CUresult w_freeasync_ptsz(CUdeviceptr d, CUstream s) {
    emit("{\"ev\":\"free\",\"id\":-1,\"addr\":%llu}", (unsigned long long)d);
    return r_freeasync_ptsz(d, s);
}

/* ---------------------------------------------------------------- modules and names ----- */
/* The image the loader was given: an ELF cubin, a fatbin (maybe behind nvcc's wrapper
 * struct), or PTX text.  Returns the start of the bytes to keep and sets their size. */
static const void *image_extent(const void *p, size_t *size) {
    const unsigned char *b = p;
    *size = 0;
    if (!b) return NULL;
    uint32_t magic;
    memcpy(&magic, b, 4);
    if (magic == 0x466243b1u) {  /* __fatBinC_Wrapper_t {magic, version, data, filename} */
        memcpy(&b, b + 8, sizeof b);
        memcpy(&magic, b, 4);
    }
    if (magic == 0xBA55ED50u) {  /* fatbin header {magic, u16 version, u16 header size, u64 size} */
        uint16_t hsize; uint64_t fsize;
        memcpy(&hsize, b + 6, 2);
        memcpy(&fsize, b + 8, 8);
        *size = (size_t)hsize + (size_t)fsize;
    } else if (b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F') {
        uint64_t shoff; uint16_t shentsize, shnum;
        memcpy(&shoff, b + 0x28, 8);
        memcpy(&shentsize, b + 0x3A, 2);
        memcpy(&shnum, b + 0x3C, 2);
        uint64_t end = shoff + (uint64_t)shentsize * shnum;
        for (uint16_t i = 0; i < shnum; i++) {  /* a section may follow the header table */
            const unsigned char *sh = b + shoff + (uint64_t)i * shentsize;
            uint32_t type; uint64_t off, sz;
            memcpy(&type, sh + 4, 4);
            memcpy(&off, sh + 0x18, 8);
            memcpy(&sz, sh + 0x20, 8);
            if (type != 8 && off + sz > end) end = off + sz;  /* 8: SHT_NOBITS */
        }
        *size = (size_t)end;
    } else {
        *size = strlen((const char *)b) + 1;
    }
    return b;
}

static int image_dump(int id) {
    if (id < 0 || (size_t)id >= nimages_) return -1;
    image_t *im = &images_[id];
    if (im->dumped) return 0;
    char name[64];
    snprintf(name, sizeof name, "image-%d.bin", id);
    if (write_file(name, im->data, im->size) != 0) return -1;
    im->dumped = 1;
    emit("{\"ev\":\"image\",\"id\":%d,\"file\":\"%s\",\"size\":%zu}", id, name, im->size);
    return 0;
}

static void note_image(const void *handle, const void *code) {
    size_t size;
    const void *data = image_extent(code, &size);
    pthread_mutex_lock(&lock_);
    GROW(images_, nimages_, capimages_);
    int id = (int)nimages_++;
    images_[id] = (image_t){data, size, 0};
    GROW(handles_, nhandles_, caphandles_);
    handles_[nhandles_++] = (handle_t){handle, id};
    /* Images inside a loaded object (the executable, a library) stay valid: dump them when a
     * recorded kernel needs them.  A heap buffer may be freed after loading: dump it now. */
    Dl_info info;
    if (!data || !dladdr(data, &info) || !info.dli_fname) image_dump(id);
    pthread_mutex_unlock(&lock_);
}

static int image_of_handle(const void *h) {
    for (size_t i = nhandles_; i-- > 0;)
        if (handles_[i].handle == h) return handles_[i].image;
    return -1;
}

static func_t *func_lookup(const void *key) {
    for (size_t i = nfuncs_; i-- > 0;)
        if (funcs_[i].key == key) return &funcs_[i];
    return NULL;
}

static void note_func(const void *key, int image, int is_kernel, const char *name) {
    pthread_mutex_lock(&lock_);
    func_t *f = func_lookup(key);
    if (!f) {
        GROW(funcs_, nfuncs_, capfuncs_);
        f = &funcs_[nfuncs_++];
        /* every field: realloc'd memory is not zeroed, and counters read garbage (an
         * application whose 65th function started with "--max-configs reached") */
        *f = (func_t){key, -1, 0, NULL, 0, 0, 0, -1, -1, NULL};
    }
    if (image >= 0) f->image = image;
    f->is_kernel |= is_kernel;
    if (name && !f->name) f->name = strdup(name);
    pthread_mutex_unlock(&lock_);
}

static CUresult w_modload(CUmodule *m, const void *image) {
    CUresult rc = r_modload(m, image);
    if (rc == CUDA_SUCCESS) note_image(*m, image);
    return rc;
}
static CUresult w_modfat(CUmodule *m, const void *image) {
    CUresult rc = r_modfat(m, image);
    if (rc == CUDA_SUCCESS) note_image(*m, image);
    return rc;
}
static CUresult w_modloadex(CUmodule *m, const void *image, unsigned n, CUjit_option *o, void **v) {
    CUresult rc = r_modloadex(m, image, n, o, v);
    if (rc == CUDA_SUCCESS) note_image(*m, image);
    return rc;
}
static CUresult w_libload(CUlibrary *l, const void *code, CUjit_option *jo, void **jv, unsigned nj,
                          CUlibraryOption *lo, void **lv, unsigned nl) {
    CUresult rc = r_libload(l, code, jo, jv, nj, lo, lv, nl);
    if (rc == CUDA_SUCCESS) note_image(*l, code);
    return rc;
}
static CUresult w_getfunc(CUfunction *f, CUmodule m, const char *name) {
    CUresult rc = r_getfunc(f, m, name);
    if (rc == CUDA_SUCCESS) note_func(*f, image_of_handle(m), 0, name);
    return rc;
}
static CUresult w_getkernel(CUkernel *k, CUlibrary l, const char *name) {
    CUresult rc = r_getkernel(k, l, name);
    if (rc == CUDA_SUCCESS) note_func(*k, image_of_handle(l), 1, name);
    return rc;
}
static CUresult w_kernfunc(CUfunction *f, CUkernel k) {
    CUresult rc = r_kernfunc(f, k);
    if (rc == CUDA_SUCCESS) {
        func_t *kf = func_lookup(k);
        note_func(*f, kf ? kf->image : -1, 0, kf ? kf->name : NULL);
        pthread_mutex_lock(&lock_);
        func_t *ff = func_lookup(*f);
        if (ff) ff->from = k;
        pthread_mutex_unlock(&lock_);
    }
    return rc;
}

/* The L1/shared split the application asked for, per function or kernel (and for the
 * context): a replay that ignored it timed hotspot3D, which prefers L1, with another split. */
static int ctx_cache_ = -1;
static void note_setting(const void *key, int is_kernel, int cache, int carveout) {
    note_func(key, -1, is_kernel, NULL);
    pthread_mutex_lock(&lock_);
    func_t *f = func_lookup(key);
    if (f && cache >= 0) f->cache = cache;
    if (f && carveout != -2) f->carveout = carveout;  /* -2: not this call's setting */
    pthread_mutex_unlock(&lock_);
}
static CUresult w_funccache(CUfunction f, CUfunc_cache config) {
    CUresult rc = r_funccache(f, config);
    if (rc == CUDA_SUCCESS) note_setting(f, 0, (int)config, -2);
    return rc;
}
static CUresult w_kerncache(CUkernel k, CUfunc_cache config, CUdevice dev) {
    CUresult rc = r_kerncache(k, config, dev);
    if (rc == CUDA_SUCCESS) note_setting(k, 1, (int)config, -2);
    return rc;
}
static CUresult w_ctxcache(CUfunc_cache config) {
    CUresult rc = r_ctxcache(config);
    if (rc == CUDA_SUCCESS) ctx_cache_ = (int)config;
    return rc;
}
static CUresult w_funcattr(CUfunction f, CUfunction_attribute attr, int value) {
    CUresult rc = r_funcattr(f, attr, value);
    if (rc == CUDA_SUCCESS && attr == CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT)
        note_setting(f, 0, -1, value);
    return rc;
}
static CUresult w_kernattr(CUfunction_attribute attr, int value, CUkernel k, CUdevice dev) {
    CUresult rc = r_kernattr(attr, value, k, dev);
    if (rc == CUDA_SUCCESS && attr == CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT)
        note_setting(k, 1, -1, value);
    return rc;
}

/* The settings in force for a launch of `fi` (under the lock): its own, else its kernel's,
 * else (the cache preference) the context's; -1 where none was set. */
static void settings_of(const func_t *fi, int *cache, int *carveout) {
    *cache = fi ? fi->cache : -1;
    *carveout = fi ? fi->carveout : -1;
    const func_t *k = fi && fi->from ? func_lookup(fi->from) : NULL;
    if (k && *cache < 0) *cache = k->cache;
    if (k && *carveout < 0) *carveout = k->carveout;
    if (*cache < 0) *cache = ctx_cache_;
}
static CUresult w_libmod(CUmodule *m, CUlibrary l) {
    CUresult rc = r_libmod(m, l);
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&lock_);
        GROW(handles_, nhandles_, caphandles_);
        handles_[nhandles_++] = (handle_t){*m, image_of_handle(l)};
        pthread_mutex_unlock(&lock_);
    }
    return rc;
}

static void note_global(const void *handle, const char *name, CUdeviceptr p, size_t size) {
    pthread_mutex_lock(&lock_);
    int image = image_of_handle(handle);
    for (size_t i = 0; i < nglobals_; i++)
        if (globals_[i].addr == p && globals_[i].image == image) { pthread_mutex_unlock(&lock_); return; }
    GROW(globals_, nglobals_, capglobals_);
    globals_[nglobals_++] = (global_t){image, strdup(name), p, size};
    open_index();
    if (index_) {
        fprintf(index_, "{\"ev\":\"global\",\"image\":%d,\"name\":", image);
        emit_string(index_, name);
        fprintf(index_, ",\"addr\":%llu,\"size\":%zu}\n", (unsigned long long)p, size);
        fflush(index_);
    }
    pthread_mutex_unlock(&lock_);
}
/* cuModuleGetGlobal and cuLibraryGetGlobal: the same call on a module or a library handle.
 * The caller may pass NULL for either output; the wrapper always needs both. */
static CUresult get_global(getglobal_fn real, CUdeviceptr *p, size_t *bytes, void *handle,
                           const char *name) {
    CUdeviceptr ptr = 0; size_t size = 0;
    CUresult rc = real ? real(&ptr, &size, handle, name) : CUDA_ERROR_NOT_INITIALIZED;
    if (rc == CUDA_SUCCESS) {
        if (p) *p = ptr;
        if (bytes) *bytes = size;
        note_global(handle, name, ptr, size);
    }
    return rc;
}
static CUresult w_modglobal(CUdeviceptr *p, size_t *bytes, void *m, const char *name) {
    return get_global(r_modglobal, p, bytes, m, name);
}
static CUresult w_libglobal(CUdeviceptr *p, size_t *bytes, void *l, const char *name) {
    return get_global(r_libglobal, p, bytes, l, name);
}

/* ---------------------------------------------------------------- launches -------------- */
typedef CUresult (*evcreate_fn)(CUevent *, unsigned);
typedef CUresult (*evrecord_fn)(CUevent, CUstream);
typedef CUresult (*evone_fn)(CUevent);
typedef CUresult (*evelapsed_fn)(float *, CUevent, CUevent);
typedef CUresult (*sync_fn)(void);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t);
typedef CUresult (*fname_fn)(const char **, CUfunction);
typedef CUresult (*pinfo_fn)(CUfunction, size_t, size_t *, size_t *);
typedef CUresult (*fmod_fn)(CUmodule *, CUfunction);

static evcreate_fn d_evcreate; static evrecord_fn d_evrecord, d_evrecord_ptsz;
static evone_fn d_evquery, d_evsync, d_evdestroy; static evelapsed_fn d_elapsed;
static sync_fn d_sync; static dtoh_fn d_dtoh; static fname_fn d_fname; static pinfo_fn d_pinfo;
static fmod_fn d_fmod;
typedef CUresult (*kname_fn)(const char **, CUkernel);
typedef CUresult (*klib_fn)(CUlibrary *, CUkernel);
static kname_fn d_kname; static klib_fn d_klib;
typedef CUresult (*iscap_fn)(CUstream, CUstreamCaptureStatus *);
typedef CUresult (*gnodes_fn)(CUgraph, CUgraphNode *, size_t *);
typedef CUresult (*gntype_fn)(CUgraphNode, CUgraphNodeType *);
typedef CUresult (*gchild_fn)(CUgraphNode, CUgraph *);
typedef CUresult (*gkparams_fn)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS *);
static iscap_fn d_iscap, d_iscap_ptsz; static gnodes_fn d_gnodes; static gntype_fn d_gntype;
static gchild_fn d_gchild; static gkparams_fn d_gkparams;
static CUevent free_events_[2 * R3_MAX_PENDING]; static size_t nfree_events_;

static void resolve_launch_helpers(void) {
    if (d_sync) return;
    d_evcreate = DRV(evcreate_fn, "cuEventCreate", 2000);
    d_evrecord = DRV(evrecord_fn, "cuEventRecord", 2000);
    const cuuint64_t ptds = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    void *p = driver_fn_flags("cuEventRecord", 7000, ptds);
    d_evrecord_ptsz = p ? (evrecord_fn)p : d_evrecord;
    d_iscap = DRV(iscap_fn, "cuStreamIsCapturing", 10000);
    p = driver_fn_flags("cuStreamIsCapturing", 10000, ptds);
    d_iscap_ptsz = p ? (iscap_fn)p : d_iscap;
    d_gnodes = DRV(gnodes_fn, "cuGraphGetNodes", 10000);
    d_gntype = DRV(gntype_fn, "cuGraphNodeGetType", 10000);
    d_gchild = DRV(gchild_fn, "cuGraphChildGraphNodeGetGraph", 10000);
    d_gkparams = DRV(gkparams_fn, "cuGraphKernelNodeGetParams", 12000);  /* the _v2 params */
    d_evquery = DRV(evone_fn, "cuEventQuery", 2000);
    d_evsync = DRV(evone_fn, "cuEventSynchronize", 2000);
    d_evdestroy = DRV(evone_fn, "cuEventDestroy", 4000);
    d_elapsed = DRV(evelapsed_fn, "cuEventElapsedTime", CUDA_VERSION);
    d_dtoh = DRV(dtoh_fn, "cuMemcpyDtoH", 3020);
    d_fname = DRV(fname_fn, "cuFuncGetName", 12030);
    d_pinfo = DRV(pinfo_fn, "cuFuncGetParamInfo", 12040);
    d_fmod = DRV(fmod_fn, "cuFuncGetModule", 11000);
    d_kname = DRV(kname_fn, "cuKernelGetName", 12030);
    d_klib = DRV(klib_fn, "cuKernelGetLibrary", 12050);
    if (!r_kernfunc) r_kernfunc = DRV(kernfunc_fn, "cuKernelGetFunction", 12000);
    d_sync = DRV(sync_fn, "cuCtxSynchronize", 2000);
    const char *lb = getenv("CUDA_LAUNCH_BLOCKING");
    launch_blocking_ = lb && *lb == '1';
}

/* The launch gate.  Events around a launch time it from the start event to the end event on
 * the GPU.  On an idle stream the start event is processed at once and the kernel only once
 * the host has finished submitting it, so the host's launch latency (microseconds, more under
 * recording) would count as kernel time: the kernels an application launches right after a
 * synchronization looked up to 20% slower in the profile than in replay.  So the stream first
 * waits on a word of mapped host memory (cuStreamWaitValue32, GEQ), the start event, the launch
 * and the end event are queued behind it, and the host opens the gate after submitting them
 * all.  A stream with work ahead of the gate is not held up at all.  Without stream memory
 * operations or mapped host memory the gate is off and timing is as before (gate_state_ -1). */
typedef CUresult (*waitval_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*hostalloc_fn)(void **, size_t, unsigned int);
typedef CUresult (*hostdptr_fn)(CUdeviceptr *, void *, unsigned int);
static waitval_fn d_waitval, d_waitval_ptsz;
static cuuint32_t *gate_host_;
static CUdeviceptr gate_dev_;
static cuuint32_t gate_seq_;
static int gate_state_;  /* 0 not tried yet, 1 on, -1 off */
static unsigned long long gated_;

static void gate_init(void) {
    gate_state_ = -1;
    /* With CUDA_LAUNCH_BLOCKING=1 a launch returns when its kernel has finished, and the
     * kernel waits for the gate the host opens after the launch returns: no gate. */
    if (getenv("R3_REC_NO_GATE") || launch_blocking_) return;
    hostalloc_fn halloc = DRV(hostalloc_fn, "cuMemHostAlloc", 3020);
    hostdptr_fn hdptr = DRV(hostdptr_fn, "cuMemHostGetDevicePointer", 3020);
    d_waitval = DRV(waitval_fn, "cuStreamWaitValue32", 11070);
    void *p = driver_fn_flags("cuStreamWaitValue32", 11070,
                              CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    d_waitval_ptsz = p ? (waitval_fn)p : d_waitval;
    void *word = NULL;
    if (!halloc || !hdptr || !d_waitval ||
        halloc(&word, sizeof(cuuint32_t),
               CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP) != CUDA_SUCCESS)
        return;
    gate_host_ = word;
    __atomic_store_n(gate_host_, 0, __ATOMIC_RELEASE);
    if (hdptr(&gate_dev_, word, 0) == CUDA_SUCCESS) gate_state_ = 1;
}

/* Queue the wait; 1 if the caller must call gate_open() after submitting its work. */
static int gate_close(int ptsz, CUstream s) {
    if (gate_state_ == 0) gate_init();
    if (gate_state_ != 1) return 0;
    cuuint32_t next = gate_seq_ + 1;
    waitval_fn wait = ptsz ? d_waitval_ptsz : d_waitval;
    if (wait(s, gate_dev_, next, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS) {
        gate_state_ = -1;  /* e.g. no stream memory operations: time without the gate */
        return 0;
    }
    gate_seq_ = next;
    gated_++;
    return 1;
}

static void gate_open(void) { __atomic_store_n(gate_host_, gate_seq_, __ATOMIC_RELEASE); }

/* A launch handle the wrappers never saw created (e.g. a runtime that enumerates a library's
 * kernels): learn whether it is a CUkernel, its name and its library from the driver. */
static func_t *learn_func(const void *f) {
    const char *name = NULL;
    int is_kernel = 0, image = -1;
    if (d_kname && d_kname(&name, (CUkernel)f) == CUDA_SUCCESS && name) {
        is_kernel = 1;
        CUlibrary lib = NULL;
        if (d_klib && d_klib(&lib, (CUkernel)f) == CUDA_SUCCESS) image = image_of_handle(lib);
    } else {
        name = NULL;
        if (d_fname) d_fname(&name, (CUfunction)f);
        CUmodule m = NULL;
        if (d_fmod && d_fmod(&m, (CUfunction)f) == CUDA_SUCCESS) image = image_of_handle(m);
    }
    note_func(f, image, is_kernel, name);
    return func_lookup(f);
}

static CUevent take_event(void) {
    if (nfree_events_) return free_events_[--nfree_events_];
    CUevent e = NULL;
    if (!d_evcreate || d_evcreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return NULL;
    return e;
}
static void give_event(CUevent e) {
    if (!e) return;
    if (nfree_events_ < 2 * R3_MAX_PENDING) free_events_[nfree_events_++] = e;
    else if (d_evdestroy) d_evdestroy(e);
}

/* ---------------------------------------------------------------- faults ---------------- */
/* The errors a kernel leaves behind (sticky: the context is unusable from then on). */
static int is_fault(CUresult rc) {
    switch ((int)rc) {
    case CUDA_ERROR_ECC_UNCORRECTABLE: case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT: case CUDA_ERROR_ASSERT: case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION: case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE: case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case 721:  /* CUDA_ERROR_TENSOR_MEMORY_LEAK (CUDA 12.8) */
        return 1;
    default:
        return 0;
    }
}

static const char *config_name(const config_t *k) {
    return k->fidx >= 0 ? funcs_[k->fidx].name : NULL;
}

/* Report the first fault, once, as one "fault" event: the launch it names (`name` the
 * kernel's entry point, NULL for a graph or nothing; `graph` a graph id or -1; `nth` its
 * launch number of that kernel or graph and `launch` the process's, 0 when unknown), whether
 * that launch is `exact`ly the one that faulted (it ran alone and was synchronized, or the
 * launch was blocking) or only the oldest launch not known to have finished, and `where` the
 * error surfaced.  From then on no launch is snapshotted or timed. */
static void note_fault(CUresult rc, const char *name, int config, int graph,
                       unsigned long long nth, unsigned long long launch, int exact,
                       const char *where) {
    if (faulted_) return;
    faulted_ = 1;
    typedef CUresult (*errstr_fn)(CUresult, const char **);
    errstr_fn gname = DRV(errstr_fn, "cuGetErrorName", 6000);
    errstr_fn gtext = DRV(errstr_fn, "cuGetErrorString", 6000);
    const char *ename = NULL, *text = NULL;
    if (!gname || gname(rc, &ename) != CUDA_SUCCESS) ename = NULL;
    if (!gtext || gtext(rc, &text) != CUDA_SUCCESS) text = NULL;
    open_index();
    if (!index_) return;
    fprintf(index_, "{\"ev\":\"fault\",\"code\":%d,\"error\":", (int)rc);
    emit_string(index_, ename ? ename : "");
    fputs(",\"text\":", index_);
    emit_string(index_, text ? text : "");
    fputs(",\"name\":", index_);
    if (name) emit_string(index_, name);
    else fputs("null", index_);
    fprintf(index_, ",\"config\":%d,\"graph\":%d,\"nth\":%llu,\"launch\":%llu,\"exact\":%d,"
            "\"where\":", config, graph, nth, launch, exact);
    emit_string(index_, where);
    fputs("}\n", index_);
    fflush(index_);
}

/* A fault seen asynchronously: the oldest launch whose end event was not yet seen is the
 * first that may have faulted (those before it finished without error).  The pending
 * events cannot be read any more: they are given back. */
static void fault_pending(CUresult rc, const char *where) {
    if (faulted_) return;
    if (!npending_) {
        note_fault(rc, NULL, -1, -1, 0, 0, 0, where);
    } else if (pending_[0].graph) {
        note_fault(rc, NULL, -1, pending_[0].graph - 1, pending_[0].nth, pending_[0].launch, 0,
                   where);
    } else {
        const config_t *k = &configs_[pending_[0].config];
        note_fault(rc, config_name(k), k->id, -1, pending_[0].nth, pending_[0].launch, 0, where);
    }
    for (size_t i = 0; i < npending_; i++) { give_event(pending_[i].a); give_event(pending_[i].b); }
    npending_ = 0;
}

/* Read finished event pairs in launch order; with `wait`, wait for all of them. */
static void harvest(int wait) {
    size_t done = 0;
    for (; done < npending_; done++) {
        pending_t *p = &pending_[done];
        CUresult st;
        if (wait && d_evsync) st = d_evsync(p->b);
        else if (d_evquery) st = d_evquery(p->b);
        else break;
        if (st == CUDA_ERROR_NOT_READY) break;
        if (is_fault(st)) {
            memmove(pending_, pending_ + done, (npending_ - done) * sizeof *pending_);
            npending_ -= done;
            fault_pending(st, wait ? "cuEventSynchronize" : "cuEventQuery");
            return;
        }
        float ms = 0;
        if (st == CUDA_SUCCESS && d_elapsed && d_elapsed(&ms, p->a, p->b) == CUDA_SUCCESS) {
            if (p->graph) {
                graphs_[p->graph - 1].time_s += ms * 1e-3;
                graphs_[p->graph - 1].timed++;
            } else {
                config_t *k = &configs_[p->config];
                k->time_s += ms * 1e-3;
                k->timed++;
                if (p->same) { k->same_time_s += ms * 1e-3; k->same_timed++; }
            }
        }
        give_event(p->a); give_event(p->b);
    }
    memmove(pending_, pending_ + done, (npending_ - done) * sizeof *pending_);
    npending_ -= done;
}

/* coop: a cooperative launch (cuLaunchCooperativeKernel, or cuLaunchKernelEx with the
 * cooperative attribute): its blocks may synchronize over the whole grid, so a replay must
 * launch it cooperatively too */
typedef struct {
    int ex, ptsz; CUfunction f; unsigned g[3], b[3], shm; CUstream s;
    void **params, **extra; const CUlaunchConfig *cfg; int coop;
} call_t;

static CUresult do_launch(const call_t *c) {
    if (c->coop && !c->ex) {
        coop_fn fn = c->ptsz ? r_coop_ptsz : r_coop;
        return fn ? fn(c->f, c->g[0], c->g[1], c->g[2], c->b[0], c->b[1], c->b[2], c->shm, c->s,
                       c->params) : CUDA_ERROR_NOT_INITIALIZED;
    }
    if (c->ex) {
        launchex_fn fn = c->ptsz ? r_launchex_ptsz : r_launchex;
        return fn ? fn(c->cfg, c->f, c->params, c->extra) : CUDA_ERROR_NOT_INITIALIZED;
    }
    launch_fn fn = c->ptsz ? r_launch_ptsz : r_launch;
    return fn ? fn(c->f, c->g[0], c->g[1], c->g[2], c->b[0], c->b[1], c->b[2], c->shm, c->s,
                   c->params, c->extra) : CUDA_ERROR_NOT_INITIALIZED;
}

static int name_selected(const char *name) {
    if (!only_) return 1;
    if (!name) return 0;
    char *copy = strdup(only_), *save = NULL;
    int hit = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok && !hit; tok = strtok_r(NULL, ",", &save)) {
        char mangled[600];
        snprintf(mangled, sizeof mangled, "%zu%s", strlen(tok), tok);  /* Itanium <len><name> */
        hit = !strcmp(name, tok) || (!strncmp(name, "_Z", 2) && strstr(name, mangled));
    }
    free(copy);
    return hit;
}

/* The argument buffer of a launch made with `extra` ({BUFFER_POINTER, p, BUFFER_SIZE, &n,
 * END}); NULL when there is none. */
static const unsigned char *extra_buffer(void **extra, size_t *n) {
    void *buf = NULL; size_t *bsize = NULL;
    for (void **e = extra; e && *e != CU_LAUNCH_PARAM_END; e += 2) {
        if (*e == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = e[1];
        else if (*e == CU_LAUNCH_PARAM_BUFFER_SIZE) bsize = e[1];
    }
    if (!buf || !bsize) return NULL;
    *n = *bsize;
    return buf;
}

/* Keep the first launch's argument bytes (taking `args`) as the configuration's reference. */
static void keep_reference(config_t *k, unsigned char *args, size_t nargs, int layout_known,
                           const size_t *offs, const size_t *sizes, size_t np) {
    k->ref_known = 1;
    k->ref = args; k->nref = nargs;
    k->layout_known = layout_known;
    k->nparams = layout_known ? np : 0;
    if (k->nparams) {
        k->ref_offs = malloc(np * sizeof *k->ref_offs);
        k->ref_sizes = malloc(np * sizeof *k->ref_sizes);
        memcpy(k->ref_offs, offs, np * sizeof *offs);
        memcpy(k->ref_sizes, sizes, np * sizeof *sizes);
    }
}

/* 1 if this launch's argument bytes equal its configuration's reference: parameter by
 * parameter where the layout is known (padding between parameters is not compared), else
 * the whole argument buffer. */
static int same_args(const config_t *k, const call_t *c) {
    if (!k->ref_known) return 0;
    size_t n = 0;
    const unsigned char *buf = c->params ? NULL : extra_buffer(c->extra, &n);
    if (k->layout_known) {
        if (!k->nparams) return 1;
        for (size_t i = 0; i < k->nparams; i++) {
            size_t off = k->ref_offs[i], size = k->ref_sizes[i];
            const void *now = c->params ? c->params[i] : buf && off + size <= n ? buf + off : NULL;
            if (!now || off + size > k->nref || memcmp(now, k->ref + off, size)) return 0;
        }
        return 1;
    }
    return buf && n == k->nref && !memcmp(buf, k->ref, n);
}

/* 128 bits of a buffer's content, four independent lanes of 8-byte words (a multiply and a
 * shift each: a few GB/s, against the copy from the device it follows).  A match is then
 * confirmed byte for byte against the file (same_as_file()), so a collision costs a read. */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}
static void content_hash(const unsigned char *p, size_t n, uint64_t out[2]) {
    uint64_t a = 0x9e3779b97f4a7c15ULL ^ n, b = 0xc2b2ae3d27d4eb4fULL, c = 0x165667b19e3779f9ULL,
             d = 0x27d4eb2f165667c5ULL;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, sizeof w);
        a = (a ^ w[0]) * 0xff51afd7ed558ccdULL; a ^= a >> 29;
        b = (b ^ w[1]) * 0xc4ceb9fe1a85ec53ULL; b ^= b >> 31;
        c = (c ^ w[2]) * 0x9fb21c651e98df25ULL; c ^= c >> 27;
        d = (d ^ w[3]) * 0xd6e8feb86659fd93ULL; d ^= d >> 33;
    }
    for (; i < n; i++) { a = (a ^ p[i]) * 0x100000001b3ULL; a ^= a >> 29; }
    out[0] = mix64(a ^ (c << 17 | c >> 47) ^ n);
    out[1] = mix64(b ^ (d << 23 | d >> 41) ^ (a + n));
}

/* Whether data/<name> holds exactly these `size` bytes. */
static int same_as_file(const char *name, const unsigned char *data, size_t size) {
    char path[4300];
    snprintf(path, sizeof path, "%s/data/%s", dir_, name);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    enum { CHUNK = 1 << 20 };  /* on the heap: an application's threads may have small stacks */
    unsigned char *chunk = malloc(CHUNK);
    size_t at = 0, n;
    int same = chunk != NULL;
    while (same && (n = fread(chunk, 1, CHUNK, f)) > 0) {
        same = at + n <= size && !memcmp(chunk, data + at, n);
        at += n;
    }
    fclose(f);
    free(chunk);
    return same && at == size;
}

/* The file written before with these bytes, or -1: among the files written since the
 * `from`-th. */
static long written_as(const unsigned char *data, size_t size, const uint64_t hash[2],
                       size_t from) {
    for (size_t i = nwritten_; i-- > from;) {
        const written_t *w = &written_[i];
        if (w->size == size && w->hash[0] == hash[0] && w->hash[1] == hash[1]
                && same_as_file(w->name, data, size))
            return (long)i;
    }
    return -1;
}

/* A buffer's content hash and the file written before that holds its bytes (-1: none among
 * the first `seen` files), so the budget can count a snapshot's new bytes and the writes
 * after it need not hash and compare them again. */
typedef struct { uint64_t hash[2]; long found; size_t seen; } match_t;
static match_t match_of(const unsigned char *data, size_t size) {
    match_t m = {{0, 0}, -1, nwritten_};
    if (dedup_ && !write_errno_) {
        content_hash(data, size, m.hash);
        m.found = written_as(data, size, m.hash, 0);
    }
    return m;
}

/* Write a snapshot file data/<name>, unless a file written before holds the same bytes (`m`,
 * then the files written since it was made); `used` (40 bytes) gets the name the event must
 * give: `name` or that earlier file's.  -1 when it could not be written (write_file()). */
static int write_matched(const char *name, const void *data, size_t size, match_t m,
                         char *used) {
    snprintf(used, 40, "%s", name);
    if (dedup_ && m.found < 0 && !write_errno_)
        m.found = written_as(data, size, m.hash, m.seen);
    if (dedup_ && m.found >= 0) { snprintf(used, 40, "%s", written_[m.found].name); return 0; }
    if (write_file(name, data, size) != 0) return -1;
    if (dedup_) {
        GROW(written_, nwritten_, capwritten_);
        written_t *w = &written_[nwritten_++];
        w->hash[0] = m.hash[0]; w->hash[1] = m.hash[1]; w->size = size;
        snprintf(w->name, sizeof w->name, "%s", name);
    }
    return 0;
}

static int write_snapshot(const char *name, const void *data, size_t size, char *used) {
    return write_matched(name, data, size, match_of(data, size), used);
}

static void hex(FILE *f, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++) fprintf(f, "%02x", b[i]);
}

/* The arena blocks this launch may touch: all live ones, or those reachable from the
 * argument bytes through 8-byte-aligned values that point into live blocks.  Reachability
 * reads the blocks, so it fills `host` with each selected block's prologue bytes; with all
 * live blocks `host` stays NULL until copy_prologues(), after the budget is checked. */
static size_t select_blocks(const unsigned char *args, size_t nargs, long *ids, unsigned char **host) {
    size_t n = 0;
    if (!reachable_) {
        for (size_t i = 0; i < nblocks_; i++)
            if (blocks_[i].live) { host[n] = NULL; ids[n++] = (long)i; }
        return n;
    }
    unsigned char *mark = calloc(nblocks_ + 1, 1);
    const unsigned char *scan = args; size_t scan_n = nargs; size_t next = 0;
    for (;;) {
        for (size_t off = 0; off + 8 <= scan_n; off += 8) {
            uint64_t v; memcpy(&v, scan + off, 8);
            long id = in_arena(v) ? block_at(v) : -1;
            if (id >= 0 && !mark[id]) {
                mark[id] = 1;
                ids[n] = id;
                host[n] = malloc(blocks_[id].size + 1);
                if (d_dtoh && blocks_[id].size) d_dtoh(host[n], blocks_[id].addr, blocks_[id].size);
                n++;
            }
        }
        if (next >= n) break;
        scan = host[next]; scan_n = blocks_[ids[next]].size; next++;
    }
    free(mark);
    return n;
}

static void copy_prologues(const long *ids, unsigned char **host, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (host[i]) continue;
        host[i] = malloc(blocks_[ids[i]].size + 1);
        if (d_dtoh && blocks_[ids[i]].size) d_dtoh(host[i], blocks_[ids[i]].addr, blocks_[ids[i]].size);
    }
}

/* The bytes a snapshot of these blocks and of the image's globals writes: each twice. */
static uint64_t snapshot_bytes(const long *ids, size_t n, int image) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += blocks_[ids[i]].size;
    for (size_t i = 0, ng = 0; i < nglobals_ && ng < 256; i++)
        if (image >= 0 && globals_[i].image == image) { total += globals_[i].size; ng++; }
    return 2 * total;
}

/* The room a snapshot of `fi` must leave: none for its first configuration, else the largest
 * first snapshot of any kernel so far. */
static uint64_t reserve_for(const func_t *fi, int check) {
    return check || (fi && fi->snapped) ? largest_first_ : 0;
}

/* Whether `need` bytes (plus the reserve) pass the budget; when they do, the refusal is
 * noted (budget_spent_, and its size and reserve for the event). */
static int fits(uint64_t need, uint64_t reserve) {
    return need <= max_bytes_ && snap_bytes_ + need + reserve <= max_bytes_;
}
static int over_budget(uint64_t need, uint64_t reserve) {
    if (fits(need, reserve)) return 0;
    budget_spent_ = 1;
    budget_need_ = need;
    budget_reserve_ = reserve;
    return 1;
}

/* Without synchronizing or reading memory: would this kernel's next snapshot surely not fit,
 * judged by the size its last one took or would have taken (every file)?  With files written
 * once, only if its epilogues alone would not: its prologues may all be files written before. */
static int surely_over_budget(const func_t *fi, int check) {
    if (!fi || !fi->need) return 0;
    uint64_t reserve = reserve_for(fi, check);
    if (dedup_ && fits(fi->need / 2, reserve)) return 0;  /* its prologues may be written */
    return over_budget(fi->need, reserve);
}

/* Snapshot one launch of `cfg`: its first (check 0: the recorded launch, whose argument bytes
 * become the configuration's reference) or its second (check 1: a check launch; `same` says
 * whether its arguments equal the reference).  Files are c<id>-* and k<id>-* apart.  The
 * caller has synchronized (settle()): the application's queued work belongs to the prologue,
 * and a fault after the launch is this launch's.  `nth`: the kernel's launch number.
 * A snapshot that would take the bytes written past R3_RECORD_MAX_BYTES (less the reserve)
 * is not taken: *declined is set and the launch is left to the caller. */
static CUresult snapshot_launch(const call_t *c, config_t *cfg, func_t *fi, const char *name,
                                int check, int same, unsigned long long nth, int *declined) {
    CUfunction fn = c->f;
    if (fi && fi->is_kernel && r_kernfunc) r_kernfunc(&fn, (CUkernel)c->f);
    size_t offs[512], sizes[512], np = 0, nargs = 0;
    int layout_known = 0;
    if (d_pinfo) {
        while (np < 512 && d_pinfo(fn, np, &offs[np], &sizes[np]) == CUDA_SUCCESS) {
            if (offs[np] + sizes[np] > nargs) nargs = offs[np] + sizes[np];
            np++;
        }
        layout_known = 1;
    }
    unsigned char *args = NULL;
    if (c->params && layout_known) {
        args = calloc(nargs + 1, 1);
        for (size_t i = 0; i < np; i++) memcpy(args + offs[i], c->params[i], sizes[i]);
    } else if (c->extra) {
        const unsigned char *buf = extra_buffer(c->extra, &nargs);
        if (buf) { args = malloc(nargs + 1); memcpy(args, buf, nargs); }
        else nargs = 0;
    }
    const char tag = check ? 'k' : 'c';
    int image = fi ? fi->image : -1;
    if (image < 0 && d_fmod) {
        CUmodule m = NULL;
        if (d_fmod(&m, fn) == CUDA_SUCCESS) image = image_of_handle(m);
    }
    long *ids = malloc((nblocks_ + 1) * sizeof *ids);
    unsigned char **host = malloc((nblocks_ + 1) * sizeof *host);
    size_t nsel = select_blocks(args ? args : (unsigned char *)"", args ? nargs : 0, ids, host);
    uint64_t need = snapshot_bytes(ids, nsel, image), reserve = reserve_for(fi, check);
    match_t *matched = NULL;  /* each prologue's match, where the budget needed them */
    if (fi) fi->need = need;  /* every file's bytes: surely_over_budget() halves it */
    if (dedup_ && !fits(need, reserve) && fits(need / 2, reserve)) {
        /* every file would not fit, but the epilogues alone would: count the prologues that
         * files written before hold already (the epilogues may all be new) */
        copy_prologues(ids, host, nsel);
        matched = malloc((nsel + 1) * sizeof *matched);
        for (size_t i = 0; i < nsel; i++) {
            matched[i] = match_of(host[i], blocks_[ids[i]].size);
            if (matched[i].found >= 0) need -= blocks_[ids[i]].size;
        }
    }
    if (over_budget(need, reserve)) {
        for (size_t i = 0; i < nsel; i++) free(host[i]);
        free(ids); free(host); free(args); free(matched);
        *declined = 1;
        return CUDA_SUCCESS;
    }
    *declined = 0;
    if (!check && fi && !fi->snapped && need > largest_first_) largest_first_ = need;
    if (!check && (args || (layout_known && !np))) {
        keep_reference(cfg, args, nargs, layout_known, offs, sizes, np);
        cfg->same_count = 1;
    }
    if (image >= 0) image_dump(image);
    copy_prologues(ids, host, nsel);
    char file[128];
    /* the file each prologue and epilogue is in: its own, or an earlier one with its bytes */
    char (*pro)[40] = malloc((nsel + 1) * sizeof *pro), (*epi)[40] = malloc((nsel + 1) * sizeof *epi);
    for (size_t i = 0; i < nsel; i++) {
        snprintf(file, sizeof file, "%c%d-a%ld.pro", tag, cfg->id, ids[i]);
        size_t size = blocks_[ids[i]].size;
        write_matched(file, host[i], size, matched ? matched[i] : match_of(host[i], size), pro[i]);
        snprintf(epi[i], sizeof epi[i], "%c%d-a%ld.epi", tag, cfg->id, ids[i]);
    }
    size_t gsel[256], ng = 0;
    char (*gpro)[40] = malloc(256 * sizeof *gpro), (*gepi)[40] = malloc(256 * sizeof *gepi);
    for (size_t i = 0; i < nglobals_ && ng < 256; i++) {
        if (globals_[i].image != image || image < 0) continue;
        unsigned char *buf = malloc(globals_[i].size + 1);
        if (d_dtoh && d_dtoh(buf, globals_[i].addr, globals_[i].size) == CUDA_SUCCESS) {
            snprintf(file, sizeof file, "%c%d-g%zu.pro", tag, cfg->id, i);
            write_snapshot(file, buf, globals_[i].size, gpro[ng]);
            snprintf(gepi[ng], sizeof gepi[ng], "%c%d-g%zu.epi", tag, cfg->id, i);
            gsel[ng++] = i;
        }
        free(buf);
    }
    CUevent a = take_event(), b = take_event();
    evrecord_fn rec = c->ptsz ? d_evrecord_ptsz : d_evrecord;
    int gated = a && b && rec && gate_close(c->ptsz, c->s);
    if (a && rec) rec(a, c->s);
    CUresult rc = do_launch(c);
    if (b && rec) rec(b, c->s);
    if (gated) gate_open();
    CUresult sync_rc = d_sync();
    /* a faulted launch has no epilogue: its files are not written (the launch is reported,
     * and not replayable) */
    CUresult fault = is_fault(rc) ? rc : is_fault(sync_rc) ? sync_rc : CUDA_SUCCESS;
    float ms = 0;
    if (!fault && a && b && d_elapsed && d_elapsed(&ms, a, b) == CUDA_SUCCESS) {
        cfg->time_s += ms * 1e-3; cfg->timed++;
        if (check ? same : cfg->ref_known) { cfg->same_time_s += ms * 1e-3; cfg->same_timed++; }
    }
    give_event(a); give_event(b);
    for (size_t i = 0; i < nsel; i++) {
        if (!fault) {
            if (d_dtoh && blocks_[ids[i]].size)
                d_dtoh(host[i], blocks_[ids[i]].addr, blocks_[ids[i]].size);
            snprintf(file, sizeof file, "%c%d-a%ld.epi", tag, cfg->id, ids[i]);
            write_snapshot(file, host[i], blocks_[ids[i]].size, epi[i]);
        }
        free(host[i]);
    }
    for (size_t k = 0; k < ng && !fault; k++) {
        global_t *g = &globals_[gsel[k]];
        unsigned char *buf = malloc(g->size + 1);
        if (d_dtoh) d_dtoh(buf, g->addr, g->size);
        snprintf(file, sizeof file, "%c%d-g%zu.epi", tag, cfg->id, gsel[k]);
        write_snapshot(file, buf, g->size, gepi[k]);
        free(buf);
    }
    open_index();
    if (index_) {
        FILE *f = index_;
        int cache, carveout;
        settings_of(fi, &cache, &carveout);
        fprintf(f, "{\"ev\":\"%s\",\"id\":%d,\"recorded\":1,\"of\":%d,\"from\":%llu,"
                "\"at\":%llu,\"name\":", check ? "check" : "config", cfg->id, cfg->root,
                cfg->from, cfg->at);
        emit_string(f, name);
        fprintf(f, ",\"cache\":%d,\"carveout\":%d,\"coop\":%d", cache, carveout, c->coop);
        fprintf(f, ",\"image\":%d,\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"shm\":%u,"
                "\"api\":\"%s\",\"rc\":%d,\"sync_rc\":%d,\"time_s\":%.9g,\"bytes\":%llu,"
                "\"write_error\":%d,\"layout\":",
                image, c->g[0], c->g[1], c->g[2], c->b[0], c->b[1], c->b[2], c->shm,
                c->ex ? "cuLaunchKernelEx" : c->coop ? "cuLaunchCooperativeKernel"
                : "cuLaunchKernel", (int)rc, (int)sync_rc, ms * 1e-3,
                (unsigned long long)need, write_errno_ != 0);
        if (layout_known) {
            fputc('[', f);
            for (size_t i = 0; i < np; i++) fprintf(f, "%s[%zu,%zu]", i ? "," : "", offs[i], sizes[i]);
            fputc(']', f);
        } else {
            fputs("null", f);
        }
        fputs(",\"args\":\"", f);
        if (args) hex(f, args, nargs);
        fputs("\",\"allocs\":[", f);
        for (size_t i = 0; i < nsel; i++)
            fprintf(f, "%s[%ld,%llu,%llu,\"%s\",\"%s\"]", i ? "," : "", ids[i],
                    (unsigned long long)blocks_[ids[i]].addr, (unsigned long long)blocks_[ids[i]].size,
                    pro[i], epi[i]);
        fputs("],\"globals\":[", f);
        for (size_t k = 0; k < ng; k++) {
            global_t *g = &globals_[gsel[k]];
            fprintf(f, "%s[", k ? "," : "");
            emit_string(f, g->name);
            fprintf(f, ",%llu,%llu,\"%s\",\"%s\"]", (unsigned long long)g->addr,
                    (unsigned long long)g->size, gpro[k], gepi[k]);
        }
        fputs("]}\n", f);
        fflush(f);
    }
    free(ids); free(host); free(pro); free(epi); free(gpro); free(gepi); free(matched);
    if (check || !cfg->ref_known) free(args);  /* else the reference holds it */
    if (fault)
        note_fault(fault, name, cfg->id, -1, nth, launches_, 1,
                   fault == rc ? "the launch" : "cuCtxSynchronize after the launch");
    return rc;
}

static void finish(int harvest_events);
static void finish_at_exit(void) { finish(1); }

static void ensure_exit_handler(void) {
    static int registered;
    if (!registered) {
        /* Registered after the runtime's own handlers, so it runs before they tear down. */
        atexit(finish_at_exit);
        registered = 1;
    }
}

/* 0: stream `s` is not capturing; 1: it is (what is launched there becomes a graph node);
 * 2: the driver will not say (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: the legacy stream while a
 * blocking stream captures); -1: the query failed otherwise.  A sticky error left by a
 * faulted kernel makes the query fail too, and it is not a capture: it is reported as the
 * fault (faulted_ is set); any other error is kept in capture_error_. */
static int stream_capture(int ptsz, CUstream s) {
    iscap_fn fn = ptsz ? d_iscap_ptsz : d_iscap;
    if (!fn) return 0;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult rc = fn(s, &st);
    if (rc == CUDA_SUCCESS) return st == CU_STREAM_CAPTURE_STATUS_NONE ? 0 : 1;
    if (rc == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) return 2;
    if (is_fault(rc)) fault_pending(rc, "cuStreamIsCapturing");
    else capture_error_ = rc;
    return -1;
}

/* Wait for the application's queued work before a snapshot; 0 if that work faulted (then
 * reported, and the launch must pass through). */
static int settle(void) {
    CUresult rc = d_sync();
    if (is_fault(rc)) fault_pending(rc, "cuCtxSynchronize before a snapshot");
    return !faulted_;
}

/* Start a stratum of *cfg's key at this launch, the key's `key_nth`: a configuration of the
 * same grid and block that this launch and the later ones count toward, its launch `snap` to
 * be snapshotted as its first.  *cfg becomes it. */
static void begin_stratum(config_t **cfg, unsigned long long key_nth, unsigned long long snap) {
    int old_id = (*cfg)->id, root_id = (*cfg)->root;
    GROW(configs_, nconfigs_, capconfigs_);
    config_t *old = &configs_[old_id], *s = &configs_[nconfigs_];
    memset(s, 0, sizeof *s);
    s->func = old->func; s->shm = old->shm; s->fidx = old->fidx;
    memcpy(s->g, old->g, sizeof s->g); memcpy(s->b, old->b, sizeof s->b);
    s->id = (int)nconfigs_++; s->root = root_id; s->from = key_nth; s->snap_at = snap;
    s->count = 1;
    old->count--;  /* the launch was counted toward the stratum it ends */
    *cfg = s;
}

/* A launch after a fault passes through untouched, counted: the application gets the
 * driver's answer (the sticky error) as it would without R3.  Unlocks. */
static CUresult pass_after_fault(const call_t *c) {
    after_fault_++;
    pthread_mutex_unlock(&lock_);
    return do_launch(c);
}

/* Count a launch of `k`'s function; its launch number (the configuration's where the
 * function is unknown). */
static unsigned long long count_launch(const config_t *k) {
    return k->fidx >= 0 ? ++funcs_[k->fidx].launches : k->count;
}

/* Why a new configuration of `fi` is not snapshotted (NULL: it is): "kernel" (not selected by
 * R3_RECORD_KERNELS, or the driver cannot synchronize), "write_error", "budget" or
 * "max_configs". */
static const char *not_snapshotted(const func_t *fi, const char *name) {
    if (!name_selected(name) || !d_sync) return "kernel";
    if (write_errno_) return "write_error";
    if (fi && fi->snapped >= max_configs_) return "max_configs";
    if (surely_over_budget(fi, 0)) return "budget";
    return NULL;
}

/* The "config" event of a configuration that is counted and timed but not snapshotted; for
 * the budget, the size its snapshot would have taken and the room kept then. */
static void emit_unrecorded(const config_t *cfg, const char *name, const char *why) {
    int budget = !strcmp(why, "budget");
    open_index();
    if (!index_) return;
    fprintf(index_, "{\"ev\":\"config\",\"id\":%d,\"recorded\":0,\"of\":%d,\"from\":%llu,"
            "\"why\":\"%s\",\"need\":%llu,\"reserve\":%llu,\"name\":", cfg->id, cfg->root,
            cfg->from, why,
            budget ? (unsigned long long)budget_need_ : 0ULL,
            budget ? (unsigned long long)budget_reserve_ : 0ULL);
    emit_string(index_, name ? name : "unknown_kernel");
    fprintf(index_, ",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"shm\":%u}\n",
            cfg->g[0], cfg->g[1], cfg->g[2], cfg->b[0], cfg->b[1], cfg->b[2], cfg->shm);
    fflush(index_);
}

static CUresult on_launch(const call_t *c) {
    pthread_mutex_lock(&lock_);
    ensure_exit_handler();
    resolve_launch_helpers();
    launches_++;
    if (faulted_) return pass_after_fault(c);
    /* A launch into a capturing stream only adds a node to the graph being built: an event
     * recorded or a synchronization there would invalidate the capture.  While any capture
     * is open, a launch elsewhere passes through too: in the default (global) capture mode
     * the event queries and synchronizations of recording are prohibited calls. */
    int capture = stream_capture(c->ptsz, c->s);
    if (faulted_) return pass_after_fault(c);  /* the query met a fault's sticky error */
    if (capture < 0) {  /* the driver would not say, for another reason: pass through */
        capture_unknown_++;
        pthread_mutex_unlock(&lock_);
        return do_launch(c);
    }
    if (capture || capturing_ > 0) {
        if (capture == 1) captured_launches_++;
        else capture_skipped_++;
        pthread_mutex_unlock(&lock_);
        return do_launch(c);
    }
    config_t *cfg = NULL;
    for (size_t i = nconfigs_; i-- > 0;) {
        config_t *k = &configs_[i];
        if (k->func == c->f && k->shm == c->shm && !memcmp(k->g, c->g, sizeof k->g) &&
            !memcmp(k->b, c->b, sizeof k->b)) { cfg = k; break; }
    }
    CUresult rc;
    int same, declined = 0;
    unsigned long long nth;
    if (!cfg) {
        func_t *fi = func_lookup(c->f);
        if (!fi || !fi->name) fi = learn_func(c->f);
        const char *name = fi ? fi->name : NULL;
        open_index();  /* reads R3_RECORD_KERNELS: a first launch may precede any allocation */
        const char *why = not_snapshotted(fi, name);
        if (!why && !settle()) return pass_after_fault(c);
        GROW(configs_, nconfigs_, capconfigs_);
        cfg = &configs_[nconfigs_];
        memset(cfg, 0, sizeof *cfg);
        cfg->func = c->f; cfg->id = (int)nconfigs_++; cfg->shm = c->shm;
        cfg->root = cfg->id; cfg->from = 1; cfg->at = 1; cfg->key_launches = 1;
        cfg->strata = strata_of(name, c->g, c->b, c->shm);
        cfg->fidx = fi ? (long)(fi - funcs_) : -1;
        memcpy(cfg->g, c->g, sizeof cfg->g); memcpy(cfg->b, c->b, sizeof cfg->b);
        cfg->count = 1;
        nth = count_launch(cfg);
        if (!why) {
            rc = snapshot_launch(c, cfg, fi, name ? name : "unknown_kernel", 0, 0, nth,
                                 &declined);
            if (!declined) {
                cfg->recorded = 1;
                if (fi) fi->snapped++;
                pthread_mutex_unlock(&lock_);
                return rc;
            }
            why = "budget";
        }
        emit_unrecorded(cfg, name, why);
        goto timed;
    }
    cfg->count++;
    nth = count_launch(cfg);
    {
        config_t *root = &configs_[cfg->root];
        unsigned long long key_nth = ++root->key_launches;
        const strata_t *plan = root->strata;
        if (plan && root->next < plan->n && key_nth == plan->begin[root->next]) {
            unsigned long long snap = plan->snap[root->next];
            root->next++;
            begin_stratum(&cfg, key_nth, snap);  /* configs_ may move: root is not read again */
        }
        if (cfg->snap_at && key_nth == cfg->snap_at) {
            cfg->snap_at = 0;
            func_t *fi = func_lookup(c->f);
            const char *name = config_name(cfg);
            if (write_errno_ || !d_sync) {
                emit_unrecorded(cfg, name, write_errno_ ? "write_error" : "kernel");
            } else {
                if (!settle()) return pass_after_fault(c);
                cfg->at = key_nth;
                CUresult src = snapshot_launch(c, cfg, fi, name ? name : "unknown_kernel", 0, 0,
                                               nth, &declined);
                if (!declined) {
                    cfg->recorded = 1;
                    pthread_mutex_unlock(&lock_);
                    return src;
                }
                emit_unrecorded(cfg, name, "budget");
            }
        }
    }
    if (cfg->recorded && !cfg->checked && checks_ && d_sync) {
        cfg->checked = 1;
        func_t *fi = func_lookup(c->f);
        int snap = !write_errno_ && !surely_over_budget(fi, 1);
        if (snap && !settle()) return pass_after_fault(c);
        same = same_args(cfg, c);
        if (same) cfg->same_count++;
        if (snap) {
            const char *name = config_name(cfg);
            rc = snapshot_launch(c, cfg, fi, name ? name : "unknown_kernel", 1, same, nth,
                                 &declined);
            if (!declined) {
                pthread_mutex_unlock(&lock_);
                return rc;
            }
        }
        emit("{\"ev\":\"check_skipped\",\"id\":%d,\"why\":\"%s\",\"need\":%llu,"
             "\"reserve\":%llu}", cfg->id, write_errno_ ? "write_error" : "budget",
             write_errno_ ? 0ULL : (unsigned long long)budget_need_,
             write_errno_ ? 0ULL : (unsigned long long)budget_reserve_);
        goto launch;
    }
timed:
    same = same_args(cfg, c);
    if (same) cfg->same_count++;
launch:
    harvest(0);
    if (faulted_) return pass_after_fault(c);  /* an earlier launch's end event said so */
    if (npending_ == R3_MAX_PENDING) harvest(1);  /* bounds memory; rare */
    {
        CUevent a = take_event(), b = take_event();
        evrecord_fn rec = c->ptsz ? d_evrecord_ptsz : d_evrecord;
        /* Not the first launch of a function: under lazy module loading (the default) that
         * launch loads the function's module, which can wait for the device while the stream
         * waits on the gate the host opens only after the launch returns.  A snapshotted
         * first launch has loaded it already (its parameters and attributes were read). */
        int gated = nth > 1 && a && b && rec && gate_close(c->ptsz, c->s);
        if (a && b && rec) rec(a, c->s);
        rc = do_launch(c);
        if (a && b && rec && rc == CUDA_SUCCESS) {
            rec(b, c->s);
            pending_[npending_++] = (pending_t){a, b, cfg->id, 0, same, nth, launches_};
        } else {
            give_event(a); give_event(b);
        }
        if (gated) gate_open();
    }
    if (is_fault(rc)) {
        /* a blocking launch returns its own kernel's fault; else the error is an earlier one */
        if (launch_blocking_)
            note_fault(rc, config_name(cfg), cfg->id, -1, nth, launches_, 1,
                       "the launch (CUDA_LAUNCH_BLOCKING=1)");
        else
            fault_pending(rc, "a later launch");
    }
    pthread_mutex_unlock(&lock_);
    return rc;
}

static CUresult launch_common(int ptsz, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                              unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s,
                              void **params, void **extra) {
    call_t c = {0, ptsz, f, {gx, gy, gz}, {bx, by, bz}, shm, s, params, extra, NULL, 0};
    return on_launch(&c);
}
static CUresult coop_common(int ptsz, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                            unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s,
                            void **params) {
    call_t c = {0, ptsz, f, {gx, gy, gz}, {bx, by, bz}, shm, s, params, NULL, NULL, 1};
    return on_launch(&c);
}
static CUresult w_coop(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned shm, CUstream s, void **p) {
    return coop_common(0, f, gx, gy, gz, bx, by, bz, shm, s, p);
}
static CUresult w_coop_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shm, CUstream s, void **p) {
    return coop_common(1, f, gx, gy, gz, bx, by, bz, shm, s, p);
}
static CUresult w_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned shm, CUstream s, void **p, void **e) {
    return launch_common(0, f, gx, gy, gz, bx, by, bz, shm, s, p, e);
}
static CUresult w_launch_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                              unsigned by, unsigned bz, unsigned shm, CUstream s, void **p, void **e) {
    return launch_common(1, f, gx, gy, gz, bx, by, bz, shm, s, p, e);
}
static CUresult launchex_common(int ptsz, const CUlaunchConfig *k, CUfunction f, void **p, void **e) {
    int coop = 0;
    for (unsigned i = 0; k->attrs && i < k->numAttrs; i++)
        if (k->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && k->attrs[i].value.cooperative)
            coop = 1;
    call_t c = {1, ptsz, f, {k->gridDimX, k->gridDimY, k->gridDimZ},
                {k->blockDimX, k->blockDimY, k->blockDimZ}, k->sharedMemBytes, k->hStream, p, e, k,
                coop};
    return on_launch(&c);
}
static CUresult w_launchex(const CUlaunchConfig *k, CUfunction f, void **p, void **e) {
    return launchex_common(0, k, f, p, e);
}
static CUresult w_launchex_ptsz(const CUlaunchConfig *k, CUfunction f, void **p, void **e) {
    return launchex_common(1, k, f, p, e);
}

/* ---------------------------------------------------------------- capture and graphs ---- */
static CUresult capbegin_common(capbegin_fn real, CUstream s, CUstreamCaptureMode mode) {
    /* under the lock: a first launch's synchronization in another thread finishes first */
    pthread_mutex_lock(&lock_);
    CUresult rc = real ? real(s, mode) : CUDA_ERROR_NOT_INITIALIZED;
    if (rc == CUDA_SUCCESS) capturing_++;
    pthread_mutex_unlock(&lock_);
    return rc;
}
static CUresult w_capbegin(CUstream s, CUstreamCaptureMode mode) {
    return capbegin_common(r_capbegin, s, mode);
}
static CUresult w_capbegin_ptsz(CUstream s, CUstreamCaptureMode mode) {
    return capbegin_common(r_capbegin_ptsz, s, mode);
}
static CUresult captograph_common(captograph_fn real, CUstream s, CUgraph g, const CUgraphNode *d,
                                  const void *e, size_t n, CUstreamCaptureMode mode) {
    pthread_mutex_lock(&lock_);
    CUresult rc = real ? real(s, g, d, e, n, mode) : CUDA_ERROR_NOT_INITIALIZED;
    if (rc == CUDA_SUCCESS) capturing_++;
    pthread_mutex_unlock(&lock_);
    return rc;
}
static CUresult w_captograph(CUstream s, CUgraph g, const CUgraphNode *d, const void *e,
                             size_t n, CUstreamCaptureMode mode) {
    return captograph_common(r_captograph, s, g, d, e, n, mode);
}
static CUresult w_captograph_ptsz(CUstream s, CUgraph g, const CUgraphNode *d, const void *e,
                                  size_t n, CUstreamCaptureMode mode) {
    return captograph_common(r_captograph_ptsz, s, g, d, e, n, mode);
}
static CUresult capend_common(capend_fn real, CUstream s, CUgraph *g) {
    CUresult rc = real ? real(s, g) : CUDA_ERROR_NOT_INITIALIZED;
    /* an invalidated capture has ended too; other errors leave it open */
    if (rc == CUDA_SUCCESS || rc == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) {
        pthread_mutex_lock(&lock_);
        if (capturing_ > 0) capturing_--;
        pthread_mutex_unlock(&lock_);
    }
    return rc;
}
static CUresult w_capend(CUstream s, CUgraph *g) { return capend_common(r_capend, s, g); }
static CUresult w_capend_ptsz(CUstream s, CUgraph *g) { return capend_common(r_capend_ptsz, s, g); }

#define R3_GRAPH_NAMES 64
/* Count the kernel nodes of `g` (child graphs included) and collect their names. */
static void graph_kernels(CUgraph g, int depth, int *count, const char **names, int *nnames) {
    size_t n = 0;
    if (!d_gnodes || !d_gntype || depth > 8 || d_gnodes(g, NULL, &n) != CUDA_SUCCESS || !n) return;
    CUgraphNode *nodes = malloc(n * sizeof *nodes);
    if (nodes && d_gnodes(g, nodes, &n) == CUDA_SUCCESS) {
        for (size_t i = 0; i < n; i++) {
            CUgraphNodeType type;
            if (d_gntype(nodes[i], &type) != CUDA_SUCCESS) continue;
            if (type == CU_GRAPH_NODE_TYPE_GRAPH) {
                CUgraph child;
                if (d_gchild && d_gchild(nodes[i], &child) == CUDA_SUCCESS)
                    graph_kernels(child, depth + 1, count, names, nnames);
                continue;
            }
            if (type != CU_GRAPH_NODE_TYPE_KERNEL) continue;
            (*count)++;
            CUDA_KERNEL_NODE_PARAMS kp;
            memset(&kp, 0, sizeof kp);
            if (!d_gkparams || d_gkparams(nodes[i], &kp) != CUDA_SUCCESS) continue;
            const void *h = kp.func ? (const void *)kp.func : (const void *)kp.kern;
            func_t *fi = h ? func_lookup(h) : NULL;
            if (h && (!fi || !fi->name)) fi = learn_func(h);
            if (!fi || !fi->name) continue;
            int known = 0;
            for (int k = 0; k < *nnames && !known; k++) known = !strcmp(names[k], fi->name);
            if (!known && *nnames < R3_GRAPH_NAMES) names[(*nnames)++] = fi->name;
        }
    }
    free(nodes);
}

static graph_t *new_graph(const void *exec, int kernel_nodes, const char **names, int nnames) {
    GROW(graphs_, ngraphs_, capgraphs_);
    graph_t *x = &graphs_[ngraphs_];
    *x = (graph_t){exec, (int)ngraphs_, kernel_nodes, 0, 0, 0.0};
    ngraphs_++;
    open_index();
    if (index_) {
        fprintf(index_, "{\"ev\":\"graph\",\"id\":%d,\"kernel_nodes\":%d,\"kernels\":[",
                x->id, kernel_nodes);
        for (int k = 0; k < nnames; k++) {
            if (k) fputc(',', index_);
            emit_string(index_, names[k]);
        }
        fputs("]}\n", index_);
        fflush(index_);
    }
    return x;
}

static void note_graph_exec(CUgraphExec exec, CUgraph g) {
    pthread_mutex_lock(&lock_);
    resolve_launch_helpers();
    const char *names[R3_GRAPH_NAMES];
    int count = 0, nnames = 0;
    graph_kernels(g, 0, &count, names, &nnames);
    new_graph(exec, count, names, nnames);
    pthread_mutex_unlock(&lock_);
}

static graph_t *graph_of(const void *exec) {
    for (size_t i = ngraphs_; i-- > 0;)
        if (graphs_[i].exec == exec) return &graphs_[i];
    return new_graph(exec, -1, NULL, 0);  /* instantiated where the wrappers did not see it */
}

static CUresult w_ginst(CUgraphExec *e, CUgraph g, unsigned long long flags) {
    CUresult rc = r_ginst ? r_ginst(e, g, flags) : CUDA_ERROR_NOT_INITIALIZED;
    if (rc == CUDA_SUCCESS && e) note_graph_exec(*e, g);
    return rc;
}
static CUresult ginstp_common(ginstp_fn real, CUgraphExec *e, CUgraph g,
                              CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    CUresult rc = real ? real(e, g, params) : CUDA_ERROR_NOT_INITIALIZED;
    if (rc == CUDA_SUCCESS && e) note_graph_exec(*e, g);
    return rc;
}
static CUresult w_ginstp(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    return ginstp_common(r_ginstp, e, g, params);
}
static CUresult w_ginstp_ptsz(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    return ginstp_common(r_ginstp_ptsz, e, g, params);
}

/* A graph launch is counted and timed as a whole (events around it, read lazily like a
 * kernel's); its kernels are not recorded. */
static CUresult graph_launch(int ptsz, CUgraphExec exec, CUstream s) {
    glaunch_fn real = ptsz ? r_glaunch_ptsz : r_glaunch;
    if (!real) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock_);
    ensure_exit_handler();
    resolve_launch_helpers();
    int capture = faulted_ ? 0 : stream_capture(ptsz, s);
    if (faulted_ || capture < 0) {  /* after a fault, or the driver would not say */
        if (faulted_) after_fault_++;
        else capture_unknown_++;
        pthread_mutex_unlock(&lock_);
        return real(exec, s);
    }
    if (capture == 1) {  /* a graph launched into a capture becomes a child graph node */
        pthread_mutex_unlock(&lock_);
        return real(exec, s);
    }
    graph_t *x = graph_of(exec);
    x->launches++;
    graph_launches_++;
    if (capture || capturing_ > 0) {
        pthread_mutex_unlock(&lock_);
        return real(exec, s);
    }
    harvest(0);
    if (faulted_) {
        after_fault_++;
        pthread_mutex_unlock(&lock_);
        return real(exec, s);
    }
    if (npending_ == R3_MAX_PENDING) harvest(1);
    CUevent a = take_event(), b = take_event();
    evrecord_fn rec = ptsz ? d_evrecord_ptsz : d_evrecord;
    int gated = a && b && rec && gate_close(ptsz, s);
    if (a && b && rec) rec(a, s);
    CUresult rc = real(exec, s);
    if (a && b && rec && rc == CUDA_SUCCESS) {
        rec(b, s);
        pending_[npending_++] = (pending_t){a, b, 0, x->id + 1, 0, x->launches, graph_launches_};
    } else {
        give_event(a); give_event(b);
    }
    if (gated) gate_open();
    if (is_fault(rc)) {
        if (launch_blocking_)
            note_fault(rc, NULL, -1, x->id, x->launches, graph_launches_, 1,
                       "the graph launch (CUDA_LAUNCH_BLOCKING=1)");
        else
            fault_pending(rc, "a later graph launch");
    }
    pthread_mutex_unlock(&lock_);
    return rc;
}
static CUresult w_glaunch(CUgraphExec exec, CUstream s) { return graph_launch(0, exec, s); }
static CUresult w_glaunch_ptsz(CUgraphExec exec, CUstream s) { return graph_launch(1, exec, s); }

/* ---------------------------------------------------------------- cuGetProcAddress ------ */
static CUresult w_gpa2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static CUresult w_gpa1(const char *, void **, int, cuuint64_t);

#define SLOT(nm, minver, slot, wrapper) \
    if (!strcmp(sym, nm)) { if (ver < (minver)) return real; slot = (__typeof__(slot))real; return (void *)(wrapper); }
#define SLOT2(nm, minver, slot, wrapper) \
    if (!strcmp(sym, nm)) { if (ver < (minver)) return real; \
        if (ptsz) { slot##_ptsz = (__typeof__(slot))real; return (void *)(wrapper##_ptsz); } \
        slot = (__typeof__(slot))real; return (void *)(wrapper); }

/* The wrapper to hand out instead of the driver's `real` entry point for `sym`. */
static void *substitute(const char *sym, void *real, int ver, cuuint64_t flags) {
    int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    if (!real || !sym || sym[0] != 'c' || sym[1] != 'u') return real;
    if (!strcmp(sym, "cuGetProcAddress")) {
        if (ver >= 12000) { real_gpa2_ = (gpa2_fn)real; return (void *)w_gpa2; }
        real_gpa1_ = (gpa1_fn)real; return (void *)w_gpa1;
    }
    SLOT("cuMemAlloc", 3020, r_alloc, w_alloc)
    SLOT("cuMemAllocPitch", 3020, r_pitch, w_pitch)
    SLOT("cuMemFree", 3020, r_free, w_free)
    SLOT("cuMemAllocManaged", 6000, r_managed, w_managed)
    SLOT2("cuMemAllocAsync", 11020, r_async, w_async)
    SLOT2("cuMemAllocFromPoolAsync", 11020, r_pool, w_pool)
    SLOT2("cuMemFreeAsync", 11020, r_freeasync, w_freeasync)
    SLOT2("cuLaunchKernel", 4000, r_launch, w_launch)
    SLOT2("cuLaunchKernelEx", 11060, r_launchex, w_launchex)
    SLOT2("cuLaunchCooperativeKernel", 9000, r_coop, w_coop)
    SLOT("cuModuleGetGlobal", 3020, r_modglobal, w_modglobal)
    SLOT("cuLibraryGetGlobal", 12000, r_libglobal, w_libglobal)
    SLOT("cuModuleLoadData", 2000, r_modload, w_modload)
    SLOT("cuModuleLoadFatBinary", 2000, r_modfat, w_modfat)
    SLOT("cuModuleLoadDataEx", 2010, r_modloadex, w_modloadex)
    SLOT("cuLibraryLoadData", 12000, r_libload, w_libload)
    SLOT("cuModuleGetFunction", 2000, r_getfunc, w_getfunc)
    SLOT("cuLibraryGetKernel", 12000, r_getkernel, w_getkernel)
    SLOT("cuKernelGetFunction", 12000, r_kernfunc, w_kernfunc)
    SLOT("cuLibraryGetModule", 12000, r_libmod, w_libmod)
    SLOT("cuFuncSetCacheConfig", 3000, r_funccache, w_funccache)
    SLOT("cuKernelSetCacheConfig", 12000, r_kerncache, w_kerncache)
    SLOT("cuCtxSetCacheConfig", 3020, r_ctxcache, w_ctxcache)
    SLOT("cuFuncSetAttribute", 9000, r_funcattr, w_funcattr)
    SLOT("cuKernelSetAttribute", 12000, r_kernattr, w_kernattr)
    SLOT2("cuStreamBeginCapture", 10010, r_capbegin, w_capbegin)  /* _v2: with a capture mode */
    SLOT2("cuStreamBeginCaptureToGraph", 12030, r_captograph, w_captograph)
    SLOT2("cuStreamEndCapture", 10000, r_capend, w_capend)
    /* cuGraphInstantiate from 12.0 on is cuGraphInstantiateWithFlags; before, it took an
     * error-log buffer and is passed through (its graphs' kernel nodes read as unknown) */
    SLOT("cuGraphInstantiate", 12000, r_ginst, w_ginst)
    SLOT("cuGraphInstantiateWithFlags", 11040, r_ginst, w_ginst)
    SLOT2("cuGraphInstantiateWithParams", 12000, r_ginstp, w_ginstp)
    SLOT2("cuGraphLaunch", 10000, r_glaunch, w_glaunch)
    return real;
}

static CUresult w_gpa2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status) {
    getproc_seen_ = 1;
    CUresult rc = real_gpa2_(sym, pfn, ver, flags, status);
    if (rc == CUDA_SUCCESS && pfn && *pfn) *pfn = substitute(sym, *pfn, ver, flags);
    return rc;
}
static CUresult w_gpa1(const char *sym, void **pfn, int ver, cuuint64_t flags) {
    getproc_seen_ = 1;
    CUresult rc = real_gpa1_(sym, pfn, ver, flags);
    if (rc == CUDA_SUCCESS && pfn && *pfn) *pfn = substitute(sym, *pfn, ver, flags);
    return rc;
}

/* dlsym(libcuda, "cuX_v2") from a program or library that loads the driver itself. */
void *dlsym(void *handle, const char *name) {
    init_real_dlsym();
    void *p = real_dlsym_(handle, name);
    if (!p || name[0] != 'c' || name[1] != 'u') return p;
    if (!strcmp(name, "cuGetProcAddress_v2")) { real_gpa2_ = (gpa2_fn)p; getproc_seen_ = 1; return (void *)w_gpa2; }
    if (!strcmp(name, "cuGetProcAddress")) { real_gpa1_ = (gpa1_fn)p; getproc_seen_ = 1; return (void *)w_gpa1; }
    char base[128];
    snprintf(base, sizeof base, "%s", name);
    cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT;
    size_t n = strlen(base);
    if (n > 5 && !strcmp(base + n - 5, "_ptsz")) { base[n -= 5] = 0; flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM; }
    if (n > 3 && !strcmp(base + n - 3, "_v2")) base[n - 3] = 0;
    else if (!strcmp(base, "cuMemAlloc") || !strcmp(base, "cuMemFree") ||
             !strcmp(base, "cuModuleGetGlobal") || !strcmp(base, "cuMemAllocPitch") ||
             !strcmp(base, "cuStreamBeginCapture"))
        return p;  /* older signatures (32-bit sizes, no capture mode): not wrapped */
    if (!strcmp(base, "cuGraphInstantiate"))
        return p;  /* the symbols cuGraphInstantiate{,_v2} take an error log, not flags */
    return substitute(base, p, CUDA_VERSION, flags);
}

/* ---------------------------------------------------------------- direct driver calls --- */
/* For programs linked against libcuda.so: these definitions come before libcuda's. */
#define REAL(slot, nm) do { exported_seen_ = 1; init_real_dlsym(); \
    if (!(slot)) (slot) = (__typeof__(slot))real_dlsym_(RTLD_NEXT, nm); } while (0)

CUresult cuMemAlloc_v2(CUdeviceptr *d, size_t n) { REAL(r_alloc, "cuMemAlloc_v2"); return w_alloc(d, n); }
CUresult cuMemAllocPitch_v2(CUdeviceptr *d, size_t *p, size_t w, size_t h, unsigned e) {
    REAL(r_pitch, "cuMemAllocPitch_v2"); return w_pitch(d, p, w, h, e);
}
CUresult cuMemFree_v2(CUdeviceptr d) { REAL(r_free, "cuMemFree_v2"); return w_free(d); }
CUresult cuMemAllocManaged(CUdeviceptr *d, size_t n, unsigned f) {
    REAL(r_managed, "cuMemAllocManaged"); return w_managed(d, n, f);
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shm, CUstream s, void **p, void **e) {
    REAL(r_launch, "cuLaunchKernel"); return w_launch(f, gx, gy, gz, bx, by, bz, shm, s, p, e);
}
CUresult cuLaunchKernelEx(const CUlaunchConfig *k, CUfunction f, void **p, void **e) {
    REAL(r_launchex, "cuLaunchKernelEx"); return w_launchex(k, f, p, e);
}
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                   unsigned bx, unsigned by, unsigned bz, unsigned shm,
                                   CUstream s, void **p) {
    REAL(r_coop, "cuLaunchCooperativeKernel");
    return w_coop(f, gx, gy, gz, bx, by, bz, shm, s, p);
}
CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    REAL(r_modload, "cuModuleLoadData"); return w_modload(m, image);
}
CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, CUjit_option *o, void **v) {
    REAL(r_modloadex, "cuModuleLoadDataEx"); return w_modloadex(m, image, n, o, v);
}
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    REAL(r_getfunc, "cuModuleGetFunction"); return w_getfunc(f, m, name);
}
CUresult cuFuncSetCacheConfig(CUfunction f, CUfunc_cache config) {
    REAL(r_funccache, "cuFuncSetCacheConfig"); return w_funccache(f, config);
}
CUresult cuCtxSetCacheConfig(CUfunc_cache config) {
    REAL(r_ctxcache, "cuCtxSetCacheConfig"); return w_ctxcache(config);
}
CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute attr, int value) {
    REAL(r_funcattr, "cuFuncSetAttribute"); return w_funcattr(f, attr, value);
}
CUresult cuModuleGetGlobal_v2(CUdeviceptr *p, size_t *bytes, CUmodule m, const char *name) {
    REAL(r_modglobal, "cuModuleGetGlobal_v2"); return w_modglobal(p, bytes, m, name);
}
CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
    REAL(r_capbegin, "cuStreamBeginCapture_v2"); return w_capbegin(s, mode);
}
#if CUDA_VERSION >= 12030
CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *d,
                                     const CUgraphEdgeData *e, size_t n, CUstreamCaptureMode mode) {
    REAL(r_captograph, "cuStreamBeginCaptureToGraph"); return w_captograph(s, g, d, e, n, mode);
}
#endif
CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
    REAL(r_capend, "cuStreamEndCapture"); return w_capend(s, g);
}
CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags) {
    REAL(r_ginst, "cuGraphInstantiateWithFlags"); return w_ginst(e, g, flags);
}
CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    REAL(r_ginstp, "cuGraphInstantiateWithParams"); return w_ginstp(e, g, params);
}
CUresult cuGraphLaunch(CUgraphExec exec, CUstream s) {
    REAL(r_glaunch, "cuGraphLaunch"); return w_glaunch(exec, s);
}

/* ---------------------------------------------------------------- exit ------------------ */
static void finish(int harvest_events) {
    pthread_mutex_lock(&lock_);
    if (finished_) { pthread_mutex_unlock(&lock_); return; }
    if (harvest_events) harvest(1);
    if (index_ && index_pid_ == getpid()) {
        /* a stratum whose launch to snapshot never came: counted and timed, not recorded */
        for (size_t i = 0; i < nconfigs_; i++)
            if (configs_[i].snap_at) emit_unrecorded(&configs_[i], config_name(&configs_[i]),
                                                     "stratum");
        fputs("{\"ev\":\"profile\",\"configs\":[", index_);
        for (size_t i = 0; i < nconfigs_; i++) {
            config_t *k = &configs_[i];
            fprintf(index_, "%s[%d,%llu,%.9g,%llu", i ? "," : "", k->id, k->count, k->time_s,
                    k->timed);
            /* the same-args launches, where the reference was captured */
            if (k->ref_known)
                fprintf(index_, ",%llu,%.9g,%llu", k->same_count, k->same_time_s, k->same_timed);
            fputc(']', index_);
        }
        fputs("],\"graphs\":[", index_);
        for (size_t i = 0; i < ngraphs_; i++)
            fprintf(index_, "%s[%d,%llu,%.9g,%llu]", i ? "," : "", graphs_[i].id,
                    graphs_[i].launches, graphs_[i].time_s, graphs_[i].timed);
        fprintf(index_, "]}\n{\"ev\":\"end\",\"launches\":%llu,\"getproc\":%d,\"exported\":%d,"
                "\"arena_failed\":%d,\"harvested\":%d,\"graph_launches\":%llu,"
                "\"captured_launches\":%llu,\"capture_skipped\":%llu,\"gate\":%d,"
                "\"gated\":%llu,\"faulted\":%d,\"after_fault\":%llu,"
                "\"capture_unknown\":%llu,\"capture_error\":%d,\"snap_bytes\":%llu,"
                "\"budget_spent\":%d,\"write_errno\":%d}\n", launches_,
                getproc_seen_, exported_seen_, arena_failed_, harvest_events, graph_launches_,
                captured_launches_, capture_skipped_, gate_state_, gated_, faulted_, after_fault_,
                capture_unknown_, (int)capture_error_, (unsigned long long)snap_bytes_,
                budget_spent_, write_errno_);
        fclose(index_);
        index_ = NULL;
    }
    finished_ = 1;
    pthread_mutex_unlock(&lock_);
}

/* Reached when the program never launched (no atexit handler yet) or exits another way;
 * it does not call the driver, which may already be torn down. */
__attribute__((destructor)) static void finish_at_unload(void) { finish(0); }

__attribute__((constructor)) static void start(void) { init_real_dlsym(); }
