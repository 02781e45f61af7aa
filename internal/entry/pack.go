package entry

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"slices"
	"strings"
	"unsafe"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/miekg/dns"
)

// The records of the common types are packed here, straight from their
// fields into uncompressed wire form, without miekg/dns's Msg.PackBuffer: it
// measures the whole message first, packs its header and question, and is
// most of the cost of an insert that the cache can avoid. The output is
// byte for byte what miekg/dns writes (pack_test.go checks it against
// dns.PackRR); what this file does not handle itself, because of the type or
// of a value (escapes in names or strings, unsorted NSEC bitmaps, malformed
// fields), miekg/dns packs, so that its escapes, its quirks and its errors
// stay the rule.

// msgHeaderLen is the length of a DNS message's header (RFC 1035 4.1.1).
const msgHeaderLen = 12

// maxTXTLen is the longest character-string of TXT rdata (RFC 1035 3.3).
const maxTXTLen = 255

// errLeftToMiekg says that appendRdata does not pack a record: miekg/dns
// does, errors included.
var errLeftToMiekg = errors.New("packed by miekg/dns")

// errNoOwner refuses a record whose owner is "": miekg/dns packs it as no
// bytes at all, which no reader of the wire form can tell from the type.
var errNoOwner = errors.New("record without an owner name")

// packRR sets r to rr in uncompressed wire form: its owner and rdata are
// slices of b.wire, valid until the next call. An owner that is the string
// alias, a name whose wire form is the qname, is not packed: the owner is nil,
// the qname, as in entry.record. It does not write to rr, which may be shared
// (file serves its zone's records). r is filled in place for the reason
// entry.record gives.
func (b *Builder) packRR(rr dns.RR, alias string, r *Record) error {
	if rr == nil {
		return b.packOther(rr, r) // miekg/dns's error for a nil record
	}
	h := rr.Header()
	wire := b.wire[:0]
	var err error
	if h.Name != alias || alias == "" {
		if wire, err = appendTextName(wire, h.Name); err != nil {
			return err
		}
		if len(wire) == 0 {
			return errNoOwner
		}
	}
	owner := len(wire)
	wire, err = packRdata(wire, rr)
	if err == errLeftToMiekg || len(wire)-owner > math.MaxUint16 {
		return b.packOther(rr, r) // its type or values, or rdata too long for RDLENGTH, which miekg/dns reports
	}
	if err != nil {
		return err
	}
	b.keepWire(wire)
	r.Owner, r.Type, r.Class, r.TTL, r.Rdata = nil, h.Rrtype, h.Class, h.Ttl, wire[owner:]
	if owner > 0 {
		r.Owner = wire[:owner]
	}
	return nil
}

// keepWire keeps wire, b.wire appended to, when it outgrew b.wire. It is
// stored only then: see build.
func (b *Builder) keepWire(wire []byte) {
	if cap(wire) > cap(b.wire) {
		b.wire = wire[:cap(wire)]
	}
}

// packOther packs rr with miekg/dns: a message holding rr alone, packed into
// b.wire and read back. dns.PackRR would set rr's Rdlength, a write to a
// record that may be shared; Msg.PackBuffer writes nothing to a record of its
// answer section (an OPT there is not the message's OPT, whose extended RCODE
// it would set).
func (b *Builder) packOther(rr dns.RR, r *Record) error {
	b.one[0] = rr
	msg := dns.Msg{Answer: b.one[:]}
	wire, err := msg.PackBuffer(b.wire[:cap(b.wire)])
	b.one[0] = nil // the pooled builder must not keep the record alive
	if err != nil {
		return err
	}
	b.keepWire(wire)
	*r, _ = WireRecord(wire, msgHeaderLen)
	return nil
}

// appendTextName appends s, a domain name in presentation form, to b in
// uncompressed wire form, as dns.PackDomainName writes it.
func appendTextName(b []byte, s string) ([]byte, error) {
	off := len(b)
	// The wire form is one byte longer than the presentation form at most:
	// a length byte for each label's dot, the first label's and the root's.
	// One byte more lets packName take its plain path.
	b = slices.Grow(b, len(s)+2)[:off+len(s)+2]
	n, err := dnsmsg.PackName(s, b[off:])
	if err != nil {
		return b[:off], err
	}
	return b[:off+n], nil
}

// appendTextRdataName appends a name of rdata. A name putPlainName does not
// write is miekg/dns's, with the record it is in.
func appendTextRdataName(b []byte, s string) ([]byte, error) {
	off := len(b)
	b = slices.Grow(b, len(s)+1)[:off+len(s)+1]
	if n, ok := dnsmsg.PutPlainName(b[off:], s); ok {
		return b[:off+n], nil
	}
	return b[:off], errLeftToMiekg
}

