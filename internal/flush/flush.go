// Package flush is what an invalidation is, wherever it comes from: an
// operator's admin request, another replica's flush through the shared
// tier, a change the Kubernetes API reports. A Flush names the entries it
// drops; a Fence keeps a fetch that began before a flush from storing
// what the flush dropped. The plugin applies a Flush to its store, probing
// the keys of names and walking the store for the rest; the sources only
// make Flushes, and the shared tier carries them (Marshal, Unmarshal).
package flush

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/miekg/dns"
)

// Scope says which entries a Flush drops.
type Scope uint8

const (
	// Names: every entry of one of Names, of one of Types (every type when
	// Types is empty), ECS variants and the names' ECS lists included.
	Names Scope = iota + 1
	// Zones: every entry of a name at or below one of Names.
	Zones
	// Negative: NXDOMAIN, NODATA and SERVFAIL entries.
	Negative
	// Expired: entries whose TTL has run out, stale ones included.
	Expired
	// All: every entry.
	All
)

var scopeNames = [...]string{Names: "names", Zones: "zones", Negative: "negative", Expired: "expired", All: "all"}

func (s Scope) String() string {
	if int(s) < len(scopeNames) && scopeNames[s] != "" {
		return scopeNames[s]
	}
	return fmt.Sprintf("scope%d", s)
}

// Flush is one invalidation. Names are lowercased wire names.
type Flush struct {
	Scope Scope
	Names [][]byte
	Types []uint16
}

// Covers reports whether f drops e, at now (unix seconds).
func (f *Flush) Covers(e entry.Entry, now int64) bool {
	switch f.Scope {
	case Names:
		q := e.QName()
		return slices.ContainsFunc(f.Names, func(n []byte) bool { return bytes.Equal(n, q) }) &&
			(len(f.Types) == 0 || slices.Contains(f.Types, e.QType()))
	case Zones:
		q := e.QName()
		return slices.ContainsFunc(f.Names, func(z []byte) bool { return dnsmsg.InZone(q, z) })
	case Negative:
		return Negativity(e)
	case Expired:
		return now >= e.Expires()
	case All:
		return true
	}
	return false
}

// Negativity reports the entries a Negative flush drops: NXDOMAIN and
// NODATA (the denials) and SERVFAIL; never the bookkeeping of ECS lists.
func Negativity(e entry.Entry) bool {
	return e.Flags()&entry.FlagMeta == 0 && (e.Flags()&entry.FlagDenial != 0 || e.Rcode() == dns.RcodeServerFailure)
}

// String is f as the log says it: the scope, names in presentation form
// and types.
func (f *Flush) String() string {
	var b strings.Builder
	b.WriteString(f.Scope.String())
	for i, n := range f.Names {
		if i == 8 {
			fmt.Fprintf(&b, " (and %d more)", len(f.Names)-i)
			break
		}
		text, _, _ := dns.UnpackDomainName(n, 0)
		b.WriteString(" " + text)
	}
	for _, t := range f.Types {
		b.WriteString(" " + dns.Type(t).String())
	}
	return b.String()
}

// The binary form, for the shared tier's messages between replicas:
//
//	version (1) scope (1) types (2) names (2), each type (2), each name
//	(an uncompressed wire name)
const (
	version   = 1
	headerLen = 6
	// maxItems bounds the names and types of one message.
	maxItems = 1 << 14
)

// Marshal appends f's binary form to b.
func (f *Flush) Marshal(b []byte) []byte {
	b = append(b, version, byte(f.Scope))
	b = binary.BigEndian.AppendUint16(b, uint16(len(f.Types)))
	b = binary.BigEndian.AppendUint16(b, uint16(len(f.Names)))
	for _, t := range f.Types {
		b = binary.BigEndian.AppendUint16(b, t)
	}
	for _, n := range f.Names {
		b = append(b, n...)
	}
	return b
}

// ErrMalformed is the error of a message that is not a Flush: from a
// replica of another version, or not from a replica at all.
var ErrMalformed = errors.New("not a flush message")

// Unmarshal reads a Flush from b, checking all of it: the message comes
// from outside the process. Its names are copies, lowercased.
func Unmarshal(b []byte) (Flush, error) {
	var f Flush
	if len(b) < headerLen || b[0] != version {
		return f, ErrMalformed
	}
	f.Scope = Scope(b[1])
	if f.Scope < Names || f.Scope > All {
		return f, fmt.Errorf("%w: scope %d", ErrMalformed, b[1])
	}
	nt, nn := int(binary.BigEndian.Uint16(b[2:])), int(binary.BigEndian.Uint16(b[4:]))
	if nt > maxItems || nn > maxItems {
		return f, fmt.Errorf("%w: %d types, %d names", ErrMalformed, nt, nn)
	}
	off := headerLen
	if len(b) < off+2*nt {
		return f, fmt.Errorf("%w: cut in its types", ErrMalformed)
	}
	for i := range nt {
		f.Types = append(f.Types, binary.BigEndian.Uint16(b[off+2*i:]))
	}
	off += 2 * nt
	for range nn {
		end := dnsmsg.NameEnd(b, off)
		if end < 0 {
			return f, fmt.Errorf("%w: a name that is not a wire name", ErrMalformed)
		}
		n := slices.Clone(b[off:end])
		dnsmsg.LowerInPlace(n)
		f.Names = append(f.Names, n)
		off = end
	}
	if off != len(b) {
		return f, fmt.Errorf("%w: %d bytes after its names", ErrMalformed, len(b)-off)
	}
	if (f.Scope == Names || f.Scope == Zones) != (nn > 0) {
		return f, fmt.Errorf("%w: %s with %d names", ErrMalformed, f.Scope, nn)
	}
	return f, nil
}
