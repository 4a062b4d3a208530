"""The sandbox's supervisor process: run as `python -I -S launcher.py CONFIG_JSON`, stdlib only.

Started by `kuberl.runtime.sandbox.run_python` in a session of its own, with the code's stdout
and stderr already pointing at files the caller reads afterwards. It knows nothing about RL.

    launcher (L)      the caller's uid and namespaces; writes the jail's uid/gid maps, keeps the
                      wall clock (SIGKILL to the jail at the deadline), waits for init, writes status.json
      jail (C)        joins the call's memory cgroup (when the caller made one) and asks to be the
                      OOM killer's first pick; unshare(user, mount, network, pid, ipc, uts); once
                      mapped, builds a root of its own on a tmpfs: the Python installation and /usr
                      read-only, /dev/null, /dev/zero, /dev/(u)random, a scratch tmpfs of its own
                      (size-limited) read-write at /scratch; then becomes uid 0 of its user
                      namespace (an unprivileged uid outside); forks
        init (I)      pid 1 of the new pid namespace: mounts its /proc, chroots into the root,
                      forks the code, reaps every process, reports how the code ended and exits,
                      which makes the kernel kill whatever the code left behind
          code (R)    no capabilities, no_new_privs, a seccomp filter refusing memory that no
                      address space counts (memfds, SysV shared memory and message queues, POSIX
                      message queues), rlimits on CPU time, address space (the call's
                      whole limit under a cgroup, else its share), processes, file size and open
                      files; cwd /scratch; a clean environment; runs the code

Uid 0 inside the user namespace is, outside it, an unprivileged uid: a fresh one the caller
picked when the caller is root (so RLIMIT_NPROC binds: it never binds uid 0), the caller's own
uid otherwise (a Kubernetes pod that runs as non-root). The network namespace has only a
loopback device, down: no packet leaves. Each of C and I dies with its parent (PDEATHSIG), so
killing the launcher's process group ends everything. The launcher adopts I when C dies first (it is a
child subreaper) and exits only once I is reaped: a pid namespace's init ends after every process in it,
so when the launcher exits nothing of the code is left, and the caller can remove its memory cgroup.
A failure to set the jail up is reported in status.json as `{"error": ...}`, never as the code's own
failure.
"""

import ctypes
import json
import os
import resource
import signal
import stat
import sys
import time
import traceback

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
JAIL_NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
#: capset(2) has no glibc wrapper.
SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
LINUX_CAPABILITY_VERSION_3 = 0x20080522
#: Calls that make memory no process's address space holds (RLIMIT_AS misses it): memfd_create, SysV shmget and
#: msgget, mq_open. Numbers from the kernel's arch/x86/entry/syscalls/syscall_64.tbl and
#: include/uapi/asm-generic/unistd.h (aarch64), with the AUDIT_ARCH the filter checks first (linux/audit.h).
UNACCOUNTED_MEMORY_CALLS = {
    "x86_64": (0xC000003E, (319, 29, 68, 240)),
    "aarch64": (0xC00000B7, (279, 194, 186, 180)),
}
#: seccomp(2): BPF opcodes, return values, the x32 ABI's bit, and the offsets of nr and arch in seccomp_data.
BPF_LD_W_ABS, BPF_JMP_JEQ_K, BPF_JMP_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, SECCOMP_RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
X32_SYSCALL_BIT, SECCOMP_DATA_NR, SECCOMP_DATA_ARCH = 0x40000000, 0, 4
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, EPERM = 22, 2, 1
#: statvfs flags of a mount that a bind mount must keep (inside a user namespace they are locked).
LOCKED_FLAGS = (
    (os.ST_RDONLY, MS_RDONLY),
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, MS_NOATIME),
    (os.ST_NODIRATIME, MS_NODIRATIME),
    (os.ST_RELATIME, MS_RELATIME),
)
DEVICES = ("null", "zero", "random", "urandom")
SCRATCH = "/scratch"
#: Files the scratch tmpfs may hold: each costs kernel memory its size limit does not count.
SCRATCH_FILES = 4096
#: The new root's mount point, relative to the sandbox's folder (the jail's working directory).
ROOT = "root"

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]


