package dnsfilter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/miekg/dns"

	"github.com/agenthold/egress/internal/hostname"
)

// upstreamUDPSize is the EDNS0 buffer size advertised to upstreams (the
// DNS flag day 2020 value, which avoids IP fragmentation).
const upstreamUDPSize = 1232

// SystemUpstreams returns the name servers of /etc/resolv.conf as
// "host:port".
func SystemUpstreams() ([]string, error) {
	return UpstreamsFromFile("/etc/resolv.conf")
}

// UpstreamsFromFile returns the name servers of a resolv.conf file as
// "host:port".
func UpstreamsFromFile(path string) ([]string, error) {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("dnsfilter: read %s: %w", path, err)
	}
	var out []string
	for _, s := range cc.Servers {
		out = append(out, net.JoinHostPort(s, cc.Port))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("dnsfilter: %s names no server", path)
	}
	return out, nil
}

// upstreamQuery builds the question sent upstream: a fresh ID, the
// client's question, and of its EDNS0 only the DNSSEC OK bit (which the
// cache keys by). The rest is the gateway's own, whoever asked first:
// recursion desired, checking not disabled, EDNS0 with the gateway's
// buffer size. The answer is shared by every agent asking the same
// question and cached for them, so no agent's flags may choose it (a
// non-recursive question would get another agent "no data"; one with
// checking disabled, answers that failed validation). Other options
// (cookies, padding, client subnet, anything unknown) stay at the
// gateway, so they cannot carry data out.
func upstreamQuery(q dns.Question, do bool) *dns.Msg {
	m := new(dns.Msg)
	m.Id = dns.Id()
	m.RecursionDesired = true
	m.Question = []dns.Question{q}
	m.SetEdns0(upstreamUDPSize, do)
	return m
}

// exchange asks the upstreams in turn until one answers, over UDP and, when
// the answer is truncated, again over TCP. It checks that the answer is
// for the question asked (miekg/dns already checks the ID).
func exchange(ctx context.Context, upstreams []string, m *dns.Msg, timeout time.Duration) (*dns.Msg, error) {
	if len(upstreams) == 0 {
		return nil, errors.New("no upstream resolver")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var errs []error
	for _, up := range upstreams {
		resp, err := exchangeOne(ctx, up, m)
		if err == nil {
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", up, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

func exchangeOne(ctx context.Context, upstream string, m *dns.Msg) (*dns.Msg, error) {
	c := dns.Client{Net: "udp", UDPSize: upstreamUDPSize}
	resp, _, err := c.ExchangeContext(ctx, m, upstream)
	if err == nil && resp.Truncated {
		c.Net = "tcp"
		resp, _, err = c.ExchangeContext(ctx, m, upstream)
	}
	if err != nil {
		return nil, err
	}
	if len(resp.Question) != 1 || !sameQuestion(resp.Question[0], m.Question[0]) {
		return nil, errors.New("answer is for another question")
	}
	return resp, nil
}

func sameQuestion(a, b dns.Question) bool {
	return a.Qtype == b.Qtype && a.Qclass == b.Qclass && hostname.Same(a.Name, b.Name)
}
