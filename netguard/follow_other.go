//go:build !linux

package netguard

import "context"

// start lists the host's addresses, and then again every followEvery.
func (f *follower) start() (func(context.Context), error) {
	if err := f.list(); err != nil {
		return nil, err
	}
	return f.poll, nil
}
