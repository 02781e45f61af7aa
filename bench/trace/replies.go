package main

import (
	"math/rand/v2"
	"strings"

	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/workload"

	"github.com/miekg/dns"
)

// The sizes of the entries of sized names: uniform in [minSized, maxSized]
// bytes as the store keeps them.
const (
	minSized = 64
	maxSized = 4096
)

// question returns the question entry index i asks.
func question(i int) dns.Question {
	q := dns.Question{Name: workload.Name(i), Qtype: workload.Qtype(i), Qclass: dns.ClassINET}
	switch {
	case i >= sizedBase:
		q.Qtype = dns.TypeTXT
	case i >= denialBase:
		q.Qtype = dns.TypeA
	}
	return q
}

// dnssecMode is how the upstream signs and how the clients ask.
type dnssecMode struct {
	signed bool // the Zipf names' answers carry an RRSIG per RRset, for DO queries
	do     int  // percent of queries with DO
}

// replies returns what the upstream answers entry index i with (reply).
func (d dnssecMode) replies() func(i int) *dns.Msg {
	return func(i int) *dns.Msg { return reply(i, d.signed) }
}

// reply returns what the upstream answers entry index i: the workload's
// reply, signed when signed is set, an NXDOMAIN with the SOA of the name's
// zone, or a TXT answer that makes an entry of 64 B to 4 KB. TTLs are an
// hour, longer than any replay.
func reply(i int, signed bool) *dns.Msg {
	if i < denialBase {
		if signed {
			return workload.Reply(i, workload.DNSSEC)
		}
		return workload.Reply(i, workload.Plain)
	}
	q := question(i)
	m := new(dns.Msg)
	m.Response, m.RecursionDesired, m.RecursionAvailable = true, true, true
	m.Question = []dns.Question{q}
	hdr := func(name string, t uint16) dns.RR_Header {
		return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: workload.TTL}
	}
	if i < sizedBase {
		zone := q.Name[strings.IndexByte(q.Name, '.')+1:]
		m.Rcode = dns.RcodeNameError
		m.Ns = []dns.RR{&dns.SOA{Hdr: hdr(zone, dns.TypeSOA), Ns: "ns1." + zone, Mbox: "hostmaster." + zone,
			Serial: 2026010101, Refresh: 7200, Retry: 3600, Expire: 1209600, Minttl: workload.TTL}}
	} else {
		// The entry is the header, the key (the name, the type and the key
		// flags), and one plain record: the rdata length and the rdata.
		want := minSized + rand.New(rand.NewPCG(uint64(i), 7)).IntN(maxSized-minSized+1)
		rdata := max(2, want-entryHeader-(len(q.Name)+1+3)-2)
		txt := &dns.TXT{Hdr: hdr(q.Name, dns.TypeTXT)}
		for rdata > 0 {
			n := min(rdata, 256) - 1 // a string is its length byte and up to 255 bytes
			n = max(n, 1)
			txt.Txt = append(txt.Txt, strings.Repeat("x", n))
			rdata -= n + 1
		}
		m.Answer = []dns.RR{txt}
	}
	m.Extra = []dns.RR{&dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: workload.UDPSize}}}
	return m
}

// entryHeader is the bytes of an entry before its key (internal/entry).
const entryHeader = 18

// sizer returns the bytes the store keeps for an entry: built from the
// reply as the plugin's miss path builds it, for clients without DO (its
// signatures left out) unless every client sets DO.
type sizer struct {
	b    *entry.Builder
	mode dnssecMode
}

func newSizer(mode dnssecMode) *sizer { return &sizer{b: entry.NewBuilder(), mode: mode} }

func (s *sizer) size(i int) int {
	m := reply(i, s.mode.signed)
	q := m.Question[0]
	key, err := entry.KeyFor(q.Name, q.Qtype, q.Qclass, false)
	if err != nil {
		panic(err)
	}
	var flags uint16
	if m.Rcode == dns.RcodeNameError {
		flags = entry.FlagDenial
	}
	if s.mode.do == 100 {
		flags |= entry.FlagDNSSEC
	}
	e, err := s.b.Build(m, key, "", 0, workload.TTL, 0, flags, 1<<16)
	if err != nil {
		panic(err)
	}
	return len(e)
}
