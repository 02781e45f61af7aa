package dnsmsg

import (
	"bytes"
	"strings"

	"github.com/miekg/dns"
)

// ZoneSet holds zones as lowercased wire names, so that the names of keys
// are matched against them without building strings.
type ZoneSet [][]byte

// NewZoneSet returns the set of zones, names in presentation form.
func NewZoneSet(zones []string) ZoneSet {
	set := make(ZoneSet, 0, len(zones))
	for _, z := range zones {
		b := make([]byte, MaxNameLen)
		n, err := dns.PackDomainName(dns.Fqdn(strings.ToLower(z)), b, 0, nil, false)
		if err != nil {
			continue // setup normalized the zones: they pack
		}
		set = append(set, b[:n])
	}
	return set
}

// Matches reports whether the lowercased wire name that key starts with is
// in one of the zones. A zone matches at a label boundary of the name, and
// its root label then lines up with the name's.
func (zs ZoneSet) Matches(key []byte) bool {
	for _, z := range zs {
		if len(z) == 1 {
			return true // the root, which holds every name: no need to walk to its label
		}
	}
	for off := 0; off < len(key); off += int(key[off]) + 1 {
		for _, z := range zs {
			if bytes.HasPrefix(key[off:], z) {
				return true
			}
		}
		if key[off] == 0 {
			break
		}
	}
	return false
}

// Covers reports whether every zone of o is in one of the zones of zs.
func (zs ZoneSet) Covers(o ZoneSet) bool {
	for _, z := range o {
		if !zs.Matches(z) {
			return false
		}
	}
	return true
}

// InZone reports whether name is zone or below it; both are lowercased
// wire names, and zone matches at a label boundary.
func InZone(name, zone []byte) bool {
	for off := 0; len(name)-off >= len(zone); off += int(name[off]) + 1 {
		if len(name)-off == len(zone) {
			return string(name[off:]) == string(zone)
		}
	}
	return false
}
