package workload

import (
	"fmt"
	"strings"
)

// Variant selects what the entries carry beyond the reference workload. The
// variants are bits, so that they combine: "cname,dnssec" signs the CNAMEs too.
type Variant uint8

// Plain is the reference workload itself.
const Plain Variant = 0

const (
	// CNAME answers 15% of the entries through a CNAME whose target owns the
	// final records.
	CNAME Variant = 1 << iota
	// DNSSEC adds one RRSIG (ECDSA P-256, algorithm 13, 64-byte signature) to
	// every RRset, and the DO bit to the request.
	DNSSEC
	// ECS asks entry i from client Client(i) with an EDNS Client Subnet option,
	// answered with scope /24 (IPv4) or /56 (IPv6).
	ECS
)

var variantNames = []struct {
	v    Variant
	name string
}{{CNAME, "cname"}, {DNSSEC, "dnssec"}, {ECS, "ecs"}}

// ParseVariant parses a comma-separated list of variant names; "" and "plain"
// are the reference workload.
func ParseVariant(s string) (Variant, error) {
	var v Variant
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" || f == "plain" {
			continue
		}
		found := false
		for _, n := range variantNames {
			if n.name == f {
				v |= n.v
				found = true
			}
		}
		if !found {
			return 0, fmt.Errorf("unknown workload variant %q (want plain, cname, dnssec, ecs)", f)
		}
	}
	return v, nil
}

func (v Variant) String() string {
	var names []string
	for _, n := range variantNames {
		if v&n.v != 0 {
			names = append(names, n.name)
		}
	}
	if len(names) == 0 {
		return "plain"
	}
	return strings.Join(names, ",")
}
