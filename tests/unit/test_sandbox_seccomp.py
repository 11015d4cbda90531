"""The seccomp program, run by a small classic-BPF interpreter over made-up seccomp_data."""

from __future__ import annotations

import errno
import struct

from activities.sandbox_seccomp import AUDIT_ARCH_X86_64, DENIED_X86_64, program

ALLOW, KILL = 0x7FFF0000, 0x80000000
EPERM = 0x00050000 | errno.EPERM


def run(code: bytes, nr: int, arch: int = AUDIT_ARCH_X86_64) -> int:
    """Interpret the filter over `struct seccomp_data {int nr; u32 arch; ...}`."""
    data = struct.pack("=iI", nr, arch) + bytes(56)
    insns = [struct.unpack_from("=HBBI", code, i) for i in range(0, len(code), 8)]
    pc, acc = 0, 0
    for _ in range(len(insns)):
        op, jt, jf, k = insns[pc]
        if op == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif op == 0x15:  # jeq #k
            pc += 1 + (jt if acc == k else jf)
        elif op == 0x35:  # jge #k
            pc += 1 + (jt if acc >= k else jf)
        elif op == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"unexpected opcode {op:#x}")
    raise AssertionError("the program ran off its end")


def test_denied_calls_get_eperm_and_the_rest_is_allowed() -> None:
    code = program()
    assert all(run(code, nr) == EPERM for nr in DENIED_X86_64.values())
    # read, write, openat, clone, execve, ptrace, getpid: what commands need.
    assert all(run(code, nr) == ALLOW for nr in (0, 1, 257, 56, 59, 101, 39))


def test_another_architecture_and_the_x32_abi_are_killed() -> None:
    code = program()
    assert run(code, 0, arch=0x40000003) == KILL  # i386
    assert run(code, 0x40000000 + 1) == KILL
