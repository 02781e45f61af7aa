package admin

import (
	"strconv"
	"strings"
)

// maxQuoted bounds, in characters, a value quoted back in an error.
const maxQuoted = 200

// Cut returns s cut after its first 200 characters: a value a caller gave,
// or a reply, named whole in an error could run to megabytes.
func Cut(s string) string {
	n := 0
	for i := range s {
		if n == maxQuoted {
			return s[:i]
		}
		n++
	}
	return s
}

// Quote returns s quoted as %q quotes it, cut as Cut cuts it and then
// ending in "...".
func Quote(s string) string {
	c := Cut(s)
	if len(c) < len(s) {
		return strconv.Quote(c) + "..."
	}
	return strconv.Quote(s)
}

// AppendText appends e as zone-file text: one comment with its metadata,
//
//	; www.example.org. IN A flags=cd ecs=192.0.2.0/24 match=scope rcode=NOERROR kind=success ttl=300 left=245 stale=no bytes=180 hits=3
//
// then its records as a DO client would get them, TTLs aged, the authority
// and additional sections each after a comment naming it. A zone-file
// reader takes the records and skips the comments.
func (e *Entry) AppendText(b []byte) []byte {
	b = append(b, "; "...)
	b = append(b, e.Name...)
	b = append(b, ' ')
	b = append(b, e.Class...)
	b = append(b, ' ')
	b = append(b, e.Type...)
	var flags []string
	if e.CD {
		flags = append(flags, "cd")
	}
	if e.NonAnswer {
		flags = append(flags, "non-answer")
	}
	if e.NoDNSSEC {
		flags = append(flags, "no-dnssec")
	}
	b = field(b, "flags", strings.Join(flags, ","))
	b = field(b, "ecs", e.ECS)
	b = field(b, "match", e.ECSMatch)
	b = field(b, "rcode", e.Rcode)
	b = field(b, "kind", e.Kind)
	b = field(b, "ttl", strconv.FormatInt(e.TTL, 10))
	b = field(b, "left", strconv.FormatInt(e.TTLLeft, 10))
	b = field(b, "stale", yesNo(e.Stale))
	b = field(b, "expired", yesNo(e.Expired))
	b = field(b, "bytes", strconv.Itoa(e.Bytes))
	b = field(b, "hits", strconv.Itoa(e.Hits))
	b = append(b, '\n')
	for _, s := range []struct {
		name string
		rrs  []string
	}{{"", e.Answer}, {"authority", e.Ns}, {"additional", e.Extra}} {
		if len(s.rrs) > 0 && s.name != "" {
			b = append(b, ";; "+s.name+"\n"...)
		}
		for _, rr := range s.rrs {
			b = append(b, rr...)
			b = append(b, '\n')
		}
	}
	return b
}

// field appends " name=value", value "-" when empty.
func field(b []byte, name, value string) []byte {
	if value == "" {
		value = "-"
	}
	b = append(b, ' ')
	b = append(b, name...)
	b = append(b, '=')
	return append(b, value...)
}

func yesNo(v bool) string {
	if v {
		return "yes"
	}
	return "no"
}
