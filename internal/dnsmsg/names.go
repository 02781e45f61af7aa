package dnsmsg

import (
	"bytes"
	"fmt"
	"math"
	"strings"

	"github.com/miekg/dns"
)

// MaxNameLen is the longest name in wire form (RFC 1035 2.3.4).
const MaxNameLen = 255

// maxLabelLen is the longest label (RFC 1035 2.3.4).
const maxLabelLen = 63

// EqualFoldWire reports whether two uncompressed wire names are equal,
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

// WireNameLen returns the length of the uncompressed wire name at the start
// of b, the root label included.
func WireNameLen(b []byte) int {
	off := 0
	for b[off] != 0 {
		off += int(b[off]) + 1
	}
	return off + 1
}

// PackName writes s in wire form at the start of buf and returns its length,
// as dns.PackDomainName(s, buf, 0, nil, false) does, errors included (ErrBuf
// when buf is too short). Names with escapes (\. and \DDD) and names it
// refuses are dns.PackDomainName's own, but for a decimal escape above
// \255, which it takes modulo 256 (a\256 for a\000): refused, as it would
// name another name.
func PackName(s string, buf []byte) (int, error) {
	if len(s) < len(buf) {
		if n, ok := PutPlainName(buf, s); ok {
			return n, nil
		}
	}
	if esc := escapeOver255(s); esc != "" {
		return 0, fmt.Errorf("the escape %s is above \\255", esc)
	}
	return dns.PackDomainName(s, buf, 0, nil, false)
}

// escapeOver255 returns the first decimal escape of s (\DDD) whose value
// is above 255, or "".
func escapeOver255(s string) string {
	for i := 0; i+1 < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		d := s[i+1:]
		if len(d) >= 3 && isDigit(d[0]) && isDigit(d[1]) && isDigit(d[2]) {
			if int(d[0]-'0')*100+int(d[1]-'0')*10+int(d[2]-'0') > 255 {
				return s[i : i+4]
			}
			i += 3
		} else {
			i++ // the byte it escapes
		}
	}
	return ""
}

func isDigit(b byte) bool { return '0' <= b && b <= '9' }

// PutPlainName writes s in wire form at the start of buf, which has room for
// len(s)+1 bytes, when s is a fully qualified name without escapes whose
// labels are 1 to 63 bytes long, and returns its length; it reports false
// for any other name, with buf's bytes undefined. miekg/dns does not bound
// the whole name, so neither does this.
func PutPlainName(buf []byte, s string) (int, bool) {
	switch {
	case s == ".":
		buf[0] = 0
		return 1, true
	case s == "" || s[len(s)-1] != '.':
		return 0, false
	case strings.IndexByte(s, '\\') >= 0:
		return 0, false // an escape: miekg/dns's to decode
	}
	// The wire form is s shifted by one byte, each dot turned into the
	// length of the label after it, the last one into the root label; the
	// first label's length goes in front. So one copy of the whole name,
	// then a search for each dot: both go a word or more at a time, where a
	// loop over the bytes takes a branch on each, which names of differing
	// shapes mispredict.
	buf = buf[:len(s)+1]
	copy(buf[1:], s)
	for at := 0; at < len(s); {
		l := strings.IndexByte(s[at:], '.') // s ends in a dot: l >= 0
		if l == 0 || l > maxLabelLen {
			return 0, false // an empty label, or one too long: miekg/dns's error
		}
		buf[at] = byte(l)
		at += l + 1
	}
	buf[len(s)] = 0
	return len(buf), true
}

// WireTTL reads a TTL as RFC 2181 section 8 asks: with the top bit set it
// means zero.
func WireTTL(ttl uint32) uint32 {
	if ttl > math.MaxInt32 {
		return 0
	}
	return ttl
}

// PrefixBytes is the bytes an address prefix of prefix bits takes (RFC 7871 6).
func PrefixBytes(prefix int) int { return (prefix + 7) / 8 }

// Mask zeroes the bits of addr past prefix.
func Mask(addr [16]byte, prefix int) [16]byte {
	var m [16]byte
	n := prefix / 8
	copy(m[:n], addr[:n])
	if rest := prefix % 8; rest != 0 {
		m[n] = addr[n] & ^byte(0xFF>>rest)
	}
	return m
}

// Compressible reports the types whose rdata names RFC 3597 section 4 lets
// a writer compress: those of RFC 1035 still in use. The names in SRV (RFC
// 2782), DNAME (RFC 6672) and DNSSEC rdata must stay whole.
func Compressible(t uint16) bool {
	return t == dns.TypeCNAME || t == dns.TypeNS || t == dns.TypePTR || t == dns.TypeMX || t == dns.TypeSOA
}

// RdataNames returns where the names of rd, the rdata of a record of a
// Compressible type t, lie: rd[start:ends[0]], and for SOA also
// rd[ends[0]:ends[1]]; n is their number. ok is false when rd does not
// hold them whole where its type has them (miekg/dns takes such records
// with RDLENGTH 0 off the wire). For other types n is 0 and ok true.
func RdataNames(t uint16, rd []byte) (start int, ends [2]int, n int, ok bool) {
	switch t {
	case dns.TypeCNAME, dns.TypeNS, dns.TypePTR:
		e := NameEnd(rd, 0)
		return 0, [2]int{e}, 1, e == len(rd)
	case dns.TypeMX:
		if len(rd) <= 2 {
			return 0, ends, 0, false
		}
		e := NameEnd(rd, 2)
		return 2, [2]int{e}, 1, e == len(rd)
	case dns.TypeSOA:
		mname := NameEnd(rd, 0)
		if mname < 0 {
			return 0, ends, 0, false
		}
		rname := NameEnd(rd, mname)
		return 0, [2]int{mname, rname}, 2, rname > 0 && rname+20 == len(rd)
	}
	return 0, ends, 0, true
}

// The address families of EDNS Client Subnet (RFC 7871 6), IANA's.
const (
	FamilyIPv4 = 1
	FamilyIPv6 = 2
)
