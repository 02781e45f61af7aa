package entry

import "bytes"

// equalFoldWire reports whether two uncompressed wire names are equal,
// ignoring ASCII case as DNS does (RFC 4343).
func EqualFoldWire(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	if bytes.Equal(a, b) {
		return true // most names come in one case: compared at memory speed
	}
	for i := range a {
		if lower(a[i]) != lower(b[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if isUpper(c) {
		return c + toLower
	}
	return c
}

const toLower = 'a' - 'A'

func isUpper(c byte) bool { return 'A' <= c && c <= 'Z' }

// LowerInPlace lowers the ASCII capitals of b. Most names have none: it
// writes only where one is, half the time of building a lowered copy a
// byte at a time.
func LowerInPlace(b []byte) {
	for i, c := range b {
		if isUpper(c) {
			b[i] = c + toLower
		}
	}
}

// NameEnd returns the offset past the uncompressed wire name at off in b, or
// -1 when b does not hold one there: a label past 63 bytes (a compression
// pointer or a reserved label type), a name past 255 bytes, or no root label
// before b ends. It reads names from outside the cache (requests, rdata);
// WireNameLen reads those of entries, which were checked when built.
func NameEnd(b []byte, off int) int {
	for start := off; off < len(b) && off-start < MaxNameLen; {
		l := int(b[off])
		switch {
		case l == 0:
			return off + 1
		case l > 63:
			return -1
		}
		off += l + 1
	}
	return -1
}