// packRdata appends the rdata of rr in uncompressed wire form, as
// miekg/dns packs it with compression off, or returns errLeftToMiekg.
func packRdata(b []byte, rr dns.RR) ([]byte, error) {
	switch rr := rr.(type) {
	case *dns.A:
		return appendA(b, rr)
	case *dns.AAAA:
		return appendAAAA(b, rr)
	case *dns.CNAME:
		return appendTextRdataName(b, rr.Target)
	case *dns.NS:
		return appendTextRdataName(b, rr.Ns)
	case *dns.PTR:
		return appendTextRdataName(b, rr.Ptr)
	case *dns.DNAME:
		return appendTextRdataName(b, rr.Target)
	case *dns.MX:
		b = binary.BigEndian.AppendUint16(b, rr.Preference)
		return appendTextRdataName(b, rr.Mx)
	case *dns.SRV:
		b = binary.BigEndian.AppendUint16(b, rr.Priority)
		b = binary.BigEndian.AppendUint16(b, rr.Weight)
		b = binary.BigEndian.AppendUint16(b, rr.Port)
		return appendTextRdataName(b, rr.Target)
	case *dns.SOA:
		return appendSOA(b, rr)
	case *dns.TXT:
		return appendTXT(b, rr.Txt)
	case *dns.DS:
		b = binary.BigEndian.AppendUint16(b, rr.KeyTag)
		b = append(b, rr.Algorithm, rr.DigestType)
		return appendHex(b, rr.Digest)
	case *dns.DNSKEY:
		b = binary.BigEndian.AppendUint16(b, rr.Flags)
		b = append(b, rr.Protocol, rr.Algorithm)
		return appendBase64(b, rr.PublicKey)
	case *dns.RRSIG:
		return appendRRSIG(b, rr)
	case *dns.NSEC:
		b, err := appendTextRdataName(b, rr.NextDomain)
		if err != nil {
			return b, err
		}
		return appendTypeBitmap(b, rr.TypeBitMap)
	case *dns.OPT:
		if len(rr.Option) == 0 {
			return b, nil // no options, no rdata; their packing is miekg/dns's
		}
	}
	return b, errLeftToMiekg
}

// appendA writes an address as miekg/dns does: four bytes, of an IPv4
// address in either of net.IP's lengths, or none for an empty one.
func appendA(b []byte, rr *dns.A) ([]byte, error) {
	if len(rr.A) == 0 {
		return b, nil
	}
	if v4 := rr.A.To4(); v4 != nil {
		return append(b, v4...), nil
	}
	return b, errLeftToMiekg
}

// appendAAAA writes sixteen bytes, or none for an empty address.
func appendAAAA(b []byte, rr *dns.AAAA) ([]byte, error) {
	switch len(rr.AAAA) {
	case 0:
		return b, nil
	case 16:
		return append(b, rr.AAAA...), nil
	}
	return b, errLeftToMiekg
}

func appendSOA(b []byte, rr *dns.SOA) ([]byte, error) {
	b, err := appendTextRdataName(b, rr.Ns)
	if err != nil {
		return b, err
	}
	if b, err = appendTextRdataName(b, rr.Mbox); err != nil {
		return b, err
	}
	for _, v := range [5]uint32{rr.Serial, rr.Refresh, rr.Retry, rr.Expire, rr.Minttl} {
		b = binary.BigEndian.AppendUint32(b, v)
	}
	return b, nil
}

func appendRRSIG(b []byte, rr *dns.RRSIG) ([]byte, error) {
	b = binary.BigEndian.AppendUint16(b, rr.TypeCovered)
	b = append(b, rr.Algorithm, rr.Labels)
	b = binary.BigEndian.AppendUint32(b, rr.OrigTtl)
	b = binary.BigEndian.AppendUint32(b, rr.Expiration)
	b = binary.BigEndian.AppendUint32(b, rr.Inception)
	b = binary.BigEndian.AppendUint16(b, rr.KeyTag)
	b, err := appendTextRdataName(b, rr.SignerName)
	if err != nil {
		return b, err
	}
	return appendBase64(b, rr.Signature)
}

// appendTXT writes the character-strings of TXT rdata, each behind its
// length byte. miekg/dns writes no rdata at all for a TXT without strings.
// Strings with escapes, or too long, are left to it.
func appendTXT(b []byte, txt []string) ([]byte, error) {
	for _, s := range txt {
		if len(s) > maxTXTLen || strings.IndexByte(s, '\\') >= 0 {
			return b, errLeftToMiekg
		}
		b = append(b, byte(len(s)))
		b = append(b, s...)
	}
	return b, nil
}

// appendHex decodes s, hexadecimal, as miekg/dns does (DS digests).
func appendHex(b []byte, s string) ([]byte, error) {
	out, err := hex.AppendDecode(b, readOnlyBytes(s))
	if err != nil {
		return b, errLeftToMiekg // its error is miekg/dns's to report
	}
	return out, nil
}

// appendBase64 decodes s, standard base64, as miekg/dns does (keys and
// signatures).
func appendBase64(b []byte, s string) ([]byte, error) {
	out, err := base64.StdEncoding.AppendDecode(b, readOnlyBytes(s))
	if err != nil {
		return b, errLeftToMiekg
	}
	return out, nil
}

// readOnlyBytes returns the bytes of s without copying them, for decoders
// that only read their input: a copy would be an allocation per signature.
func readOnlyBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// appendTypeBitmap writes the type bitmap of NSEC (RFC 4034 4.1.2): for each
// window of 256 types that has any, its number, the length of its bitmap and
// the bitmap. Types out of order are miekg/dns's: it accepts some orders and
// refuses others.
func appendTypeBitmap(b []byte, types []uint16) ([]byte, error) {
	if !slices.IsSorted(types) {
		return b, errLeftToMiekg
	}
	for i := 0; i < len(types); {
		window := types[i] >> 8
		j := i + 1
		for j < len(types) && types[j]>>8 == window {
			j++
		}
		// The bitmap ends with the byte of the window's last type.
		n := int(types[j-1]&0xff)/8 + 1
		start := len(b) + 2
		b = append(b, byte(window), byte(n))
		b = append(b, make([]byte, n)...)
		for _, t := range types[i:j] {
			b[start+int(t&0xff)/8] |= 0x80 >> (t % 8)
		}
		i = j
	}
	return b, nil
}
