package workload

import (
	"strings"

	"github.com/miekg/dns"
)

// Payload returns the information entry i of the reference workload holds:
// its qname in wire form plus, for each record, its rdata and a 2-byte
// length. A cache holding entry i in fewer bytes would have to compress it.
func Payload(i int) int { return PayloadOf(Reply(i, Plain)) }

// PayloadOf returns the payload of a reply of any variant: the qname in wire
// form and, for each record but OPT, its rdata, a 2-byte length, and its owner
// in wire form where the owner is not the qname (the targets of CNAMEs).
func PayloadOf(m *dns.Msg) int {
	qname := m.Question[0].Name
	n := wireLen(qname)
	for _, s := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range s {
			h := rr.Header()
			if h.Rrtype == dns.TypeOPT {
				continue
			}
			owner := wireLen(h.Name)
			n += dns.Len(rr) - owner - 10 + 2 // the header is the owner and 10 bytes
			if !strings.EqualFold(h.Name, qname) {
				n += owner
			}
		}
	}
	return n
}

// wireLen returns the wire length of a fully qualified name without escapes.
func wireLen(name string) int {
	if name == "." {
		return 1
	}
	return len(name) + 1
}
