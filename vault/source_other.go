//go:build !unix

package vault

import (
	"io/fs"
	"os/exec"
)

func ownProcessGroup(*exec.Cmd) {}

func inode(fs.FileInfo) int64 { return 0 }

func trustedFile(string) error { return nil }
