package compactcache

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/coredns/coredns/plugin/pkg/edns"
	"github.com/miekg/dns"
)

const (
	optLen = 11 // an OPT record without options
	edeLen = 6  // an EDE option without EXTRA-TEXT
)

// replyForm says how an entry becomes a reply besides what the entry holds:
// how stored TTLs become reply TTLs, which Extended DNS Error the reply
// carries, and for a reply the cache passes on without storing it
// (Cache.passOn), what the entry format does not keep of it.
type replyForm struct {
	age   uint32 // seconds since the entry was stored; 0 with keepttl
	fixed bool   // every TTL is value, for serve-stale replies
	value uint32
	ede   uint16 // INFO-CODE of RFC 8914, 0 for none

	// A reply passed on has its whole RCODE here: an entry keeps only the
	// rcodes the cache stores, and an extended one (RFC 6891 6.1.3) has its
	// upper bits in OPT.
	passed bool
	rcode  uint16
	tc     bool // the upstream's reply was truncated
}

// Extended DNS Error codes (RFC 8914 section 4).
const (
	edeStaleAnswer   = 3
	edeCachedError   = 13
	edeStaleNXDomain = 19
)

func (v replyForm) of(recTTL, entryTTL uint32) uint32 {
	if v.fixed {
		return v.value
	}
	return entry.ReplyTTL(recTTL, entryTTL, v.age)
}

// replyBuffers are the buffers replies are written in, kept from one reply
// to the next so that they stay grown; they are pooled with the scratch.
type replyBuffers struct {
	msg   []byte
	marks []mark
	w     replyWriter

	order  []int    // records in the order written, when rotated (rotation)
	groups [4][]int // rotation's CNAME, other, address and MX records
}

// replyWriter writes the records of one reply, compressing their names
// against what it wrote before (dnsmsg.Compressor).
type replyWriter struct{ dnsmsg.Compressor }

// mark records where a record starts, for cutting replies at RRset bounds.
type mark struct {
	off     int
	section int
	setHead bool // first record of an RRset
}

func newReplyBuffers() replyBuffers {
	return replyBuffers{msg: make([]byte, 0, dnsmsg.TypicalLen), marks: make([]mark, 0, 64)}
}

// appendReply writes the reply to q from e: header, the question as the
// client wrote it, the records with their TTLs aged by tv, DNSSEC records
// only for DO clients or when asked for, OPT when the request had one, all
// cut to the client's limit. The returned bytes are valid until the next
// reply written in b.
func (b *replyBuffers) appendReply(q *query, e entry.Entry, tv replyForm) []byte {
	// Written in local variables, stored back once: see replyWriter.
	msg, marks := b.msg[:0], b.marks[:0]
	w := &b.w
	w.Reset()

	ef := e.Flags()
	rcode := e.Rcode()
	if tv.passed {
		rcode = int(tv.rcode)
	}
	if ef&entry.FlagNXName != 0 && !q.do {
		rcode = dns.RcodeNameError // RFC 9824 section 5: see reply.CompactNXDomain
	}
	if rcode > 0xF && !q.edns {
		// An extended RCODE needs OPT, which this client cannot read: say
		// SERVFAIL, as a server would.
		rcode = dns.RcodeServerFailure
	}
	flags := uint16(dnsmsg.QR) | uint16(q.opcode&0xF)<<11 | uint16(rcode&0xF)
	if ef&entry.FlagAA != 0 {
		flags |= dnsmsg.AA
	}
	if ef&entry.FlagRA != 0 {
		flags |= dnsmsg.RA
	}
	// RFC 6840 5.7-5.8: AD only for clients that asked with AD or DO.
	if ef&entry.FlagAD != 0 && (q.ad || q.do) {
		flags |= dnsmsg.AD
	}
	if q.rd {
		flags |= dnsmsg.RD
	}
	if q.cd {
		flags |= dnsmsg.CD
	}
	if tv.tc {
		flags |= dnsmsg.TC
	}
	msg = binary.BigEndian.AppendUint16(msg, q.id)
	msg = binary.BigEndian.AppendUint16(msg, flags)
	msg = append(msg, 0, 1, 0, 0, 0, 0, 0, 0) // counts, patched below
	msg = append(msg, q.name...)
	msg = binary.BigEndian.AppendUint16(msg, q.qtype)
	msg = binary.BigEndian.AppendUint16(msg, q.qclass)

	var counts [3]int
	var stored [3]int
	off := e.Records(&stored)
	rotate := q.rotate && rcode == dns.RcodeSuccess
	if e.Plain() && !dnsmsg.Compressible(e.QType()) && stored[0] > 0 {
		// The reply's only records, one RRset: cut, which runs only when
		// the reply is over the limit, drops it whole, so one mark does
		// (cut counts the records it keeps by their marks). A plain entry
		// has nothing after the answer, so off is not carried past it.
		marks = append(marks, mark{off: len(msg), section: 0, setHead: true})
		msg = b.appendPlain(msg, e, off, stored[0], rotate, tv.of(e.TTL(), e.TTL()))
		counts[0] = stored[0]
		stored[0] = 0
	}
	for s := range counts {
		var prevType uint16
		var prevOwner []byte
		n := stored[s]
		var order []int
		if rotate && n > 1 {
			order, off = b.rotation(e, off, n)
		}
		for i := range n {
			var r entry.Record
			if order != nil {
				e.Record(order[i], &r)
			} else {
				off = e.Record(off, &r)
			}
			if r.Flags&entry.RecDNSSEC != 0 && !q.do && !entry.AskedFor(r.Type, s, q.qtype) {
				continue
			}
			head := counts[s] == 0 || r.Type != prevType || !dnsmsg.EqualFoldWire(r.Owner, prevOwner)
			marks = append(marks, mark{off: len(msg), section: s, setHead: head})
			msg = w.appendRecord(msg, &r, tv.of(r.TTL, e.TTL()))
			counts[s]++
			prevType, prevOwner = r.Type, r.Owner
		}
	}

	limit := q.limit
	if q.edns {
		limit -= optLen + len(q.opts)
		if tv.ede != 0 {
			limit -= edeLen
		}
		if q.ecs.own {
			limit -= 8 + dnsmsg.PrefixBytes(int(q.ecs.source))
		}
	}
	if len(msg) > limit {
		msg = cut(msg, marks, limit, &counts)
	}
	if q.edns {
		scope := e.Scope()
		if e.Exact() && q.ecs.source == q.ecs.sent {
			scope = uint8(familyBits(q.ecs.family)) // longer than the source: RFC 7871 7.3.1
		}
		msg = appendOPT(msg, q, uint8(rcode>>4), tv.ede, scope)
		counts[2]++
	}
	binary.BigEndian.PutUint16(msg[6:], uint16(counts[0]))
	binary.BigEndian.PutUint16(msg[8:], uint16(counts[1]))
	binary.BigEndian.PutUint16(msg[10:], uint16(counts[2]))
	b.msg, b.marks = msg, marks
	return msg
}

