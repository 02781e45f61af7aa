package entry

import (
	"encoding/binary"
	"testing"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/workload"
	"github.com/miekg/dns"
)

// builtEntries returns entries the builder made of the workload's variants,
// each a copy of its own.
func builtEntries(tb testing.TB, n int) []Entry {
	tb.Helper()
	b := NewBuilder()
	var out []Entry
	for _, v := range []workload.Variant{workload.Plain, workload.CNAME | workload.DNSSEC, workload.ECS} {
		for i := range n {
			m := workload.Reply(i, v)
			key, err := KeyFor(m.Question[0].Name, m.Question[0].Qtype, m.Question[0].Qclass, false)
			if err != nil {
				tb.Fatal(err)
			}
			e, err := b.Build(m, key, m.Question[0].Name, 1, 300, 0, FlagDNSSEC, maxRecordBytes) // the signatures too
			if err != nil {
				tb.Fatal(err)
			}
			out = append(out, append(Entry(nil), e...))
		}
	}
	return out
}

// walk reads e as the trusted readers do: every record, and the names of
// the rdata the reply writer compresses.
func walk(e Entry) {
	e.QClass()
	e.Scope()
	switch flags := e[offKey+e.nameLen()+keyTail-1]; {
	case flags&KeyECS != 0:
		VariantOf(e)
	case flags&KeyScopes != 0: // as the cache finds a list: by its key
		l := e.List()
		l.Bits()
		for i := range l.Count() {
			l.Item(i)
		}
	}
	var r Record
	var counts [3]int
	off := e.Records(&counts)
	for _, n := range counts {
		for range n {
			off = e.Record(off, &r)
			switch r.Type {
			case dns.TypeCNAME, dns.TypeNS, dns.TypePTR:
				dnsmsg.WireNameLen(r.Rdata)
			case dns.TypeMX:
				dnsmsg.WireNameLen(r.Rdata[2:])
			case dns.TypeSOA:
				n := dnsmsg.WireNameLen(r.Rdata)
				dnsmsg.WireNameLen(r.Rdata[n:])
			}
		}
	}
}

func TestCheckTakesBuiltEntries(t *testing.T) {
	for _, e := range builtEntries(t, 200) {
		if err := Check(e); err != nil {
			t.Fatalf("a built entry fails the check: %v", err)
		}
	}
	// An A without an address, as miekg/dns unpacks an upstream's of no
	// rdata and packs it again.
	m := new(dns.Msg)
	m.SetQuestion("a.example.", dns.TypeA)
	m.Response = true
	m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: "a.example.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}}}
	built(t, m)
}

func TestCheckRefusesDamage(t *testing.T) {
	built := builtEntries(t, 2)
	counted := built[2] // CNAME and DNSSEC records
	plainTXT, plainA := built[0], built[1]
	if counted.Flags()&flagPlain != 0 || plainA.QType() != dns.TypeA || plainTXT.QType() != dns.TypeTXT {
		t.Fatalf("the workload's first entries are not a plain A, a plain TXT and a counted entry")
	}
	list, chaos := listEntry(t), chaosEntry(t)
	for _, tc := range []struct {
		name   string
		good   Entry
		damage func(Entry) Entry
	}{
		{"list key on plain records", list, func(e Entry) Entry {
			binary.LittleEndian.PutUint16(e[offFlags:], e.Flags()&^FlagMeta|flagPlain)
			e = e[:e.body()] // no records: a plain entry of none
			putSize(e)
			return e
		}},
		{"class IN named", chaos, func(e Entry) Entry { e[offKey+e.nameLen()+keyTail+1] = 1; return e }},
		{"cut", counted, func(e Entry) Entry { e = e[:len(e)-3]; putSize(e); return e }},
		{"size field", counted, func(e Entry) Entry { setSize(e, len(e)+1); return e }},
		{"name length", counted, func(e Entry) Entry { e[offNameLen]++; return e }},
		{"record count", counted, func(e Entry) Entry { e[e.body()]++; return e }},
		{"counts cut", counted, func(e Entry) Entry { e = e[:e.body()+countsLen-1]; putSize(e); return e }},
		{"label past the name", counted, func(e Entry) Entry { e[offKey] = 63; return e }},
		{"header only", counted, func(e Entry) Entry { e = e[:headerLen]; putSize(e); return e }},
		{"class cut", counted, func(e Entry) Entry { e[offKey+e.nameLen()+keyTail-1] |= keyNotIN; return e }},
		{"plain A cut", plainA, func(e Entry) Entry { e = e[:len(e)-1]; putSize(e); return e }},
		{"plain TXT cut", plainTXT, func(e Entry) Entry { e = e[:len(e)-1]; putSize(e); return e }},
		{"plain TXT length", plainTXT, func(e Entry) Entry { e[e.body()+1]++; return e }},
		{"plain list", plainA, func(e Entry) Entry { e[offFlags+1] |= FlagMeta >> 8; return e }},
		{"rcode not cached", counted, func(e Entry) Entry { e[offFlags] = e[offFlags]&^FlagRcodeMask | dns.RcodeFormatError; return e }},
		{"key flag", counted, func(e Entry) Entry { e[offKey+e.nameLen()+keyTail-1] |= 1 << 7; return e }},
		{"record flag", counted, func(e Entry) Entry { e[e.body()+countsLen] |= 1 << 7; return e }},
		{"A of 3 bytes", rdataOf(t, dns.TypeA, "010203"), retype(dns.TypeA)},
		{"AAAA of 4 bytes", rdataOf(t, dns.TypeAAAA, "c0000201"), retype(dns.TypeAAAA)},
		{"plain EUI48 of 5 bytes", plainOf(t, "0102030405"), func(e Entry) Entry {
			binary.BigEndian.PutUint16(e[offKey+e.nameLen():], dns.TypeEUI48)
			return e
		}},
	} {
		e := tc.damage(append(Entry(nil), tc.good...))
		if err := Check(e); err == nil {
			t.Errorf("%s: the check passes a damaged entry", tc.name)
		}
	}
}

