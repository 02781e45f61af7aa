package main

import (
	"container/heap"
	"math"

	"github.com/maypok86/otter/v2"
)

// The offline simulations: policies that hold entries of the sizes the store
// gives them (sizer) within the same budget in bytes, with no memory of
// their own counted. Each answers one access at a time: a hit, or a miss
// after which the entry is admitted if the policy admits it.
type policy interface {
	access(pos int, key uint32, size int32) (hit bool)
}

// Simulated policies, by the name the table gives them.
const (
	simLRU    = "LRU"
	simCLOCK  = "CLOCK"
	simS3FIFO = "S3-FIFO"
	simTinyLF = "W-TinyLFU"
	simOPT    = "OPT"
)

var simNames = []string{simLRU, simCLOCK, simS3FIFO, simTinyLF, simOPT}

func newPolicy(name string, budget int64, t *prepared) policy {
	switch name {
	case simLRU:
		return newLRU(budget)
	case simCLOCK:
		return &clockSim{budget: budget, index: map[uint32]int32{}}
	case simS3FIFO:
		return newS3FIFO(budget)
	case simTinyLF:
		return newTinyLFU(budget)
	case simOPT:
		return &opt{budget: budget, next: t.next, index: map[uint32]int32{}}
	}
	panic("unknown policy " + name)
}

// slab holds the entries of a simulation by number, with a free list.
type slab struct {
	key  []uint32
	size []int32
	free []int32
}

func (s *slab) add(key uint32, size int32) int32 {
	if n := len(s.free); n > 0 {
		id := s.free[n-1]
		s.free = s.free[:n-1]
		s.key[id], s.size[id] = key, size
		return id
	}
	s.key = append(s.key, key)
	s.size = append(s.size, size)
	return int32(len(s.key) - 1)
}

func (s *slab) remove(id int32) { s.free = append(s.free, id) }

// lru is least recently used, in bytes: a doubly linked list by entry number.
type lru struct {
	slab
	budget, used int64
	index        map[uint32]int32
	prev, next   []int32 // entry 0 is the list's head, most recent next
}

func newLRU(budget int64) *lru {
	l := &lru{budget: budget, index: map[uint32]int32{}}
	l.add(0, 0)
	l.prev, l.next = []int32{0}, []int32{0}
	return l
}

func (l *lru) unlink(id int32) {
	l.next[l.prev[id]] = l.next[id]
	l.prev[l.next[id]] = l.prev[id]
}

func (l *lru) pushFront(id int32) {
	l.prev[id], l.next[id] = 0, l.next[0]
	l.prev[l.next[0]] = id
	l.next[0] = id
}

func (l *lru) access(_ int, key uint32, size int32) bool {
	if id, ok := l.index[key]; ok {
		l.unlink(id)
		l.pushFront(id)
		return true
	}
	if int64(size) > l.budget {
		return false
	}
	for l.used+int64(size) > l.budget {
		victim := l.prev[0]
		l.unlink(victim)
		delete(l.index, l.key[victim])
		l.used -= int64(l.size[victim])
		l.remove(victim)
	}
	id := l.add(key, size)
	for int(id) >= len(l.prev) {
		l.prev, l.next = append(l.prev, 0), append(l.next, 0)
	}
	l.pushFront(id)
	l.index[key] = id
	l.used += int64(size)
	return false
}

// fifo is a queue of entry numbers.
type fifo struct {
	buf  []int32
	head int
}

func (q *fifo) push(id int32) { q.buf = append(q.buf, id) }
func (q *fifo) len() int      { return len(q.buf) - q.head }

func (q *fifo) pop() int32 {
	id := q.buf[q.head]
	q.head++
	if q.head > 4096 && q.head > len(q.buf)/2 {
		q.buf = q.buf[:copy(q.buf, q.buf[q.head:])]
		q.head = 0
	}
	return id
}

// clockSim is CLOCK, in bytes: a FIFO whose entries hit since they were last
// passed go round again.
type clockSim struct {
	slab
	budget, used int64
	index        map[uint32]int32
	ring         fifo
	ref          []bool
}

func (c *clockSim) access(_ int, key uint32, size int32) bool {
	if id, ok := c.index[key]; ok {
		c.ref[id] = true
		return true
	}
	if int64(size) > c.budget {
		return false
	}
	for c.used+int64(size) > c.budget {
		id := c.ring.pop()
		if c.ref[id] {
			c.ref[id] = false
			c.ring.push(id)
			continue
		}
		delete(c.index, c.key[id])
		c.used -= int64(c.size[id])
		c.remove(id)
	}
	id := c.add(key, size)
	for int(id) >= len(c.ref) {
		c.ref = append(c.ref, false)
	}
	c.ref[id] = false
	c.ring.push(id)
	c.index[key] = id
	c.used += int64(size)
	return false
}

// s3fifo is S3-FIFO (Yang et al., SOSP 2023), in bytes: new entries enter a
// small FIFO of a tenth of the budget, and move to the main FIFO when they
// were hit there; the others leave, their keys kept in a ghost FIFO as long
// as the main one in entries, and a key found there enters the main FIFO
// directly. The main FIFO is CLOCK with a counter of hits up to 3.
type s3fifo struct {
	slab
	budget, small, usedS, usedM int64
	index                       map[uint32]int32
	qs, qm                      fifo
	freq                        []uint8
	inMain                      []bool

	ghost     map[uint32]int // key -> its place in ghostQ
	ghostQ    []uint32
	ghostHead int
}

