package policy

import "slices"

// KnownDoHEndpoints returns well-known public DNS-over-HTTPS resolvers,
// by name and by anycast address. A sandbox that reaches one can resolve any name
// past the gateway's DNS, and tunnel data through it, so they are denied
// even under "*" and in open mode, on every port; an allow entry that
// names one exactly (the name, or the address as a single address) lets
// it in. Config's DoHEndpoints add to the list.
func KnownDoHEndpoints() []string { return slices.Clone(knownDoH) }

var knownDoH = []string{
	// Google
	"dns.google", "dns.google.com", "8.8.8.8", "8.8.4.4", "2001:4860:4860::8888", "2001:4860:4860::8844",
	// Cloudflare
	"cloudflare-dns.com", "one.one.one.one", "1dot1dot1dot1.cloudflare-dns.com", "mozilla.cloudflare-dns.com",
	"chrome.cloudflare-dns.com", "security.cloudflare-dns.com", "family.cloudflare-dns.com",
	"1.1.1.1", "1.0.0.1", "1.1.1.2", "1.0.0.2", "1.1.1.3", "1.0.0.3",
	"2606:4700:4700::1111", "2606:4700:4700::1001", "2606:4700:4700::1112", "2606:4700:4700::1002",
	// Quad9
	"dns.quad9.net", "dns9.quad9.net", "dns10.quad9.net", "dns11.quad9.net",
	"9.9.9.9", "149.112.112.112", "9.9.9.10", "9.9.9.11", "2620:fe::fe", "2620:fe::9", "2620:fe::10", "2620:fe::11",
	// OpenDNS / Cisco Umbrella
	"doh.opendns.com", "doh.familyshield.opendns.com", "208.67.222.222", "208.67.220.220", "2620:119:35::35", "2620:119:53::53",
	// AdGuard
	"dns.adguard.com", "dns.adguard-dns.com", "dns-unfiltered.adguard.com", "unfiltered.adguard-dns.com", "family.adguard-dns.com",
	"94.140.14.14", "94.140.15.15", "94.140.14.140", "94.140.14.141", "2a10:50c0::ad1:ff", "2a10:50c0::ad2:ff",
	// Others with public DoH service
	"doh.cleanbrowsing.org", "dns.nextdns.io", "doh.dns.sb", "dns.twnic.tw", "doh.mullvad.net", "dns.mullvad.net",
	"dns0.eu", "open.dns0.eu", "doh.libredns.gr", "doh.applied-privacy.net", "dns.controld.com", "freedns.controld.com",
	"doh.pub", "dns.alidns.com", "223.5.5.5", "223.6.6.6", "doh.360.cn", "dns.rabbitdns.org", "basic.rethinkdns.com",
	"sky.rethinkdns.com", "ordns.he.net", "doh.xfinity.com", "dns.brahma.world",
}
