package entry

import (
	"encoding/binary"
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
	var r Record
	off := e.RecordsStart()
	for s := range 3 {
		for range e.Count(s) {
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
	good := builtEntries(t, 1)[1] // CNAME and DNSSEC records
	for _, tc := range []struct {
		name   string
		damage func(Entry) Entry
	}{
		{"cut", func(e Entry) Entry { e = e[:len(e)-3]; binary.LittleEndian.PutUint32(e, uint32(len(e))); return e }},
		{"size field", func(e Entry) Entry { binary.LittleEndian.PutUint32(e, uint32(len(e)+1)); return e }},
		{"name length", func(e Entry) Entry { e[offNameLen]++; return e }},
		{"record count", func(e Entry) Entry { binary.LittleEndian.PutUint16(e[offCounts:], uint16(e.Count(0)+1)); return e }},
		{"label past the name", func(e Entry) Entry { e[offKey] = 63; return e }},
		{"header only", func(e Entry) Entry { e = e[:headerLen]; binary.LittleEndian.PutUint32(e, uint32(len(e))); return e }},
	} {
		e := tc.damage(append(Entry(nil), good...))
		if err := Check(e); err == nil {
			t.Errorf("%s: the check passes a damaged entry", tc.name)
		}
	}
}

// FuzzCheck: whatever the bytes, an entry Check passes can be walked by the
// trusted readers without running off its end.
func FuzzCheck(f *testing.F) {
	for _, e := range builtEntries(f, 5) {
		f.Add([]byte(e))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) >= 4 {
			binary.LittleEndian.PutUint32(b, uint32(len(b))) // past the size check
		}
		if Check(b) != nil {
			return
		}
		walk(Entry(b))
	})
}
