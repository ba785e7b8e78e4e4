package mitm

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/agenthold/egress/internal/fairlru"
)

// Leaf cache defaults.
const (
	DefaultLeafTTL   = 24 * time.Hour
	DefaultLeafCache = 4096
	leafValidity     = 48 * time.Hour // beyond the cache TTL, so a cached leaf is never expired
)

// Leaves mints and caches a certificate per host, signed by a CA: each
// with a fresh random key (never derived from the CA key or the name),
// valid for that host only, kept for TTL in a bounded cache, and minted
// once when many connections for a new host arrive together. Each leaf
// belongs to the agent whose connection minted it (none, through Get);
// a full cache makes room from the agent that holds the most, its least
// recently used first, so that one agent minting leaves for name after
// name pushes out its own, not its neighbours'.
type Leaves struct {
	CA   *CA
	TTL  time.Duration // zero means DefaultLeafTTL
	Size int           // zero means DefaultLeafCache

	mu     sync.Mutex
	cache  *fairlru.Cache[string, leafEntry] // by host, made at the first store
	flight singleflight.Group
}

type leafEntry struct {
	cert    *tls.Certificate
	expires time.Time
}

// Get returns the leaf for host, minting it if needed, once however many
// ask at the same time.
func (l *Leaves) Get(host string) (*tls.Certificate, error) {
	return l.getFor("", host)
}

// getFor is Get for agent's connection: a leaf it mints is its own.
func (l *Leaves) getFor(agent, host string) (*tls.Certificate, error) {
	now := time.Now()
	if cert := l.cached(host, now); cert != nil {
		return cert, nil
	}
	v, err, _ := l.flight.Do(host, func() (any, error) {
		// A flight that ended between the check above and this one has
		// stored the leaf: look again before minting.
		if cert := l.cached(host, now); cert != nil {
			return cert, nil
		}
		cert, err := mintLeaf(l.CA, host, now)
		if err != nil {
			return nil, err
		}
		l.store(agent, host, cert, now)
		return cert, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*tls.Certificate), nil
}

// cached returns host's leaf if it is cached and valid at now.
func (l *Leaves) cached(host string, now time.Time) *tls.Certificate {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cache == nil {
		return nil
	}
	e, ok := l.cache.Get(host)
	if !ok {
		return nil
	}
	if !now.Before(e.expires) {
		l.cache.Delete(host)
		return nil
	}
	return e.cert
}

func (l *Leaves) store(owner, host string, cert *tls.Certificate, now time.Time) {
	ttl := l.TTL
	if ttl <= 0 {
		ttl = DefaultLeafTTL
	}
	size := l.Size
	if size <= 0 {
		size = DefaultLeafCache
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cache == nil {
		l.cache = fairlru.New[string, leafEntry](size)
	}
	l.cache.Put(owner, host, leafEntry{cert: cert, expires: now.Add(ttl)})
}

// Len reports how many leaves are cached.
func (l *Leaves) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cache == nil {
		return 0
	}
	return l.cache.Len()
}

// mintLeaf creates a certificate for host (a name, or an IP address)
// with a fresh key.
func mintLeaf(ca *CA, host string, now time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("mitm: leaf key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if a, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("mitm: sign leaf for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("mitm: leaf for %s: %w", host, err)
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.Cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}
