"""Operating-system isolation of the reward sandbox worker (Linux; host-side, no JAX).

The worker that executes reward programs confines itself, strongest mechanism first:

- **network namespace** (`unshare(CLONE_NEWUSER | CLONE_NEWNET)`, no privileges needed
  where the kernel allows unprivileged user namespaces): the worker has no network
  interface but a down loopback, so nothing can be reached.
- **Landlock** (kernel 5.13+): the filesystem becomes read-only and limited to what
  Python and JAX need (the interpreter's prefixes, `sys.path`, the jaxrace package,
  system libraries, `/proc`, `/sys/devices/system/cpu`, `/dev/null`, `/dev/urandom`);
  only a private temporary directory is writable. The user's files (home, the
  project, `/etc`) cannot be read. ABI 4+ also refuses TCP bind/connect, ABI 6+ refuses
  signals and abstract Unix sockets to processes outside the sandbox.
- **resource limits** per program: address space, CPU seconds, file size, no core dumps.

Each mechanism the kernel lacks is skipped, and the caller warns once, naming what is
not protected. `apply_*` functions must run in the worker process only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import resource
import sys

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000

# Landlock (include/uapi/linux/landlock.h). The syscall numbers are the same on every
# architecture that has them (they were added after the unified syscall table).
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FS_READ = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or 0 where there is none (not Linux, disabled)."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64", "arm64", "riscv64"):
        return 0
    version = _libc().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    return max(int(version), 0)


def apply_network_namespace() -> str | None:
    """Move this (single-threaded) process into new user and network namespaces.

    Returns None on success, else why not (the kernel or a container refused it).
    """
    if sys.platform != "linux":
        return "not Linux"
    if len(os.listdir("/proc/self/task")) != 1:
        return "the process already has threads"
    if _libc().unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        return f"unshare refused: {_errno_text()}"
    return None


def _fs_rights(abi: int) -> int:
    rights = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        rights |= _FS_REFER
    if abi >= 3:
        rights |= _FS_TRUNCATE
    if abi >= 5:
        rights |= _FS_IOCTL_DEV
    return rights


def readable_paths() -> list[str]:
    """What the worker may read: the interpreter, its packages, system libraries, the CPU's facts."""
    import jaxrace

    # realpath: the worker imports jaxrace through a link in its private directory
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(jaxrace.__file__)),
             "/usr", "/lib", "/lib32", "/lib64", "/proc/self", "/sys/devices/system/cpu", "/dev/null", "/dev/urandom"}
    paths |= {p for p in sys.path if p and os.path.isabs(p)}
    return sorted(p for p in paths if os.path.exists(p))


def apply_landlock(writable_dir: str) -> tuple[int, str | None]:
    """Restrict this process (and its future children) with Landlock.

    Returns (abi, None) on success, else (abi, why not).
    """
    abi = landlock_abi()
    if abi < 1:
        return 0, "Landlock is not available in this kernel"
    libc = _libc()
    attr = _RulesetAttr(handled_access_fs=_fs_rights(abi),
                        handled_access_net=(_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0,
                        scoped=(_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0)
    size = ctypes.sizeof(attr) if abi >= 6 else ctypes.sizeof(ctypes.c_uint64) * (2 if abi >= 4 else 1)
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        return abi, f"landlock_create_ruleset failed: {_errno_text()}"
    try:
        rules = [(p, _FS_READ) for p in readable_paths()] + [(writable_dir, _fs_rights(abi))]
        for path, rights in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                if not os.path.isdir(path):
                    rights &= _FILE_RIGHTS
                rule = _PathBeneathAttr(allowed_access=rights & _fs_rights(abi), parent_fd=fd)
                if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                    return abi, f"landlock_add_rule({path}) failed: {_errno_text()}"
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return abi, f"prctl(PR_SET_NO_NEW_PRIVS) failed: {_errno_text()}"
        if libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) != 0:
            return abi, f"landlock_restrict_self failed: {_errno_text()}"
    finally:
        os.close(ruleset)
    return abi, None


def apply_resource_limits(memory_bytes: int, cpu_seconds: int, file_bytes: int) -> None:
    """Address space, CPU time (SIGXCPU, then SIGKILL a second later), file size, no core dumps."""
    for limit, value in ((resource.RLIMIT_AS, memory_bytes), (resource.RLIMIT_FSIZE, file_bytes),
                         (resource.RLIMIT_CORE, 0)):
        try:
            resource.setrlimit(limit, (value, value))
        except (ValueError, OSError):
            pass  # not enforceable here (RLIMIT_AS on macOS); the wall-clock limit still holds
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
