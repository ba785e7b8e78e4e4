package netguard

import (
	"net/http"
	"time"
)

// Timeouts of the transports and clients that NewTransport and NewClient
// make.
const (
	DefaultTLSHandshakeTimeout   = 10 * time.Second
	DefaultResponseHeaderTimeout = 30 * time.Second
	DefaultIdleConnTimeout       = 90 * time.Second
	DefaultClientTimeout         = 60 * time.Second
)

// NewTransport returns an http.Transport that dials only through d (nil
// means the zero Dialer): every connection, redirects included, is
// checked at connect time. It never uses an environment proxy (which
// would make the proxy, not the destination, the address checked), and
// bounds the TLS handshake, the wait for a response's head and idle
// connections. HTTP/2 is used where the server offers it.
func NewTransport(d *Dialer) *http.Transport {
	if d == nil {
		d = &Dialer{}
	}
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   DefaultTLSHandshakeTimeout,
		ResponseHeaderTimeout: DefaultResponseHeaderTimeout,
		ExpectContinueTimeout: time.Second,
		IdleConnTimeout:       DefaultIdleConnTimeout,
		MaxIdleConnsPerHost:   16,
	}
}

// NewClient returns an http.Client on NewTransport(d) whose requests, body
// included, end after DefaultClientTimeout: a client for URLs an
// untrusted party chose (webhooks, link previews, imports), which reaches
// the public internet only.
func NewClient(d *Dialer) *http.Client {
	return &http.Client{Transport: NewTransport(d), Timeout: DefaultClientTimeout}
}
