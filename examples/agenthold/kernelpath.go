//go:build linux

package main

import (
	"github.com/agenthold/egress/tproxy"
	"github.com/agenthold/egress/tproxy/fastpath"
)

// kernelPath loads the kernel path for passed-through connections, one
// pair per connection the gateway may hold, if the config turns it on.
// Without the kernel's support or the privilege it says why, once, and
// every connection is relayed in user space.
func (s *server) kernelPath() *fastpath.Path {
	if s.cfg.Egress.KernelPath == "off" {
		s.log.Info("kernel path off (egress.kernel_path: on turns it on): connections are relayed in user space")
		return nil
	}
	pairs := s.cfg.Egress.MaxConnections
	if pairs == 0 {
		pairs = tproxy.DefaultMaxConns
	}
	kp, err := fastpath.New(pairs)
	if err != nil {
		s.log.Warn("kernel path unavailable: connections are relayed in user space", "err", err)
		return nil
	}
	s.log.Info("kernel path on: passed-through connections move between their sockets in the kernel", "pairs", pairs)
	return kp
}
