package store

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/compactcache/compactcache/internal/entry"
	"github.com/miekg/dns"
)

// modelEntry builds the entry of name, version v, of about size bytes (a TXT
// record; the smallest a name and a version take when size is 0) with flags
// (entry.FlagDenial, FlagMeta, FlagVariant) and ttl.
func modelEntry(t testing.TB, b *entry.Builder, name string, v, size int, flags uint16, ttl uint32) (entry.Entry, []byte) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeTXT)
	txt := &dns.TXT{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: ttl}}
	txt.Txt = []string{fmt.Sprint(v)}
	for ; size > 0; size -= 256 {
		txt.Txt = append(txt.Txt, strings.Repeat("x", min(size, 256)-1))
	}
	m.Answer = []dns.RR{txt}
	key, err := entry.KeyFor(name, dns.TypeTXT, dns.ClassINET, false)
	if err != nil {
		t.Fatal(err)
	}
	e, err := b.Build(m, key, "", 0, ttl, 0, flags, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	return append(entry.Entry(nil), e...), key
}

// body is what tells an entry's versions apart: its key and records, not
// the hits a lookup or a pass writes to its header.
func body(e entry.Entry) []byte { return e[offKeyOfEntry:] }

// offKeyOfEntry is where an entry's key starts, past the header (entry.go).
const offKeyOfEntry = 18

// storeModel follows a store through random operations: the latest version
// of every key ever stored, and how many entries the store should hold given
// what it reported displaced.
type storeModel struct {
	t      *testing.T
	s      *Store
	latest map[string][]byte // key: body of the latest version put
	held   int               // entries the store should hold
	now    int64
}

func (m *storeModel) total() int {
	u := m.s.Usage()
	return u.Kinds[KindSuccess] + u.Kinds[KindDenial] + u.Kinds[KindMeta]
}

func (m *storeModel) present(key []byte) bool {
	return m.s.Get(key, m.s.Hash(key), func(entry.Entry) bool { return true })
}

func (m *storeModel) displaced(d Displaced) int {
	n := 0
	for k := range NumKinds {
		n += d.Evicted[k] + d.Refused[k]
	}
	return n
}

// settle checks that the store holds as many entries as the model says,
// after op.
func (m *storeModel) settle(op string) {
	m.t.Helper()
	if got := m.total(); got != m.held {
		m.t.Fatalf("after %s: the store holds %d entries; puts, removals and displacements reported leave %d", op, got, m.held)
	}
}

// put stores e under key, by Put or Update, and accounts for what it
// reports displaced: every displacement of an entry other than the one e
// replaces, and e itself kept (the stock cache keeps what it adds).
func (m *storeModel) put(e entry.Entry, key []byte, update bool) {
	m.t.Helper()
	before := m.present(key)
	var d Displaced
	if update {
		d = m.s.Update(key, m.now, func(old entry.Entry) entry.Entry {
			if (old != nil) != before {
				m.t.Fatalf("Update saw old %t, Get %t", old != nil, before)
			}
			if old != nil && !bytes.Equal(body(old), m.latest[string(key)]) {
				m.t.Fatalf("%s: Update was lent a version other than the latest", dnsName(key))
			}
			return e
		})
	} else {
		d = m.s.Put(e, m.now)
	}
	m.latest[string(key)] = append([]byte(nil), body(e)...)
	if !before {
		m.held++
	}
	m.held -= m.displaced(d)
	if !m.present(key) {
		m.t.Fatalf("%s: not found right after it was put", dnsName(key))
	}
	m.settle("put")
}

func (m *storeModel) remove(key []byte) {
	if m.present(key) {
		m.held--
	}
	m.s.Remove(key)
	if m.present(key) {
		m.t.Fatalf("%s: found after Remove", dnsName(key))
	}
	m.settle("remove")
}

