package dnsfilter

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/policy"
)

// FuzzServeDNS feeds arbitrary packets through the same admission and
// parsing as the server, then the handler. It must never panic, always
// answer an admitted query, and never forward a name the policy denies.
func FuzzServeDNS(f *testing.F) {
	for _, q := range []struct {
		name  string
		qtype uint16
	}{{"a.test.", dns.TypeA}, {"evil.test.", dns.TypeTXT}, {"A.TEST.", dns.TypeAAAA}, {"cname.test.", dns.TypeA}, {".", dns.TypeNS}} {
		m := new(dns.Msg)
		m.SetQuestion(q.name, q.qtype)
		m.SetEdns0(1232, true)
		b, _ := m.Pack()
		f.Add(b)
	}
	f.Add([]byte{0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xc0, 0x0c, 0x00, 0x01, 0x00, 0x01})

	up := startUpstream(f)
	pol, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"a.test", "cname.test"}})
	require.NoError(f, err)
	srv := &Server{
		Agents:    func(netip.Addr) (string, *policy.Policy, bool) { return "fuzz", pol, true },
		Upstreams: []string{up.addr},
		Timeout:   200 * time.Millisecond,
		CacheSize: -1,
	}
	f.Fuzz(func(t *testing.T, packet []byte) {
		if len(packet) < 12 {
			return
		}
		var h dns.Header
		msg := new(dns.Msg)
		if err := msg.Unpack(packet); err != nil {
			return // the server answers these FORMERR before the handler
		}
		h.Bits = uint16(packet[2])<<8 | uint16(packet[3])
		h.Qdcount = uint16(len(msg.Question))
		h.Ancount = uint16(len(msg.Answer))
		h.Nscount = uint16(len(msg.Ns))
		h.Arcount = uint16(len(msg.Extra))
		if acceptQuery(h) != dns.MsgAccept {
			return
		}
		before := up.total()
		w := &testWriter{remote: &net.UDPAddr{IP: net.ParseIP("127.0.0.1"), Port: 5353}}
		srv.ServeDNS(w, msg)
		require.NotNil(t, w.msg, "no reply")
		_, err := w.msg.Pack()
		require.NoError(t, err, "reply does not pack")
		name := strings.ToLower(strings.TrimSuffix(msg.Question[0].Name, "."))
		if name != "a.test" && name != "cname.test" {
			require.Equal(t, before, up.total(), "denied name %q reached upstream", msg.Question[0].Name)
		}
	})
}
