package entry

import (
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"testing"

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
	if e.Flags()&FlagMeta != 0 {
		l := e.List()
		for i := range l.Count() {
			l.Item(i)
		}
	}
	var r Record
	off, counts := e.Records()
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
	if counted.Flags()&FlagPlain != 0 || plainA.QType() != dns.TypeA || plainTXT.QType() != dns.TypeTXT {
		t.Fatalf("the workload's first entries are not a plain A, a plain TXT and a counted entry")
	}
	for _, tc := range []struct {
		name   string
		good   Entry
		damage func(Entry) Entry
	}{
		{"cut", counted, func(e Entry) Entry { e = e[:len(e)-3]; putSize(e); return e }},
		{"size field", counted, func(e Entry) Entry { setSize(e, len(e)+1); return e }},
		{"name length", counted, func(e Entry) Entry { e[offNameLen]++; return e }},
		{"record count", counted, func(e Entry) Entry { e[e.body()]++; return e }},
		{"counts cut", counted, func(e Entry) Entry { e = e[:e.body()+countsLen-1]; putSize(e); return e }},
		{"label past the name", counted, func(e Entry) Entry { e[offKey] = 63; return e }},
		{"header only", counted, func(e Entry) Entry { e = e[:headerLen]; putSize(e); return e }},
		{"class cut", counted, func(e Entry) Entry { e[offKey+e.nameLen()+keyTail-1] |= KeyClass; return e }},
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
