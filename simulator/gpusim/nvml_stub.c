/*
 * Stand-in libnvidia-ml.so.1 for simulated GPU hosts.
 *
 * At init it runs $GPUSIM_SNAPSHOT (default: gpusim-snapshot on PATH) and parses
 * its tab-separated stdout:
 *   driver <ver> <cuda_int>
 *   gpu    <index> <uuid> <name> <total_bytes> <used_bytes> <mig 0|1> [<memory_rc>]
 *   proc   <gpu_index> <pid> <used_bytes|NA> <name...>
 * memory_rc (default 0) is what nvmlDeviceGetMemoryInfo returns: 3 (NOT_SUPPORTED) where the
 * driver does not report memory (GB10), 4 (NO_PERMISSION) in an unprivileged MIG container.
 * An empty proc name means no local process has that PID (nvmlSystemGetProcessName: NOT_FOUND).
 * Only what pynvml (nvidia-ml-py) needs for inventory/process queries is provided;
 * structs match pynvml's ctypes layouts. Build:
 *   gcc -shared -fPIC -O2 -Wall -Wextra -o libnvidia-ml.so.1 nvml_stub.c
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_UNKNOWN = 999,
};
#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFULL
#define NO_INSTANCE 0xFFFFFFFFu
#define MAX_GPUS 64
#define STR_LEN 256

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
/* pynvml uses this one layout for v1, v2 and v3 */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

struct gpu {
    unsigned int index, mig, mem_rc;
    char uuid[STR_LEN], name[STR_LEN];
    unsigned long long total, used;
};
struct proc {
    unsigned int gpu, pid;
    unsigned long long used;
    char name[STR_LEN];
};
struct snap {
    char driver[STR_LEN];
    int cuda;
    unsigned int ngpus, nprocs;
    struct gpu gpus[MAX_GPUS];
    struct proc *procs;
};

/* Handles point into g_gpus, which never moves, so stale handles stay harmless. */
typedef struct gpu *nvmlDevice_t;
static struct gpu g_gpus[MAX_GPUS];
static struct snap g_snap;  /* driver/procs of the committed snapshot; gpus copied to g_gpus */
static unsigned int g_refs; /* NVML refcounts init/shutdown pairs */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* Marker so callers can tell this stub from a real driver library. */
const char gpusim_nvml_stub[] = "gpusim";

static void copy_str(char *dst, const char *src) {
    snprintf(dst, STR_LEN, "%s", src);
}

/* Split line at tabs into at most max fields; the last one keeps any remaining tabs. */
static int split(char *line, char **f, int max) {
    int n = 0;
    f[n++] = line;
    while (n < max) {
        char *t = strchr(f[n - 1], '\t');
        if (!t) break;
        *t = '\0';
        f[n++] = t + 1;
    }
    return n;
}

static int parse_uint(const char *s, unsigned long long *out) {
    char *end;
    if (!*s || *s == '-') return 0;
    *out = strtoull(s, &end, 10);
    return *end == '\0';
}

