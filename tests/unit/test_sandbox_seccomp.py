"""The seccomp program, run by a small classic-BPF interpreter over made-up seccomp_data."""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Callable, Iterator

import pytest

from activities import sandbox_seccomp
from activities.sandbox_seccomp import (
    AUDIT_ARCH_AARCH64,
    AUDIT_ARCH_X86_64,
    DENIED_AARCH64,
    DENIED_X86_64,
    program,
)

ALLOW, KILL = 0x7FFF0000, 0x80000000
EPERM = 0x00050000 | errno.EPERM


def run(code: bytes, nr: int, arch: int = AUDIT_ARCH_X86_64, arg0: int = 0) -> int:
    """Interpret the filter over `struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}`."""
    data = struct.pack("=iIQQ", nr, arch, 0, arg0) + bytes(40)
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


def test_the_kernel_s_log_is_not_read_from_the_sandbox() -> None:
    """syslog(2) (Docker's profile denies it too): where `kernel.dmesg_restrict` is 0 any process
    reads the kernel's ring buffer — the host's devices, addresses, other containers' faults."""
    assert run(program(), 103) == EPERM
    assert run(program(DENIED_AARCH64, AUDIT_ARCH_AARCH64), 116, AUDIT_ARCH_AARCH64) == EPERM


def test_a_vsock_socket_is_refused_and_any_other_family_is_not() -> None:
    """vsock is in no namespace: with the network off, a command could still reach the
    hypervisor's vsock services (Docker's profile refuses the family too)."""
    for code, socket, arch in (
        (program(), 41, AUDIT_ARCH_X86_64),
        (program(DENIED_AARCH64, AUDIT_ARCH_AARCH64, 198), 198, AUDIT_ARCH_AARCH64),
    ):
        assert run(code, socket, arch, arg0=40) == EPERM
        assert all(run(code, socket, arch, arg0=family) == ALLOW for family in (1, 2, 10, 16))
        assert run(code, socket + 1, arch, arg0=40) == ALLOW  # another call's first argument


def test_another_architecture_and_the_x32_abi_are_killed() -> None:
    code = program()
    assert run(code, 0, arch=0x40000003) == KILL  # i386
    assert run(code, 0x40000000 + 1) == KILL


def test_aarch64_denies_the_same_calls_by_the_generic_numbers() -> None:
    code = program(DENIED_AARCH64, AUDIT_ARCH_AARCH64)
    assert all(run(code, nr, AUDIT_ARCH_AARCH64) == EPERM for nr in DENIED_AARCH64.values())
    # read, write, openat, clone, execve, ptrace, getpid, clone3 in the generic table.
    allowed = (63, 64, 56, 220, 221, 117, 172, 435)
    assert all(run(code, nr, AUDIT_ARCH_AARCH64) == ALLOW for nr in allowed)
    assert run(code, 40, AUDIT_ARCH_X86_64) == KILL  # an x86_64 filter's arch is not admitted
    assert run(code, 21, 0x40000028) == KILL  # a 32-bit arm compat task
    # Every call denied on x86_64 is denied here too, but those arm64 never had.
    x86_only = {"uselib", "ustat", "sysfs", "_sysctl", "iopl", "ioperm", "create_module"}
    x86_only |= {"get_kernel_syms", "query_module"}
    assert set(DENIED_X86_64) - set(DENIED_AARCH64) == x86_only
    assert set(DENIED_AARCH64) <= set(DENIED_X86_64)


@pytest.fixture
def another_machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Pretend to run on another machine; the program, built once per process, is rebuilt."""

    def pretend(machine: str) -> None:
        monkeypatch.setattr(sandbox_seccomp.platform, "machine", lambda: machine)
        sandbox_seccomp._machine_program.cache_clear()

    yield pretend
    sandbox_seccomp._machine_program.cache_clear()


@pytest.mark.parametrize(
    ("machine", "arch"),
    [("x86_64", AUDIT_ARCH_X86_64), ("aarch64", AUDIT_ARCH_AARCH64), ("arm64", AUDIT_ARCH_AARCH64)],
)
def test_the_machine_picks_its_table(
    another_machine: Callable[[str], None], machine: str, arch: int
) -> None:
    another_machine(machine)
    assert sandbox_seccomp.available()
    fd = sandbox_seccomp.program_fd()
    assert fd is not None
    try:
        loaded = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    assert run(loaded, 0, arch) in (ALLOW, EPERM)  # admitted: not killed
    assert (
        run(loaded, 0, AUDIT_ARCH_X86_64 if arch != AUDIT_ARCH_X86_64 else AUDIT_ARCH_AARCH64)
        == KILL
    )


def test_a_machine_without_a_table_runs_without_a_filter(
    another_machine: Callable[[str], None],
) -> None:
    another_machine("riscv64")
    assert not sandbox_seccomp.available()
    assert sandbox_seccomp.program_fd() is None
