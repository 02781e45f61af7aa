package adminserver

import (
	"encoding/binary"
	"net/netip"
	"strings"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/miekg/dns"
)

// kinds are the kind names of the entries described, as the stock cache's
// type label names them.
var kinds = [...]string{store.KindSuccess: "success", store.KindDenial: "denial"}

// describeAll describes the entries laid end to end in held, at now (unix
// seconds), for a cache that serves entries grace seconds past their TTL;
// appended to dst.
func describeAll(held []byte, now, grace int64, dst []admin.Entry) []admin.Entry {
	for off := 0; off < len(held); {
		e := entry.Entry(held[off:])
		e = e[:e.Size()]
		off += len(e)
		dst = append(dst, Describe(e, now, grace))
	}
	return dst
}

// Describe says what e holds at now (unix seconds), for a cache that
// serves entries grace seconds past their TTL: its key, flags and age, and
// its records as a DO client would get them, with TTLs aged.
func Describe(e entry.Entry, now, grace int64) admin.Entry {
	k, qname := e.Key(), e.QName()
	at := entry.FlagsAt(k)
	flags := k[at]
	d := admin.Entry{
		Type:      dns.Type(e.QType()).String(),
		Class:     dns.Class(e.QClass()).String(),
		CD:        flags&entry.KeyCD != 0,
		NonAnswer: flags&entry.KeyOther != 0,
		NoDNSSEC:  !e.HoldsDNSSEC(),
		Rcode:     dns.RcodeToString[e.Rcode()],
		Kind:      kinds[store.KindOf(e)],
		Stored:    int64(e.Stored()),
		TTL:       int64(e.TTL()),
		Bytes:     e.Size(),
		Hits:      e.Popularity(),
	}
	d.Name, _, _ = dns.UnpackDomainName(qname, 0)
	at = entry.SuffixAt(k)
	switch {
	case flags&entry.KeyECS != 0:
		d.ECS, d.ECSMatch = subnetString(k[at], k[at+1], k[at+2:]), "scope"
		if flags&entry.KeyExact != 0 {
			d.ECSMatch = "exact"
		}
	case flags&entry.KeySourceZero != 0:
		d.ECS, d.ECSMatch = subnetString(k[at], 0, nil), "source0"
	}
	age := max(0, now-int64(e.Stored()))
	d.TTLLeft = d.TTL - age
	d.Expired = d.TTLLeft <= 0
	d.Stale = d.Expired && -d.TTLLeft < grace

	var r entry.Record
	var wire []byte
	var counts [3]int
	off := e.Records(&counts)
	for s, to := range [3]*[]string{&d.Answer, &d.Ns, &d.Extra} {
		for range counts[s] {
			off = e.Record(off, &r)
			owner := r.Owner
			if owner == nil {
				owner = qname
			}
			wire = append(wire[:0], owner...)
			wire = binary.BigEndian.AppendUint16(wire, r.Type)
			wire = binary.BigEndian.AppendUint16(wire, r.Class)
			wire = binary.BigEndian.AppendUint32(wire, entry.ReplyTTL(r.TTL, e.TTL(), uint32(min(age, int64(^uint32(0))))))
			wire = binary.BigEndian.AppendUint16(wire, uint16(len(r.Rdata)))
			wire = append(wire, r.Rdata...)
			rr, _, err := dns.UnpackRR(wire, 0)
			if err != nil {
				*to = append(*to, "; a record unreadable: "+err.Error())
				continue
			}
			*to = append(*to, strings.TrimSpace(rr.String()))
		}
	}
	return d
}

// subnetString writes the ECS subnet of a key: family, prefix length and
// the address bytes the prefix covers.
func subnetString(family, prefix byte, addr []byte) string {
	var a [16]byte
	copy(a[:], addr[:min(len(addr), dnsmsg.PrefixBytes(int(prefix)))])
	ip := netip.AddrFrom16(a)
	if uint16(family) == dnsmsg.FamilyIPv4 {
		ip = netip.AddrFrom4([4]byte(a[:4]))
	}
	return netip.PrefixFrom(ip, int(prefix)).String()
}
