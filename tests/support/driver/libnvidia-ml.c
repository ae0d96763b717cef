/*
 * A stand-in for the NVIDIA driver's libnvidia-ml.so.1, built by the tests
 * (tests/support/driverstandin.py): no GPU exists on this machine, and NVML is
 * the boundary lokid reads GPUs through. Every real caller above it stays real:
 * Debian's python3-pynvml or PyPI's nvidia-ml-py load it with
 * CDLL("libnvidia-ml.so.1") in whatever process asks, so each systemd unit's
 * own sandbox decides what that process sees.
 *
 * What it does as the real library does:
 * - nvmlInit* opens /dev/nvidiactl (read-write). A node that is absent gives
 *   NVML_ERROR_DRIVER_NOT_LOADED (9, "Driver Not Loaded": nvidia-smi's words on a
 *   host without nodes). Refused by its mode (EACCES): NVML_ERROR_NO_PERMISSION (4).
 *   Refused by the device cgroup (EPERM, DevicePolicy=): NVML_ERROR_UNKNOWN (999),
 *   "Unknown Error", the message containers show when systemd's device rules
 *   stopped letting them open the nodes (NVIDIA/nvidia-container-toolkit#251).
 *   A node with no driver behind it (ENXIO, what mknod gives here) counts as the
 *   driver answering: the sandbox let the process reach it.
 * - nvmlDeviceGetHandleByIndex opens /dev/nvidia<minor> the same way; a refused
 *   node gives "Insufficient Permissions" (nvidia-smi: "Unable to determine the
 *   device handle for GPU…: Insufficient Permissions"), an absent one NOT_FOUND.
 * - Memory v1 (nvmlMemory_t) counts the driver's reserve in `used`; v2
 *   (nvmlMemory_v2_t, version 0x02000028) reports it apart, as nvidia-smi does.
 * - Compute processes: the two-call protocol (count first, INSUFFICIENT_SIZE).
 * - MIG queries: NOT_SUPPORTED, unless the devices file says `mig <gpu> 1`. A GPU in
 *   MIG mode has MAX_MIG_SLOTS MIG device slots (an A100's seven):
 *   nvmlDeviceGetMigDeviceHandleByIndex gives the instance a `migdev` line put in a
 *   slot, NOT_FOUND for an empty slot (the header's "no valid MIG device at index"),
 *   INVALID_ARGUMENT past the last slot. A MIG handle answers what a GPU's does (name,
 *   UUID `MIG-…`, memory v1 and v2 of that instance alone, its compute processes) and
 *   is told apart by nvmlDeviceIsMigDeviceHandle.
 *
 * The devices come from a file (STANDIN_FILE, set when compiling), one per line:
 *   gpu <minor> <uuid> <total MiB> <reserved MiB> <used MiB> <name…>
 *   proc <gpu index> <pid> <MiB>
 *   mig <gpu index> <0|1>
 *   migdev <gpu index> <slot> <uuid> <total MiB> <used MiB> <name…>
 *   migproc <gpu index> <slot> <pid> <MiB>
 * The device nodes are looked for under STANDIN_DEV (/dev unless set).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef STANDIN_FILE
#define STANDIN_FILE "/etc/nvml-standin/devices"
#endif
#ifndef STANDIN_DEV
#define STANDIN_DEV "/dev"
#endif

#define MIB (1024ULL * 1024ULL)
#define MAX_GPUS 16
#define MAX_PROCS 64
#define MAX_MIG_SLOTS 7
#define MAX_MIGS 32

enum {
    OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3,
    NO_PERMISSION = 4, NOT_FOUND = 6, INSUFFICIENT_SIZE = 7, DRIVER_NOT_LOADED = 9,
    UNKNOWN = 999
};

typedef struct {
    unsigned int pid;
    unsigned long long used;
} proc_t;

typedef struct {
    int minor;
    char uuid[96];
    char name[96];
    unsigned long long total, reserved, used;
    int mig;
    int parent;                      /* a MIG instance: its GPU's index; -1 for a GPU */
    int slot;                        /* a MIG instance: its slot under that GPU */
    int nprocs;
    proc_t procs[MAX_PROCS];
} gpu_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;                 /* _v2 and _v3 */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

static gpu_t gpus[MAX_GPUS];
static int ngpus;
static gpu_t migs[MAX_MIGS];
static int nmigs;
static int initialised;

static int open_error(const char *path, int absent, int refused) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        return OK;
    }
    switch (errno) {
    case ENXIO: case ENODEV: return OK;   /* reached the node: no driver behind it here */
    case ENOENT: return absent;
    case EACCES: return NO_PERMISSION;
    case EPERM: return refused;
    default: return UNKNOWN;
    }
}

static gpu_t *find_mig(int parent, int slot) {
    int i;
    for (i = 0; i < nmigs; i++)
        if (migs[i].parent == parent && migs[i].slot == slot)
            return &migs[i];
    return NULL;
}