class JailError(RuntimeError):
    """The jail could not be set up (the code never ran)."""


def check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise JailError(f"{what}: {os.strerror(errno)} (errno {errno})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda s: s.encode() if s is not None else None  # noqa: E731
    check(libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)), f"mount {target}")


def open_paths(paths: list[str]) -> dict[str, int]:
    """O_PATH descriptors of the paths that exist, opened while the caller's uid can still reach them.

    After the uid switch a bind mount takes its source from /proc/self/fd/N, which resolves without
    searching the path's parents again (a Python under /root stays reachable to an unprivileged uid).
    """
    opened = {}
    for path in paths:
        if os.path.islink(path) or not os.path.exists(path):
            continue
        opened[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
    return opened


def bind(fd: int, target: str, *, read_only: bool, device: bool = False) -> None:
    """The file or folder behind `fd` at `target`, keeping the flags the kernel locks in a user namespace.

    A device node is bound without nodev (or it could not be opened) and noexec; everything else nosuid, nodev.
    """
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))  # a mount point for a file
    mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    locked = os.statvfs(fd).f_flag
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | (MS_NOEXEC if device else MS_NODEV) | (MS_RDONLY if read_only else 0)
    flags |= sum(ms for st, ms in LOCKED_FLAGS if locked & st)
    mount(None, target, None, flags)


def build_root(root: str, scratch_bytes: int, read_only: dict[str, int], links: list[str]) -> None:
    """A tmpfs at `root` holding only what the code needs: the read-only paths, a few devices, and /scratch, a
    tmpfs of `scratch_bytes` that ends with the call's mount namespace."""
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path in links:  # /lib -> usr/lib on merged-/usr systems
        os.makedirs(os.path.dirname(root + path), exist_ok=True)
        os.symlink(os.readlink(path), root + path)
    for path, fd in read_only.items():
        device = path.startswith("/dev/")
        bind(fd, root + path, read_only=not device, device=device)
    os.makedirs(root + SCRATCH)
    mount(
        "tmpfs",
        root + SCRATCH,
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={scratch_bytes},nr_inodes={SCRATCH_FILES},mode=0700",
    )
    os.makedirs(root + "/proc")
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=0755")


def enter_root(root: str) -> None:
    """In the jail's pid namespace: its own /proc, then chroot into the root."""
    try:  # a container that masks parts of its /proc refuses a new one inside a user namespace: go without
        mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except JailError:
        pass
    os.chroot(root)
    os.chdir("/")


