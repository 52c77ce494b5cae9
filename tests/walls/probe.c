/* Tries, from inside a sandbox, the ways out of it that forkd's walls close, and prints
 * one line per attempt: its name and the errno it failed with (0 if it succeeded).
 * Built statically by tests/walls.rs and copied into a busybox and a Debian sandbox.
 * Usage: probe [host-pid]   (a pid of the host, which must not be reachable) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/ip_icmp.h>
#include <poll.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

static void report(const char *name, long rc) {
    printf("%s %d\n", name, rc < 0 ? errno : 0);
    fflush(stdout);
}

/* A system call whose failure is the answer; a success is undone where it made
 * something (a descriptor). */
#define TRY(name, call) do { errno = 0; long r_ = (call); report(name, r_); \
    if (r_ > 2 && strcmp(name, "clone-newuser") != 0) close((int)r_); } while (0)

static long write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY);
    if (fd < 0) return -1;
    long n = write(fd, text, strlen(text));
    int e = errno;
    close(fd);
    errno = e;
    return n < 0 ? -1 : 0;
}

/* A system call through the 32-bit entry (int 0x80): getpid is 20 there. */
static long int80_getpid(void) {
    long ret;
    __asm__ volatile("int $0x80" : "=a"(ret) : "a"(20L) : "memory");
    if (ret < 0 && ret > -4096) { errno = (int)-ret; return -1; }
    return ret;
}

/* An ICMP echo to `addr` from a raw socket: 0 if an answer came back (a way to another
 * sandbox), ETIMEDOUT if none did within a second, else sendto's errno. */
static long raw_echo(const char *addr) {
    struct sockaddr_in to = {.sin_family = AF_INET};
    if (inet_pton(AF_INET, addr, &to.sin_addr) != 1) { errno = EINVAL; return -1; }
    int s = socket(AF_INET, SOCK_RAW, IPPROTO_ICMP);
    if (s < 0) return -1;
    unsigned char pkt[16] = {ICMP_ECHO, 0, 0, 0, 0x12, 0x34, 0, 1};
    unsigned sum = 0;
    for (int i = 0; i < 16; i += 2) sum += (pkt[i] << 8) | pkt[i + 1];
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    sum = ~sum & 0xffff;
    pkt[2] = sum >> 8; pkt[3] = sum & 0xff;
    if (sendto(s, pkt, sizeof pkt, 0, (struct sockaddr *)&to, sizeof to) < 0) {
        int e = errno; close(s); errno = e; return -1;
    }
    struct pollfd p = {.fd = s, .events = POLLIN};
    for (int waited = 0; waited < 10; waited++) {
        if (poll(&p, 1, 100) > 0) {
            unsigned char buf[256];
            struct sockaddr_in from;
            socklen_t len = sizeof from;
            long n = recvfrom(s, buf, sizeof buf, 0, (struct sockaddr *)&from, &len);
            int hl = n > 0 ? (buf[0] & 0xf) * 4 : 0;
            if (n > hl && from.sin_addr.s_addr == to.sin_addr.s_addr && buf[hl] == ICMP_ECHOREPLY) {
                close(s); return 0;
            }
        }
    }
    close(s);
    errno = ETIMEDOUT;
    return -1;
}