static void load(void) {
    char line[512];
    FILE *f = fopen(STANDIN_FILE, "re");
    ngpus = 0;
    nmigs = 0;
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        gpu_t *g;
        unsigned long long total, reserved, used, mib;
        int minor, index, on, slot, n = 0;
        unsigned int pid;
        char uuid[96];
        if (sscanf(line, "gpu %d %95s %llu %llu %llu %n", &minor, uuid, &total, &reserved,
                   &used, &n) == 5 && n > 0 && ngpus < MAX_GPUS) {
            g = &gpus[ngpus++];
            memset(g, 0, sizeof *g);
            g->minor = minor;
            g->parent = -1;
            snprintf(g->uuid, sizeof g->uuid, "%s", uuid);
            snprintf(g->name, sizeof g->name, "%s", line + n);
            g->name[strcspn(g->name, "\r\n")] = 0;
            g->total = total * MIB;
            g->reserved = reserved * MIB;
            g->used = used * MIB;
        } else if (sscanf(line, "proc %d %u %llu", &index, &pid, &mib) == 3 && index >= 0
                   && index < ngpus && gpus[index].nprocs < MAX_PROCS) {
            g = &gpus[index];
            g->procs[g->nprocs].pid = pid;
            g->procs[g->nprocs].used = mib * MIB;
            g->nprocs++;
        } else if (sscanf(line, "mig %d %d", &index, &on) == 2 && index >= 0 && index < ngpus) {
            gpus[index].mig = on;
        } else if (sscanf(line, "migdev %d %d %95s %llu %llu %n", &index, &slot, uuid, &total,
                          &used, &n) == 5 && n > 0 && index >= 0 && index < ngpus
                   && slot >= 0 && slot < MAX_MIG_SLOTS && nmigs < MAX_MIGS) {
            g = &migs[nmigs++];
            memset(g, 0, sizeof *g);
            g->minor = gpus[index].minor;
            g->parent = index;
            g->slot = slot;
            snprintf(g->uuid, sizeof g->uuid, "%s", uuid);
            snprintf(g->name, sizeof g->name, "%s", line + n);
            g->name[strcspn(g->name, "\r\n")] = 0;
            g->total = total * MIB;
            g->used = used * MIB;
        } else if (sscanf(line, "migproc %d %d %u %llu", &index, &slot, &pid, &mib) == 4) {
            g = find_mig(index, slot);
            if (g && g->nprocs < MAX_PROCS) {
                g->procs[g->nprocs].pid = pid;
                g->procs[g->nprocs].used = mib * MIB;
                g->nprocs++;
            }
        }
    }
    fclose(f);
}

int nvmlInitWithFlags(unsigned int flags) {
    int r;
    (void)flags;
    r = open_error(STANDIN_DEV "/nvidiactl", DRIVER_NOT_LOADED, UNKNOWN);
    if (r != OK)
        return r;
    load();
    initialised = 1;
    return OK;
}
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlInit(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) {
    if (!initialised)
        return UNINITIALIZED;
    initialised = 0;
    return OK;
}

