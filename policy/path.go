package policy

import (
	"slices"
	"strings"
	"unicode/utf8"
)

// Reasons a request path is refused before any rule is consulted: it does
// not normalise to one path every server would read alike.
const (
	ReasonPathNotOrigin     = "the request path does not start with /"
	ReasonPathInvalidEscape = "the request path has an invalid percent-escape"
	ReasonPathControl       = "the request path holds a NUL or another control character"
	ReasonPathBackslash     = "the request path holds a backslash, which some servers read as a slash"
	ReasonPathFragment      = "the request path holds a fragment (#)"
	ReasonPathDotSegment    = "the request path has a . or .. segment, which servers resolve differently"
	ReasonPathNotUTF8       = "the request path decodes to invalid UTF-8"
	ReasonPathTooDeep       = "the request path has more segments than a request rule judges"
	ReasonPathEncodedDots   = "the request path hides an empty, . or .. segment behind an encoded slash"
)

// MaxPathSegments bounds the segments of a path that request rules judge;
// a deeper path is refused, so that "**" patterns stay cheap whatever an
// agent sends.
const MaxPathSegments = 128

// appendPath appends to dst the segments of a request path (as sent,
// escaped; a query is ignored) as a server reads them, and returns them,
// or the reason the path does not normalise cleanly:
//
//   - a "." or ".." segment, as written or encoded ("%2e%2e"), or with
//     parameters ("..;"), is refused: the path is forwarded as it came,
//     and servers resolve these differently (Tomcat reads "..;" as "..",
//     others as a name; RFC 3986 readers keep the empty segment that
//     "//.." pops, others drop it), so no one reading of them is safe;
//   - a ";" starts a segment's parameters, which are dropped ("/a;x=1/b"
//     is /a/b, as Tomcat reads it; a deny entry's match is the broader);
//   - percent-escapes are decoded, an encoded slash ("%2F") included,
//     which stays inside its segment: it never separates two (and a
//     segment whose encoded slashes hide an empty, "." or ".." part, as
//     "..%2Fadmin" does, is refused);
//   - empty segments (repeated slashes, a trailing slash) are dropped;
//   - case is kept: paths are case-sensitive;
//   - a NUL or other control character, a backslash (encoded or not), a
//     "#", an invalid escape or a segment that decodes to invalid UTF-8
//     is refused.
//
// A path that needs no decoding allocates nothing beyond dst's growth.
func appendPath(dst []string, path string) ([]string, string) {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	if path == "" || path[0] != '/' {
		return dst, ReasonPathNotOrigin
	}
	base := len(dst)
	for rest := path[1:]; ; {
		seg, next, more := strings.Cut(rest, "/")
		rest = next
		if i := strings.IndexByte(seg, ';'); i >= 0 {
			seg = seg[:i]
		}
		seg, why := decodeSegment(seg)
		if why != "" {
			return dst, why
		}
		switch seg {
		case "":
		case ".", "..":
			return dst, ReasonPathDotSegment
		default:
			if len(dst)-base == MaxPathSegments {
				return dst, ReasonPathTooDeep
			}
			dst = append(dst, seg)
		}
		if !more {
			return dst, ""
		}
	}
}

// decodeSegment decodes one segment's percent-escapes, refusing what a
// server could read two ways.
func decodeSegment(seg string) (string, string) {
	escaped := false
	for i := 0; i < len(seg); i++ {
		switch c := seg[i]; {
		case c == '%':
			if i+2 >= len(seg) || !isHex(seg[i+1]) || !isHex(seg[i+2]) {
				return "", ReasonPathInvalidEscape
			}
			escaped = true
			i += 2
		case c < 0x20 || c == 0x7f:
			return "", ReasonPathControl
		case c == '\\':
			return "", ReasonPathBackslash
		case c == '#':
			return "", ReasonPathFragment
		}
	}
	if !escaped {
		if !utf8.ValidString(seg) {
			return "", ReasonPathNotUTF8
		}
		return seg, ""
	}
	var b strings.Builder
	b.Grow(len(seg))
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if c == '%' {
			c = unhex(seg[i+1])<<4 | unhex(seg[i+2])
			i += 2
			switch {
			case c < 0x20 || c == 0x7f:
				return "", ReasonPathControl
			case c == '\\':
				return "", ReasonPathBackslash
			}
		}
		b.WriteByte(c)
	}
	out := b.String()
	if !utf8.ValidString(out) {
		return "", ReasonPathNotUTF8
	}
	if strings.Contains(out, "/") {
		for part := range strings.SplitSeq(out, "/") {
			if part == "" || part == "." || part == ".." {
				return "", ReasonPathEncodedDots
			}
		}
	}
	return out, ""
}

// splitEncodedSlashes returns segs with each segment that holds a decoded
// slash split at it: the path as a server that decodes "%2F" reads it.
// It returns segs itself when no segment holds one.
func splitEncodedSlashes(segs []string) []string {
	i := slices.IndexFunc(segs, func(s string) bool { return strings.Contains(s, "/") })
	if i < 0 {
		return segs
	}
	out := slices.Clone(segs[:i])
	for _, s := range segs[i:] {
		out = append(out, strings.Split(s, "/")...)
	}
	return out
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}
