package entry

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/miekg/dns"
)

// Check reports whether b is an entry the readers of entries can walk: the
// lengths and offsets of its header, key and records, and of a variant
// list, within b; names whole where the reply writer walks them; no flag
// and no rcode a build does not write, and rdata of its type's length. The
// builder writes only such entries; Check is for entries from outside the
// process (a snapshot file), which the trusted readers must never meet
// malformed: they walk names and records without bounds checks, and
// clients would get the records as they are.
func Check(b []byte) error {
	if len(b) < MinLen {
		return errors.New("shorter than a header and a key")
	}
	if len(b) > MaxLen {
		return fmt.Errorf("%d bytes, over the %d an entry can have", len(b), MaxLen)
	}
	if size := SizeAt(b); size != len(b) {
		return fmt.Errorf("size field %d, %d bytes", size, len(b))
	}
	nameLen := int(b[offNameLen])
	if dnsmsg.NameEnd(b, offKey) != offKey+nameLen {
		return errors.New("the key does not start with a name of its length")
	}
	kl, err := checkKey(b[offKey:], nameLen)
	if err != nil {
		return err
	}
	e := Entry(b)
	body := offKey + kl
	list := b[offKey+nameLen+keyTail-1]&KeyScopes != 0
	switch f := e.Flags(); {
	case f&FlagRcodeMask == dns.RcodeFormatError:
		// Two bits hold NOERROR, SERVFAIL and NXDOMAIN, the rcodes the
		// cache stores; this one stands for none of them.
		return fmt.Errorf("rcode %d, which the cache does not store", dns.RcodeFormatError)
	case list != (f&FlagMeta != 0):
		// The readers of a variant list find it by its key and read it
		// as the flag says.
		return errors.New("a variant list's key and flag disagree")
	case f&FlagMeta != 0 && f&flagPlain != 0:
		return errors.New("a variant list flagged as plain records")
	case f&FlagMeta != 0:
		return checkList(b[body:])
	case f&flagPlain != 0:
		return checkPlain(b[body:], e.QType())
	}
	if body+countsLen > len(b) {
		return errors.New("section counts cut short")
	}
	var counts [3]int
	off := e.Records(&counts)
	for s, n := range counts {
		for range n {
			if off, err = checkRecord(b, off); err != nil {
				return fmt.Errorf("section %d: %w", s, err)
			}
		}
	}
	if off != len(b) {
		return fmt.Errorf("%d bytes past the records", len(b)-off)
	}
	return nil
}

// checkPlain checks the plain records of type qtype in body (Entry.Record
// without the trust).
func checkPlain(body []byte, qtype uint16) error {
	if n := fixedRdlen(qtype); n > 0 {
		if len(body)%n != 0 {
			return fmt.Errorf("plain records of %d bytes, not a multiple of %d", len(body), n)
		}
		return nil
	}
	for off := 0; off < len(body); {
		if off+2 > len(body) {
			return errors.New("record cut short")
		}
		end := off + 2 + int(binary.BigEndian.Uint16(body[off:]))
		if end > len(body) {
			return errors.New("rdata past the entry")
		}
		if !rdataWhole(qtype, body[off+2:end]) {
			return errBadRdata
		}
		off = end
	}
	return nil
}

// checkKey returns the length of the key at the start of k, whose name is
// nameLen bytes, after checking its suffix (keyLen without the trust).
func checkKey(k []byte, nameLen int) (int, error) {
	n := nameLen + keyTail
	if len(k) < n {
		return 0, errors.New("key cut short")
	}
	flags := k[n-1]
	if flags&^keyFlags != 0 {
		return 0, fmt.Errorf("key flags %#x, which no build writes", flags)
	}
	if flags&keyNotIN != 0 {
		if len(k) < n+2 {
			return 0, errors.New("key cut short of its class")
		}
		if binary.BigEndian.Uint16(k[n:]) == dns.ClassINET {
			return 0, errors.New("a key that names class IN, which keys leave out")
		}
		n += 2
	}
	switch {
	case flags&KeyECS != 0:
		if len(k) < n+2 {
			return 0, errors.New("ECS key cut short")
		}
		family, prefix := k[n], int(k[n+1])
		if family != dnsmsg.FamilyIPv4 && family != dnsmsg.FamilyIPv6 || family == dnsmsg.FamilyIPv4 && prefix > 32 || prefix > 128 {
			return 0, fmt.Errorf("ECS key of family %d, prefix %d", family, prefix)
		}
		n += 2 + dnsmsg.PrefixBytes(prefix)
	case flags&(KeyScopes|KeySourceZero) != 0:
		if len(k) < n+1 || k[n] != 1 && k[n] != 2 {
			return 0, errors.New("key without its family")
		}
		n++
	}
	if len(k) < n {
		return 0, errors.New("key cut short")
	}
	return n, nil
}

// checkList checks the records of a variant list (key.go's layout).
func checkList(l []byte) error {
	if len(l) < listItems {
		return errors.New("variant list cut short")
	}
	list := List(l)
	capacity, count, head := list.capacity(), list.Count(), list.head()
	if capacity == 0 || count > capacity || head >= capacity || len(l) != listItems+itemLen*capacity {
		return fmt.Errorf("variant list of capacity %d, %d variants from %d, in %d bytes", capacity, count, head, len(l))
	}
	for i := range count {
		if v := list.Item(i); v.Prefix > 128 {
			return fmt.Errorf("variant of prefix %d", v.Prefix)
		}
	}
	return nil
}

// checkRecord checks the record at off in b and returns the offset of the
// next (Entry.Record without the trust).
func checkRecord(b []byte, off int) (int, error) {
	if off >= len(b) {
		return 0, errors.New("record cut short")
	}
	flags := b[off]
	if flags&^recFlags != 0 {
		return 0, fmt.Errorf("record flags %#x, which no build writes", flags)
	}
	off++
	rtype := uint16(0)
	if flags&RecOwnerIsQname == 0 {
		end := dnsmsg.NameEnd(b, off)
		if end < 0 {
			return 0, errors.New("record owner is not a name")
		}
		off = end
	}
	fixed := 2 // RDLENGTH
	if flags&recTypeIsQtype == 0 {
		if off+2 > len(b) {
			return 0, errors.New("record cut short")
		}
		rtype = binary.BigEndian.Uint16(b[off:])
		fixed += 2
	} else {
		nameLen := int(b[offNameLen])
		rtype = binary.BigEndian.Uint16(b[offKey+nameLen:])
	}
	if flags&recClassIsQclass == 0 {
		fixed += 2
	}
	if flags&RecTTLIsEntry == 0 {
		fixed += 4
	}
	if off+fixed > len(b) {
		return 0, errors.New("record cut short")
	}
	off += fixed
	rdlen := int(binary.BigEndian.Uint16(b[off-2:]))
	if off+rdlen > len(b) {
		return 0, errors.New("rdata past the entry")
	}
	if !rdataWhole(rtype, b[off:off+rdlen]) {
		return 0, errBadRdata
	}
	return off + rdlen, nil
}