// appendPlain writes the n plain records of e, from off on, whose names are
// not compressed: each the question's name as a pointer, its type and class,
// TTL ttl and its rdata as stored; in rotation's order when rotate is set.
// It is the loop of appendReply without what other records need.
func (b *replyBuffers) appendPlain(msg []byte, e entry.Entry, off, n int, rotate bool, ttl uint32) []byte {
	qtype := e.QType()
	var head [10]byte // all but RDLENGTH
	head[0], head[1] = qnamePointer[0], qnamePointer[1]
	binary.BigEndian.PutUint16(head[2:], qtype)
	binary.BigEndian.PutUint16(head[4:], e.QClass())
	binary.BigEndian.PutUint32(head[6:], ttl)
	var order []int
	if rotate && n > 1 {
		order, _ = b.rotation(e, off, n)
	}
	var rdata []byte
	for i := range n {
		if order != nil {
			rdata, _ = e.PlainRdata(order[i], qtype)
		} else {
			rdata, off = e.PlainRdata(off, qtype)
		}
		msg = append(msg, head[:]...)
		msg = binary.BigEndian.AppendUint16(msg, uint16(len(rdata)))
		msg = append(msg, rdata...)
	}
	return msg
}

// rotation returns the offsets of the n records of a section of e, which
// starts at off, in the order the loadbalance plugin's round_robin policy
// gives them (its randomShuffle): CNAME records first, then those of other
// types, then the address records in a random order, then the MX records
// in a random order; and the offset past the section. The records are
// written in that order, so that MX and the other records that compress
// names point at what precedes them in the reply, as when loadbalance
// reorders a *dns.Msg before it is packed.
func (b *replyBuffers) rotation(e entry.Entry, off, n int) ([]int, int) {
	cname, rest, addr, mx := b.groups[0][:0], b.groups[1][:0], b.groups[2][:0], b.groups[3][:0]
	var r entry.Record
	for range n {
		at := off
		off = e.Record(off, &r)
		switch r.Type {
		case dns.TypeCNAME:
			cname = append(cname, at)
		case dns.TypeA, dns.TypeAAAA:
			addr = append(addr, at)
		case dns.TypeMX:
			mx = append(mx, at)
		default:
			rest = append(rest, at)
		}
	}
	shuffle(addr)
	shuffle(mx)
	order := append(append(append(append(b.order[:0], cname...), rest...), addr...), mx...)
	b.groups = [4][]int{cname, rest, addr, mx}
	b.order = order
	return order, off
}

// shuffle puts offs in a random order, as loadbalance's roundRobinShuffle
// does (Fisher-Yates), from the runtime's per-thread generator, which takes
// no lock.
func shuffle(offs []int) {
	for j := range len(offs) - 1 {
		p := j + int(rand.Uint32()%uint32(len(offs)-j))
		offs[j], offs[p] = offs[p], offs[j]
	}
}