def drop_capabilities() -> None:
    """No capabilities left in any set, and none to gain by exec (no_new_privs)."""
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    machine = os.uname().machine
    number = SYS_CAPSET.get(machine)
    if number is None:
        raise JailError(f"cannot drop capabilities on {machine}: no capset number known")
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all zero
    check(libc.syscall(number, header, data), "capset")


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def refuse_unaccounted_memory() -> None:
    """A seccomp filter (after no_new_privs): the calls in UNACCOUNTED_MEMORY_CALLS fail with EPERM, another
    architecture's or the x32 ABI's calls end the process. Without it a call could hold gigabytes in memfds or
    shared-memory segments that RLIMIT_AS never counts (where no cgroup holds the call, that is all there is)."""
    machine = os.uname().machine
    if machine not in UNACCOUNTED_MEMORY_CALLS:
        raise JailError(f"cannot filter system calls on {machine}: no numbers known")
    arch, numbers = UNACCOUNTED_MEMORY_CALLS[machine]
    deny = 6 + len(numbers)  # the index of the last instruction, which refuses
    program = [
        SockFilter(BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH),
        SockFilter(BPF_JMP_JEQ_K, 1, 0, arch),
        SockFilter(BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
        SockFilter(BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_NR),
        SockFilter(BPF_JMP_JGE_K, deny - 5, 0, X32_SYSCALL_BIT),
        *(SockFilter(BPF_JMP_JEQ_K, deny - 6 - index, 0, number) for index, number in enumerate(numbers)),
        SockFilter(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        SockFilter(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM),
    ]
    instructions = (SockFilter * len(program))(*program)
    fprog = SockFprog(len(program), instructions)
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "prctl(SECCOMP)")


def set_limits(limits: dict, address_space: int) -> None:
    cpu = max(1, int(limits["cpu_seconds"] + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the soft limit, SIGKILL a second later
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past file_bytes fails (EFBIG) instead of killing


def run_code(code: str, limits: dict, address_space: int) -> None:
    """In the code process: confine, then run `code` as __main__; never returns."""
    status = 1
    try:
        drop_capabilities()
        refuse_unaccounted_memory()
        os.closerange(3, 65536)
        os.chdir(SCRATCH)
        os.environ.clear()
        os.environ.update(PATH="/usr/local/bin:/usr/bin:/bin", HOME=SCRATCH, TMPDIR=SCRATCH, LANG="C.UTF-8")
        set_limits(limits, address_space)
        status = execute(code)
    except BaseException:  # noqa: BLE001 - whatever the set-up raises, the code has not run
        traceback.print_exc()
        status = 126
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def execute(code: str) -> int:
    """Runs the code like a notebook cell: the value of a final expression is printed (unless None)."""
    import ast

    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        tree = ast.parse(code, "<tool>", "exec")
        last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        if last is not None:
            tree.body.pop()
        exec(compile(tree, "<tool>", "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<tool>", "eval"), namespace)
            if value is not None:
                print(repr(value))  # noqa: T201 - the notebook-cell convention: the code's own stdout
    except SystemExit as stop:
        code_ = stop.code
        return code_ if isinstance(code_, int) else (0 if code_ is None else 1)
    except BaseException as error:  # noqa: BLE001 - the code's own error is its output
        # the traceback from the code's frames on: the frame of this function is ours, not the code's
        traceback.print_exception(type(error), error, error.__traceback__.tb_next if error.__traceback__ else None)
        return 1
    return 0


def init_process(config: dict, status_fd: int, code: str) -> None:
    """pid 1 of the jail: build the root, run the code in a child, report how it ended."""
    report: dict = {}
    try:
        check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
        enter_root(ROOT)
        child = os.fork()
        if child == 0:
            os.close(status_fd)
            run_code(code, config["limits"], config["address_space_bytes"])
        while True:  # pid 1 adopts every orphan: reap them all until the code's own process ends
            pid, wait_status = os.wait()
            if pid == child:
                break
        if os.WIFSIGNALED(wait_status):
            report = {"signal": os.WTERMSIG(wait_status)}
        else:
            report = {"exit_code": os.WEXITSTATUS(wait_status)}
    except BaseException as error:  # noqa: BLE001 - reported to the caller as a set-up failure
        report = {"error": f"{type(error).__name__}: {error}"}
    os.write(status_fd, json.dumps(report).encode())
    os._exit(0)  # the kernel now kills every process left in the namespace


def jail_process(config: dict, mapped_fd: int, ready_fd: int, status_fd: int, code: str) -> None:
    """The first process in the new namespaces: builds the root, takes on its mapped uid, forks init."""
    try:
        check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
        enter_memory_cgroup(config["cgroup"])
        check(libc.unshare(JAIL_NAMESPACES), "unshare(user, mount, net, pid, ipc, uts)")
        os.write(ready_fd, b"1")
        if os.read(mapped_fd, 1) != b"1":
            os._exit(0)  # the launcher could not map us and says why
        devices = [f"/dev/{device}" for device in DEVICES]
        paths = config["read_only"] + devices
        read_only = open_paths(paths)
        links = [path for path in config["read_only"] if os.path.islink(path)]
        # From here on paths are relative to the sandbox's folder: after the uid switch its parents may be
        # out of reach (a 0700 temporary folder of root's), the folder itself and `root` in it are not.
        os.chdir(os.path.dirname(config["root"]))
        mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here leaks back to the caller
        if config["drop_groups"]:
            os.setgroups([])
        os.setresgid(0, 0, 0)  # files the jail creates must belong to a uid mapped in it
        os.setresuid(0, 0, 0)
        build_root(ROOT, config["limits"]["scratch_bytes"], read_only, links)
    except BaseException as error:  # noqa: BLE001 - reported to the caller as a set-up failure
        os.write(status_fd, json.dumps({"error": f"{type(error).__name__}: {error}"}).encode())
        os._exit(0)
    init = os.fork()
    if init == 0:
        init_process(config, status_fd, code)
    os.waitpid(init, 0)
    os._exit(0)


def enter_memory_cgroup(cgroup: str | None) -> None:
    """Into the call's memory cgroup (its processes are held to the limit together), before anything of the call
    starts; and first in line for the OOM killer, should the pod itself run short (raising it needs no privilege)."""
    if cgroup is not None:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as handle:
            handle.write(str(os.getpid()))
    with open("/proc/self/oom_score_adj", "w") as handle:
        handle.write("1000")


def write_maps(pid: int, outside_uid: int, outside_gid: int) -> None:
    """uid and gid 0 inside the jail are `outside_uid` / `outside_gid` outside it."""
    if os.getuid() != 0:  # an unprivileged writer may map only its own ids, and only without setgroups
        with open(f"/proc/{pid}/setgroups", "w") as handle:
            handle.write("deny")
    with open(f"/proc/{pid}/uid_map", "w") as handle:
        handle.write(f"0 {outside_uid} 1")
    with open(f"/proc/{pid}/gid_map", "w") as handle:
        handle.write(f"0 {outside_gid} 1")


def main() -> None:
    config = json.loads(sys.argv[1])
    with open(config["code_path"], encoding="utf-8") as handle:
        code = handle.read()
    ready_r, ready_w = os.pipe()
    mapped_r, mapped_w = os.pipe()
    status_r, status_w = os.pipe()
    started = time.monotonic()
    # init is adopted here, not by the machine's init, when the jail dies first (killed at the deadline), so
    # that `reap_all` can wait for it: init's end is the end of every process of its namespace
    check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
    jail = os.fork()
    if jail == 0:
        for fd in (ready_r, mapped_w, status_r):
            os.close(fd)
        jail_process(config, mapped_r, ready_w, status_w, code)
    for fd in (ready_w, mapped_r, status_w):
        os.close(fd)
    report: dict = {}
    if os.read(ready_r, 1) == b"1":
        try:
            write_maps(jail, config["uid"], config["gid"])
            os.write(mapped_w, b"1")
        except OSError as error:
            report = {"error": f"cannot map the jail's user ids: {error}"}
    os.close(mapped_w)
    stopped_by_clock = wait_with_deadline(jail, started + config["limits"]["wall_seconds"] - time.monotonic())
    reap_all()
    written = b""
    while chunk := os.read(status_r, 4096):
        written += chunk
    if written and not report:
        report = json.loads(written)
    if stopped_by_clock:
        report = {"wall_time": True}
    report["seconds"] = time.monotonic() - started
    with open(config["status_path"], "w", encoding="utf-8") as handle:
        json.dump(report, handle)


def reap_all() -> None:
    """Kills the children left (init, orphaned when the jail was killed at the deadline) and waits for them.

    Without this the launcher would return while the kernel is still ending the namespace's processes: the
    caller would find them alive, and their memory cgroup busy (rmdir: EBUSY). A pid namespace's init ends
    only after every other process in it has (the kernel's zap_pid_ns_processes), so once init is reaped
    here nothing of the code is left."""
    me = str(os.getpid())
    for stat_file in os.listdir("/proc"):
        if not stat_file.isdigit():
            continue
        try:
            with open(f"/proc/{stat_file}/stat", encoding="utf-8") as handle:
                text = handle.read()
        except OSError:
            continue
        if text[text.rindex(")") + 2 :].split()[1] == me:  # after "pid (comm) ": state, ppid
            try:
                os.kill(int(stat_file), signal.SIGKILL)
            except ProcessLookupError:
                pass
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return


def wait_with_deadline(pid: int, seconds: float) -> bool:
    """Waits for `pid`; at the deadline kills it (its init dies with it, and the whole namespace with init).

    Returns True when the deadline stopped it.
    """
    expired = []

    def kill(*_: object) -> None:
        expired.append(True)
        os.kill(pid, signal.SIGKILL)

    signal.signal(signal.SIGALRM, kill)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    os.waitpid(pid, 0)  # retried after the handler ran (PEP 475) until the killed child is reaped
    signal.setitimer(signal.ITIMER_REAL, 0)
    return bool(expired)


if __name__ == "__main__":
    main()