func newS3FIFO(budget int64) *s3fifo {
	return &s3fifo{budget: budget, small: budget / 10, index: map[uint32]int32{}, ghost: map[uint32]int{}}
}

func (s *s3fifo) access(_ int, key uint32, size int32) bool {
	if id, ok := s.index[key]; ok {
		s.freq[id] = min(s.freq[id]+1, 3)
		return true
	}
	if int64(size) > s.budget {
		return false
	}
	for s.usedS+s.usedM+int64(size) > s.budget {
		if s.usedS > s.small || s.qm.len() == 0 {
			s.evictSmall()
		} else {
			s.evictMain()
		}
	}
	id := s.add(key, size)
	for int(id) >= len(s.freq) {
		s.freq, s.inMain = append(s.freq, 0), append(s.inMain, false)
	}
	s.freq[id] = 0
	s.index[key] = id
	if _, ok := s.ghost[key]; ok {
		delete(s.ghost, key)
		s.inMain[id] = true
		s.qm.push(id)
		s.usedM += int64(size)
	} else {
		s.inMain[id] = false
		s.qs.push(id)
		s.usedS += int64(size)
	}
	return false
}

func (s *s3fifo) evictSmall() {
	id := s.qs.pop()
	s.usedS -= int64(s.size[id])
	if s.freq[id] > 0 {
		s.freq[id] = 0
		s.inMain[id] = true
		s.qm.push(id)
		s.usedM += int64(s.size[id])
		return
	}
	key := s.key[id]
	delete(s.index, key)
	s.remove(id)
	s.ghost[key] = len(s.ghostQ)
	s.ghostQ = append(s.ghostQ, key)
	for len(s.ghostQ)-s.ghostHead > s.qm.len() {
		old := s.ghostQ[s.ghostHead]
		if s.ghost[old] == s.ghostHead {
			delete(s.ghost, old)
		}
		s.ghostHead++
	}
	if s.ghostHead > 4096 && s.ghostHead > len(s.ghostQ)/2 {
		n := copy(s.ghostQ, s.ghostQ[s.ghostHead:])
		s.ghostQ = s.ghostQ[:n]
		for k, at := range s.ghost {
			s.ghost[k] = at - s.ghostHead
		}
		s.ghostHead = 0
	}
}

func (s *s3fifo) evictMain() {
	for {
		id := s.qm.pop()
		if s.freq[id] > 0 {
			s.freq[id]--
			s.qm.push(id)
			continue
		}
		s.usedM -= int64(s.size[id])
		delete(s.index, s.key[id])
		s.remove(id)
		return
	}
}

// tinyLFU is W-TinyLFU as otter v2 implements it (a Caffeine port: window,
// count-min sketch with doorkeeper, segmented main, adaptive window), with
// entries weighed by their size. Its maintenance runs in the caller and is
// drained after every access, so that the policy sees every access in order
// as Caffeine's simulator feeds it.
type tinyLFU struct {
	c *otter.Cache[uint32, int32]
}

func newTinyLFU(budget int64) *tinyLFU {
	return &tinyLFU{c: otter.Must(&otter.Options[uint32, int32]{
		MaximumWeight: uint64(budget),
		Weigher:       func(_ uint32, size int32) uint32 { return uint32(size) },
		Executor:      func(fn func()) { fn() },
	})}
}

func (t *tinyLFU) access(_ int, key uint32, size int32) bool {
	_, hit := t.c.GetIfPresent(key)
	if !hit {
		t.c.Set(key, size)
	}
	t.c.CleanUp()
	return hit
}

// opt is Belady's policy in bytes: on a miss the entry is admitted, and the
// entries asked again farthest in the future leave until the rest fit, the
// new one among them (so it is refused when it is that entry). With sizes
// this is not exactly optimal, but it is the bound the literature uses.
type opt struct {
	budget, used int64
	next         []int32 // the trace position of each query's next ask of its key
	index        map[uint32]int32
	size         map[uint32]int32
	byNext       nextHeap
}

// never is the next position of a key that is not asked again.
const never = math.MaxInt32

func (o *opt) access(pos int, key uint32, size int32) bool {
	n := o.next[pos]
	if _, ok := o.index[key]; ok {
		o.index[key] = n
		heap.Push(&o.byNext, asked{key, n})
		return true
	}
	if n == never || int64(size) > o.budget {
		return false
	}
	if o.size == nil {
		o.size = map[uint32]int32{}
	}
	for o.used+int64(size) > o.budget {
		top := o.byNext[0]
		if cur, ok := o.index[top.key]; !ok || cur != top.next {
			heap.Pop(&o.byNext) // stale: asked since, or gone
			continue
		}
		if top.next <= n {
			return false // the new entry is the one asked last
		}
		heap.Pop(&o.byNext)
		delete(o.index, top.key)
		o.used -= int64(o.size[top.key])
		delete(o.size, top.key)
	}
	o.index[key] = n
	o.size[key] = size
	o.used += int64(size)
	heap.Push(&o.byNext, asked{key, n})
	return false
}

type asked struct {
	key  uint32
	next int32
}

// nextHeap is a max-heap of keys by their next ask.
type nextHeap []asked

func (h nextHeap) Len() int           { return len(h) }
func (h nextHeap) Less(i, j int) bool { return h[i].next > h[j].next }
func (h nextHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *nextHeap) Push(x any)        { *h = append(*h, x.(asked)) }
func (h *nextHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