// walkStep takes one step of a walk at c, checking that what it visits is
// the latest version of its key, and removing some.
func (m *storeModel) walkStep(rng *rand.Rand, c Cursor) (Cursor, bool) {
	m.t.Helper()
	removed := 0
	c, more := m.s.Walk(c, func(e entry.Entry) bool {
		if !bytes.Equal(body(e), m.latest[string(e.Key())]) {
			m.t.Errorf("%s: the walk visited a version other than the latest", dnsName(e.Key()))
		}
		if rng.IntN(256) == 0 {
			removed++
			return true
		}
		return false
	})
	m.held -= removed
	m.settle("walk")
	return c, more
}

// ttl is mostly an hour, sometimes seconds.
func ttl(rng *rand.Rand) uint32 {
	if rng.IntN(10) == 0 {
		return uint32(1 + rng.IntN(20))
	}
	return 3600
}

// TestStoreConsistentUnderRandomOps runs a bounded, seeded sequence of
// random operations on stores at the edges of their shapes (the smallest
// budget, budgets of a chunk and a bit, few shards, caps of 1 and caps
// larger than what fits) with entries from the smallest to the largest, of
// every kind, among walks that remove some: after each operation, the
// entries the store holds are those put, less those removed and those it
// reported displaced (each once), and every key put is found right after,
// in its latest version; every so often the shards' own accounting is
// checked (Check).
func TestStoreConsistentUnderRandomOps(t *testing.T) {
	largest := entry.MaxLen - 600 // about the most a TXT record of a long name takes
	for _, tc := range []struct {
		procs    int
		capacity int64
		limits   PerKind
		small    bool // entries of a few dozen bytes only, to fill the index
	}{
		{1, MinCapacity, PerKind{}, true},
		{1, MinCapacity, PerKind{}, false},
		{1, MinCapacity, PerKind{1, 1, 1}, false},
		{2, 4<<20 + chunkSize + 4097, PerKind{KindSuccess: 3, KindDenial: 1 << 40}, true},
		{4, 8<<20 - 1, PerKind{KindDenial: 5, KindMeta: 2}, false},
		{1, MinCapacity + 3*chunkSize/2, PerKind{KindSuccess: 1 << 62}, false},
	} {
		t.Run(fmt.Sprintf("%d_%d_%v", tc.procs, tc.capacity, tc.limits), func(t *testing.T) {
			s, err := newStoreOn(tc.procs, tc.capacity, tc.limits, 5)
			if err != nil {
				t.Fatal(err)
			}
			m := &storeModel{t: t, s: s, latest: map[string][]byte{}}
			rng := rand.New(rand.NewPCG(7, uint64(tc.capacity)))
			b := entry.NewBuilder()
			var c Cursor
			walking := false
			for op := range 30000 {
				keys := 20000
				if tc.small {
					keys = 100000
				}
				name := fmt.Sprintf("k%d.example.org.", rng.IntN(keys))
				if rng.IntN(20) == 0 {
					name = strings.Repeat("a", 60) + "." + strings.Repeat("b", 60) + "." + name
				}
				switch r := rng.IntN(100); {
				case r < 60:
					size := 0
					switch x := rng.IntN(200); {
					case tc.small:
					case x == 0:
						size = largest
					case x < 6:
						size = rng.IntN(largest)
					case x < 40:
						size = rng.IntN(400)
					}
					var flags uint16
					switch rng.IntN(6) {
					case 0:
						flags = entry.FlagDenial
					case 1:
						flags = entry.FlagMeta
					case 2:
						flags = entry.FlagVariant
					}
					e, key := modelEntry(t, b, name, op, size, flags, ttl(rng))
					m.put(e, key, rng.IntN(3) == 0)
				case r < 64:
					key, _ := entry.KeyFor(name, dns.TypeTXT, dns.ClassINET, false)
					m.remove(key)
				case r < 90:
					key, _ := entry.KeyFor(name, dns.TypeTXT, dns.ClassINET, false)
					s.Get(key, s.Hash(key), func(e entry.Entry) bool { e.Hit(m.now, 60); return true })
				case r < 97:
					if !walking {
						c, walking = Cursor{}, true
					}
					c, walking = m.walkStep(rng, c)
				default:
					m.now += int64(rng.IntN(2))
				}
				if op%200 == 0 {
					checkShards(t, s)
				}
			}
			checkShards(t, s)
		})
	}
}
