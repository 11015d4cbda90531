"""The seccomp filter every sandboxed command runs under: system calls that reach kernel state the
namespaces do not separate (keyrings, modules, the clock, swap, mounts, BPF, perf, io_uring,
kexec, reboot, namespaces, the kernel's log) and sockets of the vsock family fail with EPERM;
everything else is allowed.

It is a deny-list in the spirit of Docker's default profile (which also allows `ptrace` and
`process_vm_*` on current kernels: a coding agent's debugger works on the sandbox's own
processes). bwrap loads it (`--seccomp FD`) just before it execs the command, after its own
setup, so bwrap itself is not filtered. The program is classic BPF built here, no libseccomp.
x86_64 and aarch64 have a table (aarch64's numbers are the kernel's generic ones,
`include/uapi/asm-generic/unistd.h`, where the x86-only calls do not exist); on another machine
the sandbox runs without the filter and says so at start (`sandbox.ready` has `seccomp: null`).
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import struct

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (the low half of
# args[0] first, on these little-endian machines).
_NR, _ARCH, _ARG0 = 0, 4, 16
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_X32_BIT = 0x40000000
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7  # EM_AARCH64 (183) | 64-bit | little-endian
# socket(2) of the vsock family, as Docker's profile refuses it: vsock is not in any namespace,
# so a command with no network would still reach the hypervisor's (or a VM guest's agent's)
# vsock services.
AF_VSOCK = 40
SOCKET_X86_64, SOCKET_AARCH64 = 41, 198

# Calls added since Linux 5.1 have one number on every architecture.
_UNIFIED: dict[str, int] = {
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}

DENIED_X86_64: dict[str, int] = {
    "syslog": 103,
    "uselib": 134,
    "ustat": 136,
    "sysfs": 139,
    "pivot_root": 155,
    "_sysctl": 156,
    "acct": 163,
    "settimeofday": 164,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "sethostname": 170,
    "setdomainname": 171,
    "iopl": 172,
    "ioperm": 173,
    "create_module": 174,
    "init_module": 175,
    "delete_module": 176,
    "get_kernel_syms": 177,
    "query_module": 178,
    "quotactl": 179,
    "nfsservctl": 180,
    "lookup_dcookie": 212,
    "clock_settime": 227,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "clock_adjtime": 305,
    "setns": 308,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    **_UNIFIED,
}

# The same calls in the generic table arm64 uses. uselib, ustat, sysfs, _sysctl, iopl, ioperm,
# create_module, get_kernel_syms and query_module have no number there: nothing to deny.
DENIED_AARCH64: dict[str, int] = {
    "lookup_dcookie": 18,
    "umount2": 39,
    "mount": 40,
    "pivot_root": 41,
    "nfsservctl": 42,
    "quotactl": 60,
    "acct": 89,
    "unshare": 97,
    "syslog": 116,
    "kexec_load": 104,
    "init_module": 105,
    "delete_module": 106,
    "clock_settime": 112,
    "reboot": 142,
    "sethostname": 161,
    "setdomainname": 162,
    "settimeofday": 170,
    "add_key": 217,
    "request_key": 218,
    "keyctl": 219,
    "swapon": 224,
    "swapoff": 225,
    "perf_event_open": 241,
    "name_to_handle_at": 264,
    "open_by_handle_at": 265,
    "clock_adjtime": 266,
    "setns": 268,
    "finit_module": 273,
    "bpf": 280,
    "userfaultfd": 282,
    "kexec_file_load": 294,
    **_UNIFIED,
}

# platform.machine() → (the audit arch the filter admits, its deny-list, socket's number).
TABLES: dict[str, tuple[int, dict[str, int], int]] = {
    "x86_64": (AUDIT_ARCH_X86_64, DENIED_X86_64, SOCKET_X86_64),
    "AMD64": (AUDIT_ARCH_X86_64, DENIED_X86_64, SOCKET_X86_64),
    "aarch64": (AUDIT_ARCH_AARCH64, DENIED_AARCH64, SOCKET_AARCH64),
    "arm64": (AUDIT_ARCH_AARCH64, DENIED_AARCH64, SOCKET_AARCH64),
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(
    denied: dict[str, int] = DENIED_X86_64,
    arch: int = AUDIT_ARCH_X86_64,
    socket: int = SOCKET_X86_64,
) -> bytes:
    """The filter as bytes of `struct sock_filter` (what `seccomp_export_bpf` writes): another
    architecture than `arch` (a 32-bit compat task) or the x32 ABI's numbers (none exist on
    aarch64) is killed, a denied call and a `socket` (its number) of AF_VSOCK get EPERM, the
    rest is allowed."""
    numbers = sorted(set(denied.values()))
    n = len(numbers)
    # Layout: 0 ld arch; 1 jeq arch; 2 ld nr; 3 jge x32; 4..4+n-1 jeq nr; 4+n jeq socket;
    # ld args[0]; jeq AF_VSOCK; allow; errno; kill.
    allow = 4 + n + 3
    deny, kill = allow + 1, allow + 2
    code = [
        _insn(_LD_W_ABS, 0, 0, _ARCH),
        _insn(_JEQ_K, 0, kill - 2, arch),
        _insn(_LD_W_ABS, 0, 0, _NR),
        _insn(_JGE_K, kill - 4, 0, _X32_BIT),
    ]
    for i, number in enumerate(numbers):
        here = 4 + i
        code.append(_insn(_JEQ_K, deny - here - 1, 0, number))
    code += [
        _insn(_JEQ_K, 0, allow - (4 + n) - 1, socket),
        _insn(_LD_W_ABS, 0, 0, _ARG0),
        _insn(_JEQ_K, deny - (4 + n + 2) - 1, 0, AF_VSOCK),
        _insn(_RET_K, 0, 0, _RET_ALLOW),
        _insn(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),
        _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),
    ]
    return b"".join(code)


def available() -> bool:
    """Whether this machine has a table (x86_64, aarch64)."""
    return platform.machine() in TABLES


@functools.cache
def _machine_program() -> bytes | None:
    """This machine's program, built once per process; None where there is no table."""
    table = TABLES.get(platform.machine())
    return program(table[1], table[0], table[2]) if table is not None else None


def program_fd() -> int | None:
    """A file descriptor holding the program, positioned at its start, for `bwrap --seccomp`
    (the caller passes it to the child and closes it); None where there is no table."""
    code = _machine_program()
    if code is None:
        return None
    fd = os.memfd_create("receipt-seccomp", os.MFD_CLOEXEC)
    os.write(fd, code)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