int main(int argc, char **argv) {
    /* Only ever inside a sandbox: its PID 1 is forkd's init. */
    char init[64] = {0};
    int cf = open("/proc/1/cmdline", O_RDONLY);
    if (cf < 0 || read(cf, init, sizeof init - 1) < 0 || strcmp(init, "forkd-init") != 0) {
        fprintf(stderr, "probe: not inside a forkd sandbox; refusing to run\n");
        return 2;
    }
    close(cf);
    long host_pid = argc > 1 ? atol(argv[1]) : 1000000;
    char zero[256];
    memset(zero, 0, sizeof zero);

    /* New namespaces, the user namespace above all. */
    TRY("unshare-user", unshare(CLONE_NEWUSER));
    TRY("unshare-user-mount-net", unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET));
    TRY("unshare-mount", unshare(CLONE_NEWNS));
    {
        errno = 0;
        long pid = syscall(SYS_clone, (long)(CLONE_NEWUSER | SIGCHLD), 0L, 0L, 0L, 0L);
        if (pid == 0) _exit(0);
        if (pid > 0) waitpid((pid_t)pid, NULL, 0);
        report("clone-newuser", pid);
    }
    {
        struct { unsigned long long flags, pidfd, child_tid, parent_tid, exit_signal,
                 stack, stack_size, tls; } args;
        memset(&args, 0, sizeof args);
        args.flags = CLONE_NEWUSER;
        args.exit_signal = SIGCHLD;
        errno = 0;
        long pid = syscall(435, &args, sizeof args);
        if (pid == 0) _exit(0);
        if (pid > 0) waitpid((pid_t)pid, NULL, 0);
        report("clone3-newuser", pid);
    }
    TRY("setns", syscall(SYS_setns, 0, 0));

    /* Mounts, and the cgroup v1 release_agent route. */
    mkdir("/tmp/walls-m", 0700);
    TRY("mount-tmpfs", mount("x", "/tmp/walls-m", "tmpfs", 0, NULL));
    TRY("mount-cgroup-v1", mount("cgroup", "/tmp/walls-m", "cgroup", 0, "rdma"));
    TRY("umount-proc", umount2("/proc", MNT_DETACH));
    TRY("pivot-root", syscall(SYS_pivot_root, "/tmp", "/tmp/walls-m"));
    TRY("fsopen", syscall(430, "tmpfs", 0));
    TRY("open-tree", syscall(428, AT_FDCWD, "/", 0));
    TRY("swapon", syscall(SYS_swapon, "/tmp/walls-swap", 0));
    TRY("reboot", syscall(SYS_reboot, 0xfee1dead, 672274793, 0x0 /* CAD off */, 0));

    /* The kernel's wider surface. */
    TRY("keyctl", syscall(SYS_keyctl, 1 /* JOIN_SESSION_KEYRING */, 0));
    TRY("add-key", syscall(SYS_add_key, "user", "walls", "x", 1, -3 /* session */));
    TRY("request-key", syscall(SYS_request_key, "user", "walls", 0, 0));
    TRY("bpf-prog-load", syscall(SYS_bpf, 5 /* BPF_PROG_LOAD */, zero, 128));
    TRY("perf-event-open", syscall(SYS_perf_event_open, zero, 0, -1, -1, 0));
    TRY("userfaultfd", syscall(SYS_userfaultfd, O_CLOEXEC));
    TRY("io-uring-setup", syscall(425, 8, zero));
    TRY("init-module", syscall(SYS_init_module, zero, 16, ""));
    TRY("finit-module", syscall(SYS_finit_module, 0, "", 0));
    TRY("delete-module", syscall(SYS_delete_module, "loop", 0));
    TRY("kexec-load", syscall(SYS_kexec_load, 0, 0, 0, 0));
    TRY("kexec-file-load", syscall(SYS_kexec_file_load, -1, -1, 0, "", 0));
    TRY("open-by-handle-at", syscall(SYS_open_by_handle_at, AT_FDCWD, zero, O_RDONLY));
    TRY("socket-vsock", socket(40 /* AF_VSOCK */, SOCK_STREAM, 0));
    TRY("personality-exec", syscall(SYS_personality, 0x0400000 /* READ_IMPLIES_EXEC */));
    TRY("iopl", syscall(SYS_iopl, 3));
    TRY("int80-getpid", int80_getpid());
    TRY("x32-unshare-user", syscall(0x40000000L | SYS_unshare, CLONE_NEWUSER));
    TRY("x32-io-uring-setup", syscall(0x40000000L | 425, 8, zero));
    TRY("unknown-syscall", syscall(500));

    /* Devices, the host's knobs, processes outside. */
    TRY("mknod-block", mknod("/tmp/walls-sda", S_IFBLK | 0600, makedev(8, 0)));
    TRY("write-proc-sys", write_file("/proc/sys/kernel/domainname", "walls"));
    TRY("write-sysrq", write_file("/proc/sysrq-trigger", "h"));
    TRY("write-sys", write_file("/sys/kernel/mm/transparent_hugepage/enabled", "never"));
    TRY("ptrace-host-pid", ptrace(PTRACE_ATTACH, (pid_t)host_pid, 0, 0));
    /* PID 1's parent is outside the namespace: the sandbox sees it as pid 0. */
    TRY("ptrace-init-parent", ptrace(PTRACE_ATTACH, (pid_t)0, 0, 0));
    TRY("kill-host-pid", kill((pid_t)host_pid, 0));
    /* Another sandbox's address, through a raw socket (CAP_NET_RAW is kept). */
    if (argc > 2) TRY("raw-socket-sibling", raw_echo(argv[2]));

    /* What programs need goes on. */
    TRY("unshare-files", unshare(CLONE_FILES | CLONE_FS));
    TRY("personality-query", syscall(SYS_personality, 0xffffffffL));
    TRY("socket-inet", socket(AF_INET, SOCK_STREAM, 0));
    return 0;
}
