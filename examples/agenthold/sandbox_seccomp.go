//go:build linux

package main

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// noUserNamespaces installs, on the calling thread (and so in the command
// it forks), a seccomp filter that refuses to make a user namespace:
// unshare and clone with CLONE_NEWUSER fail with EPERM, and clone3, whose
// flags a filter cannot read, with ENOSYS (callers then fall back to
// clone, as C libraries do). In a user namespace of its own the command
// would hold every capability, and with them reach kernel code (nf_tables,
// mounts of many filesystems) that a process without capabilities never
// does. Any system call of another ABI than the native one (a 32-bit or
// x32 one, with other numbers) fails with EPERM, so that none passes the
// filter by its number. It needs no_new_privs (dropPrivileges).
func noUserNamespaces() error {
	arch, ok := auditArch[runtime.GOARCH]
	if !ok {
		return fmt.Errorf("no seccomp filter for %s: refusing to run a command that could make a user namespace", runtime.GOARCH)
	}
	const (
		offNr, offArch, offArg0 = 0, 4, 16 // struct seccomp_data; arg0's low half on a little-endian machine
		x32Bit                  = 0x40000000
	)
	errno := func(e unix.Errno) bpf.Instruction {
		return bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(e)}
	}
	allow := bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW}
	prog, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: arch, SkipTrue: 1},
		errno(unix.EPERM),
		bpf.LoadAbsolute{Off: offNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: x32Bit, SkipFalse: 1},
		errno(unix.EPERM),
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SYS_CLONE3, SkipFalse: 1},
		errno(unix.ENOSYS),
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SYS_UNSHARE, SkipTrue: 2},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SYS_CLONE, SkipTrue: 1},
		allow,
		bpf.LoadAbsolute{Off: offArg0, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: unix.CLONE_NEWUSER, SkipFalse: 1},
		errno(unix.EPERM),
		allow,
	})
	if err != nil {
		return fmt.Errorf("seccomp filter: %w", err)
	}
	filter := make([]unix.SockFilter, len(prog))
	for i, ins := range prog {
		filter[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&fprog)), 0, 0); err != nil {
		return errors.Join(errors.New("seccomp filter"), err)
	}
	return nil
}

// auditArch is the native system call ABI of each architecture the
// filter knows, as seccomp names it.
var auditArch = map[string]uint32{"amd64": unix.AUDIT_ARCH_X86_64, "arm64": unix.AUDIT_ARCH_AARCH64}
