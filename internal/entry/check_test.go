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
	} {
		e := tc.damage(append(Entry(nil), tc.good...))
		if err := Check(e); err == nil {
			t.Errorf("%s: the check passes a damaged entry", tc.name)
		}
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
