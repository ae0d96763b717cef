/*
 * A stand-in for the driver's setuid-root nvidia-modprobe, built by the tests
 * (tests/support/driverstandin.py). The real one loads the kernel modules and
 * creates the device nodes CUDA and NVML need; it can only do so with root's
 * powers, which the setuid bit gives it unless the caller runs with
 * NoNewPrivileges= (then it stays the caller). So does this one: it makes the
 * nodes with mknod when its effective uid is 0, and otherwise fails, saying
 * which uid ran it, and it appends each run's uid and arguments to a log so a
 * test can tell who ran it.
 * Its options as the real one reads them (NVIDIA/nvidia-modprobe, nvidia-modprobe.c):
 *   (no option)    load the driver: nothing to make here
 *   -c N, -c=N     /dev/nvidiaN c 195 N, and /dev/nvidiactl for N = 255
 *   -u -c=0 -c=1   the unified memory driver: /dev/nvidia-uvm, /dev/nvidia-uvm-tools
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#ifndef STANDIN_DEV
#define STANDIN_DEV "/dev"
#endif
#ifndef STANDIN_LOG
#define STANDIN_LOG "/run/nvidia-modprobe-standin.log"
#endif
#define UVM_MAJOR 511

static int node(const char *name, unsigned int major, unsigned int minor) {
    char path[512];
    snprintf(path, sizeof path, STANDIN_DEV "/%s", name);
    if (mknod(path, S_IFCHR | 0666, makedev(major, minor)) != 0) {
        struct stat st;
        if (stat(path, &st) == 0)
            return 0;                    /* already there */
        perror(path);
        return 1;
    }
    chmod(path, 0666);
    return 0;
}

int main(int argc, char **argv) {
    int i, failed = 0, uvm = 0, n = 0, minors[64];
    FILE *log = fopen(STANDIN_LOG, "ae");
    if (log) {
        fprintf(log, "euid=%u", (unsigned)geteuid());
        for (i = 1; i < argc; i++)
            fprintf(log, " %s", argv[i]);
        fputc('\n', log);
        fclose(log);
    }
    if (geteuid() != 0) {
        fprintf(stderr, "nvidia-modprobe: running as uid %u, not root: no node made\n",
                (unsigned)geteuid());
        return 1;
    }
    for (i = 1; i < argc; i++) {
        const char *value = NULL;
        if (strcmp(argv[i], "-u") == 0)
            uvm = 1;
        else if (strncmp(argv[i], "-c=", 3) == 0)
            value = argv[i] + 3;
        else if (strcmp(argv[i], "-c") == 0 && i + 1 < argc)
            value = argv[++i];
        if (value && n < 64)
            minors[n++] = atoi(value);
    }
    for (i = 0; i < n; i++) {
        char name[32];
        if (uvm) {
            if (minors[i] == 0 || minors[i] == 1)
                failed |= node(minors[i] ? "nvidia-uvm-tools" : "nvidia-uvm", UVM_MAJOR,
                               (unsigned)minors[i]);
            continue;
        }
        if (minors[i] < 0 || minors[i] > 255)
            return 1;
        if (minors[i] == 255)
            snprintf(name, sizeof name, "nvidiactl");
        else
            snprintf(name, sizeof name, "nvidia%d", minors[i]);
        failed |= node(name, 195, (unsigned)minors[i]);
    }
    return failed;
}
