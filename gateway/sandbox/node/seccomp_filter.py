"""The seccomp deny list applied inside every sandbox, compiled to BPF for `bwrap --seccomp`.

Everything not listed is allowed: the namespaces, the uid and the cgroups do the
containing; this filter removes the kernel interfaces that sandboxed code has no
use for and that are the usual way out of a namespace.
"""

import errno
import socket
import tempfile

# Debug, namespace, mount, keyring, BPF and machine-level interfaces.
DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev",
    "mount", "umount2", "pivot_root", "chroot", "open_by_handle_at",
    "unshare", "setns",
    "keyctl", "add_key", "request_key",
    "bpf", "perf_event_open", "userfaultfd",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff",
    # io_uring can create sockets and open files without the syscalls filtered here.
    "io_uring_setup", "io_uring_enter", "io_uring_register",
)  # fmt: skip
# Every address family but AF_UNIX is refused (node's child_process talks over
# socketpairs): an allow list, so that families the namespace does not cover (AF_VSOCK
# reaches the hypervisor's host) or that the kernel adds later are never reachable.
ALLOWED_SOCKET_FAMILY = socket.AF_UNIX
CLONE_NEWUSER = 0x10000000


def build_bpf() -> bytes:
    """Compiles the filter; raises ImportError or OSError when libseccomp is unusable."""
    # optional: the node reports the layer missing without it. The ignore: pyseccomp ships
    # neither type hints nor a py.typed marker, and typeshed has no stubs for it.
    import pyseccomp as sc  # type: ignore[import-untyped]

    filt = sc.SyscallFilter(sc.ALLOW)
    for name in DENIED:
        filt.add_rule(sc.ERRNO(errno.EPERM), name)
    # The whole 64-bit argument is compared: high bits set on AF_UNIX are refused too.
    for call in ("socket", "socketpair"):
        filt.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), call, sc.Arg(0, sc.NE, ALLOWED_SOCKET_FAMILY))
    filt.add_rule(
        sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
    )
    # clone3 passes its flags in memory a filter cannot inspect: ENOSYS makes libc
    # fall back to clone, whose flags are checked above.
    filt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as out:  # export_bpf wants a file object
        filt.export_bpf(out)
        out.seek(0)
        return out.read()
