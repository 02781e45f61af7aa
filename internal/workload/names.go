package workload

import (
	"github.com/miekg/dns"
)

// NumSLDs is the number of second-level domains the qnames live under.
const NumSLDs = 5000

// The first five letters of entry i's label spell i through a bijection of
// [0, 26^5), so qnames are distinct for i < 26^5 (11,881,376, more than the
// 10M names of the zipf trace): a collision would make two entries one key and
// the "every entry stored" check fail. nameMul is coprime with 26.
const (
	nameSpace = 26 * 26 * 26 * 26 * 26
	nameMul   = 4194301
	nameAdd   = 7654321
)

// slds holds the second-level domains with their trailing dot, "example.com.".
var slds = func() []string {
	tlds := [...]string{"com.", "net.", "org."}
	s := make([]string, NumSLDs)
	for j := range s {
		r := newRNG(domainSLD, j)
		b := r.letters(make([]byte, 0, 20), 5+r.intn(8))
		b = append(b, '.')
		s[j] = string(append(b, tlds[r.intn(len(tlds))]...))
	}
	return s
}()

// qtypeOf draws entry i's qtype: it is the first draw of the entry's stream.
func qtypeOf(r *rng) uint16 {
	switch n := r.intn(100); {
	case n < 56:
		return dns.TypeA
	case n < 81:
		return dns.TypeAAAA
	default:
		return dns.TypeTXT
	}
}

// appendName appends entry i's qname, continuing i's stream after the qtype.
func appendName(b []byte, i int, r *rng) []byte {
	n := 6 + r.intn(15)
	x := (uint64(i)%nameSpace*nameMul + nameAdd) % nameSpace
	for range 5 {
		b = append(b, byte('a'+x%26))
		x /= 26
	}
	b = r.letters(b, n-5)
	b = append(b, '.')
	return append(b, slds[r.intn(NumSLDs)]...)
}

// AppendName appends entry i's qname in presentation form, fully qualified.
func AppendName(b []byte, i int) []byte {
	r := newRNG(domainEntry, i)
	qtypeOf(&r)
	return appendName(b, i, &r)
}

// Name returns entry i's qname.
func Name(i int) string { return string(AppendName(make([]byte, 0, 48), i)) }

// Qtype returns entry i's qtype without building its name.
func Qtype(i int) uint16 {
	r := newRNG(domainEntry, i)
	return qtypeOf(&r)
}

// Question returns the question entry i answers.
func Question(i int) dns.Question {
	return dns.Question{Name: Name(i), Qtype: Qtype(i), Qclass: dns.ClassINET}
}

// Names holds the qnames of entries [0, n) in one string, so that a benchmark
// gets entry i's qname without allocating. It holds no pointer per name: the
// garbage collector does not scan it.
type Names struct {
	all string
	end []uint32
}

// NewNames builds the qnames of entries [0, n).
func NewNames(n int) *Names {
	b := make([]byte, 0, n*30)
	end := make([]uint32, n)
	for i := range end {
		b = AppendName(b, i)
		end[i] = uint32(len(b))
	}
	return &Names{all: string(b), end: end}
}

// Len returns the number of names held.
func (t *Names) Len() int { return len(t.end) }

// Name returns entry i's qname, a substring of one shared string.
func (t *Names) Name(i int) string {
	var start uint32
	if i > 0 {
		start = t.end[i-1]
	}
	return t.all[start:t.end[i]]
}
