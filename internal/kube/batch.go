package kube

import (
	"slices"
	"strings"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/flush"
)

// kind is what changed in the cluster.
type kind int

const (
	kindService   kind = iota // a Service
	kindEndpoints             // an EndpointSlice
	kindPod                   // a change that may be a Pod's (pods verified)
	kindNamespace             // a namespace appeared or went
	numKinds
)

var kindNames = [numKinds]string{"service", "endpoints", "pod", "namespace"}

func (k kind) String() string { return kindNames[k] }

// batch gathers the names that changes since the last flush make wrong,
// each once however many changes name it.
type batch struct {
	// keep, when not empty, holds the zones of the cache the names are
	// for: a name outside them has no entry to drop.
	keep     dnsmsg.ZoneSet
	names    map[string]struct{} // lowercased wire names
	subtrees map[string]struct{}
	// outNames and outTrees are the names and subtrees out of keep that
	// changes named: the cache has no entries of them, but may have of an
	// alias of one (aliasNames), which empties them.
	outNames, outTrees map[string]struct{}
	changes            [numKinds]int64
	buf                [dnsmsg.MaxNameLen]byte
}

func newBatch(keep dnsmsg.ZoneSet) *batch {
	return &batch{keep: keep, names: map[string]struct{}{}, subtrees: map[string]struct{}{},
		outNames: map[string]struct{}{}, outTrees: map[string]struct{}{}}
}

// name adds a name in presentation form, fully qualified.
func (b *batch) name(s string) { b.add(s, nil, false) }

// nameIn adds a name where one of zones holds it.
func (b *batch) nameIn(s string, zones dnsmsg.ZoneSet) { b.add(s, zones, false) }

// subtree adds a name whose whole subtree is dropped.
func (b *batch) subtree(s string) { b.add(s, nil, true) }

func (b *batch) add(s string, in dnsmsg.ZoneSet, subtree bool) {
	n, err := dnsmsg.PackName(strings.ToLower(s), b.buf[:])
	if err != nil {
		return // a label over 63 bytes: no query can ask for the name
	}
	w := b.buf[:n]
	if in != nil && !in.Matches(w) {
		return
	}
	names, subtrees := b.names, b.subtrees
	if !b.kept(w, subtree) {
		names, subtrees = b.outNames, b.outTrees
	}
	if subtree {
		subtrees[string(w)] = struct{}{}
	} else {
		names[string(w)] = struct{}{}
	}
}

// drops reports whether the changes b holds named w, a lowercased wire
// name, or a subtree holding it, in the cache's zones or out of them.
func (b *batch) drops(w string) bool {
	return named(w, b.names, b.subtrees) || named(w, b.outNames, b.outTrees)
}

func named(w string, names, subtrees map[string]struct{}) bool {
	if _, ok := names[w]; ok {
		return true
	}
	for st := range subtrees {
		if dnsmsg.InZone([]byte(w), []byte(st)) {
			return true
		}
	}
	return false
}

// kept reports whether the cache can hold entries of w: w is in one of
// its zones, or, for a subtree, holds one of them.
func (b *batch) kept(w []byte, subtree bool) bool {
	if len(b.keep) == 0 || b.keep.Matches(w) {
		return true
	}
	if subtree {
		for _, z := range b.keep {
			if dnsmsg.InZone(z, w) {
				return true
			}
		}
	}
	return false
}

// empty reports whether the batch has nothing to flush.
func (b *batch) empty() bool { return len(b.names) == 0 && len(b.subtrees) == 0 }

// take returns the batch's flushes, names first, and empties it; the
// changes counted stay for the caller to read and reset.
func (b *batch) take() []flush.Flush {
	var fs []flush.Flush
	if len(b.names) > 0 {
		fs = append(fs, chunks(flush.Names, b.names)...)
		clear(b.names)
	}
	if len(b.subtrees) > 0 {
		fs = append(fs, chunks(flush.Zones, b.subtrees)...)
		clear(b.subtrees)
	}
	return fs
}

// maxNames bounds the names of one Flush: the shared tier carries a
// Flush to the other replicas as one message.
const maxNames = 4096

func chunks(scope flush.Scope, set map[string]struct{}) []flush.Flush {
	names := make([][]byte, 0, len(set))
	for n := range set {
		names = append(names, []byte(n))
	}
	// In a fixed order, for the tests and for the log.
	slices.SortFunc(names, func(a, b []byte) int { return strings.Compare(string(a), string(b)) })
	var fs []flush.Flush
	for len(names) > 0 {
		k := min(len(names), maxNames)
		fs = append(fs, flush.Flush{Scope: scope, Names: names[:k:k]})
		names = names[k:]
	}
	return fs
}