const char *nvmlErrorString(int r) {
    switch (r) {
    case OK: return "Success";
    case UNINITIALIZED: return "Uninitialized";
    case INVALID_ARGUMENT: return "Invalid Argument";
    case NOT_SUPPORTED: return "Not Supported";
    case NO_PERMISSION: return "Insufficient Permissions";
    case NOT_FOUND: return "Not Found";
    case INSUFFICIENT_SIZE: return "Insufficient Size";
    case DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialised)
        return UNINITIALIZED;
    snprintf(version, length, "%s", "550.163.01");
    return OK;
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised)
        return UNINITIALIZED;
    if (!count)
        return INVALID_ARGUMENT;
    *count = (unsigned int)ngpus;
    return OK;
}
int nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, gpu_t **device) {
    char path[512];
    int r;
    if (!initialised)
        return UNINITIALIZED;
    if (index >= (unsigned int)ngpus || !device)
        return INVALID_ARGUMENT;
    snprintf(path, sizeof path, STANDIN_DEV "/nvidia%d", gpus[index].minor);
    r = open_error(path, NOT_FOUND, NO_PERMISSION);
    if (r != OK)
        return r;
    *device = &gpus[index];
    return OK;
}
int nvmlDeviceGetHandleByIndex(unsigned int index, gpu_t **device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

int nvmlDeviceGetHandleByUUID(const char *uuid, gpu_t **device) {
    int i;
    if (!initialised)
        return UNINITIALIZED;
    for (i = 0; i < ngpus; i++)
        if (uuid && strcmp(uuid, gpus[i].uuid) == 0)
            return nvmlDeviceGetHandleByIndex_v2((unsigned int)i, device);
    return NOT_FOUND;
}

int nvmlDeviceGetIndex(gpu_t *device, unsigned int *index) {
    if (!initialised)
        return UNINITIALIZED;
    if (!device || !index || device->parent >= 0)
        return INVALID_ARGUMENT;       /* a MIG handle has no index among the GPUs */
    *index = (unsigned int)(device - gpus);
    return OK;
}

static int copy_text(const char *text, char *out, unsigned int length) {
    if (!out)
        return INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return OK;
}
int nvmlDeviceGetName(gpu_t *device, char *name, unsigned int length) {
    if (!device)
        return INVALID_ARGUMENT;
    return copy_text(device->name, name, length);
}
int nvmlDeviceGetUUID(gpu_t *device, char *uuid, unsigned int length) {
    if (!device)
        return INVALID_ARGUMENT;
    return copy_text(device->uuid, uuid, length);
}

int nvmlDeviceGetMemoryInfo(gpu_t *device, nvmlMemory_t *memory) {
    if (!device || !memory)
        return INVALID_ARGUMENT;
    memory->total = device->total;
    memory->used = device->used + device->reserved;     /* v1: the reserve is "used" */
    memory->free = device->total - memory->used;
    return OK;
}
int nvmlDeviceGetMemoryInfo_v2(gpu_t *device, nvmlMemory_v2_t *memory) {
    if (!device || !memory)
        return INVALID_ARGUMENT;
    if (memory->version != 0x02000028u)
        return INVALID_ARGUMENT;   /* the struct's size and version, as the header sets it */
    memory->total = device->total;
    memory->reserved = device->reserved;
    memory->used = device->used;
    memory->free = device->total - device->reserved - device->used;
    return OK;
}

static int processes(gpu_t *device, unsigned int *count, void *infos, int v1) {
    int i;
    if (!device || !count)
        return INVALID_ARGUMENT;
    if (*count < (unsigned int)device->nprocs || (!infos && device->nprocs)) {
        *count = (unsigned int)device->nprocs;
        return INSUFFICIENT_SIZE;
    }
    for (i = 0; i < device->nprocs; i++) {
        if (v1) {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
            p->pid = device->procs[i].pid;
            p->usedGpuMemory = device->procs[i].used;
        } else {
            nvmlProcessInfo_t *p = (nvmlProcessInfo_t *)infos + i;
            p->pid = device->procs[i].pid;
            p->usedGpuMemory = device->procs[i].used;
            p->gpuInstanceId = 0xFFFFFFFFu;
            p->computeInstanceId = 0xFFFFFFFFu;
        }
    }
    *count = (unsigned int)device->nprocs;
    return OK;
}
int nvmlDeviceGetComputeRunningProcesses_v3(gpu_t *d, unsigned int *n, nvmlProcessInfo_t *p) {
    return processes(d, n, p, 0);
}
int nvmlDeviceGetComputeRunningProcesses_v2(gpu_t *d, unsigned int *n, nvmlProcessInfo_t *p) {
    return processes(d, n, p, 0);
}
int nvmlDeviceGetComputeRunningProcesses(gpu_t *d, unsigned int *n, nvmlProcessInfo_v1_t *p) {
    return processes(d, n, p, 1);
}

int nvmlDeviceGetMigMode(gpu_t *device, unsigned int *current, unsigned int *pending) {
    if (!device || !current || !pending)
        return INVALID_ARGUMENT;
    if (!device->mig)
        return NOT_SUPPORTED;
    *current = *pending = 1;
    return OK;
}
int nvmlDeviceGetMaxMigDeviceCount(gpu_t *device, unsigned int *count) {
    if (!device || !count)
        return INVALID_ARGUMENT;
    if (!device->mig)
        return NOT_SUPPORTED;
    *count = MAX_MIG_SLOTS;
    return OK;
}
int nvmlDeviceGetMigDeviceHandleByIndex(gpu_t *device, unsigned int index, gpu_t **mig) {
    gpu_t *found;
    if (!initialised)
        return UNINITIALIZED;
    if (!device || !mig || device->parent >= 0 || index >= MAX_MIG_SLOTS)
        return INVALID_ARGUMENT;
    if (!device->mig)
        return NOT_SUPPORTED;
    found = find_mig((int)(device - gpus), (int)index);
    if (!found)
        return NOT_FOUND;              /* an empty slot: no instance made there */
    *mig = found;
    return OK;
}
int nvmlDeviceIsMigDeviceHandle(gpu_t *device, unsigned int *is_mig) {
    if (!device || !is_mig)
        return INVALID_ARGUMENT;
    *is_mig = device->parent >= 0;
    return OK;
}
int nvmlDeviceGetDeviceHandleFromMigDeviceHandle(gpu_t *mig, gpu_t **device) {
    if (!mig || !device || mig->parent < 0)
        return INVALID_ARGUMENT;
    *device = &gpus[mig->parent];
    return OK;
}