/* Run the snapshot command and parse it into *s; NVML error code on failure. */
static nvmlReturn_t take_snapshot(struct snap *s) {
    const char *cmd = getenv("GPUSIM_SNAPSHOT");
    if (!cmd || !*cmd) cmd = "gpusim-snapshot";
    memset(s, 0, sizeof(*s));
    FILE *p = popen(cmd, "r");
    if (!p) return NVML_ERROR_DRIVER_NOT_LOADED;

    char *line = NULL;
    size_t cap = 0, proc_cap = 0;
    int have_driver = 0, oom = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, p)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        char *f[8];
        int n = split(line, f, 8);
        unsigned long long a, b, c, d, e = 0;
        if (!strcmp(f[0], "driver") && n >= 3 && parse_uint(f[2], &a)) {
            copy_str(s->driver, f[1]);
            s->cuda = (int)a;
            have_driver = 1;
        } else if (!strcmp(f[0], "gpu") && (n == 7 || (n == 8 && parse_uint(f[7], &e))) && s->ngpus < MAX_GPUS &&
                   parse_uint(f[1], &a) && parse_uint(f[4], &b) && parse_uint(f[5], &c) && parse_uint(f[6], &d)) {
            struct gpu *g = &s->gpus[s->ngpus++];
            g->index = (unsigned int)a;
            copy_str(g->uuid, f[2]);
            copy_str(g->name, f[3]);
            g->total = b;
            g->used = c;
            g->mig = d != 0;
            g->mem_rc = (unsigned int)e;
        } else if (!strcmp(f[0], "proc") && n >= 5 && parse_uint(f[1], &a) && parse_uint(f[2], &b)) {
            for (int k = 5; k < n; k++) f[k][-1] = '\t'; /* rejoin the name if split() cut it at a tab */
            if (s->nprocs == proc_cap) {
                size_t ncap = proc_cap ? proc_cap * 2 : 16;
                struct proc *np = realloc(s->procs, ncap * sizeof(*np));
                if (!np) { oom = 1; break; }
                s->procs = np;
                proc_cap = ncap;
            }
            struct proc *pr = &s->procs[s->nprocs++];
            pr->gpu = (unsigned int)a;
            pr->pid = (unsigned int)b;
            pr->used = parse_uint(f[3], &c) ? c : NVML_VALUE_NOT_AVAILABLE_ULL;
            copy_str(pr->name, f[4]);
        } /* other kinds ignored, so the snapshot format can grow */
    }
    free(line);
    if (oom) {
        while (getc(p) != EOF) {} /* drain so pclose doesn't block the child on a full pipe */
    }
    int st = pclose(p);
    if (oom) {
        free(s->procs);
        return NVML_ERROR_MEMORY;
    }
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || !have_driver) {
        free(s->procs);
        s->procs = NULL;
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    return NVML_SUCCESS;
}

/* ---- live values ---- */

/* Real NVML answers live; the stub re-reads the ledger when its snapshot is older than GPUSIM_NVML_TTL_MS
 * (default 10 ms). Refreshing on the device count keeps one enumeration pass consistent and cheap. */
static double g_taken;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
}

static void commit(struct snap *fresh) {
    free(g_snap.procs);
    g_snap = *fresh;
    memcpy(g_gpus, fresh->gpus, sizeof(g_gpus));
    g_taken = now_ms();
}

static void refresh_if_stale(void) {
    static struct snap fresh;
    const char *ttl_env = getenv("GPUSIM_NVML_TTL_MS");
    double ttl = ttl_env ? atof(ttl_env) : 10.0;
    pthread_mutex_lock(&g_lock);
    if (g_refs && now_ms() - g_taken > ttl && take_snapshot(&fresh) == NVML_SUCCESS)
        commit(&fresh); /* a failed re-read keeps the last good snapshot */
    pthread_mutex_unlock(&g_lock);
}

/* ---- init / shutdown ---- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    static struct snap fresh; /* large; keep it off the stack */
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = take_snapshot(&fresh);
    if (r == NVML_SUCCESS) { /* commit only a good snapshot; each init re-reads */
        commit(&fresh);
        g_refs++;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = NVML_SUCCESS;
    if (!g_refs) r = NVML_ERROR_UNINITIALIZED;
    else if (--g_refs == 0) {
        free(g_snap.procs);
        memset(&g_snap, 0, sizeof(g_snap));
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    default: return "Unknown Error";
    }
}

/* ---- helpers: state checks (reads are unlocked like real NVML's getters; the
 * snapshot only changes on init/shutdown) ---- */

#define NEED_INIT() do { if (!g_refs) return NVML_ERROR_UNINITIALIZED; } while (0)

static nvmlReturn_t check_dev(nvmlDevice_t d) {
    if (!g_refs) return NVML_ERROR_UNINITIALIZED;
    if (d < g_gpus || d >= g_gpus + g_snap.ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

/* NVML fails rather than truncates when an identifier doesn't fit. */
static nvmlReturn_t put_str(char *buf, unsigned int len, const char *s) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) >= len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, s);
    return NVML_SUCCESS;
}

