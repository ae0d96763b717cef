/*
 * A stand-in for the driver's setuid-root nvidia-modprobe, built by the tests
 * (tests/support/driverstandin.py). The real one loads the kernel modules and
 * creates the device nodes CUDA and NVML need; it can only do so with root's
 * powers, which the setuid bit gives it unless the caller runs with
 * NoNewPrivileges= (then it stays the caller). So does this one: it makes the
 * nodes with mknod when its effective uid is 0, and otherwise fails, saying
 * which uid ran it, and it appends each run's uid and arguments to a log so a
 * test can tell who ran it.
 *   (no option)  /dev/nvidiactl            c 195 255
 *   -c N, -c=N   /dev/nvidiaN              c 195 N
 *   -u           /dev/nvidia-uvm, -tools   c UVM_MAJOR 0 and 1
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
    char path[128];
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
    int i, failed = 0, uvm = 0, minor = -1;
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
        if (strcmp(argv[i], "-u") == 0)
            uvm = 1;
        else if (strncmp(argv[i], "-c=", 3) == 0)
            minor = atoi(argv[i] + 3);
        else if (strcmp(argv[i], "-c") == 0 && i + 1 < argc)
            minor = atoi(argv[++i]);
    }
    failed |= node("nvidiactl", 195, 255);
    if (minor >= 0 && minor < 255) {
        char name[32];
        snprintf(name, sizeof name, "nvidia%d", minor);
        failed |= node(name, 195, (unsigned)minor);
    }
    if (uvm) {
        failed |= node("nvidia-uvm", UVM_MAJOR, 0);
        failed |= node("nvidia-uvm-tools", UVM_MAJOR, 1);
    }
    return failed;
}