// unknownType is the type rdataOf and plainOf build records of, retyped
// by the damage: the builder refuses rdata of another type's form.
const unknownType = 65280

// rdataOf returns an entry of a question of MX whose additional section
// holds a record of unknownType with rdata hex, to be retyped as t.
func rdataOf(t *testing.T, rtype uint16, hex string) Entry {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("a.example.", dns.TypeMX)
	m.Response = true
	m.Answer = []dns.RR{&dns.MX{Hdr: dns.RR_Header{Name: "a.example.", Rrtype: dns.TypeMX, Class: dns.ClassINET, Ttl: 300}, Preference: 1, Mx: "b.example."}}
	m.Extra = []dns.RR{&dns.RFC3597{Hdr: dns.RR_Header{Name: "b.example.", Rrtype: unknownType, Class: dns.ClassINET, Ttl: 300}, Rdata: hex}}
	return built(t, m)
}

// plainOf returns a plain entry of a question of unknownType whose record
// has rdata hex.
func plainOf(t *testing.T, hex string) Entry {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("a.example.", unknownType)
	m.Response = true
	m.Answer = []dns.RR{&dns.RFC3597{Hdr: dns.RR_Header{Name: "a.example.", Rrtype: unknownType, Class: dns.ClassINET, Ttl: 300}, Rdata: hex}}
	e := built(t, m)
	if !e.Plain() {
		t.Fatal("not a plain entry")
	}
	return e
}

// built returns the entry the builder makes of m, checked.
func built(t *testing.T, m *dns.Msg) Entry {
	t.Helper()
	key, err := KeyFor(m.Question[0].Name, m.Question[0].Qtype, dns.ClassINET, false)
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewBuilder().Build(m, key, m.Question[0].Name, 1, 300, 0, 0, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(e); err != nil {
		t.Fatal(err)
	}
	return append(Entry(nil), e...)
}

// retype gives the records of unknownType of an entry rdataOf made the
// type t.
func retype(t uint16) func(Entry) Entry {
	return func(e Entry) Entry {
		var counts [3]int
		var r Record
		for off := e.Records(&counts); off < len(e); {
			at := off
			off = e.Record(off, &r)
			if r.Type == unknownType {
				typeAt := at + 1 + len(r.Owner)
				binary.BigEndian.PutUint16(e[typeAt:], t)
			}
		}
		return e
	}
}

// listEntry returns the variant list of a name, as ListVariant makes it.
func listEntry(t *testing.T) Entry {
	t.Helper()
	base, err := KeyFor("l.example.", dns.TypeA, dns.ClassINET, false)
	if err != nil {
		t.Fatal(err)
	}
	l, _ := ListVariant(NewBuilder(), nil, base, dnsmsg.FamilyIPv4, Variant{Prefix: 24, Addr: [16]byte{192, 0, 2}}, 8, 1, 300)
	if err := Check(l); err != nil {
		t.Fatal(err)
	}
	return append(Entry(nil), l...)
}

// chaosEntry returns an entry of a question of class CH.
func chaosEntry(t *testing.T) Entry {
	t.Helper()
	key, err := KeyFor("version.bind.", dns.TypeTXT, dns.ClassCHAOS, false)
	if err != nil {
		t.Fatal(err)
	}
	m := new(dns.Msg)
	m.Question = []dns.Question{{Name: "version.bind.", Qtype: dns.TypeTXT, Qclass: dns.ClassCHAOS}}
	m.Response = true
	m.Answer = []dns.RR{&dns.TXT{Hdr: dns.RR_Header{Name: "version.bind.", Rrtype: dns.TypeTXT, Class: dns.ClassCHAOS, Ttl: 300}, Txt: []string{"x"}}}
	e, err := NewBuilder().Build(m, key, "version.bind.", 1, 300, 0, 0, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(e); err != nil || e.QClass() != dns.ClassCHAOS {
		t.Fatalf("class %d: %v", e.QClass(), err)
	}
	return append(Entry(nil), e...)
}

// setSize sets e's size field to n, whatever its length.
func setSize(e Entry, n int) { e[0], e[1], e[2] = byte(n), byte(n>>8), byte(n>>16) }

// FuzzCheck: whatever the bytes, an entry Check passes can be walked by the
// trusted readers without running off its end.
func FuzzCheck(f *testing.F) {
	for _, e := range builtEntries(f, 5) {
		f.Add([]byte(e))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) >= 4 {
			putSize(b) // past the size check
		}
		if Check(b) != nil {
			return
		}
		walk(Entry(b))
	})
}