/* ---- system ---- */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    NEED_INIT();
    return put_str(version, length, g_snap.driver);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    NEED_INIT();
    char buf[STR_LEN + 16]; /* real format: "<cuda major>.<driver version>" */
    snprintf(buf, sizeof(buf), "%d.%s", g_snap.cuda / 1000, g_snap.driver);
    return put_str(version, length, buf);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    NEED_INIT();
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    *v = g_snap.cuda;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    NEED_INIT();
    if (!name || !length) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < g_snap.nprocs; i++)
        if (g_snap.procs[i].pid == pid) { /* NVML truncates process names */
            if (!g_snap.procs[i].name[0]) return NVML_ERROR_NOT_FOUND; /* listed, but no such local process */
            snprintf(name, length, "%s", g_snap.procs[i].name);
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

/* ---- devices ---- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    NEED_INIT();
    refresh_if_stale();
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = g_snap.ngpus;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

/* Look up by the snapshot's index field, not line order, so gpu lines may come in any order. */
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *dev) {
    NEED_INIT();
    if (!dev) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < g_snap.ngpus; i++)
        if (g_gpus[i].index == index) { *dev = &g_gpus[i]; return NVML_SUCCESS; }
    return NVML_ERROR_INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *dev) {
    return nvmlDeviceGetHandleByIndex_v2(index, dev);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *dev) {
    NEED_INIT();
    if (!uuid || !dev) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < g_snap.ngpus; i++)
        if (!strcmp(g_gpus[i].uuid, uuid)) { *dev = &g_gpus[i]; return NVML_SUCCESS; }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    nvmlReturn_t r = check_dev(d);
    if (r) return r;
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = d->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    nvmlReturn_t r = check_dev(d);
    return r ? r : put_str(name, length, d->name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    nvmlReturn_t r = check_dev(d);
    return r ? r : put_str(uuid, length, d->uuid);
}

static unsigned long long free_of(const struct gpu *g) {
    return g->used < g->total ? g->total - g->used : 0;
}

/* Both versions fail alike where memory is unreadable (the GB10 driver answers NOT_SUPPORTED to v1 and v2). */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    nvmlReturn_t r = check_dev(d);
    if (r) return r;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mem_rc) return (nvmlReturn_t)d->mem_rc;
    m->total = d->total;
    m->used = d->used;
    m->free = free_of(d);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    nvmlReturn_t r = check_dev(d);
    if (r) return r;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->mem_rc) return (nvmlReturn_t)d->mem_rc;
    m->total = d->total;
    m->reserved = 0;
    m->used = d->used;
    m->free = free_of(d);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    nvmlReturn_t r = check_dev(d);
    if (r) return r;
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = d->mig;
    return NVML_SUCCESS;
}

/* NVML sizing protocol: *count in = capacity, out = number of processes; too small (or NULL
 * infos with processes present) -> INSUFFICIENT_SIZE; none -> SUCCESS with count 0. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    nvmlReturn_t r = check_dev(d);
    if (r) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    for (unsigned int i = 0; i < g_snap.nprocs; i++) n += g_snap.procs[i].gpu == d->index;
    if (n == 0) { *count = 0; return NVML_SUCCESS; }
    if (!infos || *count < n) { *count = n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    unsigned int k = 0;
    for (unsigned int i = 0; i < g_snap.nprocs; i++) {
        const struct proc *p = &g_snap.procs[i];
        if (p->gpu != d->index) continue;
        infos[k].pid = p->pid;
        infos[k].usedGpuMemory = p->used;
        infos[k].gpuInstanceId = infos[k].computeInstanceId = NO_INSTANCE;
        k++;
    }
    *count = n;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i) {
    return nvmlDeviceGetComputeRunningProcesses_v3(d, c, i);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i) {
    return nvmlDeviceGetComputeRunningProcesses_v3(d, c, i);
}

/* Simulated GPUs run compute work only: graphics/MPS lists are always empty (tools like
 * nvitop/gpustat ask for them alongside compute processes). */
static nvmlReturn_t no_procs(nvmlDevice_t d, unsigned int *count) {
    nvmlReturn_t r = check_dev(d);
    if (r) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i) {
    (void)i;
    return no_procs(d, c);
}
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i) {
    (void)i;
    return no_procs(d, c);
}
