package kube

import "sync"

// At a reload CoreDNS starts the new instance's sources before it stops
// the old ones, and a new source tells the changes it sees against its
// first full state. When the old source of a block stops before the new
// one has that state (the kubernetes plugin's startup wait ran out before
// its informers synced, or a new watch still lists), the changes between
// are neither's: the old one no longer looks, the new one takes them as
// its base, and the store, carried across the reload, keeps the names
// they made wrong for their TTL. So the old source hands its last view to
// the block's new source, whose first full state is told against it. The
// view rather than a flush of the cluster zones' subtrees: the names
// flushed are those that changed, no walk of the store, and a reload whose
// source syncs before the old one stops hands nothing over.

// state is what a stopped source knew of the cluster.
type state struct {
	view *clusterView
	ns   map[string]bool // the namespaces' existence as a follow last looked (nil: a watch's)
}

// A block's first source in the process has no source before it to
// hand over a view: what its store holds was stored while none looked (read
// from a snapshot, filled from a peer, answered before the plugin synced),
// and what changed meanwhile, while the process was down or before the
// first full state, is told against nothing. So the first full state of a
// block's first source drops its zones whole; a block whose sources have
// had one before takes a view handed over, or none where the source before
// still runs.

// filledBlocks holds the blocks one of whose sources has had its first
// full state in this process.
var filledBlocks sync.Map // block → struct{}

// baseline is a source's base at its start: the state of the block's
// source it replaces, when that one stopped first.
type baseline struct {
	block  string // Target.Block, naming the block across reloads; "" for none (tests)
	mu     sync.Mutex
	filled bool   // the source has its first full state, or has stopped: it takes no base
	base   *state // the state handed over, while not filled
}

func newBaseline(block string) *baseline { return &baseline{block: block} }

// inherit offers st as the base of the source's first full state,
// reporting whether the source took it.
func (b *baseline) inherit(st *state) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.filled || b.base != nil {
		return false
	}
	b.base = st
	return true
}

// fill marks the source filled at its first full state, and returns the
// state handed over to it, nil if none was, and whether it is cold: the
// first of its block to fill, whose zones are dropped.
func (b *baseline) fill() (st *state, cold bool) {
	if b.block != "" {
		_, seen := filledBlocks.LoadOrStore(b.block, struct{}{})
		cold = !seen
	}
	return b.release(), cold
}

// release marks the source filled, or stopped before it was, and returns
// the state handed over to it, nil if none was.
func (b *baseline) release() *state {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.filled = true
	st := b.base
	b.base = nil
	return st
}

// handOver hands the last state of inv, stopped, to a running source of
// its block that has no full state yet: the one a reload started. A block
// left with no source (a reload took the option away, or moved it to
// another block) is forgotten: no source watches what its store keeps from
// then on, and one that a later reload gives it drops its zones as a first
// one does.
func handOver(inv *Invalidator) {
	if inv.base.block == "" {
		return
	}
	var st *state
	if inv.last != nil {
		st = inv.last()
	}
	followed := false
	sources.Range(func(_, v any) bool {
		o := v.(*Invalidator)
		if o == inv || o.base.block != inv.base.block {
			return true
		}
		followed = true
		return st == nil || !o.base.inherit(st)
	})
	if !followed {
		filledBlocks.Delete(inv.base.block)
	}
}