func (w *replyWriter) appendRecord(msg []byte, r *entry.Record, ttl uint32) []byte {
	msg = w.appendOwner(msg, r.Owner)
	msg = binary.BigEndian.AppendUint16(msg, r.Type)
	msg = binary.BigEndian.AppendUint16(msg, r.Class)
	msg = binary.BigEndian.AppendUint32(msg, ttl)
	rdlen := len(msg)
	msg = append(msg, 0, 0)
	msg = w.appendRdata(msg, r.Type, r.Rdata)
	binary.BigEndian.PutUint16(msg[rdlen:], uint16(len(msg)-rdlen-2))
	return msg
}

// appendRdata writes rd, the rdata of a record of type t, compressing the
// names of the types that allow it (dnsmsg.Compressible). The entry's rdata
// holds them whole: checked when it was built.
func (w *replyWriter) appendRdata(msg []byte, t uint16, rd []byte) []byte {
	if !dnsmsg.Compressible(t) {
		return append(msg, rd...)
	}
	start, ends, n, _ := dnsmsg.RdataNames(t, rd)
	msg = append(msg, rd[:start]...)
	for _, end := range ends[:n] {
		msg = w.AppendName(msg, rd[start:end])
		start = end
	}
	return append(msg, rd[start:]...)
}

// appendOPT writes the OPT record the stock cache's replies get from
// CoreDNS's request.SizeAndDo: the client's UDP size and DO bit, version 0;
// with an Extended DNS Error option when ede is not 0, and the client's ECS
// option with the scope the answer was stored for.
func appendOPT(msg []byte, q *query, rcodeHigh uint8, ede uint16, scope uint8) []byte {
	ttl := uint32(rcodeHigh) << 24 // extended RCODE, version 0, flags
	if q.do {
		ttl |= 1 << 15
	}
	msg = append(msg, 0) // root owner
	msg = binary.BigEndian.AppendUint16(msg, dns.TypeOPT)
	msg = binary.BigEndian.AppendUint16(msg, q.udpSize)
	msg = binary.BigEndian.AppendUint32(msg, ttl)
	rdlen := len(msg)
	msg = append(msg, 0, 0)
	msg = append(msg, q.opts...)
	if ede != 0 {
		msg = binary.BigEndian.AppendUint16(msg, dns.EDNS0EDE)
		msg = binary.BigEndian.AppendUint16(msg, 2) // INFO-CODE, no EXTRA-TEXT
		msg = binary.BigEndian.AppendUint16(msg, ede)
	}
	if q.ecs.own {
		msg = appendSubnet(msg, &q.ecs, scope)
	}
	binary.BigEndian.PutUint16(msg[rdlen:], uint16(len(msg)-rdlen-2))
	return msg
}

// echoed returns the options of o that CoreDNS echoes into replies: those
// plugins register with edns.SetSupportedOption (request.SizeAndDo copies
// them for the stock cache). ECS is answered apart.
func echoed(o *dns.OPT) []dns.EDNS0 {
	var opts []dns.EDNS0
	for _, opt := range o.Option {
		if code := opt.Option(); code != dns.EDNS0SUBNET && edns.SupportedOption(code) {
			opts = append(opts, opt)
		}
	}
	return opts
}

// appendEchoed appends to dst the options echoed of o, in wire form. Most
// requests have none, and then it allocates nothing.
func appendEchoed(dst []byte, o *dns.OPT) []byte {
	opts := echoed(o)
	if len(opts) == 0 {
		return dst
	}
	// miekg/dns packs options only as part of an OPT record: pack one in
	// dst's spare room (the scratch keeps it for later requests) and keep
	// its rdata, after the root owner, type, class, TTL and rdlength.
	opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}, Option: opts}
	start := len(dst)
	for room := dnsmsg.TypicalLen; room <= dns.MaxMsgSize; room *= 4 {
		dst = slices.Grow(dst, room)[:start+room]
		if n, err := dns.PackRR(opt, dst, start, nil, false); err == nil {
			return append(dst[:start], dst[start+optLen:n]...)
		}
	}
	return dst[:start]
}

// cut shortens the reply msg, whose records start at marks, to limit bytes:
// it drops whole RRsets from the end of the additional section, which costs
// the client nothing it asked for, and then from the other sections,
// setting TC (RFC 2181 9) so the client retries over TCP. The header and
// question always fit: a wire name is at most 255 bytes and the smallest
// limit is 512.
func cut(msg []byte, marks []mark, limit int, counts *[3]int) []byte {
	n := len(marks) // records kept
	for n > 0 && end(msg, marks, n) > limit {
		n--
		for n > 0 && !marks[n].setHead {
			n--
		}
	}
	*counts = [3]int{}
	for _, m := range marks[:n] {
		counts[m.section]++
	}
	if n < len(marks) && marks[n].section < 2 {
		msg[2] |= dnsmsg.TC >> 8
	}
	return msg[:end(msg, marks, n)]
}

// end returns where msg ends when it keeps the first n of the records that
// start at marks.
func end(msg []byte, marks []mark, n int) int {
	if n == len(marks) {
		return len(msg)
	}
	return marks[n].off
}
